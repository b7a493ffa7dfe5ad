#!/usr/bin/env python3
"""The experiment of "Profiling in PyTorch (Part 2): From nn.Linear to a Fused MLP",
repeated with fused-mlp: torch.profiler over a GeGLU MLP block

    y = down(gelu_tanh(gate(x)) * up(x)),  three nn.Linear(bias=True)
    x: [batch 64, seq 128, dim 768], hidden 3072, bf16

run four ways: eager, torch.compile, Liger (its fused GeGLU act*mul between the cuBLAS
linears), and fused-mlp (fused_mlp.gated_mlp). Each run's trace is saved as Chrome /
Perfetto JSON under --out-dir (open in https://ui.perfetto.dev or chrome://tracing), and
a table lists the GPU kernels of one forward with their times.

    KERNELS_CACHE=... HF_HUB_OFFLINE=1 python benchmarks/profile_post.py --out-dir out/profile
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import DTYPES, run_info  # noqa: E402


class GeGLUMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool, approximate: str):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.approximate = approximate

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x), approximate=self.approximate) * self.up_proj(x))


def variants(mlp: GeGLUMLP, fm, activation: str) -> dict:
    g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    out = {"eager": mlp, "compile": torch.compile(mlp)}
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
    except Exception as e:
        print(f"[profile] Liger-Kernel not available ({type(e).__name__}: {e}): skipped")
    else:
        if activation == "gelu_tanh":  # Liger's GeGLU is the tanh form
            out["liger"] = lambda x: d(LigerGELUMulFunction.apply(g(x), u(x)))
    out["fused-mlp"] = lambda x: fm.gated_mlp(
        x, g.weight, u.weight, d.weight, activation, gate_bias=g.bias, up_bias=u.bias, down_bias=d.bias)
    return out


def kernel_table(prof, steps: int, annotations: frozenset = frozenset()) -> list[tuple[str, float, float]]:
    """(kernel name, launches per forward, GPU microseconds per forward), slowest first.
    The GPU-side ranges of record_function annotations (named in `annotations`) are not
    kernels: without this filter each forward's whole range was counted as one more."""
    calls, us = defaultdict(int), defaultdict(float)
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(evt, "is_user_annotation", False) or evt.name in annotations:
            continue
        name = evt.name
        calls[name] += 1
        us[name] += evt.time_range.elapsed_us()
    rows = [(n, calls[n] / steps, us[n] / steps) for n in calls]
    return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results" / "profile_post")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--hidden", type=int, default=3072)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--activation", choices=["gelu_tanh", "gelu"], default="gelu_tanh")
    p.add_argument("--no-bias", action="store_true")
    p.add_argument("--steps", type=int, default=5, help="profiled forwards per variant")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repo-id", default="org/fused-mlp")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": dry run
    a = p.parse_args()

    from kernels import get_kernel

    fm = get_kernel(a.repo_id, version=1)
    dev, dtype = a.device, DTYPES[a.dtype]
    torch.manual_seed(0)
    approx = "tanh" if a.activation == "gelu_tanh" else "none"
    mlp = GeGLUMLP(a.dim, a.hidden, not a.no_bias, approx).to(dev, dtype)
    x = torch.randn(a.batch, a.seq, a.dim, device=dev, dtype=dtype)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])

    summary, report = {}, {}
    with torch.inference_mode():
        ref = mlp(x).float()
        for name, fn in variants(mlp, fm, a.activation).items():
            for _ in range(a.warmup):  # compile / autotune / load everything first
                y = fn(x)
            sync()
            err = ((y.float() - ref).norm() / ref.norm()).item()
            with profile(activities=activities) as prof:
                for _ in range(a.steps):
                    with record_function(f"{name}_forward"):
                        fn(x)
                sync()
            trace = a.out_dir / f"{name}.json"
            prof.export_chrome_trace(str(trace))
            rows = kernel_table(prof, a.steps, frozenset({f"{name}_forward"}))
            total = sum(r[2] for r in rows)
            summary[name] = (total, sum(r[1] for r in rows))
            print(f"\n== {name}: {len(rows)} distinct GPU kernels, {summary[name][1]:.0f} launches and "
                  f"{total:.1f} us of GPU time per forward; rel. error vs eager {err:.1e}; trace {trace}")
            print(f"   {'kernel':90s} {'calls':>5s} {'us/fwd':>9s}")
            for kname, n, us in rows:
                print(f"   {kname[:90]:90s} {n:5.1f} {us:9.1f}")
            report[name] = {"rel_err_vs_eager": err, "launches_per_forward": summary[name][1],
                            "gpu_us_per_forward": total, "trace": trace.name,
                            "kernels": [{"name": k, "calls_per_forward": n, "us_per_forward": us}
                                        for k, n, us in rows]}
    print("\nper forward:  variant      launches   GPU us")
    for name, (total, launches) in summary.items():
        print(f"              {name:12s} {launches:8.0f} {total:8.1f}")
    info = run_info(dev)
    info["shape"] = {"batch": a.batch, "seq": a.seq, "dim": a.dim, "hidden": a.hidden, "dtype": a.dtype,
                     "activation": a.activation, "bias": not a.no_bias, "steps": a.steps}
    (a.out_dir / "summary.json").write_text(json.dumps({**info, "variants": report}, indent=1) + "\n")
    print(f"[profile] summary: {a.out_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
