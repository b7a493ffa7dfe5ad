#!/usr/bin/env python3
"""Does running the MLP in row chunks, with each chunk's second GEMM on a side stream while
the next chunk's first GEMM runs, fill the tail waves of the two GEMMs?

    python benchmarks/micro/overlap_chunks.py [--out FILE]

At d768, M = 8192 the fused gate/up kernel is 1536 tiles of 128 x 128 on 132 SMs (11.6
waves: the last one 64% full) and cuBLAS's down GEMM a few hundred tiles (1-2 waves): each
leaves SMs idle at its end. Variants, each checked against the one-piece result:
    one            first GEMM over all rows, then the second (what the package runs)
    chunks=C seq   C row chunks one after the other on one stream (the cost of splitting)
    chunks=C 2s    C row chunks; chunk i's second GEMM on a side stream, overlapping chunk
                   i+1's first GEMM (an event per chunk; joined at the end)
Cases: the gated MLP (our fused gate/up kernel, cuBLAS down) and the plain MLP (cuBLASLt's
bias + gelu_tanh epilogue, cuBLAS addmm). Timing: triton.testing.do_bench (events, L2
flushed) and a CUDA-graph replay of the same call, medians."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import graphed, local_package, median_us, rel_err, write_report  # noqa: E402

# name -> (gated, M, D, H, activation)
CASES = {
    "geglu_m8192_d768_h3072": (True, 8192, 768, 3072, "gelu_tanh"),
    "mlp_gelu_tanh_m8192_d768_h3072": (False, 8192, 768, 3072, "gelu_tanh"),
    "swiglu_m4096_d4096_h14336": (True, 4096, 4096, 14336, "silu"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    _, tg, activations = local_package("triton_gemm", "activations")
    ids = activations.ACTIVATION_IDS
    rows = []
    side = torch.cuda.Stream()
    for name, (gated, m, d, hdim, act) in CASES.items():
        g = torch.Generator(device="cuda").manual_seed(m + d)
        dt = torch.bfloat16
        x = torch.randn(m, d, device="cuda", dtype=dt, generator=g)
        w1 = torch.randn(hdim, d, device="cuda", dtype=dt, generator=g) * d**-0.5
        wu = torch.randn(hdim, d, device="cuda", dtype=dt, generator=g) * d**-0.5
        w2 = torch.randn(d, hdim, device="cuda", dtype=dt, generator=g) * hdim**-0.5
        b1 = torch.randn(hdim, device="cuda", dtype=dt, generator=g) * 0.5
        b2 = torch.randn(d, device="cuda", dtype=dt, generator=g) * 0.5
        aid = ids[act]
        h = torch.empty(m, hdim, device="cuda", dtype=dt)
        y = torch.empty(m, d, device="cuda", dtype=dt)

        def first(rows_):
            if gated:
                tg.gated_linear(x[rows_], w1, wu, None, None, aid, out=h[rows_])
            else:
                torch._addmm_activation(b1, x[rows_], w1.t(), use_gelu=True, out=h[rows_])

        def second(rows_):
            if gated:
                torch.mm(h[rows_], w2.t(), out=y[rows_])
            else:
                torch.addmm(b2, h[rows_], w2.t(), out=y[rows_])

        def one():
            first(slice(None))
            second(slice(None))

        def chunked(c: int, two_streams: bool):
            bounds = [(m * i // c, m * (i + 1) // c) for i in range(c)]

            def fn():
                main_s = torch.cuda.current_stream()
                if two_streams:
                    side.wait_stream(main_s)
                for a, b in bounds:
                    first(slice(a, b))
                    if two_streams:
                        ev = torch.cuda.Event()
                        ev.record(main_s)
                        side.wait_event(ev)
                        with torch.cuda.stream(side):
                            second(slice(a, b))
                    else:
                        second(slice(a, b))
                if two_streams:
                    main_s.wait_stream(side)
            return fn

        one()
        torch.cuda.synchronize()
        want = y.clone()
        variants = {"one": one}
        for c in (2, 3, 4):
            variants[f"chunks={c} seq"] = chunked(c, False)
            variants[f"chunks={c} 2s"] = chunked(c, True)
        for vname, fn in variants.items():
            y.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = rel_err(y, want)
            ev = median_us(fn)
            gr = median_us(graphed(fn))
            row = {"case": name, "variant": vname, "events_us": ev, "graph_us": gr, "rel_err_vs_one": err}
            rows.append(row)
            print(f"[overlap] {name:<32} {vname:<14} events {ev:8.1f} us  graph {gr:8.1f} us  err {err:.1e}",
                  flush=True)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
