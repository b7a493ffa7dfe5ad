#!/usr/bin/env python3
"""The few-token down GEMM as a 2-way batched split-K with a reduction of our own (session 35, an
experiment; nothing here is used by the package).

Session 35's first call (`results/down_layouts_h200_session35.*`) found that at SwiGLU M 128
cuBLAS's own down GEMM (its split-K kernel, then `splitKreduce_kernel`) and a strided-batched GEMM
over the two K halves of h and W_down with fp32 partial sums (torch.bmm(..., out_dtype=float32)
on views, no copies) run the same main kernel tile (128 x 64, 128 CTAs) in the same time: the
3.4 us between them is cuBLAS's reduce kernel. This script times what the op would run with the
batched form and a reduction kernel of ours (a Triton kernel: sum the partial sums, cast, store),
with and without a programmatic edge from the batched GEMM (launch_pdl; the reduction waits with
griddepcontrol.wait before its loads), alone and after our gate/up kernel:

  linear            F.linear(h, W_down): the op's down GEMM today
  bmm_only          the batched GEMM alone (fp32 partial sums into a buffer)
  bmm_sum_B         it, then the reduction with B elements a program
  bmm_sum_B_pdl     the same, the reduction launched with a programmatic edge
  op                fused_mlp.gated_mlp (our gate/up kernel, then F.linear)
  gu_bmm_sum_B[_pdl] our gate/up kernel, then the batched GEMM and the reduction

Each form is a CUDA graph, timed by events around replays, interleaved, with L2 evicted by a
256 MiB fill (the benchmarks' method) and by a read (_common.interleaved_us). Before timing, each
form's output is checked after a replay with its buffers poisoned (NaN) against F.linear's, and
both against an fp64 product.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/down_bmm_split.py [--m 128] [--out F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import graphed, interleaved_us, local_package, rel_err, swiglu_operands, write_report  # noqa: E402


@triton.jit
def _sum_parts(p_ptr, y_ptr, n, PARTS: tl.constexpr, BLOCK: tl.constexpr, WAIT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if WAIT:
        tl.extra.cuda.gdc_wait()  # the partial sums are the previous kernel's output
    acc = tl.load(p_ptr + offs, mask=mask)
    for i in tl.static_range(1, PARTS):
        acc += tl.load(p_ptr + i * n + offs, mask=mask)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def split_down(h: torch.Tensor, wd: torch.Tensor, block: int, pdl: bool, parts: int = 2):
    """(the batched GEMM alone, it with the reduction) writing into buffers made here; returns
    (only, full, buffers) with buffers = (partial sums, y) for the poison check."""
    m, k = h.shape
    d = wd.shape[0]
    hb = h.view(m, parts, k // parts).transpose(0, 1)
    wb = wd.view(d, parts, k // parts).permute(1, 2, 0)
    p = torch.empty(parts, m, d, device=h.device, dtype=torch.float32)
    y = torch.empty(m, d, device=h.device, dtype=h.dtype)
    n = m * d

    def only():
        torch.bmm(hb, wb, torch.float32, out=p)

    def full():
        only()
        _sum_parts[(triton.cdiv(n, block),)](p, y, n, PARTS=parts, BLOCK=block, WAIT=pdl, launch_pdl=pdl)
        return y

    return only, full, (p, y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="128", help="comma-separated token counts")
    ap.add_argument("--blocks", default="1024,4096")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    (fm,) = local_package()
    act = fm.activations.ACTIVATION_IDS["silu"]
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        x, wg, wu, wd = swiglu_operands(m=m)
        hbuf = torch.empty(m, wd.shape[1], device="cuda", dtype=torch.bfloat16)
        fm.ops.gated_gemm_sm90(hbuf, x, wg, wu, None, None, None, act, 0)
        h = hbuf.clone()  # the standalone forms' input: a real h, not hbuf (which gu_ forms rewrite)
        exact = (h.double() @ wd.double().t())
        ref = F.linear(h, wd)
        forms, checks = {"linear": lambda: F.linear(h, wd)}, {}
        only, _, (p_only, _) = split_down(h, wd, 1024, False)
        forms["bmm_only"] = only
        gu_forms = {}
        for block in [int(v) for v in args.blocks.split(",")]:
            for pdl in (False, True):
                name = f"bmm_sum_{block}" + ("_pdl" if pdl else "")
                _, full, bufs = split_down(h, wd, block, pdl)
                forms[name], checks[name] = full, bufs
                _, gfull, gbufs = split_down(hbuf, wd, block, pdl)

                def gu(gfull=gfull):
                    fm.ops.gated_gemm_sm90(hbuf, x, wg, wu, None, None, None, act, 0)
                    gfull()
                gu_forms["gu_" + name], checks["gu_" + name] = gu, gbufs
        forms["op"] = lambda: fm.gated_mlp(x, wg, wu, wd, "silu")
        forms.update(gu_forms)
        replays = {n: graphed(f) for n, f in forms.items()}
        errs = {"linear": rel_err(ref, exact)}
        for n, (p, y) in checks.items():
            p.fill_(float("nan"))
            y.fill_(float("nan"))
            replays[n]()
            torch.cuda.synchronize()
            errs[n] = rel_err(y, exact)
            same = torch.equal(y, checks[n.replace("_pdl", "")][1]) if n.endswith("_pdl") else None
            print(f"[check] m {m} {n:22s} rel err vs fp64 {errs[n]:.2e} (linear {errs['linear']:.2e})"
                  + ("" if same is None else f"  bitwise equal to the form without the edge: {same}"), flush=True)
            if not torch.isfinite(y).all() or errs[n] > 4 * errs["linear"] + 1e-3:
                raise SystemExit(f"{n}: wrong output (rel err {errs[n]:.2e})")
        for mode in ("fill", "read"):
            for n, (us, rounds) in interleaved_us(replays, mode, args.reps, args.rounds).items():
                rows.append({"m": m, "eviction": mode, "form": n, "us": us, "rounds_us": rounds,
                             "rel_err_vs_fp64": errs.get(n)})
                print(f"[split] m {m} {mode:4s} {n:24s} {us:7.1f} us  rounds " + " ".join(f"{t:.1f}" for t in rounds),
                      flush=True)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
