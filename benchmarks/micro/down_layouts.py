#!/usr/bin/env python3
"""The few-token down GEMM in the layouts cuBLAS could be handed (session 34, an experiment).

At SwiGLU M 128 the down projection y = h W_down^T (h [M, 14336], W_down [4096, 14336]) is
cuBLAS's split-K GEMM with its reduce kernel, ~37 us for 117 MB of weight. cuBLAS picks its kernel
from the operands' layouts; session 29 surveyed its algorithms for this one layout only. Here the
same product in the others (all without copies of W_down), each a CUDA graph:
  linear      F.linear(h, W_down): what the op runs (y [M, D])
  linear_hT   F.linear(hT.t(), W_down), h stored transposed (hT [14336, M]): the gate/up kernel
              could write h that way
  swap        y^T = W_down @ h^T, h row-major read as the column-major B operand (y^T [D, M])
  swap_hT     y^T = W_down @ hT
  swap_copy   swap, then y = y^T.t().contiguous() (what the op would have to return)
timed by events around replays, interleaved, with L2 evicted by a fill and by a read
(_common.interleaved_us); each form's result is checked against `linear`; the kernels each
form launches are listed from one profiled replay.

    python3 benchmarks/micro/down_layouts.py [--m 128] [--out F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import graphed, interleaved_us, rel_err, swiglu_operands, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="128", help="comma-separated token counts")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        _, _, _, wd = swiglu_operands(m=m)
        h = torch.randn(m, wd.shape[1], device="cuda", dtype=torch.bfloat16)
        hT = h.t().contiguous()
        forms = {
            "linear": lambda: F.linear(h, wd),
            "linear_hT": lambda: F.linear(hT.t(), wd),
            "swap": lambda: torch.mm(wd, h.t()),
            "swap_hT": lambda: torch.mm(wd, hT),
            "swap_copy": lambda: torch.mm(wd, h.t()).t().contiguous(),
        }
        ref = forms["linear"]().float()
        errs = {}
        for n, f in forms.items():
            y = f()
            errs[n] = rel_err(y.t() if n in ("swap", "swap_hT") else y, ref)
        replays = {n: graphed(f) for n, f in forms.items()}
        kernels = {}
        for n, r in replays.items():
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                r()
                torch.cuda.synchronize()
            kernels[n] = [e.name[:80] for e in sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                                                       key=lambda e: e.time_range.start)]
        for mode in ("fill", "read"):
            for n, (us, rounds) in interleaved_us(replays, mode, args.reps, args.rounds).items():
                rows.append({"m": m, "eviction": mode, "form": n, "us": us, "rounds_us": rounds,
                             "rel_err_vs_linear": errs[n], "kernels": kernels[n]})
                print(f"[down] m {m} {mode:4s} {n:10s} {us:7.1f} us  rounds "
                      + " ".join(f"{t:.1f}" for t in rounds) + f"  err {errs[n]:.1e}  {' | '.join(kernels[n])}",
                      flush=True)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
