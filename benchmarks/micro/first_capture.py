#!/usr/bin/env python3
"""Is fused-mlp's first CUDA graph in a process faster than the ones captured after it? In
session 38 the first graph of a process timed 0.5-1.4 us faster at SwiGLU M 128 than later ones
(bench_mlp's first case against its second; placement_m128.py's first trial against the rest).
This captures the op three times (G0 first, G1 again on the same operands, G2 on operands
allocated anew), plus eager and torch.compile, times all interleaved call by call with L2
evicted by a fill (_common.interleaved_us), and lists the kernels of one replay of each of the
op's graphs (name, grid, block, median duration over 20 replays) from a torch.profiler trace.
Its answer (session 38, call 4): not the capture (G0 = G1) but the allocation (G2 slower, in the
gate/up kernel).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/first_capture.py [--m 128] [--dtype bf16] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, graphed, interleaved_us, l2_evictor, local_package, swiglu_eager as eager, swiglu_operands, trace_events, write_report  # noqa: E402


def kernels_of(replay, evict, replays: int = 20) -> list:
    """[(name, grid, block, median us)] of the kernels one replay runs, in launch order."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            evict()
            replay()
        torch.cuda.synchronize()
    evs = [e for e in trace_events(prof) if "fill" not in e["name"].lower() and "FillFunctor" not in e["name"]]
    per = len(evs) // replays
    out = []
    for k in range(per):
        group = evs[k::per]
        e = group[0]
        out.append((e["name"][:90], str(e["args"].get("grid")), str(e["args"].get("block")),
                    statistics.median(g["dur"] for g in group)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fm, = local_package()
    compiled = torch.compile(eager, dynamic=False)
    dt = DTYPES[args.dtype]
    torch.manual_seed(1000)
    a = swiglu_operands(m=args.m, dtype=dt)
    torch.manual_seed(1000)
    b = swiglu_operands(m=args.m, dtype=dt)
    outs = {}

    def op(name, ops):
        return lambda: outs.__setitem__(name, fm.gated_mlp(*ops, "silu"))

    graphs = {}
    with torch.inference_mode():
        graphs["ours_G0"] = graphed(op("ours_G0", a))
        graphs["ours_G1"] = graphed(op("ours_G1", a))
        graphs["ours_G2"] = graphed(op("ours_G2", b))
        graphs["eager"] = graphed(lambda: outs.__setitem__("eager", eager(*a)))
        graphs["compile"] = graphed(lambda: outs.__setitem__("compile", compiled(*a)))
        for g in graphs.values():
            g()
        torch.cuda.synchronize()
        diffs = {n: (outs[n].float() - outs["ours_G0"].float()).abs().max().item() for n in outs}
        times = interleaved_us(graphs, reps=args.reps, rounds=args.rounds)
        evict = l2_evictor("fill")
        listing = {n: kernels_of(graphs[n], evict) for n in ("ours_G0", "ours_G1", "ours_G2")}
    rows = []
    for n, (us, per_round) in times.items():
        rows.append({"graph": n, "us": us, "rounds_us": per_round, "max_abs_diff_to_G0": diffs[n],
                     "kernels": listing.get(n)})
        print(f"[first-capture] {args.dtype} m {args.m} {n:>8s}: {us:7.2f} us (rounds "
              + " ".join(f"{t:.2f}" for t in per_round) + f"), max |diff| to G0 {diffs[n]:.1e}", flush=True)
    for n, ks in listing.items():
        print(f"[first-capture] {n} kernels:")
        for name, grid, block, us in ks:
            print(f"    {us:7.2f} us  grid {grid:>16s} block {block:>14s}  {name}")
    write_report(args.out, rows, m=args.m, dtype=args.dtype)


if __name__ == "__main__":
    main()
