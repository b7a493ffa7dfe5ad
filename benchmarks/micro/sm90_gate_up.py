#!/usr/bin/env python3
"""The warp-specialized sm_90a gate/up kernel (kernel_src/cuda/gated_gemm_sm90.cu, op
`gated_gemm_sm90`) against the Triton gated kernel and cuBLAS, on the GPU:

    python benchmarks/micro/sm90_gate_up.py [--out benchmarks/results/sm90_gate_up_h200.json]

1. Correctness: fresh random inputs, awkward shapes (M = 1, 3, 777; N and K not multiples
   of the tile), every activation, bf16 and fp16, with and without biases and the training
   store of g | u; outputs poisoned with NaN first; error against float64 printed beside the
   Triton kernel's on the same inputs. A failure is reported and makes the exit status 1.
2. Timing (triton.testing.do_bench median, L2 flushed): the benchmark cases' gate/up GEMM
   as the sm90 op (its own tile width, and 128 / 112 forced), the Triton kernel (the
   tuner's pick) and cuBLAS's x @ [Wg; Wu] (the same FLOPs without the epilogue), inference
   and training (storing g | u); and the backward's dh GEMM with the derivative epilogue
   (gated): the sm90 op (without and with the down weight's transposed copy), the Triton
   kernel, cuBLAS's bare dy @ Wd; and the plain MLP's first GEMM + bias + gelu_tanh at d768
   (sm90 op, Triton, cuBLASLt's epilogue, cuBLAS's GEMM + bias).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import local_package, median_us, rel_err, write_report  # noqa: E402

ACTS = ["silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"]
# (M, K, N): awkward sizes, then the benchmark shapes
CHECK_SHAPES = [(1, 64, 8), (3, 200, 136), (777, 520, 1000), (4096, 768, 3072), (300, 4096, 1432)]
TIME_CASES = {
    "geglu_m8192_d768_h3072": (8192, 768, 3072, "gelu_tanh"),
    "swiglu_m4096_d4096_h14336": (4096, 4096, 14336, "silu"),
    "swiglu_m16384_d4096_h14336": (16384, 4096, 14336, "silu"),
    "swiglu_m512_d4096_h14336": (512, 4096, 14336, "silu"),
    "swiglu_m128_d4096_h14336": (128, 4096, 14336, "silu"),
}


def reference(fm, x, wg, wu, bg, bu, act):
    """(act(g) * u, g, u) in float64, with the package's plain-PyTorch activation."""
    g = x.double() @ wg.double().t() + (0 if bg is None else bg.double())
    u = x.double() @ wu.double().t() + (0 if bu is None else bu.double())
    return fm.activations.torch_activation(act)(g) * u, g, u


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    # tg.gated_linear would call the sm90 kernel itself: keep it on its Triton kernel here.
    os.environ["FUSED_MLP_SM90"] = "0"
    fm, tg, ops_mod = local_package("triton_gemm", "_ops")
    ops = ops_mod.ops
    if not hasattr(ops, "gated_gemm_sm90"):
        print("[sm90] this build has no gated_gemm_sm90 (not built for sm_90a)")
        return 1
    ids = fm.activations.ACTIVATION_IDS
    rows, failures = [], 0
    torch.manual_seed(0)
    if not args.skip_check:
        for (m, k, n) in CHECK_SHAPES:
            for dtype in (torch.bfloat16, torch.float16):
                for act in ACTS:
                    for bias in (False, True):
                        for train in (False, True):
                            if (m, k, n) == (4096, 768, 3072) and (act != "gelu_tanh" or dtype != torch.bfloat16):
                                continue
                            x = torch.randn(m, k, device="cuda", dtype=dtype)
                            wg = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
                            wu = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
                            bg = torch.randn(n, device="cuda", dtype=dtype) if bias else None
                            bu = torch.randn(n, device="cuda", dtype=dtype) if bias else None
                            out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
                            pre = torch.full((m, 2 * n), float("nan"), device="cuda", dtype=dtype) if train else None
                            ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, pre, ids[act])
                            want, g, u = reference(fm, x, wg, wu, bg, bu, act)
                            tri = tg.gated_linear(x, wg, wu, bg, bu, ids[act])
                            e, e_tri = rel_err(out, want), rel_err(tri, want)
                            e_pre = rel_err(pre, torch.cat([g, u], 1)) if train else 0.0
                            tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
                            ok = e <= max(tol, 2 * e_tri) and e_pre <= tol
                            failures += not ok
                            rows.append({"check": [m, k, n], "dtype": str(dtype), "act": act, "bias": bias,
                                         "train": train, "rel_err": e, "rel_err_triton": e_tri,
                                         "rel_err_pre": e_pre, "ok": ok})
                            if not ok or (act == "gelu_tanh" and not bias):
                                print(f"[sm90] check M={m} K={k} N={n} {dtype} {act} bias={bias} train={train}: "
                                      f"err {e:.2e} (triton {e_tri:.2e}) pre {e_pre:.2e} {'ok' if ok else 'FAIL'}",
                                      flush=True)
        print(f"[sm90] checks: {len(rows) - failures} ok, {failures} failed", flush=True)

    for name, (m, k, n, act) in TIME_CASES.items():
        dtype = torch.bfloat16
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        wg = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        wu = torch.randn(n, k, device="cuda", dtype=dtype) / k**0.5
        wgu = torch.cat([wg, wu])
        out = torch.empty(m, n, device="cuda", dtype=dtype)
        pre = torch.empty(m, 2 * n, device="cuda", dtype=dtype)
        aid = ids[act]
        res = {
            "cublas_x_wgu": median_us(lambda: torch.mm(x, wgu.t())),
            "triton_infer": median_us(lambda: tg.gated_linear(x, wg, wu, None, None, aid, out=out)),
            "sm90_infer": median_us(lambda: ops.gated_gemm_sm90(out, x, wg, wu, None, None, None, aid)),
            "sm90_infer_bn128": median_us(lambda: ops.gated_gemm_sm90(out, x, wg, wu, None, None, None, aid, 128)),
            "sm90_infer_bn112": median_us(lambda: ops.gated_gemm_sm90(out, x, wg, wu, None, None, None, aid, 112)),
            "triton_train": median_us(lambda: tg.gated_linear(x, wg, wu, None, None, aid, pre=pre, out=out)),
            "sm90_train": median_us(lambda: ops.gated_gemm_sm90(out, x, wg, wu, None, None, pre, aid)),
        }
        bg = torch.randn(n, device="cuda", dtype=dtype)
        bu = torch.randn(n, device="cuda", dtype=dtype)
        res["triton_infer_bias"] = median_us(lambda: tg.gated_linear(x, wg, wu, bg, bu, aid, out=out))
        res["sm90_infer_bias"] = median_us(lambda: ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, None, aid))
        # The backward's dh GEMM with the derivative epilogue into a scratch buffer (every run
        # reads the same g | u), the same in place (last: it overwrites g | u, whose values
        # then drift from run to run; the timing does not depend on them), and cuBLAS's
        # bare dy @ Wd.
        wd = torch.randn(k, n, device="cuda", dtype=dtype) / n**0.5  # down weight [dim, hidden]
        dy = torch.randn(m, k, device="cuda", dtype=dtype)
        gu = torch.randn(m, 2 * n, device="cuda", dtype=dtype)
        scratch = torch.empty_like(gu)
        res["cublas_dh"] = median_us(lambda: torch.mm(dy, wd))
        res["triton_dact"] = median_us(lambda: tg.linear_dact(dy, wd, True, gu, scratch, aid, gated=True))
        if hasattr(ops, "dact_gemm_sm90"):
            res["sm90_dact"] = median_us(lambda: ops.dact_gemm_sm90(scratch, dy, wd, gu, aid, True, True))
            res["sm90_dact_in_place"] = median_us(lambda: ops.dact_gemm_sm90(gu, dy, wd, gu, aid, True, True))
        def tflops(key: str) -> float:  # MFLOP: dh is one GEMM of [M, K] x [K, N]; gate/up two
            return 2 * m * k * n * (1 if ("dh" in key or "dact" in key) else 2) / 1e6

        print(f"[sm90] {name}: " + ", ".join(f"{key} {v:.1f} us ({tflops(key) / v:.0f} TF/s)" for key, v in res.items()),
              flush=True)
        rows.append({"case": name, "m": m, "k": k, "n": n, "act": act, "us": res})
    # The plain MLP's first GEMM + bias + gelu_tanh at d768: cuBLAS's GEMM + bias alone,
    # cuBLASLt's bias + GELU epilogue (the current default there), our Triton kernel, sm90.
    if hasattr(ops, "linear_act_sm90"):
        m, k, n = 8192, 768, 3072
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        aid = ids["gelu_tanh"]
        os.environ["FUSED_MLP_CUBLASLT"] = "0"  # linear_act on its Triton kernel
        res = {
            "cublas_addmm": median_us(lambda: torch.addmm(b, x, w.t())),
            "cublaslt_bias_gelu": median_us(lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
            "triton_linear_act": median_us(lambda: tg.linear_act(x, w, b, aid, out=out)),
            "sm90_linear_act": median_us(lambda: ops.linear_act_sm90(out, x, w, b, None, aid)),
        }
        print("[sm90] mlp_gelu_tanh_m8192_d768_h3072: " + ", ".join(f"{key} {v:.1f} us" for key, v in res.items()),
              flush=True)
        rows.append({"case": "mlp_gelu_tanh_m8192_d768_h3072", "m": m, "k": k, "n": n, "act": "gelu_tanh", "us": res})
    write_report(args.out, rows, failures=failures)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
