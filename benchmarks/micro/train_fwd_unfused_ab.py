"""A/B (session 27): the gated training forward's gate/up stage as the fused kernel storing
g | u and h, against cuBLAS's two GEMMs into g | u's halves + act_and_mul (sm90.gate_up's two
forms, picked per call by FUSED_MLP_SM90_TRAIN_FWD=fused / unfused), alternating calls, 3
rounds: the stage alone ("*_stage"), the forward with the down GEMM ("*_fwd") and the whole
eager training step through gated_mlp (the C++ node, "*_step"). Shapes: the issue's SwiGLU
and GeGLU training cases and a few between them, for the rule (sm90.train_forward_unfused).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/train_fwd_unfused_ab.py OUT.json [M,D,H,act ...]"""
import importlib
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench_mlp as B  # noqa: E402
from _common import rel_err, run_info, with_env  # noqa: E402
from kernels import get_kernel  # noqa: E402

SHAPES = [(4096, 4096, 14336, "silu"), (8192, 768, 3072, "gelu_tanh"), (1024, 4096, 14336, "silu"),
          (16384, 4096, 14336, "silu"), (4096, 2048, 8192, "silu"), (8192, 1024, 4096, "silu")]


ENV = "FUSED_MLP_SM90_TRAIN_FWD"


def main():
    fm = get_kernel("org/fused-mlp", version=1)
    tg = importlib.import_module(fm.__name__ + ".triton_gemm")
    shapes = SHAPES
    if len(sys.argv) > 2:
        shapes = [(int(a), int(b), int(c), act) for a, b, c, act in (s.split(",") for s in sys.argv[2:])]
    out = {"info": run_info()}
    for m, d, h, act in shapes:
        aid = fm.activations.ACTIVATION_IDS[act]
        g = torch.Generator(device="cuda").manual_seed(0)
        bf = dict(device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, d, generator=g, **bf)
        wg = torch.randn(h, d, generator=g, **bf) * d**-0.5
        wu = torch.randn(h, d, generator=g, **bf) * d**-0.5
        wd = torch.randn(d, h, generator=g, **bf) * h**-0.5
        dy = torch.randn(m, d, generator=g, **bf)
        gu = torch.empty(m, 2 * h, **bf)
        hb = torch.empty(m, h, **bf)
        leaves = [t.clone().requires_grad_(True) for t in (x, wg, wu, wd)]

        def stage():
            tg.gated_linear(x, wg, wu, None, None, aid, pre=gu, out=hb)

        def fwd():
            stage()
            return torch.nn.functional.linear(hb, wd)

        def step():
            for t in leaves:
                t.grad = None
            fm.gated_mlp(*leaves, act).backward(dy)

        # The two forms agree within bf16 rounding (h from fp32 accumulators or from bf16 g, u).
        checks = {}
        for mode in ("fused", "unfused"):
            y = with_env(fwd, ENV, mode)().float()
            with_env(step, ENV, mode)()
            checks[mode] = (y, gu.float().clone(), [t.grad.float().clone() for t in leaves])
        (yf, gf, df), (yu, gu_u, du) = checks["fused"], checks["unfused"]
        diffs = {"y": rel_err(yu, yf), "gu": rel_err(gu_u, gf), "grads": [rel_err(a, b) for a, b in zip(du, df)]}
        del checks, yf, gf, df, yu, gu_u, du
        fns = {}
        for mode in ("fused", "unfused"):
            fns[f"{mode}_stage"] = with_env(stage, ENV, mode)
            fns[f"{mode}_fwd"] = with_env(fwd, ENV, mode)
            fns[f"{mode}_step"] = with_env(step, ENV, mode)
        med, per = B.alternating_rounds(fns, 1500, "cuda", 3)
        key = f"m{m}_d{d}_h{h}_{act}"
        ratios = {p: med[f"unfused_{p}"] / med[f"fused_{p}"] for p in ("stage", "fwd", "step")}
        out[key] = {"median_ms": med, "rounds_ms": per, "unfused_over_fused": ratios, "rel_diff_unfused_vs_fused": diffs}
        print(key, json.dumps({"median_ms": med, "unfused_over_fused": ratios, "diffs": diffs}), flush=True)
        del leaves, x, wg, wu, wd, dy, gu, hb
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
