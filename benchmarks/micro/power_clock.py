#!/usr/bin/env python3
"""SM clock and board power while one implementation runs back to back, on the GPU:

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/micro/power_clock.py [--env NAME]

Why: at large shapes the H200 sits at its 700 W limit and lowers its SM clock until the
power fits (~1.4-1.5 GHz for these GEMMs, against 1.98 in short bursts), so a kernel's speed
under sustained load follows the energy it spends per tile, not only its cycles. Short
timings (the standalone probe's 43 runs) see higher clocks than a model's forward and can
rank two kernels the other way round (NOTES, session 14).

For each implementation (SwiGLU M 4096, d 4096, h 14336, bf16): the op's gate/up GEMM and
cuBLAS's x [Wg; Wu], the whole gated_mlp and eager's; with --env NAME also the op's rows with
NAME=0 (an on / off switch the ops read at each call, e.g. FUSED_MLP_SM90_NARROW_DH). Each is
captured as a CUDA graph of 10 calls and replayed for 4 s; nvidia-smi samples clock, power
and temperature every 100 ms (the first second dropped). Two rounds. Prints time per call and
the medians.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from kernels import get_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import swiglu_operands  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default=None, help="also run the op's rows with this switch set to 0")
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    fm = get_kernel("org/fused-mlp", version=1)
    x, wg, wu, wd = swiglu_operands()
    wgu = torch.cat([wg, wu])
    out = torch.empty(x.shape[0], wg.shape[0], device="cuda", dtype=torch.bfloat16)
    silu = fm.activations.ACTIVATION_IDS["silu"]

    def ours_gate_up():
        fm.ops.gated_gemm_sm90(out, x, wg, wu, None, None, None, silu, 0)

    def ours_mlp():
        fm.gated_mlp(x, wg, wu, wd, "silu")

    forms = [("ours_gate_up", ours_gate_up, None), ("cublas_x_wgu", lambda: torch.mm(x, wgu.t()), None),
             ("ours_mlp", ours_mlp, None), ("eager_mlp", lambda: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd), None)]
    if a.env:
        forms.insert(1, (f"ours_gate_up {a.env}=0", ours_gate_up, "0"))
        forms.insert(4, (f"ours_mlp {a.env}=0", ours_mlp, "0"))
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader,nounits",
             "-lms", "100"]
    for rnd in range(2):
        for name, fn, env in forms:
            if a.env:
                if env is None:
                    os.environ.pop(a.env, None)
                else:
                    os.environ[a.env] = env
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(10):
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            mon = subprocess.Popen(query, stdout=subprocess.PIPE, text=True)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0, n = time.time(), 0
            e0.record()
            while time.time() - t0 < a.seconds:
                graph.replay()
                n += 1
                if n % 20 == 0:
                    torch.cuda.synchronize()
            e1.record()
            torch.cuda.synchronize()
            mon.terminate()
            rows = [line.split(",") for line in mon.stdout.read().strip().splitlines()[10:]]
            clk = sorted(float(r[0]) for r in rows)
            pw = sorted(float(r[1]) for r in rows)
            print(f"[power] round {rnd} {name:<16} {e0.elapsed_time(e1) * 1e3 / (10 * n):8.1f} us/call  SM clock median "
                  f"{clk[len(clk) // 2]:6.0f} MHz  power median {pw[len(pw) // 2]:6.1f} W  temp {rows[-1][2].strip()} C  "
                  f"samples {len(rows)}", flush=True)
            del graph
        if a.env:
            os.environ.pop(a.env, None)


if __name__ == "__main__":
    main()
