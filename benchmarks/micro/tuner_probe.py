#!/usr/bin/env python3
"""What the tuner picks for the plain forward GEMM + bias + activation at M = 8192,
768 -> 3072 bf16, and each candidate's time as the tuner measures it (L2 warm, _time_ms)
next to do_bench's (L2 flushed), in one process.

    python benchmarks/micro/tuner_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import local_package  # noqa: E402

fm, tg = local_package("triton_gemm")
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
