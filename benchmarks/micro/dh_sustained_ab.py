"""A/B (session 27, plan item 1): the gated backward's dh stage at SwiGLU M 4096 sustained
(alternating calls, 3 rounds): our fused kernel (dh = dy Wd with the activation's derivative
in its epilogue, dg | du written over a copy of g | u) against cuBLAS's dh and the derivative
as one torch.compile'd pointwise kernel (what torch.compile's step runs), and cuBLAS's dh alone.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/dh_sustained_ab.py OUT.json [M,D,H]"""
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench_mlp as B  # noqa: E402
from _common import rel_err, run_info  # noqa: E402
from kernels import get_kernel  # noqa: E402


@torch.compile(fullgraph=True)
def swiglu_dact(dh, g, u):
    s = torch.sigmoid(g.float())
    gf, uf, dhf = g.float(), u.float(), dh.float()
    return torch.cat([(dhf * uf * s * (1 + gf * (1 - s))).to(dh.dtype), (dhf * gf * s).to(dh.dtype)], 1)


def main():
    fm = get_kernel("org/fused-mlp", version=1)
    m, d, h = (int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "4096,4096,14336").split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, d, generator=gen, **bf)
    wd = torch.randn(d, h, generator=gen, **bf) * h**-0.5
    gu = torch.randn(m, 2 * h, generator=gen, **bf)
    out = torch.empty_like(gu)
    aid = fm.activations.ACTIVATION_IDS["silu"]

    def fused():
        fm.ops.dact_gemm_sm90(out, dy, wd, gu, aid, True, True)

    def cublas_pointwise():
        return swiglu_dact(dy @ wd, gu[:, :h], gu[:, h:])

    def cublas_dh():
        return dy @ wd

    fused()
    ref = cublas_pointwise()
    rel = rel_err(out, ref)
    med, per = B.alternating_rounds({"fused": fused, "cublas_pointwise": cublas_pointwise, "cublas_dh": cublas_dh},
                                    1500, "cuda", 3)
    res = {"info": run_info(), "shape": [m, d, h], "median_ms": med, "rounds_ms": per, "rel_diff_fused_vs_cublas_pointwise": rel}
    print(json.dumps(res), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
