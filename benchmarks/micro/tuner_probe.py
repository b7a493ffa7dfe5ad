#!/usr/bin/env python3
"""What the tuner picks for the plain forward GEMM + bias + activation at M = 8192,
768 -> 3072 bf16, and each candidate's time as the tuner measures it (L2 warm, _time_ms)
next to do_bench's (L2 flushed), in one process.

    python benchmarks/micro/tuner_probe.py
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import triton.testing  # noqa: E402
from kernels import get_kernel  # noqa: E402

fm = get_kernel("org/fused-mlp", version=1)
tg = importlib.import_module(fm.__name__ + ".triton_gemm")
m, k, n = 8192, 768, 3072
x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
act = fm.activations.ACTIVATION_IDS["gelu_tanh"]
tg.linear_act(x, w, b, act)
print("tuned:", {str(key[1:5]): cfg for key, cfg in tg._TUNED.items()})
out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
for cfg in tg.candidates(False, m, n, k, x.dtype, tma=True):
    fn = lambda: tg.linear_act(x, w, b, act, config=cfg, out=out)  # noqa: E731
    tuner = tg._time_ms(fn)
    flushed = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    print(f"{cfg}: tuner {tuner * 1e3:6.1f} us, do_bench {flushed * 1e3:6.1f} us")
