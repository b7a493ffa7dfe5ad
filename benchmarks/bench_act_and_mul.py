#!/usr/bin/env python3
"""Activation-and-multiply on a GPU: fused-mlp against the copy roofline and its peers.

In one process this measures
  * device-to-device copy bandwidth (a large ``dst.copy_(src)``, bytes read + written),
    the ceiling for a kernel that only streams memory;
  * fused-mlp's silu_and_mul and gelu_tanh_and_mul on an 8192 x (2 x 14336) bfloat16
    input (Llama-3-8B's MLP width at 8192 tokens);
  * the same function eagerly (``act(x[..., :d]) * x[..., d:]``, two kernels), under
    ``torch.compile`` (one fused Triton kernel), and Liger's fused Triton kernel when
    liger_kernel is importable.
Every output is checked against the float64 reference before it is timed. Times are
``triton.testing.do_bench`` medians. A table goes to stdout and the numbers to JSON.

fused-mlp is loaded the way users load it, ``kernels.get_kernel("org/fused-mlp",
version=1)``, from the Hub cache in KERNELS_CACHE (default: .hub-cache/ next to this
repository), offline unless HF_HUB_OFFLINE is set otherwise.

Usage:
    python benchmarks/bench_act_and_mul.py [--out benchmarks/results/act_and_mul_<card>.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "org/fused-mlp"
# Before huggingface_hub is imported: it reads these once.
os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _common import default_out, rel_err, run_info  # noqa: E402
from _common import copy_bandwidth as _copy_bandwidth  # noqa: E402

DEVICE = "cuda"
ROWS, D = 8192, 14336
DTYPE = torch.bfloat16
# Relative norm error allowed against the float64 reference. Ours rounds once to
# bf16 (unit roundoff 3.9e-3, RMS ~2.3e-3); eager, torch.compile and Liger round the
# activation to bf16 before the product, two roundings, still well inside 1e-2.
BF16_TOL = 1e-2
ROUNDS = 3  # timing rounds per implementation, interleaved
COPY_BYTES = 1 << 30  # source size of the copy measurement (2 GiB moved per copy)

ACTS = {
    # case name -> (fused-mlp op, plain PyTorch activation, reference activation name)
    "silu_and_mul": ("silu_and_mul", F.silu, "silu"),
    "gelu_tanh_and_mul": ("gelu_tanh_and_mul", lambda t: F.gelu(t, approximate="tanh"), "gelu_tanh"),
}


def bench(fn: Callable[[], object]) -> float:
    """Median milliseconds of fn() (do_bench flushes L2 between calls, so nothing is cached)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def check(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = BF16_TOL) -> None:
    err = rel_err(out, ref)
    if not err <= tol:
        raise SystemExit(f"[bench] {name}: relative error {err:.3g} exceeds {tol:g}; not timing it")


def copy_bandwidth() -> float:
    return _copy_bandwidth(bench, DEVICE, COPY_BYTES)


def load_liger():
    """Liger's forward functions for SwiGLU and GeGLU (tanh), or None with the reason."""
    try:
        from liger_kernel.ops.geglu import geglu_forward
        from liger_kernel.ops.swiglu import swiglu_forward
    except Exception as e:  # not installed, or its imports fail on this torch
        return None, f"{type(e).__name__}: {e}"
    return {"silu_and_mul": swiglu_forward, "gelu_tanh_and_mul": geglu_forward}, None


