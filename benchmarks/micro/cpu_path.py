#!/usr/bin/env python3
"""The CPU path against eager PyTorch on the same CPU (session 56; a probe, not a benchmark of
the project's targets, which are the GPU's).

On CPU fused-mlp runs the gated MLP as two GEMMs into the halves of one [M, 2H] buffer, its
compiled CPU act_and_mul, and the down GEMM (dispatch "cpu-act-and-mul"); training takes the
plain-PyTorch reference backward. Here, one MLP shape (M 2048, 768 -> 3072) in bf16 and fp32,
interleaved rounds (median per round, median of rounds, ms):
    mlp_<act>        fused_mlp.gated_mlp against eager F.linear / act / mul / F.linear
    act_and_mul_<act> the compiled op alone against eager act(g) * u on the same g | u
    train_silu       forward + backward (x and the three weights require grad)
Every output is checked against float64 first (forward outputs and, for training, every
gradient: relative error printed, ours and eager's).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python3 benchmarks/micro/cpu_path.py [--out F]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import call_order, local_package, rel_err, write_report  # noqa: E402

M, D, H = 2048, 768, 3072
ACTS = ("gelu_tanh", "silu")


def timed_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def interleaved(fns: dict, rounds: int, reps: int) -> dict:
    per_round = {n: [] for n in fns}
    for n in fns:
        fns[n]()  # warm
    for r in range(rounds):
        for n in call_order(list(fns), r):
            per_round[n].append(statistics.median(timed_ms(fns[n]) for _ in range(reps)))
    return {n: {"ms": statistics.median(v), "rounds": v} for n, v in per_round.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    (fm,) = local_package()
    gen = torch.Generator().manual_seed(0)
    base = [torch.randn(s, generator=gen, dtype=torch.float64) * sc
            for s, sc in (((M, D), 1.0), ((H, D), D**-0.5), ((H, D), D**-0.5), ((D, H), H**-0.5), ((M, D), 1.0))]
    rows = []
    for dt in (torch.bfloat16, torch.float32):
        x, wg, wu, wd, dy = (t.to(dt) for t in base)
        for act in ACTS:
            # eager: fm.reference, plain PyTorch in the inputs' dtype (in float64: the reference)
            ref = fm.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), act)
            errs = {"ours": rel_err(fm.gated_mlp(x, wg, wu, wd, act), ref),
                    "eager": rel_err(fm.reference.gated_mlp(x, wg, wu, wd, act), ref)}
            gu = torch.cat([F.linear(x, wg), F.linear(x, wu)], 1)
            h = torch.empty(M, H, dtype=dt)
            errs["act_and_mul"] = rel_err(fm.act_and_mul(h, gu, act), fm.reference.act_and_mul(gu.double(), act))
            t = interleaved({"ours": lambda: fm.gated_mlp(x, wg, wu, wd, act),
                             "eager": lambda: fm.reference.gated_mlp(x, wg, wu, wd, act)}, args.rounds, args.reps)
            ta = interleaved({"ours": lambda: fm.act_and_mul(h, gu, act),
                              "eager": lambda: fm.reference.act_and_mul(gu, act)}, args.rounds, args.reps)
            for case, res in ((f"mlp_{act}", t), (f"act_and_mul_{act}", ta)):
                rows.append({"case": case, "dtype": str(dt), "ours_ms": res["ours"]["ms"], "eager_ms": res["eager"]["ms"],
                             "rounds": {k: v["rounds"] for k, v in res.items()}, "rel_err": errs})
                print(f"{case:<22} {str(dt):<15} ours {res['ours']['ms']:8.2f} ms  eager {res['eager']['ms']:8.2f} ms  "
                      f"(rel err {errs})", flush=True)

        leaves = {}

        def step(kind, x=x, wg=wg, wu=wu, wd=wd, dy=dy):
            ts = [t.detach().clone().requires_grad_() for t in (x, wg, wu, wd)]
            y = (fm.gated_mlp if kind == "ours" else fm.reference.gated_mlp)(*ts, "silu")
            y.backward(dy)
            leaves[kind] = [t.grad for t in ts]

        ts64 = [t.double().requires_grad_() for t in (x, wg, wu, wd)]
        fm.reference.gated_mlp(*ts64, "silu").backward(dy.double())
        step("ours"), step("eager")
        gerr = {k: max(rel_err(g, t.grad) for g, t in zip(v, ts64)) for k, v in leaves.items()}
        tt = interleaved({"ours": lambda: step("ours"), "eager": lambda: step("eager")}, args.rounds, args.reps)
        rows.append({"case": "train_silu", "dtype": str(dt), "ours_ms": tt["ours"]["ms"], "eager_ms": tt["eager"]["ms"],
                     "rounds": {k: v["rounds"] for k, v in tt.items()}, "grad_rel_err_max": gerr})
        print(f"{'train_silu':<22} {str(dt):<15} ours {tt['ours']['ms']:8.2f} ms  eager {tt['eager']['ms']:8.2f} ms  "
              f"(gradients' max rel err {gerr})", flush=True)
    write_report(args.out, rows, device="cpu", gpu=None, cpu=platform.processor() or platform.machine(),
                 threads=torch.get_num_threads(), shape={"m": M, "d": D, "h": H})


if __name__ == "__main__":
    main()
