#!/usr/bin/env python3
"""The backward's dh kernel (dh = dy @ W_down with the activation's derivative in its
epilogue) in every tile config and epilogue variant, against cuBLAS, on the training cases.

    python benchmarks/micro/dh_variants.py [--out benchmarks/results/dh_variants_h200.json]

Variants: every config of the tuner's backward list for the shape (pointer loads, and TMA
for the first three as the tuner tries them) and two larger tiles, each with PREFETCH on
and off (the epilogue's pre-activation tiles loaded before the tile loop or after it);
the whole-tile epilogue (SUBTILE=0) for the first config only.
References in the same process: cuBLAS's dy @ W alone, and the unfused backward of the
same step (cuBLAS dh, then PyTorch's elementwise derivative).
Each variant's output (written beside the pre-activations, not in place, so repeated
runs read the same inputs) is checked against float64 before it is timed. Timing:
triton.testing.do_bench, median, L2 flushed between runs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import rel_err  # noqa: E402

# name -> (gated, M, K (= model dim), N (= hidden), activation)
CASES = {
    "geglu_m8192_d768_h3072": (True, 8192, 768, 3072, "gelu_tanh"),
    "mlp_gelu_tanh_m8192_d768_h3072": (False, 8192, 768, 3072, "gelu_tanh"),
    "swiglu_m4096_d4096_h14336": (True, 4096, 4096, 14336, "silu"),
}
# Extra configs beyond the tuner's list (block_m, block_n, block_k, group_m, warps, stages).
EXTRA = [(128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/dh_variants_h200.json"))
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("[dh] needs a CUDA GPU")
    import triton
    import triton.testing
    from kernels import get_kernel

    fm = get_kernel("org/fused-mlp", version=1)
    tg = importlib.import_module(fm.__name__ + ".triton_gemm")
    acts = fm.activations
    dtype = torch.bfloat16
    rows = []

    def bench(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    for name in args.cases.split(","):
        gated, m, k, n, act = CASES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        dy = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
        wd = (torch.randn(k, n, device="cuda", dtype=dtype, generator=g) * k**-0.5)  # nn.Linear's [D, H]
        pre = torch.randn(m, (2 if gated else 1) * n, device="cuda", dtype=dtype, generator=g)
        f, df = acts.torch_activation(act), acts.torch_activation_derivative(act)
        dh = dy.double() @ wd.double()
        z = pre[:, :n].double()
        if gated:
            u = pre[:, n:].double()
            want = torch.cat([dh * u * df(z), dh * f(z)], 1)
        else:
            want = dh * df(z)
        del dh, z
        act_id = acts.ACTIVATION_IDS[act]
        out = torch.empty_like(pre)
        base = {"case": name, "m": m, "k": k, "n": n, "gated": gated}

        cublas = bench(lambda: torch.mm(dy, wd))
        rows.append({**base, "variant": "cublas_mm", "ms": cublas})

        def unfused():
            d = torch.mm(dy, wd)
            if gated:
                zz, uu = pre[:, :n].float(), pre[:, n:].float()
                torch.cat([(d * uu * df(zz)), d * f(zz)], 1, out=out)
            else:
                torch.mul(d, df(pre.float()), out=out)
        rows.append({**base, "variant": "cublas_then_torch_elementwise", "ms": bench(unfused)})
        print(f"[dh] {name}: cuBLAS mm {cublas * 1e3:.1f} us, unfused {rows[-1]['ms'] * 1e3:.1f} us", flush=True)

        cands = tg.candidates(False, m, n, k, dtype, tma=True, table=tg._BWD_CONFIGS)
        extra = [tg.Config(*e) for e in EXTRA]
        cands += extra + [c._replace(tma=True) for c in extra]
        runs = [(c, p, "1") for c in dict.fromkeys(cands) for p in ("0", "1")]
        runs += [(cands[0], p, "0") for p in ("0", "1")]
        for cfg, prefetch, subtile in runs:
            os.environ["FUSED_MLP_BWD_PREFETCH"] = prefetch
            os.environ["FUSED_MLP_BWD_SUBTILE"] = subtile
            label = (f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
                     f"{' tma' if cfg.tma else ''} prefetch={prefetch} subtile={subtile}")
            row = {**base, "variant": label, "config": list(cfg), "prefetch": prefetch == "1",
                   "subtile": subtile == "1"}
            try:
                out.fill_(float("nan"))
                tg.linear_dact(dy, wd, True, pre, out, act_id, gated=gated, config=cfg)
                torch.cuda.synchronize()
            except Exception as e:  # does not fit this GPU
                row["error"] = f"{type(e).__name__}: {str(e)[:120]}"
                rows.append(row)
                print(f"[dh]   {label}: {row['error']}", flush=True)
                continue
            err = rel_err(out, want)
            row["rel_err"] = err
            if not err < 1e-2:
                row["error"] = "wrong result"
            else:
                row["ms"] = bench(lambda: tg.linear_dact(dy, wd, True, pre, out, act_id, gated=gated,
                                                         config=cfg))
            rows.append(row)
            print(f"[dh]   {label}: {row.get('ms', float('nan')) * 1e3:7.1f} us  err {err:.1e}", flush=True)
        os.environ.pop("FUSED_MLP_BWD_PREFETCH", None)
        os.environ.pop("FUSED_MLP_BWD_SUBTILE", None)
        best = min((r for r in rows if r["case"] == name and "ms" in r and "config" in r), key=lambda r: r["ms"])
        print(f"[dh] {name}: best {best['variant']} {best['ms'] * 1e3:.1f} us (cuBLAS mm {cublas * 1e3:.1f})",
              flush=True)

    report = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"[dh] wrote {args.out}")


if __name__ == "__main__":
    main()
