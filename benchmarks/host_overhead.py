#!/usr/bin/env python3
"""Host (CPU) time per call of fused-mlp's public functions against eager, and a
cProfile of where it goes. A call whose host time exceeds its GPU time is launch-bound:
`events` timings then measure Python, not kernels.

    KERNELS_CACHE=... HF_HUB_OFFLINE=1 python benchmarks/host_overhead.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
import torch.nn.functional as F
from kernels import get_kernel


def host_us(fn, n: int = 300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def main() -> None:
    fm = get_kernel("org/fused-mlp", version=1)
    dev, dt = "cuda", torch.bfloat16
    cases = {
        "gated m128 d4096 h14336": (128, 4096, 14336),
        "gated m8192 d768 h3072": (8192, 768, 3072),
    }
    for name, (m, d, h) in cases.items():
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, d, device=dev, dtype=dt)
            wg, wu = (torch.randn(h, d, device=dev, dtype=dt) * d**-0.5 for _ in range(2))
            wd = torch.randn(d, h, device=dev, dtype=dt) * h**-0.5
            ours = lambda: fm.gated_mlp(x, wg, wu, wd, "gelu_tanh")
            eager = lambda: F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)
            print(f"{name} {dt}: host us/call ours {host_us(ours):7.1f}  eager {host_us(eager):7.1f}")
            w1 = torch.randn(h, d, device=dev, dtype=dt) * d**-0.5
            b1 = torch.randn(h, device=dev, dtype=dt)
            w2 = torch.randn(d, h, device=dev, dtype=dt) * h**-0.5
            b2 = torch.randn(d, device=dev, dtype=dt)
            plain = lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh")
            print(f"{name} {dt}: host us/call mlp {host_us(plain):7.1f}")
    # Where the host time of one fused call goes: each layer measured alone.
    import importlib
    tg = importlib.import_module(fm.__name__ + ".triton_gemm")
    disp = importlib.import_module(fm.__name__ + ".dispatch")
    x = torch.randn(128, 4096, device=dev, dtype=torch.bfloat16)
    wg, wu = (torch.randn(14336, 4096, device=dev, dtype=torch.bfloat16) * 0.01 for _ in range(2))
    wd = torch.randn(4096, 14336, device=dev, dtype=torch.bfloat16) * 0.01
    h = torch.randn(128, 14336, device=dev, dtype=torch.bfloat16)
    layers = {
        "public gated_mlp": lambda: fm.gated_mlp(x, wg, wu, wd, "silu"),
        "dispatch.gated_mlp_forward": lambda: disp.gated_mlp_forward(x, wg, wu, wd, "silu", None, None, None),
        "triton_gemm.gated_linear": lambda: tg.gated_linear(x, wg, wu, None, None, 1),
        "F.linear (down)": lambda: F.linear(h, wd),
        "dispatch.choose": lambda: disp.choose(x, "gated", (wg, wu, wd), 14336),
    }
    for name, fn in layers.items():
        print(f"  {name:<28} {host_us(fn):7.1f} us/call (host)")
    fn = layers["triton_gemm.gated_linear"]
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue()[:5000])


if __name__ == "__main__":
    main()
