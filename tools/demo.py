#!/usr/bin/env python3
"""The main job's report: load fused-mlp through the Kernel Hub loader, check every
kernel against the plain-PyTorch reference, kernelize tiny models, and on a GPU
machine time the kernels against eager PyTorch.

Run through tools/demo.sh (which builds and stages the kernel first).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_models import rel_err  # noqa: E402  (benchmarks/_common's, ||out - ref|| / ||ref|| in fp64)

REPO_ID = "org/fused-mlp"


# Relative-error bounds per dtype for one rounding of the output (act-and-mul) and
# for a whole MLP (bf16 GEMM inputs are rounded to 8 mantissa bits).
BOUNDS = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
MLP_BOUNDS = {torch.float32: 1e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def check(label: str, err: float, bound: float, failures: list[str]) -> None:
    ok = err <= bound
    print(f"  {label:<46} rel err {err:9.2e}  (bound {bound:.0e})  {'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(label)


def check_kernels(fm, device: str, failures: list[str]) -> None:
    print(f"\n== act-and-mul ops vs reference ({device}) ==")
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    for dt in dtypes:
        x = torch.randn(257, 2 * 1003, device=device, dtype=dt)
        for act in ("silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"):
            out = torch.full((257, 1003), float("nan"), device=device, dtype=dt)
            fm.act_and_mul(out, x, act)
            ref = fm.reference.act_and_mul(x.double(), act)
            check(f"{act}_and_mul {str(dt).replace('torch.', '')}", rel_err(out, ref), BOUNDS[dt], failures)

    print(f"\n== fused MLPs vs reference ({device}) ==")
    for dt in dtypes:
        m, d, h = 77, 200, 328
        x = torch.randn(m, d, device=device, dtype=dt)
        wg, wu = (torch.randn(h, d, device=device, dtype=dt) / d**0.5 for _ in range(2))
        wd = torch.randn(d, h, device=device, dtype=dt) / h**0.5
        name = str(dt).replace("torch.", "")
        for act in ("silu", "gelu_tanh"):
            y = fm.gated_mlp(x, wg, wu, wd, act)
            ref = fm.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), act)
            check(f"gated_mlp {act} {name}", rel_err(y, ref), MLP_BOUNDS[dt], failures)
        w1 = torch.randn(h, d, device=device, dtype=dt) / d**0.5
        b1 = torch.randn(h, device=device, dtype=dt)
        w2 = torch.randn(d, h, device=device, dtype=dt) / h**0.5
        b2 = torch.randn(d, device=device, dtype=dt)
        y = fm.mlp(x, w1, b1, w2, b2, "gelu_tanh")
        ref = fm.reference.mlp(x.double(), w1.double(), b1.double(), w2.double(), b2.double(), "gelu_tanh")
        check(f"mlp gelu_tanh +bias {name}", rel_err(y, ref), MLP_BOUNDS[dt], failures)
    explain = getattr(getattr(fm, "dispatch", None), "explain", None)
    if explain is not None:
        try:
            x = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
            print(f"  dispatcher for a [4096, 4096] input on {device}: {explain(x, 'gated')}")
        except Exception as e:  # the report is informative only
            print(f"  dispatcher: explain() unavailable ({e})")


def time_gpu(fm) -> None:
    from demo_models import bench_interleaved

    print(f"\n== timings ({torch.cuda.get_device_name()}, median of triton.testing.do_bench blocks, taking turns) ==")
    torch.manual_seed(0)
    x = torch.randn(8192, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8192, 14336, device="cuda", dtype=torch.bfloat16)
    t_ours, t_eager = bench_interleaved({
        "ours": lambda: fm.silu_and_mul(out, x),
        "eager": lambda: torch.nn.functional.silu(x[:, :14336]) * x[:, 14336:],
    }).values()
    gb = 3 * out.numel() * out.element_size() / 1e9
    print(f"  silu_and_mul 8192x28672 bf16: {t_ours * 1e3:7.1f} us ({gb / (t_ours * 1e-3):.0f} GB/s), eager {t_eager * 1e3:7.1f} us")

    m, d, h = 4096, 4096, 14336
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    wg, wu = (torch.randn(h, d, device="cuda", dtype=torch.bfloat16) * d**-0.5 for _ in range(2))
    wd = torch.randn(d, h, device="cuda", dtype=torch.bfloat16) * h**-0.5
    t_ours, t_eager = bench_interleaved({
        "ours": lambda: fm.gated_mlp(x, wg, wu, wd, "silu"),
        "eager": lambda: fm.reference.gated_mlp(x, wg, wu, wd, "silu"),
    }).values()
    print(f"  SwiGLU MLP M={m} {d}->{h} bf16: fused {t_ours * 1e3:7.1f} us, eager {t_eager * 1e3:7.1f} us, "
          f"speedup {t_eager / t_ours:.2f}x")

    m, d, h = 8192, 768, 3072  # GPT-2 small's MLP (bias, gelu_tanh) over 8192 tokens
    x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(h, d, device="cuda", dtype=torch.bfloat16) * d**-0.5
    w2 = torch.randn(d, h, device="cuda", dtype=torch.bfloat16) * h**-0.5
    b1, b2 = torch.randn(h, device="cuda", dtype=torch.bfloat16), torch.randn(d, device="cuda", dtype=torch.bfloat16)
    args = (x, w1, b1, w2, b2, "gelu_tanh")
    t_ours, t_eager = bench_interleaved({
        "ours": lambda: fm.mlp(*args),
        "eager": lambda: fm.reference.mlp(*args, "linear"),
    }).values()
    print(f"  plain MLP (bias, gelu_tanh) M={m} {d}->{h} bf16: fused {t_ours * 1e3:7.1f} us, "
          f"eager {t_eager * 1e3:7.1f} us, speedup {t_eager / t_ours:.2f}x")


def main() -> int:
    from kernels import get_kernel

    t0 = time.time()
    fm = get_kernel(REPO_ID, version=1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"fused-mlp loaded with get_kernel({REPO_ID!r}, version=1) in {time.time() - t0:.1f}s")
    print(f"  module {fm.__name__}, from {Path(fm.__file__).parent}")
    print(f"  torch {torch.__version__}, device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")

    torch.manual_seed(0)
    failures: list[str] = []
    check_kernels(fm, device, failures)

    try:
        import demo_models
    except ImportError as e:
        print(f"\n(model demo unavailable: {e})")
    else:
        failures += demo_models.run(fm, device)

    if device == "cuda" and not os.environ.get("FUSED_MLP_DEMO_NO_TIMING"):
        time_gpu(fm)

    print(f"\n{'ALL CHECKS PASSED' if not failures else 'FAILED: ' + ', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
