#!/usr/bin/env python3
"""How fast could a split-K down GEMM of our own stream W_down at SwiGLU M 128? (session 34, an
experiment; nothing here is used by the package.)

At M 128 the down projection y = h W_down^T (h [128, 14336], W_down [4096, 14336], 117 MB) is
cuBLAS's split-K GEMM plus its reduce kernel (33.0 + 3.4 us under the benchmark's L2 flush,
`results/profile_gated_mlp_h200_session34.txt`): W_down at ~3.5 TB/s, while our gate/up kernel
streams its weights at 3.87 TB/s once L2 holds no dirty lines. A down GEMM of ours would be the
gate/up kernel's main loop over a K slice. Before writing one, this times a proxy with the same
per-CTA pattern, built from the shipped op: S launches of gated_gemm_sm90 side by side (a CUDA
graph forking S streams), launch s reading h[:, K_s] and W_down[:, K_s] as "gate" (rows 0-2047) and
"up" (rows 2048-4095), 128-column tiles: 16 CTAs each, so S = 8 fills 128 SMs with the gate/up
kernel's stages (224 weight rows and 128 rows of h per 64-column K step) over K slices of 1792.
Its outputs are meaningless (act(g) * u of partial sums); only its time is of interest, as the
stream time of such a kernel before any reduction of the S partial sums.

Forms (each a CUDA graph, timed by events around replays, the forms interleaved replay by
replay, L2 evicted before each by a 256 MiB fill, as the benchmarks do, or by a read):
  cublas_down       F.linear(h, W_down)
  proxy_down_S      the proxy, S in --splits (S = 1: one launch, the whole K)
  proxy_down_S_contig  the same on packed copies of the K slices (--contig; session 35): is it
                    the slicing of W_down's 28 KB rows that slows the pattern?
  proxy_down_8_seq  the 8 launches on one stream (if the side-by-side form is not much faster,
                    the launches did not run together)
  op                fused_mlp.gated_mlp (our gate/up kernel, then cuBLAS's down GEMM)
  gate_up_proxy     our gate/up kernel, then the 8-way proxy: what the MLP would take with a
                    down GEMM streaming like the proxy, before its reduction

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/down_stream_proxy.py
        [--splits 1,4,8] [--contig 8] [--out F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import graphed, interleaved_us, local_package, swiglu_operands, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--splits", default="1,4,8")
    ap.add_argument("--contig", default="", help="comma-separated splits also timed on packed K slices")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    (fm,) = local_package()
    ops = fm.ops
    act = fm.activations.ACTIVATION_IDS["silu"]
    m, d, hid = args.m, 4096, 14336
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, wg, wu, wd = swiglu_operands(m=m)
    h = torch.randn(m, hid, **bf)
    half = d // 2

    def proxy(splits: int, side_by_side: bool = True, contig: bool = False):
        ks = hid // splits
        streams = [torch.cuda.Stream() for _ in range(splits)]
        outs = [torch.empty(m, half, **bf) for _ in range(splits)]
        # contig: each launch reads a packed copy of its K slice (rows of ks elements, back to
        # back) instead of a column slice of W_down (rows 28 KB apart): the same bytes, the
        # weight's row stride taken out.
        slices = [wd[:, s * ks:(s + 1) * ks] for s in range(splits)]
        if contig:
            slices = [w.contiguous() for w in slices]

        def launch(s: int) -> None:
            k0 = s * ks
            ops.gated_gemm_sm90(outs[s], h[:, k0:k0 + ks], slices[s][:half], slices[s][half:],
                                None, None, None, act, 128)

        def call() -> None:
            cur = torch.cuda.current_stream()
            if not side_by_side:
                for s in range(splits):
                    launch(s)
                return
            for s, st in enumerate(streams):
                st.wait_stream(cur)
                with torch.cuda.stream(st):
                    launch(s)
            for st in streams:
                cur.wait_stream(st)
        return call

    hbuf = torch.empty(m, hid, **bf)
    p8 = proxy(8)

    def gate_up_proxy() -> None:
        ops.gated_gemm_sm90(hbuf, x, wg, wu, None, None, None, act, 0)
        p8()

    forms = {"cublas_down": lambda: F.linear(h, wd)}
    for s in [int(v) for v in args.splits.split(",")]:
        forms[f"proxy_down_{s}"] = proxy(s)
    for s in [int(v) for v in args.contig.split(",") if v]:
        forms[f"proxy_down_{s}_contig"] = proxy(s, contig=True)
    forms["proxy_down_8_seq"] = proxy(8, side_by_side=False)
    forms["op"] = lambda: fm.gated_mlp(x, wg, wu, wd, "silu")
    forms["gate_up_proxy"] = gate_up_proxy
    replays = {n: graphed(f) for n, f in forms.items()}

    rows = []
    for mode in ("fill", "read"):
        for n, (us, rounds) in interleaved_us(replays, mode, args.reps, args.rounds).items():
            rows.append({"eviction": mode, "form": n, "us": us, "rounds_us": rounds})
            print(f"[proxy] {mode:4s} {n:18s} {us:8.1f} us  rounds " + " ".join(f"{t:.1f}" for t in rounds), flush=True)
    write_report(args.out, rows, m=m)


if __name__ == "__main__":
    main()
