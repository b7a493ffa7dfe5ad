"""Session 27: why the unfused training forward's first form (torch.addmm with the bias into g | u's
strided halves) missed relu + bias gradients: g | u of both forms against float64, bit differences, sign flips of g.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/train_fwd_bias_rounding.py"""
import importlib
import os
import pathlib
import sys

import torch
from kernels import get_kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from _common import rel_err  # noqa: E402
fm = get_kernel("org/fused-mlp", version=1)
tg = importlib.import_module(fm.__name__ + ".triton_gemm")
for dtype in (torch.float16, torch.bfloat16):
    for act in ("relu", "silu"):
        for bias in (False, True):
            g = torch.Generator(device="cuda").manual_seed(5)
            kw = dict(device="cuda", dtype=dtype)
            m, d, h = 777, 200, 344
            x = torch.randn(m, d, generator=g, **kw); wg = torch.randn(h, d, generator=g, **kw) * d**-0.5
            wu = torch.randn(h, d, generator=g, **kw) * d**-0.5
            bg = torch.randn(h, generator=g, **kw) if bias else None; bu = torch.randn(h, generator=g, **kw) if bias else None
            exact = torch.cat([x.double() @ wg.double().t() + (0 if bg is None else bg.double()),
                               x.double() @ wu.double().t() + (0 if bu is None else bu.double())], 1)
            res = {}
            for mode in ("fused", "unfused"):
                os.environ["FUSED_MLP_SM90_TRAIN_FWD"] = mode
                gu = torch.full((m, 2 * h), float("nan"), **kw); hb = torch.full((m, h), float("nan"), **kw)
                if mode == "fused":
                    tg.gated_linear(x, wg, wu, bg, bu, fm.activations.ACTIVATION_IDS[act], pre=gu, out=hb)
                else:  # session 27's first unfused form: addmm into the strided halves
                    for w, b, part in ((wg, bg, gu[:, :h]), (wu, bu, gu[:, h:])):
                        if b is None:
                            torch.mm(x, w.t(), out=part)
                        else:
                            torch.addmm(b, x, w.t(), out=part)
                    fm.act_and_mul(hb, gu, act)
                    c = torch.empty(m, h, **kw)
                    if bg is not None:  # the same into a contiguous out, and mm + bias
                        torch.addmm(bg, x, wg.t(), out=c)
                        e = lambda a: int((a.double() != gu[:, :h].double()).sum())
                        print("  addmm strided vs contiguous bits differ:", e(c), "; vs mm then + b:", e(x @ wg.t() + bg),
                              "; vs F.linear:", e(torch.nn.functional.linear(x, wg, bg)))
                torch.cuda.synchronize()
                res[mode] = (gu.double(), hb.double())
            (gf, hf), (gn, hn) = res["fused"], res["unfused"]
            er = lambda a: rel_err(a, exact)  # noqa: E731
            flips = lambda a: int(((a[:, :h] > 0) != (exact[:, :h] > 0)).sum())
            print(f"{dtype} {act} bias={bias}: gu err fused {er(gf):.2e} unfused {er(gn):.2e}; g bits differ "
                  f"{int((gf[:, :h] != gn[:, :h]).sum())}, u {int((gf[:, h:] != gn[:, h:]).sum())}; sign flips of g "
                  f"fused {flips(gf)} unfused {flips(gn)}; nan {int(gn.isnan().sum())}/{int(hn.isnan().sum())}; "
                  f"h diff {((hf - hn).norm() / hf.norm()).item():.2e}", flush=True)
