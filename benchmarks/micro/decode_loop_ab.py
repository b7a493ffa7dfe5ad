#!/usr/bin/env python3
"""Decode kernels or the general path in a loop over layers, eager and graphed? (session 56; a
probe, nothing here is used by the package.)

bench_decode.py's crossover times one MLP at a time two ways: `graph` (10 captured calls,
replayed) and `events` (do_bench: a 256 MB fill before every call, host launch included). In
session 55 on an H100 the two disagree at M 1-16: under graphs the decode kernels win (M 1: 125.0
against 133.4 us), under events the general path does (144.9 against 150.7). The dispatcher
follows the graph rows (DECODE_MAX_M). Which timing stands for a user's decode step?

Here, Llama-3-8B's MLP in bf16 with LAYERS distinct weight sets (a model's layers: nothing of
one layer's weights is in L2 when the next reads its own), for each M and each of
    decode   fused_mlp.decode.gated_mlp (the path the dispatcher takes at M <= DECODE_MAX_M)
    general  fused_mlp.gated_mlp with DECODE_MAX_M emptied (the path above it)
    eager    F.linear x3 + silu + mul
four timings, the implementations interleaved round by round:
    loop_eager   LAYERS x REPS calls issued back to back from Python, events around the loop
                 (host launch cost included where it exceeds the GPU's time; L2 never flushed)
    host_issue   the same loop's CPU time to issue the calls (perf_counter, before the sync)
    loop_graph   the LAYERS calls captured in one CUDA graph, replayed REPS times
    events_fill  do_bench of one call on layer 0 (as bench_decode.py's `events`)
Every output is checked against the float64 reference first.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/decode_loop_ab.py [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import call_order, graphed, local_package, median_us, rel_err, swiglu_eager, write_report  # noqa: E402
from bench_decode import GeneralPath  # noqa: E402

D, H = 4096, 14336
TOL = 2e-2  # bf16 output against float64 (bench_decode.py's bound)


def loop_args(doc: str, ms: str) -> argparse.Namespace:
    """The arguments this probe and micro/general_small_m.py share (M list default `ms`)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--ms", default=ms)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args()


def layer_weights(layers: int, gen: torch.Generator, dt: torch.dtype = torch.bfloat16) -> list:
    """`layers` sets of Llama-3-8B's MLP weights (gate, up, down; nn.Linear layout) on the GPU."""
    return [tuple((torch.randn(o, i, device="cuda", generator=gen) / i**0.5).to(dt)
                  for o, i in ((H, D), (H, D), (D, H))) for _ in range(layers)]


def main() -> None:
    args = loop_args(__doc__, "1,2,4,8,12,16,24,32")
    fm, dec = local_package("decode")
    general = GeneralPath(fm)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    W = layer_weights(args.layers, gen, dt)

    rows = []
    for m in (int(s) for s in args.ms.split(",")):
        x = torch.randn(m, D, device="cuda", generator=gen).to(dt)
        impls = {
            "decode": lambda i: dec.gated_mlp(x, *W[i], "silu"),
            "general": lambda i: general(x, *W[i]),
            "eager": lambda i: swiglu_eager(x, *W[i]),
        }
        ref = swiglu_eager(x.double(), *(w.double() for w in W[0]))
        errs = {n: rel_err(fn(0), ref) for n, fn in impls.items()}
        bad = {n: e for n, e in errs.items() if not e <= TOL}
        if bad:
            raise SystemExit(f"M {m}: outputs off the float64 reference: {bad}")

        # one graph per implementation: its calls on every layer's weights, in order
        replays = {n: graphed(lambda fn=fn: [fn(i) for i in range(args.layers)]) for n, fn in impls.items()}

        res = {n: {"loop_eager": [], "host_issue": [], "loop_graph": [], "events_fill": []} for n in impls}
        names = list(impls)
        for r in range(args.rounds):
            for n in call_order(names, r):
                fn, calls = impls[n], args.layers * args.reps
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    for i in range(args.layers):
                        fn(i)
                t1 = time.perf_counter()
                b.record()
                torch.cuda.synchronize()
                res[n]["loop_eager"].append(a.elapsed_time(b) * 1e3 / calls)
                res[n]["host_issue"].append((t1 - t0) * 1e6 / calls)
                replays[n]()
                a.record()
                for _ in range(args.reps):
                    replays[n]()
                b.record()
                torch.cuda.synchronize()
                res[n]["loop_graph"].append(a.elapsed_time(b) * 1e3 / calls)
                res[n]["events_fill"].append(median_us(lambda: fn(0), rep=100))
        row = {"m": m, "rel_err": errs}
        for n in names:
            row[n] = {k: statistics.median(v) for k, v in res[n].items()}
            row[n]["rounds"] = res[n]
        rows.append(row)
        print(f"M {m:3d}  " + "  ".join(
            f"{n}: loop {row[n]['loop_eager']:6.1f} (host {row[n]['host_issue']:5.1f}) graph {row[n]['loop_graph']:6.1f}"
            f" events {row[n]['events_fill']:6.1f}" for n in names), flush=True)
    write_report(args.out, rows, layers=args.layers, reps=args.reps, rounds=args.rounds, d=D, h=H)


if __name__ == "__main__":
    main()
