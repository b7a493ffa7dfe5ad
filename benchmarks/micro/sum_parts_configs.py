#!/usr/bin/env python3
"""The split down projection's reduction kernel (triton_gemm._sum_parts_kernel) in other launch
shapes: elements per program (_SUM_BLOCK) and warps (_SUM_WARPS), A/B on the whole SwiGLU op at
few tokens as a CUDA graph (the split forced with FUSED_MLP_DOWN_SPLIT=2, as the default takes it
in graphs at M 128), timed interleaved call by call with L2 evicted by a fill before each call
(_common.interleaved_us), and the reduction kernel's own median duration from torch.profiler.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/sum_parts_configs.py \
        [--m 128] [--dtype bf16] [--configs 1024x4,2048x8,...] [--out F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, graphed, interleaved_us, local_package, swiglu_operands, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--configs", default="1024x4,512x4,1024x8,2048x4,2048x8,4096x8",
                    help="BLOCKxWARPS, the first one the reference of the ratios")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["FUSED_MLP_DOWN_SPLIT"] = "2"
    fm, tg = local_package("triton_gemm")
    x, wg, wu, wd = swiglu_operands(m=args.m, dtype=DTYPES[args.dtype])
    ref = fm.gated_mlp(x, wg, wu, wd, "silu").clone()
    configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    graphs, kernel_us, diffs = {}, {}, {}
    for block, warps in configs:
        name = f"{block}x{warps}"
        tg._SUM_BLOCK, tg._SUM_WARPS = block, warps
        tg._SUM_RUNNERS.clear()  # its launchers hold the compiled kernel of the previous shape
        out = {}
        graphs[name] = graphed(lambda out=out: out.__setitem__("y", fm.gated_mlp(x, wg, wu, wd, "silu")))
        graphs[name]()
        torch.cuda.synchronize()
        diffs[name] = (out["y"].float() - ref.float()).abs().max().item()
        if diffs[name] != 0.0:  # each element sums the same parts in the same order whatever the shape
            raise SystemExit(f"{name}: the graphed op differs from the eager one by {diffs[name]:.2e}")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                graphs[name]()
            torch.cuda.synchronize()
        kernel_us[name] = statistics.median(e.time_range.end - e.time_range.start for e in prof.events()
                                            if e.device_type.name == "CUDA" and "sum_parts" in e.name)
    times = interleaved_us(graphs, reps=60, rounds=3)
    base = times[f"{configs[0][0]}x{configs[0][1]}"][0]
    rows = []
    for name, (us, per_round) in times.items():
        rows.append({"config": name, "call_us": us, "rounds_us": per_round, "sum_kernel_us": kernel_us[name],
                     "max_abs_diff_to_eager": diffs[name]})
        print(f"[sum-parts] {args.dtype} m {args.m} {name:>8s}: call {us:7.2f} us ({us / base:.4f}; rounds "
              + " ".join(f"{t:.2f}" for t in per_round) + f"), reduction kernel {kernel_us[name]:.2f} us, "
              f"max |diff| to the first eager output {diffs[name]:.1e}", flush=True)
    write_report(args.out, rows, m=args.m, dtype=args.dtype)


if __name__ == "__main__":
    main()