def run(out_path: Path, rows: int, d: int) -> dict:
    from kernels import get_kernel

    fused_mlp = get_kernel(REPO_ID, version=1)

    torch.manual_seed(0)
    copy_gbps = copy_bandwidth()
    print(f"device copy: {copy_gbps:,.0f} GB/s (read + written)")

    liger, liger_why = load_liger()
    if liger is None:
        print(f"liger_kernel not used ({liger_why})")

    # Fresh random input, not zeros: the activations' cost and any data-dependent
    # slow path must show up in the timing.
    x = torch.randn(rows, 2 * d, device=DEVICE, dtype=torch.float32).mul_(2.0).to(DTYPE)
    # Liger's kernels take gate and up as two tensors of the same row stride as the
    # output; they would copy strided halves of x (ensure_contiguous / their pointer
    # arithmetic), so they get the two halves as separate contiguous tensors, which
    # is what a model with separate gate and up projections produces. Same bytes
    # moved: read 2 * rows * d, write rows * d.
    gate, up = x[:, :d].contiguous(), x[:, d:].contiguous()
    moved = 3 * rows * d * x.element_size()

    results = []
    for case, (op_name, act, ref_act) in ACTS.items():
        ref = fused_mlp.reference.act_and_mul(x.double(), ref_act)
        op = getattr(fused_mlp, op_name)
        out = torch.full((rows, d), float("nan"), device=DEVICE, dtype=DTYPE)

        def eager(t, act=act):
            h = t.shape[-1] // 2
            return act(t[..., :h]) * t[..., h:]

        compiled = torch.compile(eager, fullgraph=True, dynamic=False)
        candidates: dict[str, Callable[[], torch.Tensor]] = {
            "ours": lambda op=op, out=out: op(out, x),
            "eager": lambda eager=eager: eager(x),
            "torch_compile": lambda compiled=compiled: compiled(x),
        }
        if liger is not None:
            candidates["liger"] = lambda f=liger[case]: f(gate, up)[2]

        for name, fn in candidates.items():
            check(f"{case}/{name}", fn(), ref)  # also compiles / JITs before timing
        del ref
        # ROUNDS interleaved rounds, the median of each implementation's round medians:
        # a slow phase of the machine then hits every implementation alike.
        per_round: dict[str, list] = {name: [] for name in candidates}
        for _ in range(ROUNDS):
            for name, fn in candidates.items():
                per_round[name].append(bench(fn))
        times = {name: sorted(v)[len(v) // 2] for name, v in per_round.items()}

        ours_ms = times.pop("ours")
        ours_gbps = moved / (ours_ms * 1e-3) / 1e9
        results.append(
            {
                "case": case,
                "shape": [rows, 2 * d],
                "dtype": str(DTYPE).replace("torch.", ""),
                "bytes_moved": moved,
                "ours_ms": round(ours_ms, 5),
                "ours_GBps": round(ours_gbps, 1),
                "fraction_of_copy": round(ours_gbps / copy_gbps, 4),
                "peers_ms": {k: round(v, 5) for k, v in times.items()},
                "rounds_ms": {k: [round(t, 5) for t in v] for k, v in per_round.items()},
                "peers_fraction_of_copy": {
                    k: round(moved / (v * 1e-3) / 1e9 / copy_gbps, 4) for k, v in times.items()
                },
            }
        )

    report = {
        **run_info(),
        "copy_bandwidth_GBps": round(copy_gbps, 1),
        "liger": None if liger is not None else f"not measured: {liger_why}",
        "rows": results,
    }
    print_table(report)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out_path}")
    return report


def print_table(report: dict) -> None:
    copy = report["copy_bandwidth_GBps"]
    print(f"\n{report['gpu']}, torch {report['torch']}, triton {report['triton']}; "
          f"copy {copy:,.0f} GB/s")
    header = f"{'case':<20} {'impl':<14} {'ms':>9} {'GB/s':>8} {'of copy':>8}"
    print(header)
    print("-" * len(header))
    for row in report["rows"]:
        entries = [("fused-mlp", row["ours_ms"])] + list(row["peers_ms"].items())
        for name, ms in entries:
            gbps = row["bytes_moved"] / (ms * 1e-3) / 1e9
            print(f"{row['case']:<20} {name:<14} {ms:>9.4f} {gbps:>8,.0f} {gbps / copy:>8.1%}")


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/act_and_mul_<card>.json")
    p.add_argument("--rows", type=int, default=ROWS, help=f"rows of the input (default {ROWS})")
    p.add_argument("--d", type=int, default=D, help=f"output width; the input is 2d wide (default {D})")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("[bench] needs a CUDA GPU")
    run(a.out or default_out("act_and_mul"), a.rows, a.d)


if __name__ == "__main__":
    main()
