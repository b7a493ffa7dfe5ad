#!/usr/bin/env python3
"""Does where the operands lie in GPU memory move the SwiGLU M 128 times? bench_mlp's second case
of a process read ours ~1.4 us slower and torch.compile ~1.1 us faster than the same case run
first, with the same input values and a 20 s pause between (NOTES, session 38). This script
allocates the operands again and again in other ways, graphs fused-mlp, eager and torch.compile
on each placement and times them interleaved call by call, L2 evicted by a fill before each call
(_common.interleaved_us). The same values every time. Layouts (--layouts, in order):
  fresh       the allocator's cache emptied first: each operand in a segment of its own
  padN        fresh, behind a pad of N MiB kept alive (other addresses)
  carvedN     a block of N MiB allocated and freed first, so the operands are carved out of
              one cached segment (as bench_mlp's first case carves them from the ceilings' buffers)

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/placement_m128.py \
        [--m 128] [--dtype bf16] [--layouts fresh,carved1024,pad62,...] [--passes 2] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, graphed, interleaved_us, local_package, swiglu_eager as eager, swiglu_operands, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--layouts", default="fresh,carved1024,pad62,carved1024,fresh,carved1024")
    ap.add_argument("--passes", type=int, default=2, help="times the whole list of layouts is run")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fm, = local_package()
    compiled = torch.compile(eager, dynamic=False)
    layouts = args.layouts.split(",")
    rows = []
    for p in range(args.passes):
        for layout in layouts:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            pad = None
            if layout.startswith("pad"):
                pad = torch.empty(int(layout[3:]) << 20, dtype=torch.uint8, device="cuda")
            elif layout.startswith("carved"):
                block = torch.empty(int(layout[6:]) << 20, dtype=torch.uint8, device="cuda")
                del block  # back to the allocator's cache, not to the driver
            elif layout != "fresh":
                raise SystemExit(f"unknown layout {layout!r}")
            torch.manual_seed(1000)
            x, wg, wu, wd = swiglu_operands(m=args.m, dtype=DTYPES[args.dtype])
            out = {}
            impls = {"ours": lambda: out.__setitem__("ours", fm.gated_mlp(x, wg, wu, wd, "silu")),
                     "eager": lambda: out.__setitem__("eager", eager(x, wg, wu, wd)),
                     "compile": lambda: out.__setitem__("compile", compiled(x, wg, wu, wd))}
            with torch.inference_mode():
                graphs = {n: graphed(f) for n, f in impls.items()}
                for g in graphs.values():
                    g()
                torch.cuda.synchronize()
                err = (out["ours"].float() - out["eager"].float()).abs().max().item()
                times = interleaved_us(graphs, reps=args.reps, rounds=args.rounds)
            ptrs = {n: t.data_ptr() for n, t in (("x", x), ("wg", wg), ("wu", wu), ("wd", wd))}
            seg = {n: next((sg["address"] for sg in torch.cuda.memory_snapshot()
                            if sg["address"] <= v < sg["address"] + sg["total_size"]), None) for n, v in ptrs.items()}
            row = {"pass": p, "layout": layout, "segments": {n: hex(v) if v else None for n, v in seg.items()}, **{f"{n}_us": times[n][0] for n in graphs},
                   **{f"{n}_rounds_us": times[n][1] for n in graphs},
                   "ptrs": {n: hex(v) for n, v in ptrs.items()}, "max_abs_diff_ours_eager": err}
            rows.append(row)
            print(f"[placement] pass {p} {layout:>10s}: ours {row['ours_us']:7.2f}  eager {row['eager_us']:7.2f}  "
                  f"compile {row['compile_us']:7.2f}  ours/compile {row['ours_us'] / row['compile_us']:.4f}  "
                  f"wg {row['ptrs']['wg']} wd {row['ptrs']['wd']}; segments of x wg wu wd: "
                  f"{len(set(seg.values()))}", flush=True)
            del graphs, impls, out, x, wg, wu, wd, pad
    for layout in dict.fromkeys(layouts):
        for n in ("ours", "eager", "compile"):
            v = [r[f"{n}_us"] for r in rows if r["layout"] == layout]
            print(f"[placement] {layout:>10s} {n:>7s}: min {min(v):.2f} median {statistics.median(v):.2f} "
                  f"max {max(v):.2f} us (n={len(v)})")
    write_report(args.out, rows, m=args.m, dtype=args.dtype)


if __name__ == "__main__":
    main()
