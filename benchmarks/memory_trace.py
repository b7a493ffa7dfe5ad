#!/usr/bin/env python3
"""Where a training step's peak memory goes: one step of bench_train's case under
torch.cuda.memory._record_memory_history, replayed to find the moment of the peak and the
blocks alive then (size and the Python line that allocated each).

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/memory_trace.py \
        [--cases mlp_gelu] [--impls ours,eager] [--out trace.txt]

Before the recorded step, each implementation runs three warm-up steps (tuning, launch
plans) and bench_train.peak_mb is printed twice, so a peak that only the first steps reach
shows up as a difference. Peaks count allocations made during the step only (blocks alive
before it, inputs and weights, are not in the trace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import bench_train  # noqa: E402  (sets KERNELS_CACHE / HF_HUB_OFFLINE defaults)

OWN_FILES = ("fused_mlp", "benchmarks", "torch/autograd", "torch/nn/functional")


def where(frames: list) -> str:
    """The innermost frames that belong to this project (or autograd), shortened; with
    C++ stacks recorded, also the innermost ATen operator frames."""
    picked = [f for f in frames if any(k in f.get("filename", "") for k in OWN_FILES)]
    py = " <- ".join(f"{Path(f['filename']).name}:{f['line']}:{f['name']}" for f in picked[:3])
    ops = [f["name"] for f in frames if "at::native::" in f.get("name", "") or "at::_ops::" in f.get("name", "")]
    cpp = " <- ".join(n.split("(")[0][-60:] for n in ops[:3])
    return " | ".join(p for p in (py, cpp) if p) or "?"


def peak_of_trace(trace: list) -> tuple[int, list]:
    """Replays alloc / free events; returns the peak of bytes allocated and the blocks alive then."""
    live, total, peak, at_peak = {}, 0, 0, []
    for e in trace:
        action = e["action"]
        if action == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, list(live.values())
        elif action == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])[0]
    return peak, at_peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="mlp_gelu")
    ap.add_argument("--impls", default="ours,eager,ours_recompute")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpp", action="store_true", help="record C++ stacks too (names the ATen operator)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("[trace] needs a CUDA device")
    from kernels import get_kernel

    fm = get_kernel("org/fused-mlp", version=1)
    lines = [f"torch {torch.__version__}, {torch.cuda.get_device_name()}"]

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    # A bias gradient is a column sum of an [M, H] gradient: what does that allocate?
    for shape in ((8192, 3072), (8192, 768)):
        g = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for label, fn in (("t.sum(0)", lambda: g.sum(0)), ("torch.mv(t.T, ones)", lambda: torch.mv(g.t(), ones))):
            ones = torch.ones(shape[0], device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            r = fn()
            torch.cuda.synchronize()
            say(f"probe {label} on bf16 {shape}: peak +{(torch.cuda.max_memory_allocated() - before) / 1e6:.2f} MB")
            del r
        del g, ones

    cases = [c for c in bench_train.all_cases() if any(p in c.name for p in args.cases.split(","))]
    for i, c in enumerate(cases):
        t = bench_train.make_inputs(c, seed=1000 + i)
        ps, dy = bench_train.params(t), t["dy"]
        fwds = bench_train.forward_fns(c, t, fm, None, None)
        for name in args.impls.split(","):
            step = bench_train.train_step(fwds[name], dy)
            for _ in range(3):
                for p in ps:
                    p.grad = None
                step()
            mb = [bench_train.peak_mb(step, ps) for _ in range(2)]
            for p in ps:
                p.grad = None
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=100000, stacks="all" if args.cpp else "python")
            step()
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            for p in ps:
                p.grad = None
            trace = snap["device_traces"][torch.cuda.current_device()]
            peak, alive = peak_of_trace(trace)
            say(f"== {c.name} {name}: peak_mb (two steps) {mb[0]:.1f} / {mb[1]:.1f}; "
                f"traced step peak {peak / 1e6:.1f} MB in {len(alive)} blocks, {len(trace)} events")
            for size, frames in sorted(alive, key=lambda a: -a[0])[:12]:
                say(f"   {size / 1e6:9.2f} MB  {where(frames)}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
