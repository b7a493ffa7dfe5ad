#!/usr/bin/env python3
"""Host time of fused-mlp's training wrapper alone: the public gated_mlp's forward and
backward with the dispatcher's kernels stubbed out (they return ready tensors), against a
do-nothing autograd Function with the same four inputs. What is left is the wrapper's Python
and autograd's own cost; runs on the CPU (no GPU, no kernels).

    KERNELS_CACHE=... HF_HUB_OFFLINE=1 python benchmarks/micro/wrapper_overhead.py [--calls N]

Median of 5 loops of N calls, after N // 10 warm-up calls; tiny float32 CPU tensors.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
from kernels import get_kernel


def median_us(fn, calls: int) -> float:
    for _ in range(max(1, calls // 10)):
        fn()
    loops = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(loops)


def measure(fm, calls: int, m: int = 64, d: int = 32, h: int = 48) -> dict[str, float]:
    """{row: us per call} of ours' step, a toy Function's step and ours' forward alone."""
    disp = fm.dispatch
    leaves = [torch.randn(*s).requires_grad_() for s in ((m, d), (h, d), (h, d), (d, h))]
    dy = torch.randn(m, d)
    y, gu, hh = torch.randn(m, d), torch.randn(m, 2 * h), torch.randn(m, h)
    grads = (torch.randn(m, d), torch.randn(2 * h, d), torch.randn(d, h), None, None)

    class Toy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c, e):
            return y.clone()

        @staticmethod
        def backward(ctx, g):
            return grads[0], grads[1][:h], grads[1][h:], grads[2]

    def step(fwd):
        def run():
            for p in leaves:
                p.grad = None
            fwd().backward(dy)
        return run

    with mock.patch.object(disp, "gated_mlp_train_forward", lambda *a: (y.clone(), gu, hh)), \
            mock.patch.object(disp, "gated_mlp_backward", lambda *a, **k: grads), \
            mock.patch.object(disp, "backward_choice", lambda *a, **k: disp.Choice("triton", "stub")):
        return {
            "ours gated_mlp step (kernels stubbed)": median_us(step(lambda: fm.gated_mlp(*leaves, "gelu_tanh")), calls),
            "do-nothing 4-input Function step": median_us(step(lambda: Toy.apply(*leaves)), calls),
            "ours gated_mlp forward alone": median_us(lambda: fm.gated_mlp(*leaves, "gelu_tanh"), calls),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    fm = get_kernel("org/fused-mlp", version=1)
    print(f"# host us/call, median of 5 loops of {args.calls}, torch {torch.__version__}, CPU")
    for name, us in measure(fm, args.calls).items():
        print(f"  {name:<40} {us:8.1f}")


if __name__ == "__main__":
    main()
