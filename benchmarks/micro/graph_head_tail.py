#!/usr/bin/env python3
"""Where the time of a timed graph call goes outside its kernels. bench_mlp times a graph replay
between two events after an L2 flush (a fill); at SwiGLU M 128 our call reads ~107 us there
while its kernels span ~103 us (session 37's profile), eager's ~122 against a ~120 us span.
This times fused-mlp, eager and torch.compile as bench_mlp's alternating loop does (fill, event,
replay, event), under torch.profiler, and splits each call's event time into the head (fill's
end to the first kernel's start), the kernels' span, and the rest (last kernel's end to the end
event). Medians over the calls; the same operands for all.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/graph_head_tail.py [--m 128] [--dtype bf16] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_mlp  # noqa: E402
from _common import DTYPES, call_order, graphed, local_package, swiglu_eager as eager, swiglu_operands, trace_events, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fm, = local_package()
    compiled = torch.compile(eager, dynamic=False)
    torch.manual_seed(1000)
    ops = swiglu_operands(m=args.m, dtype=DTYPES[args.dtype])
    outs = {}
    with torch.inference_mode():
        graphs = {"ours": graphed(lambda: outs.__setitem__("ours", fm.gated_mlp(*ops, "silu"))),
                  "eager": graphed(lambda: outs.__setitem__("eager", eager(*ops))),
                  "compile": graphed(lambda: outs.__setitem__("compile", compiled(*ops)))}
    flush = bench_mlp._flush_buffer()  # the buffer bench_mlp's alternating loop zeroes
    names = list(graphs)
    order, events = [], []
    for g in graphs.values():  # warm
        g()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for c in range(args.cycles):
            for n in call_order(names, c):
                flush.zero_()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                graphs[n]()
                e.record()
                order.append(n)
                events.append((s, e))
        torch.cuda.synchronize()
    gpu = trace_events(prof, ("kernel", "gpu_memset", "gpu_memcpy"))
    # each call: a flush (the memset or fill that zero_ launches), then the call's own GPU work
    is_flush = [("fill" in e["name"].lower() or e.get("cat") == "gpu_memset") and e["dur"] > 30 for e in gpu]
    starts = [i for i, f in enumerate(is_flush) if f]
    if len(starts) != len(order):
        raise SystemExit(f"found {len(starts)} flushes for {len(order)} calls")
    per = {n: {"event": [], "head": [], "span": [], "tail": [], "kernels": []} for n in names}
    for j, (n, (s, e)) in enumerate(zip(order, events)):
        i0 = starts[j]
        i1 = starts[j + 1] if j + 1 < len(starts) else len(gpu)
        fl, work = gpu[i0], gpu[i0 + 1:i1]
        ev = s.elapsed_time(e) * 1e3
        head = work[0]["ts"] - (fl["ts"] + fl["dur"])
        span = work[-1]["ts"] + work[-1]["dur"] - work[0]["ts"]
        r = per[n]
        r["event"].append(ev)
        r["head"].append(head)
        r["span"].append(span)
        r["tail"].append(ev - head - span)
        r["kernels"].append(len(work))
    rows = []
    for n, r in per.items():
        row = {"impl": n, **{f"{k}_us": statistics.median(v) for k, v in r.items() if k != "kernels"},
               "gpu_ops_per_call": statistics.median(r["kernels"]),
               "names": [w["name"][:80] for w in gpu[starts[order.index(n)] + 1:starts[order.index(n) + 1]]]}
        rows.append(row)
        print(f"[head-tail] {args.dtype} m {args.m} {n:>8s}: event {row['event_us']:7.2f} = head {row['head_us']:5.2f} "
              f"+ span {row['span_us']:7.2f} + rest {row['tail_us']:5.2f} us ({row['gpu_ops_per_call']} GPU ops a call)",
              flush=True)
        for nm in row["names"]:
            print(f"      {nm}")
    write_report(args.out, rows, m=args.m, dtype=args.dtype)


if __name__ == "__main__":
    main()
