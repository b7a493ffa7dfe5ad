#!/usr/bin/env python3
"""A/B of the sm_90a gated forward's cache hints end to end (FUSED_MLP_SM90_CACHE_HINTS: the
default lets the op apply them where gated_forward_hints in the kernel header says, 0 turns
them off): the whole forward and the whole training step, so that the effect on the kernels
after ours (which read h / out / pre back) counts too, not only the kernel itself. Cases the
rule leaves without hints run the same kernels both ways: their on / off ratio is the
method's noise (~1.4% on the H200, NOTES session 11).

For each case it captures two CUDA graphs of the same call, one with the hints and one without
(the switch is read when the op is called, so each graph keeps its setting), checks that both
give bit-identical results (hints change where data is cached, not what is computed), then
times them alternately (triton do_bench median, L2 flushed between replays) for --rounds rounds.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/micro/cache_hints_ab.py [--out F]

--env NAME does the same A/B for another on / off switch the ops read at each call, e.g.
FUSED_MLP_SM90_NARROW_DH (the narrow gated dh kind, session 12); "on" is the default (the
variable unset), "off" NAME=0, or NAME=V with --off-value V (e.g. FUSED_MLP_SM90_GROUP_M=16,
session 15); --on-value V sets NAME=V on the "on" side instead of unsetting it (e.g.
FUSED_MLP_DOWN_SPLIT=auto, which differs from the default, graphs, only in eager calls).
Results may then differ in the last bit (different tiles), so only the hints A/B fails on a
difference.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import graphed, local_package, median_us, write_report  # noqa: E402

ENV = "FUSED_MLP_SM90_CACHE_HINTS"
# name, kind, activation, M, D, H, bias, training
CASES = [
    ("geglu_m8192_d768_h3072_bf16", "gated", "gelu_tanh", 8192, 768, 3072, False, False),
    ("geglu_m8192_d768_h3072_bf16_train", "gated", "gelu_tanh", 8192, 768, 3072, False, True),
    ("mlp_gelu_tanh_m8192_d768_h3072_bf16", "mlp", "gelu_tanh", 8192, 768, 3072, True, False),
    ("mlp_gelu_tanh_m8192_d768_h3072_bf16_train", "mlp", "gelu_tanh", 8192, 768, 3072, True, True),
    ("swiglu_m128_d4096_h14336_bf16", "gated", "silu", 128, 4096, 14336, False, False),
    ("swiglu_m512_d4096_h14336_bf16", "gated", "silu", 512, 4096, 14336, False, False),
    ("swiglu_m4096_d4096_h14336_bf16", "gated", "silu", 4096, 4096, 14336, False, False),
    ("swiglu_m4096_d4096_h14336_bf16_train", "gated", "silu", 4096, 4096, 14336, False, True),
    ("swiglu_m16384_d4096_h14336_bf16", "gated", "silu", 16384, 4096, 14336, False, False),
]


def make_call(fm, kind, act, m, d, h, bias, train):
    """A zero-argument call writing its results into tensors it returns (the graph's outputs)."""
    g = torch.Generator(device="cuda").manual_seed(m + d + h)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16).requires_grad_(train)

    x = rnd(m, d)
    if kind == "gated":
        ws = [rnd(h, d, scale=d**-0.5), rnd(h, d, scale=d**-0.5), rnd(d, h, scale=h**-0.5)]
        fwd = lambda: fm.gated_mlp(x, *ws, act)  # noqa: E731
    else:
        ws = [rnd(h, d, scale=d**-0.5), rnd(h, scale=0.1) if bias else None, rnd(d, h, scale=h**-0.5),
              rnd(d, scale=0.1) if bias else None]
        fwd = lambda: fm.mlp(x, *ws, act)  # noqa: E731
    params = [x] + [w for w in ws if w is not None]
    dy = torch.randn(m, d, generator=g, device="cuda").to(torch.bfloat16)
    if not train:
        def call():
            with torch.no_grad():
                return [fwd()]
        return call

    def call():
        for p in params:
            p.grad = None
        fwd().backward(dy)
        return [p.grad for p in params]
    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names")
    p.add_argument("--out", type=Path, default=None, help="JSON results")
    p.add_argument("--env", default=ENV, help="the switch to A/B (default: the cache hints)")
    p.add_argument("--off-value", default="0", help="the value the 'off' side sets (default 0)")
    p.add_argument("--on-value", default=None,
                   help="the value the 'on' side sets (default: the variable unset), e.g. auto for "
                        "FUSED_MLP_DOWN_SPLIT")
    a = p.parse_args()
    fm, = local_package()
    rows = []
    for name, *spec in CASES:
        if a.cases and not any(s in name for s in a.cases.split(",")):
            continue
        call = make_call(fm, *spec)
        replays, outs = {}, {}
        for hints in ("1", "0"):
            if hints == "1" and a.on_value is None:
                os.environ.pop(a.env, None)
            elif hints == "1":
                os.environ[a.env] = a.on_value
            else:
                os.environ[a.env] = a.off_value
            holder = {}

            def run(holder=holder):
                holder["out"] = call()
            replays[hints] = graphed(run)
            replays[hints]()
            torch.cuda.synchronize()
            outs[hints] = [t.detach().clone() for t in holder["out"]]
        os.environ.pop(a.env, None)
        same = all(torch.equal(u, v) for u, v in zip(outs["1"], outs["0"]))
        times = {"1": [], "0": []}
        for _ in range(a.rounds):
            for hints in ("1", "0"):
                times[hints].append(median_us(replays[hints]))
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        row = {"case": name, "hints_us": med["1"], "no_hints_us": med["0"], "ratio": med["1"] / med["0"],
               "rounds_us": times, "bit_identical": same}
        rows.append(row)
        print(f"[{a.env}] {name:45s} on {med['1']:8.1f} us  off {med['0']:8.1f} us  on/off {row['ratio']:.3f}  "
              f"identical {same}  rounds on {['%.1f' % t for t in times['1']]} off {['%.1f' % t for t in times['0']]}",
              flush=True)
        del replays, outs, call
        torch.cuda.empty_cache()
    write_report(a.out, rows, switch=a.env, off_value=a.off_value, on_value=a.on_value)
    if a.env == ENV and not all(r["bit_identical"] for r in rows):
        raise SystemExit("[hints] results differ with and without the hints")


if __name__ == "__main__":
    main()
