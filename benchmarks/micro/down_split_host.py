#!/usr/bin/env python3
"""Host time of one gated_mlp call (Llama-3-8B SwiGLU, bf16) with the down projection as
F.linear (FUSED_MLP_DOWN_SPLIT=0) or split in 2 / 4 (the switch forced), at few tokens
(session 36): the split form makes ~3 host calls where F.linear makes one, which matters for
eager callers whose calls are host-bound. Beside it, the same calls' events time back to back
(do_bench median): where that is near the host time, eager calls are launch-bound. Where the
build has down_gemm_sm90 (main since session 51), it too at M <= 128 (=kernel: one launch and
one allocation, like F.linear; whether eager calls could take it is this question again).

Host time: 30 calls enqueued behind a sleeping kernel (so the launch queue never waits on the
GPU), per call, in 5 interleaved rounds; the median.

--pieces: host time of the split form's pieces one by one (host_overhead.host_us: the minimum
of three loops of 100 calls) beside F.linear's, and a cProfile of 200 split_linear calls.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/down_split_host.py [--m 16,64,128,256] [--out F]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import local_package, median_us, swiglu_operands, with_env, write_report  # noqa: E402

ENV = "FUSED_MLP_DOWN_SPLIT"
CALLS = 30
KERNEL_VALUES = ("kernel",)  # the one-kernel form's value of the switch (M <= 128)


def host_us_behind_sleep(fn) -> float:
    """Host us per call of CALLS calls enqueued while the GPU sleeps (the queue never waits)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~100 ms at the H200's clock: longer than the 30 calls' enqueueing
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / CALLS * 1e6


def pieces(m: int, tg) -> dict:
    """Host us per call of each piece of split_linear (2 parts) and of F.linear at this M."""
    import cProfile
    import pstats

    import torch.nn.functional as F
    from host_overhead import host_us

    k, n = 14336, 4096
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, w = torch.randn(m, k, **bf), torch.randn(n, k, **bf) * k**-0.5
    hb = h.view(m, 2, k // 2).transpose(0, 1)
    wb = w.view(n, 2, k // 2).permute(1, 2, 0)
    p = torch.empty((2, m, n), device="cuda", dtype=torch.float32)
    out = torch.empty((m, n), **bf)
    os.environ[ENV] = "2"
    fns = {
        "F.linear": lambda: F.linear(h, w, None),
        "split_linear(2)": lambda: tg.split_linear(h, w, None, 2),
        "down_linear (switch 2)": lambda: tg.down_linear(h, w, None),
        "down_parts (switch 2)": lambda: tg.down_parts(h, w, None),
        "down_parts (graphs, eager, timed)": with_env(lambda: tg.down_parts(h, w, None), ENV, "graphs"),
        "down_parts (switch 0)": with_env(lambda: tg.down_parts(h, w, None), ENV, "0"),
        "with_env alone": with_env(lambda: None, ENV, "0"),
        "split_parts_allowed": lambda: tg.split_parts_allowed(h, w, None),
        "views": lambda: (h.view(m, 2, k // 2).transpose(0, 1), w.view(n, 2, k // 2).permute(1, 2, 0)),
        "torch.empty fp32 [2, M, N]": lambda: torch.empty((2, m, n), device="cuda", dtype=torch.float32),
        "torch.bmm(out_dtype fp32, out=)": lambda: torch.bmm(hb, wb, torch.float32, out=p),
        "torch.bmm(out=) bf16 (no out_dtype)": lambda: torch.bmm(hb, wb, out=out.new_empty((2, m, n))),
        "sum_parts (pdl)": lambda: tg.sum_parts(p, None, out, pdl=True),
        "sum_parts (no pdl)": lambda: tg.sum_parts(p, None, out, pdl=False),
    }
    for fn in fns.values():
        fn()
    us = {name: host_us(fn, n=100) for name, fn in fns.items()}
    for name, t in us.items():
        print(f"[down-split-host] pieces m {m:4d}  {name:40s} {t:7.1f} us", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        tg.split_linear(h, w, None, 2)
    pr.disable()
    torch.cuda.synchronize()
    st = io.StringIO()
    pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(18)
    print(st.getvalue()[:5000], flush=True)
    del os.environ[ENV]
    return us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="16,64,128,256")
    ap.add_argument("--pieces", action="store_true", help="the split form's pieces (see the docstring)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    fm, tg = local_package("triton_gemm")
    if args.pieces:
        rows = [{"m": m, "host_us": pieces(m, tg)} for m in [int(v) for v in args.m.split(",")]]
        write_report(args.out, rows, mode="pieces")
        return
    rows = []
    for m in [int(v) for v in args.m.split(",")]:
        x, wg, wu, wd = swiglu_operands(m=m)
        values = ("0", "2", "4") + (KERNEL_VALUES if hasattr(fm.ops, "down_gemm_sm90") and m <= 128 else ())
        fns = {v: with_env(lambda: fm.gated_mlp(x, wg, wu, wd, "silu"), ENV, v) for v in values}
        ref = fns["0"]()
        for v, fn in fns.items():  # warm-up (compiles the reduction), and the forms agree
            out = fn()
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            assert err < 2e-2, f"down form {v} differs from F.linear at m {m}: {err}"
        rounds = {v: [] for v in fns}
        for _ in range(5):
            for v, fn in fns.items():
                rounds[v].append(host_us_behind_sleep(fn))
        host = {v: statistics.median(t) for v, t in rounds.items()}
        events = {v: median_us(fn) for v, fn in fns.items()}
        rows.append({"m": m, "host_us": host, "events_us": events})
        print(f"[down-split-host] m {m:4d}  " + "  ".join(
            f"{ENV}={v}: host {host[v]:.1f} us, events {events[v]:.1f} us" for v in fns), flush=True)
    write_report(args.out, rows, calls_per_loop=CALLS)


if __name__ == "__main__":
    main()
