"""Helpers shared by the GPU comparison scripts (bench_*.py)."""

from __future__ import annotations

from typing import Callable

import torch


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
