#!/usr/bin/env python3
"""Where the general path's time goes at few tokens (session 77; a probe, nothing here is used
by the package).

Session 77's bench_decode.py on an H200 timed the general path (fused_mlp.gated_mlp with the
decode kernels switched off) of Llama-3-8B's MLP at 113-116 us per call at M 1-16 under CUDA
graphs, but at 102-103 us at M 64-96: more tokens, less time, while the weights (the floor,
~83 us) are the same bytes at every M. On the H100 the same sweep is flat (~131 us). This
splits the general path into its two stages at each M, each captured alone in a CUDA graph
over LAYERS distinct weight sets (nothing of one set is in L2 when the next is read):
    gate_up      triton_gemm.gated_linear (on sm_90 the warp-specialized CUDA kernel)
    down         triton_gemm.down_linear as the general path runs it under capture (the form
                 its timing rule chose: F.linear, a split or the one-kernel form)
    down_linear  F.linear alone (cuBLAS)
    down_form<F> each other form down_linear may take for this shape (triton_gemm's form codes:
                 2 / 4 the K splits, 0 the one-kernel form; down_forms_allowed), so that one run
                 shows which form each M bucket should take
    general      the whole general path
    decode       fused_mlp.decode.gated_mlp (where M <= decode.MAX_M)
all interleaved round by round (call_order), each the median over rounds of events around
REPS replays. Also prints the down form chosen at each M, and at the end what the timing rule
measured per M bucket (down_stream.down_choice_report). Every whole-MLP output is checked
against the float64 reference first.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/general_small_m.py [--out F]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import graphed, local_package, rel_err, replay_rounds_us, swiglu_eager, write_report  # noqa: E402
from bench_decode import GeneralPath  # noqa: E402
from decode_loop_ab import D, H, TOL, layer_weights, loop_args  # noqa: E402
from down_stream import down_choice_report  # noqa: E402


def main() -> None:
    args = loop_args(__doc__, "1,8,16,32,64,128")
    fm, tg, dec = local_package("triton_gemm", "decode")
    general = GeneralPath(fm)
    act = fm.activations.ACTIVATION_IDS["silu"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    W = layer_weights(args.layers, gen, dt)
    floor_bytes = sum(w.numel() * w.element_size() for w in W[0])

    rows = []
    for m in (int(s) for s in args.ms.split(",")):
        x = torch.randn(m, D, device="cuda", generator=gen).to(dt)
        hs = [torch.randn(m, H, device="cuda", generator=gen).to(dt) for _ in range(args.layers)]
        impls = {
            "gate_up": lambda i: tg.gated_linear(x, W[i][0], W[i][1], None, None, act),
            "down": lambda i: tg.down_linear(hs[i], W[i][2], None),
            "down_linear": lambda i: F.linear(hs[i], W[i][2]),
            "general": lambda i: general(x, *W[i]),
        }
        for f in tg.down_forms_allowed(hs[0], W[0][2], None):
            impls[f"down_form{f}"] = lambda i, f=f: tg._down_form(hs[i], W[i][2], None, f)
        if m <= dec.MAX_M:
            impls["decode"] = lambda i: dec.gated_mlp(x, *W[i], "silu")
        ref = swiglu_eager(x.double(), *(w.double() for w in W[0]))
        errs = {n: rel_err(impls[n](0), ref) for n in ("general", "decode") if n in impls}
        bad = {n: e for n, e in errs.items() if not e <= TOL}
        if bad:
            raise SystemExit(f"M {m}: outputs off the float64 reference: {bad}")
        replays = {n: graphed(lambda fn=fn: [fn(i) for i in range(args.layers)]) for n, fn in impls.items()}
        # the down form the timing rule picked for this shape (1: F.linear, else a split count or
        # the one-kernel form): down_parts in its "auto" mode answers as a capture does, from the
        # choice the warm-up's first eager call timed and cached
        with mock.patch.dict(os.environ, {"FUSED_MLP_DOWN_SPLIT": "auto"}):
            form = tg.down_parts(hs[0], W[0][2], None)
        row = {"m": m, "rel_err": errs, "down_form": form,
               **replay_rounds_us(replays, args.rounds, args.reps, args.layers)}
        rows.append(row)
        print(f"M {m:4d}  down form {form!s:>4}  " + "  ".join(f"{n} {row[n]['us']:6.1f}" for n in impls), flush=True)
    write_report(args.out, rows, layers=args.layers, reps=args.reps, rounds=args.rounds, d=D, h=H,
                 weight_bytes=floor_bytes, down_choice=down_choice_report(tg))


if __name__ == "__main__":
    main()
