#!/usr/bin/env python3
"""What the op's down-projection tuner (triton_gemm.down_parts) times and picks for Llama-3-8B's
SwiGLU block at the given token counts: F.linear (1) or a K split in 2 / 4 (session 35), and
the wall time of that timing (_time_down_forms), the warm-up cost the first eager call of a
bucket pays in the default mode. The first bucket's time includes compiling the reduction
kernel; the gate/up kernel is called (and compiled) before the timed part.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/down_choice.py [--m 128,512] [--out F]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import DTYPES, local_package, swiglu_operands, write_report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="64,128,192,256,384,512")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["FUSED_MLP_DOWN_SPLIT"] = "auto"  # times as the default (graphs) does, on an eager call
    fm, tg = local_package("triton_gemm")
    timer = tg._time_down_forms
    walls: list = []

    def timed(*a, **k):  # the tuner's own timing, measured from the outside
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = timer(*a, **k)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        return r

    tg._time_down_forms = timed  # down_parts looks it up in the module on each call
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        x, wg, wu, wd = swiglu_operands(m=m, dtype=DTYPES[args.dtype])
        walls.clear()
        fm.gated_mlp(x, wg, wu, wd, "silu")
        wall_ms = walls[0] * 1e3 if walls else None
        for key, ms in tg._DOWN_TIMES.items():
            if key[0] == (m + 31) // 32 and key[1:4] == (*wd.shape, wd.dtype):
                choice = tg._DOWN_CHOICE[key]
                rows.append({"m": m, "dtype": args.dtype, "choice": choice, "us": {str(p): t * 1e3 for p, t in ms.items()},
                             "timing_wall_ms": wall_ms})
                print(f"[down-choice] {args.dtype} m {m:4d} picks {choice}  " + "  ".join(f"{p}: {t * 1e3:.1f} us" for p, t in ms.items())
                      + (f"  (timing took {wall_ms:.1f} ms)" if wall_ms is not None else ""), flush=True)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
