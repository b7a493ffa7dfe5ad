"""cuBLAS (torch's default for mm) against cuBLASLt (torch.backends.cuda.preferred_blas_library
("cublaslt")) for the GEMMs fused-mlp leaves to torch (the down projection; the training step's
weight-gradient and dx GEMMs): alone ("alone": F.linear at the issue's shapes), inside our forward
("fwd": every bf16 case of bench_mlp, ours with the backend switched around the call as
"ours_lt", against eager / compile / Liger on torch's default) and inside our training step
("train": GeGLU d768 and SwiGLU M 4096), all timed with bench_mlp.alternating, 3 rounds
(session 23, NOTES).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/blas_backend_ab.py OUT.json [alone,fwd,train]
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import bench_mlp as B  # noqa: E402
import bench_train as T  # noqa: E402
from _common import graphed, run_info  # noqa: E402

out_path = sys.argv[1]
which = sys.argv[2] if len(sys.argv) > 2 else "alone,fwd,train"
ROUNDS = 3


def with_blas(fn, name):
    def f():
        prev = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library(name)
        try:
            return fn()
        finally:
            torch.backends.cuda.preferred_blas_library(prev)
    return f


res = {**run_info("cuda"), "command": "python3 benchmarks/micro/blas_backend_ab.py " + " ".join(sys.argv[1:]),
       "rows": []}
print("default blas", torch.backends.cuda.preferred_blas_library(), flush=True)

if "alone" in which:
    for m, n, k, bias in [(128, 4096, 14336, False), (512, 4096, 14336, False), (4096, 4096, 14336, False),
                          (16384, 4096, 14336, False), (8192, 768, 3072, False), (8192, 768, 3072, True),
                          (4096, 28672, 4096, False), (4096, 14336, 4096, False)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        base = lambda: F.linear(a, w, b)
        fns = {"cublas": base, "cublaslt": with_blas(base, "cublaslt")}
        y0, y1 = fns["cublas"](), fns["cublaslt"]()
        med, per = B.alternating_rounds(fns, 1000, "cuda", ROUNDS)
        row = {"what": f"F.linear M{m} N{n} K{k}{' bias' if bias else ''}", "ms": med, "rounds": per,
               "lt_over_cublas": med["cublaslt"] / med["cublas"], "max_abs_diff": (y0 - y1).abs().max().item()}
        print(json.dumps(row), flush=True)
        res["rows"].append(row)
        del a, w, b, y0, y1

liger = B.load_liger()
if "fwd" in which:
    for c in B.all_cases():
        if c.dtype != torch.bfloat16:
            continue
        torch._dynamo.reset()
        compiled = {"gated": torch.compile(B.eager_gated, dynamic=False),
                    "mlp": torch.compile(B.eager_mlp, dynamic=False)}
        from kernels import get_kernel
        fm = get_kernel("org/fused-mlp", version=1)
        t = B.make_inputs(c, "cuda", seed=1000)
        ref = B.reference(c, t)
        impl = B.implementations(c, t, fm, compiled, liger)
        impl.pop("gemms_only")
        impl = {k: v for k, v in impl.items() if v is not None}
        impl["ours_lt"] = with_blas(impl["ours"], "cublaslt")
        with torch.inference_mode():
            errs = {k: B.rel_err(f(), ref) for k, f in impl.items()}
            bit = torch.equal(impl["ours"](), impl["ours_lt"]())
            for mode in (["events", "graph"] if c.m <= 128 or c.d <= 1024 else ["events"]):
                calls = {k: (graphed(f) if mode == "graph" else f) for k, f in impl.items()}
                med, per = B.alternating_rounds(calls, 1500, "cuda", ROUNDS)
                best = min(med[p] for p in ("eager", "compile", "liger") if p in med)
                row = {"what": c.name, "timing": mode, "ms": med, "rounds": per, "rel_err": errs,
                       "bit_identical": bit, "ours_over_best": med["ours"] / best,
                       "ours_lt_over_best": med["ours_lt"] / best, "lt_over_ours": med["ours_lt"] / med["ours"]}
                print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
                res["rows"].append(row)
                del calls
        del t, ref, impl
        torch.cuda.empty_cache()

if "train" in which:
    from kernels import get_kernel
    fm = get_kernel("org/fused-mlp", version=1)
    for c in T.all_cases():
        if not any(s in c.name for s in ("geglu", "swiglu")):
            continue
        torch._dynamo.reset()
        compiled = {"gated": torch.compile(B.eager_gated, dynamic=False),
                    "mlp": torch.compile(B.eager_mlp, dynamic=False)}
        t = T.make_inputs(c, seed=1000)
        ps, dy = T.params(t), t["dy"]
        fwds = T.forward_fns(c, t, fm, compiled, liger)
        fwds.pop("ours_recompute")
        steps = {k: T.train_step(f, dy) for k, f in fwds.items() if f is not None}
        steps["ours_lt"] = with_blas(steps["ours"], "cublaslt")
        ref = T.reference_grads(c, t)
        errs = {k: max(B.rel_err(g, r) for g, r in zip(T.grads_of(s, ps), ref)) for k, s in steps.items()}

        def no_grads(ps=ps):
            for p in ps:
                p.grad = None

        med, per = B.alternating_rounds(steps, 2000, "cuda", ROUNDS, before=no_grads)
        best = min(med[p] for p in ("eager", "compile", "liger") if p in med)
        row = {"what": c.name, "timing": "events", "ms": med, "rounds": per, "grad_rel_err": errs,
               "ours_over_best": med["ours"] / best, "ours_lt_over_best": med["ours_lt"] / best,
               "lt_over_ours": med["ours_lt"] / med["ours"]}
        print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        res["rows"].append(row)
        if c.d <= 1024:
            gs = {k: T.graphed_step(s, ps) for k, s in steps.items()}
            med, per = B.alternating_rounds(gs, 2000, "cuda", ROUNDS)
            best = min(med[p] for p in ("eager", "compile", "liger") if p in med)
            row = {"what": c.name, "timing": "graph", "ms": med, "rounds": per,
                   "ours_over_best": med["ours"] / best, "ours_lt_over_best": med["ours_lt"] / best,
                   "lt_over_ours": med["ours_lt"] / med["ours"]}
            print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
            res["rows"].append(row)
            del gs
        del t, steps, fwds
        torch.cuda.empty_cache()

res["date"] = time.strftime("%Y-%m-%d %H:%M")
with open(out_path, "w") as f:
    json.dump(res, f, indent=1)
