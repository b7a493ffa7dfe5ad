#!/usr/bin/env python3
"""The GPU kernels of fused_mlp.gated_mlp at SwiGLU M 4096 (d 4096, h 14336, bf16) and their
times, from torch.profiler over 10 calls with L2 flushed before each (a 256 MiB fill):

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/micro/profile_gated_mlp.py

Ten calls are a short burst: the clocks are higher than under a sustained load (see
power_clock.py), so these times are the kernels' own at burst clocks, not the benchmark's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from kernels import get_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import swiglu_operands  # noqa: E402


def main() -> None:
    fm = get_kernel("org/fused-mlp", version=1)
    x, wg, wu, wd = swiglu_operands()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(5):
        fm.gated_mlp(x, wg, wu, wd, "silu")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(10):
            flush.fill_(i)
            fm.gated_mlp(x, wg, wu, wd, "silu")
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times.setdefault(e.name[:90], []).append(e.device_time)
    for name, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        v.sort()
        print(f"{name:<92} n={len(v):3d} median {v[len(v) // 2]:8.1f} us")


if __name__ == "__main__":
    main()
