#!/usr/bin/env python3
"""Why is the op captured in the default mode slower than the op captured with the one-kernel
down GEMM forced? (session 52; a probe, nothing here is used by the package.)

Session 52's run of down_stream.py (SwiGLU M 128, bf16, H200): the default mode's timed choice
took the one-kernel form (form 0: 35.8 us against the split's 38.1), yet the op captured in the
default mode ("op") replayed at 102.5 / 109.0 us (read / fill eviction) against 101.8 / 107.8 for
the op captured with FUSED_MLP_DOWN_SPLIT=kernel ("op_kernel"). Both graphs should hold the same
two kernels. Here, in one process:

  default_a, default_b   fused_mlp.gated_mlp captured in the default mode, twice (two graphs,
                         two memory pools: h and the output at other addresses)
  kernel_a, kernel_b     the same with FUSED_MLP_DOWN_SPLIT=kernel set around the capture
  split2_a               with FUSED_MLP_DOWN_SPLIT=2

First each graph's kernels (name, grid, block, duration) from one profiled replay, and whether
the outputs are the same bits; then the graphs' replays interleaved under both evictions
(_common.interleaved_us), in the order given and reversed (a form's place in the rotation).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/op_mode_ab.py [--out F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import (graphed, interleaved_us, local_package, swiglu_operands, trace_events,  # noqa: E402
                     with_env, write_report)
from down_stream import down_choice_report  # noqa: E402  (this folder is the script's sys.path[0])


def capture(fn):
    """_common.graphed's graph of one call of fn; returns (replay, the captured call's output)."""
    box = {}
    replay = graphed(lambda: box.__setitem__("y", fn()))  # the capture is the last call: its output stays
    return replay, box["y"]


def kernels_of(replay) -> list:
    """(name, grid, block, us) of each kernel one replay runs, from the profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    return [(e["name"][:90], e.get("args", {}).get("grid"), e.get("args", {}).get("block"), e.get("dur"))
            for e in trace_events(prof)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    fm, tg = local_package("triton_gemm")
    x, wg, wu, wd = swiglu_operands(m=128)

    def op():
        return fm.gated_mlp(x, wg, wu, wd, "silu")

    names = {"default_a": op, "kernel_a": with_env(op, "FUSED_MLP_DOWN_SPLIT", "kernel"),
             "split2_a": with_env(op, "FUSED_MLP_DOWN_SPLIT", "2"), "default_b": op,
             "kernel_b": with_env(op, "FUSED_MLP_DOWN_SPLIT", "kernel")}
    graphs, outs = {}, {}
    for name, fn in names.items():
        graphs[name], outs[name] = capture(fn)
    down_choice = down_choice_report(tg)  # the timed choice the default-mode captures took
    # A capture only records its kernels: every output holds what the pool had until its graph
    # replays, so all graphs replay before any output is compared (session 53's H100 run compared
    # default_a with kernel_a before kernel_a had replayed, and read "False").
    for replay in graphs.values():
        replay()
    torch.cuda.synchronize()
    kernels = {}
    for name, replay in graphs.items():
        same = torch.equal(outs[name], outs["kernel_a"])
        kernels[name] = kernels_of(replay)
        print(f"[kernels] {name}: same bits as kernel_a {same}", flush=True)
        for k in kernels[name]:
            print(f"[kernels]   {k[3]} us grid {k[1]} block {k[2]} {k[0]}", flush=True)
    rows = []
    for order in ("given", "reversed"):
        fns = dict(graphs) if order == "given" else dict(reversed(list(graphs.items())))
        for ev in ("fill", "read"):
            for name, (us, rounds) in interleaved_us(fns, ev, args.reps, args.rounds).items():
                rows.append({"order": order, "eviction": ev, "form": name, "us": us, "rounds_us": rounds})
                print(f"[time] {order:8s} {ev:4s} {name:10s} {us:7.1f} us  rounds "
                      + " ".join(f"{t:.1f}" for t in rounds), flush=True)
    write_report(args.out, rows, kernels=kernels, down_choice=down_choice)


if __name__ == "__main__":
    main()
