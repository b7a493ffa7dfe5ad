#!/usr/bin/env python3
"""The plain MLP's first GEMM with bias + activation in cuBLASLt's epilogue, as PyTorch
exposes it (torch._addmm_activation: bias + GELU (tanh form) or bias + ReLU), against our
Triton kernel (linear_act, tuned; run with FUSED_MLP_CUBLASLT=0, which this script sets, since
linear_act itself may choose cuBLASLt's epilogue now) and cuBLAS without the epilogue, and
the whole plain MLP with each first GEMM.

    python benchmarks/micro/lt_epilogue.py [--out FILE]

For each case: which GPU kernels _addmm_activation launches (torch.profiler: one kernel
means the epilogue ran inside the GEMM, two means PyTorch fell back to addmm + an
activation kernel); its error against float64 with the tanh GELU and with the erf GELU
(which of the two cuBLASLt computes); then times. Timing: triton.testing.do_bench,
median, L2 flushed between runs."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import local_package, median_us, rel_err, write_report  # noqa: E402

# name -> (M, D, H, dtype, weight layout)
CASES = {
    "m8192_d768_h3072_bf16": (8192, 768, 3072, torch.bfloat16, "linear"),
    "m8192_d768_h3072_fp16": (8192, 768, 3072, torch.float16, "linear"),
    "m8192_d768_h3072_bf16_conv1d": (8192, 768, 3072, torch.bfloat16, "conv1d"),
    "m777_d768_h3072_bf16": (777, 768, 3072, torch.bfloat16, "linear"),
    "m4096_d1024_h4096_bf16": (4096, 1024, 4096, torch.bfloat16, "linear"),
    "m16384_d1024_h4096_bf16": (16384, 1024, 4096, torch.bfloat16, "linear"),
}


def kernel_names(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    os.environ["FUSED_MLP_CUBLASLT"] = "0"  # "ours" = our kernel; the cuBLASLt path is timed directly
    _, tg, activations = local_package("triton_gemm", "activations")
    ids = activations.ACTIVATION_IDS
    rows = []
    for name, (m, d, hdim, dt, layout) in CASES.items():
        g = torch.Generator(device="cuda").manual_seed(m + d)
        x = torch.randn(m, d, device="cuda", dtype=dt, generator=g)
        w = torch.randn(hdim, d, device="cuda", dtype=dt, generator=g) * d**-0.5
        b = torch.randn(hdim, device="cuda", dtype=dt, generator=g) * 0.5
        w2 = torch.randn(d, hdim, device="cuda", dtype=dt, generator=g) * hdim**-0.5
        b2 = torch.randn(d, device="cuda", dtype=dt, generator=g) * 0.5
        if layout == "conv1d":  # GPT-2's [in, out] storage, read as is
            w_store, w2_store = w.t().contiguous(), w2.t().contiguous()
            w_kn, w2_kn = w_store, w2_store
        else:
            w_store, w2_store = w, w2
            w_kn, w2_kn = w.t(), w2.t()
        pre64 = x.double() @ w.double().t() + b.double()
        want = {"gelu_tanh": F.gelu(pre64, approximate="tanh"), "gelu_erf": F.gelu(pre64), "relu": F.relu(pre64)}
        row = {"case": name}
        for act in ("gelu_tanh", "relu"):
            use_gelu = act == "gelu_tanh"

            def lt():
                return torch._addmm_activation(b, x, w_kn, use_gelu=use_gelu)

            out = lt()
            row[f"lt_{act}_kernels"] = kernel_names(lt)
            row[f"lt_{act}_err"] = rel_err(out, want[act])
            if use_gelu:
                row["lt_gelu_err_vs_erf"] = rel_err(out, want["gelu_erf"])
            ours_out = tg.linear_act(x, w_store, b, ids[act], layout)
            row[f"ours_{act}_err"] = rel_err(ours_out, want[act])
            row[f"lt_{act}_us"] = median_us(lt)
            row[f"ours_{act}_us"] = median_us(lambda: tg.linear_act(x, w_store, b, ids[act], layout))
            print(f"[lt] {name} {act}: lt {row[f'lt_{act}_us']:.1f} us (err {row[f'lt_{act}_err']:.1e}, "
                  f"kernels {row[f'lt_{act}_kernels']}) ours {row[f'ours_{act}_us']:.1f} us "
                  f"(err {row[f'ours_{act}_err']:.1e})", flush=True)
        row["addmm_us"] = median_us(lambda: torch.addmm(b, x, w_kn))
        row["addmm_gelu_us"] = median_us(lambda: F.gelu(torch.addmm(b, x, w_kn), approximate="tanh"))
        # whole plain MLP (gelu_tanh): our op's path, Lt first GEMM + cuBLAS second, eager
        gid = ids["gelu_tanh"]
        row["mlp_ours_us"] = median_us(lambda: tg.mlp(x, w_store, b, w2_store, b2, gid, layout))
        row["mlp_lt_us"] = median_us(lambda: torch.addmm(b2, torch._addmm_activation(b, x, w_kn, use_gelu=True), w2_kn))
        row["mlp_eager_us"] = median_us(
            lambda: torch.addmm(b2, F.gelu(torch.addmm(b, x, w_kn), approximate="tanh"), w2_kn))
        print(f"[lt] {name}: addmm {row['addmm_us']:.1f} addmm+gelu {row['addmm_gelu_us']:.1f} | mlp ours "
              f"{row['mlp_ours_us']:.1f} lt {row['mlp_lt_us']:.1f} eager {row['mlp_eager_us']:.1f} us | "
              f"lt gelu err vs erf {row['lt_gelu_err_vs_erf']:.1e}", flush=True)
        rows.append(row)
    write_report(args.out, rows)


if __name__ == "__main__":
    main()
