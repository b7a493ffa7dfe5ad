"""Helpers shared by the GPU comparison scripts (bench_*.py)."""

from __future__ import annotations

import datetime
import importlib
import shlex
import sys
from pathlib import Path
from typing import Callable, Optional

import torch


def module_version(name: str) -> Optional[str]:
    """`name.__version__`, or None where the module does not import."""
    try:
        return importlib.import_module(name).__version__
    except Exception:
        return None


def run_info(device: str = "cuda") -> dict:
    """The head of every results file: GPU, torch and Triton versions, UTC date and the
    command line that made it."""
    return {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "triton": module_version("triton"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
    }


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; any non-finite value gives inf."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def copy_bandwidth(time_ms: Callable[[Callable[[], object]], float], device: str = "cuda",
                   nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of `nbytes` (random bf16), counting bytes read plus
    bytes written, timed with the caller's timer (median milliseconds of a callable)."""
    src = torch.randn(nbytes // 2, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise SystemExit("[bench] copy produced wrong data")
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9
