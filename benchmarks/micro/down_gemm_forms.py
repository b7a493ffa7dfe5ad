#!/usr/bin/env python3
"""cuBLAS on the MLP's second GEMM at few tokens, y = h @ W^T (h [M, H], W [D, H], nn.Linear
layout), in forms that give cuBLAS different problem shapes: F.linear as the MLP runs it
(cuBLAS's m = D, n = M), the transposed product W @ h^T (m = M, n = D) with and without
the copy back to [M, D], split-K as one strided-batched GEMM with fp32 partials and their sum
(s = 2, 4, 7 parts of K), F.linear with a bias and with a zero bias (torch then calls
cuBLASLt with its bias epilogue, a different kernel choice), and, for reference only,
against a [H, D] copy of the weight.

    python benchmarks/micro/down_gemm_forms.py [--m 128,512] [--shapes 4096x14336] [--forms SUBSTR,...] [--out FILE]

Timing: triton.testing.do_bench, median, L2 flushed between runs; each form is checked
against float64 first."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import median_us, rel_err, write_report  # noqa: E402


def split_k(h: torch.Tensor, w: torch.Tensor, s: int) -> torch.Tensor:
    """h @ w^T with K split in s parts: one strided-batched cuBLAS GEMM writing s fp32 partial
    products (views of h and w, no copies), then their sum rounded once to h's dtype."""
    m, k = h.shape
    kc = k // s
    parts = torch.bmm(h.view(m, s, kc).transpose(0, 1), w.view(-1, s, kc).permute(1, 2, 0), out_dtype=torch.float32)
    return parts.sum(0).to(h.dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="128,512", help="comma-separated token counts")
    ap.add_argument("--shapes", default="4096x14336", help="comma-separated DxH (model dim x hidden)")
    ap.add_argument("--forms", default=None, help="comma-separated substrings of the form names to time")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        for d, h in shapes:
            g = torch.Generator(device="cuda").manual_seed(m)
            x = torch.randn(m, h, device="cuda", dtype=torch.bfloat16, generator=g)
            w = torch.randn(d, h, device="cuda", dtype=torch.bfloat16, generator=g) * h**-0.5
            b = torch.randn(d, device="cuda", dtype=torch.bfloat16, generator=g)
            zeros = torch.zeros(d, device="cuda", dtype=torch.bfloat16)
            want = x.double() @ w.double().t()
            w_kn = w.t().contiguous()
            forms = {
                "F.linear(h, W)": lambda: F.linear(x, w),
                **{f"split-K {s} (bmm, fp32 partials) + sum": (lambda s=s: split_k(x, w, s)) for s in (2, 4, 7)},
                "F.linear(h, W, b)": lambda: F.linear(x, w, b),
                "F.linear(h, W, zeros)": lambda: F.linear(x, w, zeros),
                "mm(W, h^T) (transposed result)": lambda: torch.mm(w, x.t()),
                "mm(W, h^T).t().contiguous()": lambda: torch.mm(w, x.t()).t().contiguous(),
                "mm(h, W_kn) (weight copy, reference only)": lambda: torch.mm(x, w_kn),
            }
            for name, fn in forms.items():
                if args.forms and not any(f in name for f in args.forms.split(",")):
                    continue
                y = fn()
                y = y.t() if "transposed result" in name else y
                if name == "F.linear(h, W, b)":
                    y = y - b
                err = rel_err(y, want)
                us = median_us(fn)
                rows.append({"m": m, "d": d, "h": h, "form": name, "us": us, "rel_err": err})
                print(f"[down] m={m} {d}x{h} {name:<42} {us:7.1f} us  err {err:.1e}", flush=True)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
