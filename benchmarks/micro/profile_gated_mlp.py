#!/usr/bin/env python3
"""The GPU kernels of one fused-mlp forward and their times, from torch.profiler over 10 calls
with L2 flushed before each (a 256 MiB fill): each kernel's median time, the median idle gap
between consecutive kernels of a call, and the median span of a call (first kernel's start to
last kernel's end).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/micro/profile_gated_mlp.py \
        [--case swiglu|plain] [--m M] [--graph] [--flush fill|read] [--dtype bf16|fp16] \
        [--calls N] [--load-s S] [--impl ours|eager]

--case swiglu: fused_mlp.gated_mlp on the SwiGLU block (d 4096, h 14336, bf16; default M 4096);
--case plain: fused_mlp.mlp on the post's GeLU-tanh block with biases (d 768, h 3072; M 8192).
--dtype fp16: the same in fp16. --impl eager: the SwiGLU block in plain PyTorch instead (the
peers' cuBLAS GEMMs and pointwise kernels), for a side-by-side list.
--graph profiles replays of a CUDA graph of the call (as bench_mlp.py's "graph" timing), so the
gaps are the GPU's own, not the host's launch time.
--flush read evicts L2 by reading 256 MiB (a sum) instead of writing it (_common.l2_evictor):
after a fill, L2 holds dirty lines that the call's first kernels write back to DRAM, which
slowed the few-token down GEMM by ~8 us in session 29 (NOTES.md, lt_algos' "mlp" context); a
read leaves clean lines. Calls are delimited by the eviction's own kernels, found by profiling
one eviction alone.

Ten calls (--calls) are a short burst: the clocks are higher than under a sustained load (see
power_clock.py), so these times are the kernels' own at burst clocks, not the benchmark's.
--load-s S runs the same eviction + call loop for S seconds before the profiled calls, so that
they run at the clocks a benchmark's sustained loop settles at.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from kernels import get_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, graphed, l2_evictor, swiglu_eager, swiglu_operands  # noqa: E402


def median(v: list[float]) -> float:
    return statistics.median_high(v) if v else float("nan")  # an observed value, as before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["swiglu", "plain"], default="swiglu")
    ap.add_argument("--m", type=int, default=None, help="tokens (default 4096 for swiglu, 8192 for plain)")
    ap.add_argument("--graph", action="store_true", help="profile CUDA-graph replays of the call")
    ap.add_argument("--flush", choices=["fill", "read"], default="fill", help="how L2 is evicted before each call")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--impl", choices=["ours", "eager"], default="ours",
                    help="eager: the same block in plain PyTorch (the peers' GEMMs), swiglu only")
    ap.add_argument("--calls", type=int, default=10, help="profiled calls")
    ap.add_argument("--load-s", type=float, default=0.0, help="seconds of the same loop before the profiled calls")
    a = ap.parse_args()
    dt = DTYPES[a.dtype]
    fm = get_kernel("org/fused-mlp", version=1)
    if a.case == "swiglu":
        x, wg, wu, wd = swiglu_operands(m=a.m or 4096, dtype=dt)
        if a.impl == "eager":  # the peers' eager form: three cuBLAS GEMMs, SiLU, the product
            call = lambda: swiglu_eager(x, wg, wu, wd)  # noqa: E731
        else:
            call = lambda: fm.gated_mlp(x, wg, wu, wd, "silu")  # noqa: E731
    else:
        if a.impl == "eager":
            ap.error("--impl eager is for --case swiglu")
        kw = dict(device="cuda", dtype=dt)
        m, d, h = a.m or 8192, 768, 3072
        x = torch.randn(m, d, **kw)
        w1, b1 = torch.randn(h, d, **kw) * d**-0.5, torch.randn(h, **kw) * 0.1
        w2, b2 = torch.randn(d, h, **kw) * h**-0.5, torch.randn(d, **kw) * 0.1
        call = lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh")  # noqa: E731
    step = graphed(call) if a.graph else call
    evict = l2_evictor(a.flush)
    for _ in range(5):
        step()
    torch.cuda.synchronize()

    def gpu_kernels(prof) -> list:
        return sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)

    # The eviction's own kernels, in order (a fill: one kernel; a read: a memset, then the sum).
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        evict()
        torch.cuda.synchronize()
    evict_names = [e.name for e in gpu_kernels(prof)]
    opener, prelude = evict_names[-1], set(evict_names[:-1])
    t_end = time.perf_counter() + a.load_s
    while time.perf_counter() < t_end:
        for _ in range(20):
            evict()
            step()
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(a.calls):
            evict()
            step()
        torch.cuda.synchronize()
    # A call opens at the eviction's last kernel; the next eviction's earlier kernels, which
    # follow the call's own, are taken off its end.
    calls: list[list] = []
    for e in gpu_kernels(prof):
        if e.name == opener:
            calls.append([])
        elif calls:
            calls[-1].append(e)
    for ks in calls:
        while ks and ks[-1].name in prelude:
            ks.pop()
    times: dict[str, list[float]] = {}
    gaps, spans = [], []
    for ks in calls:
        for e in ks:
            times.setdefault(e.name[:90], []).append(e.time_range.end - e.time_range.start)
        gaps += [b.time_range.start - p.time_range.end for p, b in zip(ks, ks[1:])]
        if ks:
            spans.append(ks[-1].time_range.end - ks[0].time_range.start)
    print(f"# {a.case} ({a.impl}) {a.dtype} M {x.shape[0]}, {'graph replay' if a.graph else 'eager calls'}, L2 evicted by a {a.flush}"
          f"{f' after {a.load_s:g} s of load' if a.load_s else ''}: {len(calls)} calls, "
          f"{median([len(ks) for ks in calls]):.0f} kernels each")
    for name, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:<92} n={len(v):3d} median {median(v):8.1f} us")
    print(f"gap between consecutive kernels: median {median(gaps):.1f} us (n={len(gaps)}); "
          f"call span: median {median(spans):.1f} us")


if __name__ == "__main__":
    main()
