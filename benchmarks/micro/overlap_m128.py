#!/usr/bin/env python3
"""Few-token SwiGLU forward with the down projection overlapped (session 29, an experiment): the
hidden dimension is cut into chunks; the gate/up kernel runs chunk after chunk on the caller's
stream, and the down GEMM of chunk i (h_i W_down[:, chunk i]^T, summed into y) runs on a side
stream as soon as chunk i of h is written, beside the gate/up kernel of chunk i + 1. Both are
weight streams (at M 128 the MLP moves 352 MB of weights); the question is whether running them
side by side keeps the DRAM busier than one after the other (cuBLAS's split-K down GEMM streams
at ~3.1 TB/s against our gate/up kernel's ~3.5, NOTES sessions 17 and 29).

Every form is captured as a CUDA graph (the side stream forks from and joins the capturing
stream) and timed by replay (triton do_bench, L2 flushed), alternating forms for --rounds rounds;
each form's output is compared with the op's (relative max difference; the sums' order and
roundings differ, so not bit-identical).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/overlap_m128.py [--out F] [--m 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import graphed, local_package, median_us, write_report  # noqa: E402


def chunks_of(h: int, parts: list[float], step: int = 112) -> list[tuple[int, int]]:
    """[c0, c1) column ranges of the hidden dimension in the given proportions, multiples of step."""
    bounds, acc = [0], 0.0
    for p in parts[:-1]:
        acc += p
        bounds.append(int(round(acc * h / step)) * step)
    bounds.append(h)
    return list(zip(bounds[:-1], bounds[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    (fm,) = local_package()
    ops = fm.ops
    act = fm.activations.ACTIVATION_IDS["silu"]
    m, d, h = args.m, 4096, 14336
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, d, generator=g, device="cuda").to(torch.bfloat16)
    wg = (torch.randn(h, d, generator=g, device="cuda") * d**-0.5).to(torch.bfloat16)
    wu = (torch.randn(h, d, generator=g, device="cuda") * d**-0.5).to(torch.bfloat16)
    wd = (torch.randn(d, h, generator=g, device="cuda") * h**-0.5).to(torch.bfloat16)
    hbuf = torch.empty(m, h, **bf)
    side = torch.cuda.Stream()

    def base():
        return fm.gated_mlp(x, wg, wu, wd, "silu")

    def chunked(parts, overlap: bool, fp32: bool):
        cs = chunks_of(h, parts)

        def call():
            main = torch.cuda.current_stream()
            evs = []
            for c0, c1 in cs:
                ops.gated_gemm_sm90(hbuf[:, c0:c1], x, wg[c0:c1], wu[c0:c1], None, None, None, act, 0)
                ev = torch.cuda.Event()
                ev.record(main)
                evs.append(ev)
            stream = side if overlap else main
            out = None
            with torch.cuda.stream(stream):
                for i, (c0, c1) in enumerate(cs):
                    stream.wait_event(evs[i])
                    hi, wi = hbuf[:, c0:c1], wd[:, c0:c1]
                    if fp32:  # partial sums in fp32, rounded once at the end
                        out = (torch.mm(hi, wi.t(), out_dtype=torch.float32) if i == 0
                               else torch.addmm(out, hi, wi.t(), out_dtype=torch.float32))
                    else:  # bf16 output, each chunk's GEMM adding the rounded sum so far
                        out = F.linear(hi, wi) if i == 0 else out.addmm_(hi, wi.t())
                if fp32:
                    out = out.to(torch.bfloat16)
            if overlap:
                main.wait_stream(side)
                if not torch.cuda.is_current_stream_capturing():
                    out.record_stream(main)
            return out

        return call

    forms = {"op": base}
    for name, parts in (("c2", [0.5, 0.5]), ("c2_60_40", [0.6, 0.4]), ("c3", [1 / 3] * 3), ("c4", [0.25] * 4)):
        forms[name + "_seq"] = chunked(parts, False, False)
        forms[name + "_ovl"] = chunked(parts, True, False)
        forms[name + "_ovl_fp32"] = chunked(parts, True, True)
    ref = base().float()
    rows, replay = [], {}
    for name, fn in forms.items():
        try:
            out = fn().float()
            torch.cuda.synchronize()
            err = float((out - ref).abs().max() / ref.abs().max())
            replay[name] = graphed(fn)
            rows.append({"form": name, "rel_max_diff_vs_op": err})
        except Exception as e:  # noqa: BLE001 - a form that cannot run is reported, not fatal
            print(f"[overlap] {name}: {type(e).__name__}: {e}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in replay}
    for _ in range(args.rounds):
        for name, rp in replay.items():
            times[name].append(median_us(rp))
    for r in rows:
        if r["form"] in times:
            r["us_rounds"] = times[r["form"]]
            r["us"] = statistics.median(times[r["form"]])
            r["ratio_to_op"] = r["us"] / statistics.median(times["op"])
            print(f"[overlap] M {m} {r['form']:<16} {r['us']:8.1f} us  {r['ratio_to_op']:.3f} of the op"
                  f"  rel diff {r['rel_max_diff_vs_op']:.2e}", flush=True)
    write_report(args.out, rows, m=m)  # run_info gives the command line


if __name__ == "__main__":
    main()
