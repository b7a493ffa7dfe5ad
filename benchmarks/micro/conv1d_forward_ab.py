#!/usr/bin/env python3
"""GPT-2's MLP forward (inference, Conv1D weights [in, out], biases, tanh-GELU) with the sm_90a
linear_act reading the fc weight N-major, against FUSED_MLP_SM90=0 (the Triton / cuBLASLt first
GEMM that Conv1D took before session 21), the same MLP in nn.Linear's layout, and eager as
GPT-2 runs it (addmm). Each output checked against float64 first; then 5 interleaved rounds of
do_bench (L2 flushed) per implementation, medians in us, at M 512 and 8192, d768 h3072 bf16.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/micro/conv1d_forward_ab.py OUT.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from kernels import get_kernel
from triton.testing import do_bench


def set_sm90(value) -> None:
    """FUSED_MLP_SM90 as given (None: unset, the kernels on). The package reads it per call."""
    if value is None:
        os.environ.pop("FUSED_MLP_SM90", None)
    else:
        os.environ["FUSED_MLP_SM90"] = value


def main() -> None:
    fm = get_kernel("org/fused-mlp", version=1)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    res = {}
    for m in (512, 8192):
        d, h = 768, 3072
        x = torch.randn(m, d, **bf)
        w1, w2 = torch.randn(h, d, **bf) * d**-0.5, torch.randn(d, h, **bf) * h**-0.5
        b1, b2 = torch.randn(h, **bf) * 0.1, torch.randn(d, **bf) * 0.1
        c1, c2 = w1.t().contiguous(), w2.t().contiguous()  # Conv1D's [in, out]
        ref = F.linear(F.gelu(F.linear(x.double(), w1.double(), b1.double()), approximate="tanh"),
                       w2.double(), b2.double())
        fns = {  # name: (FUSED_MLP_SM90, forward)
            "conv1d sm90 (new)": (None, lambda: fm.mlp(x, c1, b1, c2, b2, "gelu_tanh", "conv1d")),
            "conv1d FUSED_MLP_SM90=0 (before)": ("0", lambda: fm.mlp(x, c1, b1, c2, b2, "gelu_tanh", "conv1d")),
            "linear sm90": (None, lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh")),
            "eager conv1d (addmm)": (None, lambda: torch.addmm(
                b2, F.gelu(torch.addmm(b1, x, c1), approximate="tanh"), c2)),
        }
        rounds = {k: [] for k in fns}
        with torch.no_grad():
            for k, (sm90, fn) in fns.items():
                set_sm90(sm90)
                y = fn()
                torch.cuda.synchronize()
                err = ((y.double() - ref).norm() / ref.norm()).item()
                print(f"m{m} {k:34s} rel err {err:.2e}", flush=True)
                assert err < 2e-2, k
            for _ in range(5):  # interleaved rounds
                for k, (sm90, fn) in fns.items():
                    set_sm90(sm90)
                    rounds[k].append(1e3 * do_bench(fn, warmup=25, rep=100))
        set_sm90(None)
        for k, v in rounds.items():
            res[f"m{m} {k}"] = statistics.median(v)
            print(f"m{m} {k:34s} {statistics.median(v):8.1f} us  rounds {' '.join(f'{t:.1f}' for t in v)}", flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "us": res}, f, indent=1)


if __name__ == "__main__":
    main()
