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
  bmm_S       (session 35) split-K by hand: one strided-batched GEMM over S K slices of h and
              W_down (views, no copies) with fp32 partial sums, then their sum cast to bf16;
              bmm_S_only is the batched GEMM alone (--bmm lists S; 7 makes every slice of a
              W_down row one 4 KB-aligned 4 KB run, 8 makes 3.5 KB runs)
  gate_linear F.linear(x, W_gate): cuBLAS on the same number of weight bytes (117 MB) in the gate
              GEMM's shape (whole 8 KB rows, K = 4096), for comparison
timed by events around replays, interleaved, with L2 evicted by a fill and by a read
(_common.interleaved_us); each form's result is checked against `linear`; the kernels each
form launches are listed from one profiled replay.

    python3 benchmarks/micro/down_layouts.py [--m 128] [--bmm 2,7,8] [--out F]
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


def split_k_forms(h: torch.Tensor, wd: torch.Tensor, parts: int):
    """(the batched GEMM alone, it with the reduction) for y = h W_down^T split into `parts` K
    slices: h [M, K] viewed as [parts, M, K/parts] and W_down [D, K] as [parts, K/parts, D], both
    views of the original storage (cuBLAS takes the row strides as leading dimensions)."""
    m, k = h.shape
    d = wd.shape[0]
    if k % parts:
        raise ValueError(f"--bmm: {parts} does not divide K = {k}")
    hb = h.view(m, parts, k // parts).transpose(0, 1)
    wb = wd.view(d, parts, k // parts).permute(1, 2, 0)

    def only():
        try:
            return torch.bmm(hb, wb, torch.float32)
        except RuntimeError as e:  # a torch without bmm's out_dtype on this GPU: say so, stop
            raise SystemExit(f"torch.bmm(..., out_dtype=torch.float32) failed: {e}") from e

    return only, lambda: only().sum(0).to(h.dtype)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="128", help="comma-separated token counts")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bmm", default="2,7,8", help="comma-separated split counts of the bmm forms")
    args = ap.parse_args()
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        x, wg, _, wd = swiglu_operands(m=m)
        h = torch.randn(m, wd.shape[1], device="cuda", dtype=torch.bfloat16)
        hT = h.t().contiguous()
        forms = {
            "linear": lambda: F.linear(h, wd),
            "linear_hT": lambda: F.linear(hT.t(), wd),
            "swap": lambda: torch.mm(wd, h.t()),
            "swap_hT": lambda: torch.mm(wd, hT),
            "swap_copy": lambda: torch.mm(wd, h.t()).t().contiguous(),
        }
        for parts in [int(v) for v in args.bmm.split(",") if v]:
            forms[f"bmm_{parts}_only"], forms[f"bmm_{parts}"] = split_k_forms(h, wd, parts)
        forms["gate_linear"] = lambda: F.linear(x, wg)
        ref = forms["linear"]().float()
        errs = {}
        for n, f in forms.items():
            y = f()
            if n.endswith("_only"):
                y = y.sum(0)
            elif n == "gate_linear":
                errs[n] = float("nan")
                continue
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
