#!/usr/bin/env python3
"""Where does a hand-made split-K down GEMM beat F.linear? (session 35, an experiment; torch and
Triton only, no build.)

down_bmm_split.py found that at SwiGLU M 128 (Llama-3-8B) the down GEMM as a strided-batched
cuBLAS GEMM over S K slices with fp32 partial sums, then a Triton reduction with a programmatic
edge, takes 1.6 us less than F.linear (cuBLAS's split-K kernel and its reduce kernel). Whether
that holds elsewhere decides whether (and for which shapes) the op could take it. This times, for
the down GEMMs of common models' MLP blocks and token counts from 16 to 512,

  linear   F.linear(h, W_down)
  split_S  down_bmm_split.split_down(..., parts=S) with the edge, S in --parts

each a CUDA graph, events around replays, interleaved, L2 evicted by a read before each (the
down GEMM runs after the gate/up kernel, which leaves L2 clean); every split form's output is
checked against F.linear's (relative difference under 1e-2; both round the same fp32 sums).

    python3 benchmarks/micro/down_split_sweep.py [--m 16,...] [--parts 2,4] [--out F]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import graphed, interleaved_us, rel_err, write_report  # noqa: E402
from down_bmm_split import split_down  # noqa: E402

# (model, hidden_size D, intermediate_size H): the down GEMM is [M, H] x [D, H]^T.
SHAPES = (
    ("llama3-8b", 4096, 14336),
    ("llama2-7b", 4096, 11008),
    ("qwen2.5-7b", 3584, 18944),
    ("llama3.2-1b", 2048, 8192),
    ("llama3.2-3b", 3072, 8192),
    ("qwen2.5-14b", 5120, 13824),
    ("llama3-70b", 8192, 28672),
    ("post-geglu", 768, 3072),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--m", default="16,32,64,96,128,192,256,384,512")
    ap.add_argument("--parts", default="2,4")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    rows = []
    for model, d, hid in SHAPES:
        wd = torch.randn(d, hid, device="cuda", dtype=dt) * hid**-0.5
        for m in [int(v) for v in args.m.split(",")]:
            h = torch.randn(m, hid, device="cuda", dtype=dt)
            ref = F.linear(h, wd)
            forms = {"linear": lambda h=h: F.linear(h, wd)}
            for s in [int(v) for v in args.parts.split(",")]:
                if hid % (8 * s):
                    continue
                _, full, _ = split_down(h, wd, 1024, True, parts=s)
                err = rel_err(full(), ref)
                if err > 1e-2:
                    raise SystemExit(f"{model} m {m} split {s}: differs from F.linear by {err:.2e}")
                forms[f"split_{s}"] = full
            res = interleaved_us({n: graphed(f) for n, f in forms.items()}, "read", args.reps, args.rounds)
            base = res["linear"][0]
            row = {"model": model, "d": d, "h": hid, "m": m, "dtype": args.dtype,
                   "us": {n: v[0] for n, v in res.items()}, "rounds_us": {n: v[1] for n, v in res.items()}}
            rows.append(row)
            print(f"[sweep] {model:12s} d {d:5d} h {hid:5d} m {m:4d}  linear {base:7.1f}  "
                  + "  ".join(f"{n} {v[0]:7.1f} ({v[0] - base:+.1f})" for n, v in res.items() if n != "linear"),
                  flush=True)
        del wd
        torch.cuda.empty_cache()
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
