"""Wave quantization of the sm_90a kernels at SwiGLU sizes (d 4096, hidden 14336): the gated forward
(128-column tiles with and without the narrow tail, FUSED_MLP_SM90_NARROW_TAIL=0 set around each
"_notail" call; 112-column tiles; the training form storing g | u), the gated dh kind and cuBLAS's
x [Wg; Wu]^T, timed alone with bench_mlp.alternating (3 rounds), at row counts whose tile counts
fill the SMs differently (default 3968, 4096, 4224, 4352: 31-34 row blocks). Prints time per row.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/sm90_waves.py OUT.json [M,M,...]
"""
import json
import os
import sys
import time

import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
import bench_mlp as B
from _common import run_info, with_env
from kernels import get_kernel

fm = get_kernel("org/fused-mlp", version=1)
ops = sys.modules[fm.__name__ + "._ops"].ops
act = sys.modules[fm.__name__ + ".activations"].activation_id("silu")
D, H = 4096, 14336
res = {**run_info("cuda"), "command": "python3 benchmarks/micro/sm90_waves.py " + " ".join(sys.argv[1:]), "rows": []}
g = torch.Generator(device="cuda").manual_seed(0)
bf = dict(device="cuda", dtype=torch.bfloat16)
wg = torch.randn(H, D, generator=g, device="cuda").to(torch.bfloat16) * D**-0.5
wu = torch.randn(H, D, generator=g, device="cuda").to(torch.bfloat16) * D**-0.5
wd = torch.randn(D, H, generator=g, device="cuda").to(torch.bfloat16) * H**-0.5
wgu = torch.cat([wg, wu])


def off(fn):
    """fn with the narrow tail switched off (the op reads the switch at each call)."""
    return with_env(fn, "FUSED_MLP_SM90_NARROW_TAIL", "0")


os.environ.pop("FUSED_MLP_SM90_NARROW_TAIL", None)
MS = [int(m) for m in (sys.argv[2].split(",") if len(sys.argv) > 2 else "3968,4096,4224,4352".split(","))]
for m in MS:
    x = torch.randn(m, D, generator=g, device="cuda").to(torch.bfloat16)
    dy = torch.randn(m, D, generator=g, device="cuda").to(torch.bfloat16)
    h = torch.empty(m, H, **bf); pre = torch.empty(m, 2 * H, **bf); gu = torch.empty(m, 2 * H, **bf)
    ops.gated_gemm_sm90(h, x, wg, wu, None, None, pre, act, 0)
    dout = torch.empty_like(pre)
    fns = {
        "fwd_bn128_notail": off(lambda: ops.gated_gemm_sm90(h, x, wg, wu, None, None, None, act, 128)),
        "fwd_train_notail": off(lambda: ops.gated_gemm_sm90(h, x, wg, wu, None, None, gu, act, 128)),
        "fwd_bn128": lambda: ops.gated_gemm_sm90(h, x, wg, wu, None, None, None, act, 128),
        "fwd_bn112": lambda: ops.gated_gemm_sm90(h, x, wg, wu, None, None, None, act, 112),
        "fwd_train": lambda: ops.gated_gemm_sm90(h, x, wg, wu, None, None, gu, act, 128),
        "dh": lambda: ops.dact_gemm_sm90(dout, dy, wd, pre, act, True, True),
        "cublas_x_wgu": lambda: torch.mm(x, wgu.t(), out=gu),
    }
    med, per = B.alternating_rounds(fns, 1500, "cuda", 3)
    row = {"m": m, "ms": med, "rounds": per, "us_per_row": {n: v * 1e3 / m for n, v in med.items()}}
    print(json.dumps({"m": m, "ms": {n: round(v, 4) for n, v in med.items()},
                      "ns_per_row": {n: round(v * 1e6 / m, 2) for n, v in med.items()}}), flush=True)
    res["rows"].append(row)
    del x, dy, h, pre, gu, dout
res["date"] = time.strftime("%Y-%m-%d %H:%M")
json.dump(res, open(sys.argv[1], "w"), indent=1)
