#!/usr/bin/env python3
"""Our Triton GEMM kernels in every tile config and epilogue variant, against cuBLAS, on
the benchmark cases: the backward's dh kernel (dh = dy @ W_down with the activation's
derivative in its epilogue) and the forward's first GEMM (gated: gate/up with act * mul,
with and without storing g | u for training; plain: GEMM + bias + activation).

    python benchmarks/micro/gemm_variants.py [--kernels dh,fwd] [--out benchmarks/results/gemm_variants_h200.json]

Variants: the tuner's candidate list for the shape (pointer loads; TMA for the first three
and persistent TMA for the first two, as the tuner tries them) and two larger tiles (also
as TMA and persistent TMA). dh: each with PREFETCH on and off (the epilogue's
pre-activation tiles loaded before the tile loop or after it; never with persistent
kernels), and the whole-tile epilogue (SUBTILE=0) for the first config.
References in the same process: cuBLAS's GEMM of the same shape alone, and (dh) the
unfused backward of the same step (cuBLAS dh, then PyTorch's elementwise derivative).
Each variant's output (not in place, so repeated runs read the same inputs) is checked
against float64 before it is timed. Timing: triton.testing.do_bench, median, L2 flushed
between runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import local_package, rel_err, write_report  # noqa: E402

# name -> (gated, M, K (= model dim), N (= hidden), activation); plain cases have a bias
CASES = {
    "geglu_m8192_d768_h3072": (True, 8192, 768, 3072, "gelu_tanh"),
    "mlp_gelu_tanh_m8192_d768_h3072": (False, 8192, 768, 3072, "gelu_tanh"),
    "swiglu_m4096_d4096_h14336": (True, 4096, 4096, 14336, "silu"),
    # few tokens: the gate/up GEMM streams 235 MB of weights; at 128 x 128 tiles it has
    # only 112 programs for the H200's 132 SMs (forward only: `--kernels fwd`)
    "swiglu_m128_d4096_h14336": (True, 128, 4096, 14336, "silu"),
    "swiglu_m512_d4096_h14336": (True, 512, 4096, 14336, "silu"),
}
# Extra configs beyond the tuner's list (block_m, block_n, block_k, group_m, warps, stages).
EXTRA = [(128, 256, 64, 8, 8, 3), (256, 128, 64, 8, 8, 3)]
# ... and for the gated forward at M <= 512 (weight-bandwidth bound): tiles whose shared
# memory lets two programs share an SM (<= 113 KB: 128 x 64 / 3 stages, 128 x 32 / 4),
# deeper K tiles, one wave of 128 x 128 tiles (4 stages), and TMA variants of each.
EXTRA_GATED_FEW_TOKENS = [(128, 64, 64, 8, 4, 3), (128, 32, 64, 8, 4, 4), (128, 32, 128, 8, 4, 3),
                          (64, 64, 128, 8, 4, 3), (128, 64, 128, 8, 4, 3), (128, 128, 64, 8, 8, 4),
                          (64, 32, 128, 8, 4, 4)]


# ... and persistent TMA kernels with narrower tiles (at most 64 accumulator elements per
# thread for the gated forward's two accumulators / the dh kernel's epilogue), so that the
# next tile's loads have registers to land in while this tile's epilogue runs
# (`--persistent-narrow`; session 4 tried only the 128 x 128 gated / dh tiles persistent).
EXTRA_PERSISTENT_NARROW = [(128, 64, 64, 8, 8, 4), (128, 64, 64, 8, 8, 3), (64, 128, 64, 8, 8, 4),
                           (128, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4)]
PERSISTENT_NARROW = False
# --configs: the forward's variants are exactly these (no tuner list, no extras)
ONLY_CONFIGS: list = []
# --gated-bias: the gated forward with gate and up biases (the cuBLAS references stay bias-free)
GATED_BIAS = False
# --fast-tanh: every variant also with FUSED_MLP_FAST_TANH=0 (the exact activation forms); without
# it, the package's default (the tanh.approx forms for 16-bit outputs)
FAST_TANH = ("1",)


def variants_of(tg, cands: list, extra: bool = True, few_tokens: bool = False) -> list:
    """The candidates plus EXTRA (if `extra`), each extra also as TMA and persistent TMA;
    few_tokens: plus EXTRA_GATED_FEW_TOKENS, each also as TMA; with PERSISTENT_NARROW,
    EXTRA_PERSISTENT_NARROW as persistent TMA kernels."""
    more = [tg.Config(*e) for e in EXTRA] if extra else []
    more += [c._replace(tma=True) for c in more] + [c._replace(tma=True, persistent=True) for c in more]
    if few_tokens:
        few = [tg.Config(*e) for e in EXTRA_GATED_FEW_TOKENS]
        more += few + [c._replace(tma=True) for c in few]
    if PERSISTENT_NARROW:
        more += [tg.Config(*e)._replace(tma=True, persistent=True) for e in EXTRA_PERSISTENT_NARROW]
    return list(dict.fromkeys(cands + more))


def label(cfg) -> str:
    kind = " persistent" if cfg.persistent else " tma" if cfg.tma else ""
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}{kind}"


def timed(rows: list, base: dict, name: str, run, check, bench) -> None:
    """One variant: run it once, check it (check() -> relative error against float64; None
    for cuBLAS references, which are not checked), time it."""
    row = {**base, "variant": name}
    try:
        run()
        torch.cuda.synchronize()
    except Exception as e:  # does not fit this GPU, or does not compile
        row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
        rows.append(row)
        print(f"[gemm]   {name}: {row['error']}", flush=True)
        return
    err = row["rel_err"] = check() if check is not None else None
    if err is not None and not err < 1e-2:
        row["error"] = "wrong result"
    else:
        row["ms"] = bench(run)
    rows.append(row)
    print(f"[gemm]   {name}: {row.get('ms', float('nan')) * 1e3:7.1f} us"
          + (f"  err {err:.1e}" if err is not None else ""), flush=True)


def dh_case(tg, acts, name, gated, m, k, n, act, bench, rows) -> None:
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    dy = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    wd = torch.randn(k, n, device="cuda", dtype=dtype, generator=g) * k**-0.5  # nn.Linear's [D, H]
    pre = torch.randn(m, (2 if gated else 1) * n, device="cuda", dtype=dtype, generator=g)
    f, df = acts.torch_activation(act), acts.torch_activation_derivative(act)
    dh = dy.double() @ wd.double()
    z = pre[:, :n].double()
    want = torch.cat([dh * pre[:, n:].double() * df(z), dh * f(z)], 1) if gated else dh * df(z)
    del dh, z
    act_id = acts.ACTIVATION_IDS[act]
    out = torch.empty_like(pre)
    base = {"kernel": "dh", "case": name, "m": m, "k": k, "n": n, "gated": gated}
    timed(rows, base, "cublas_mm", lambda: torch.mm(dy, wd), None, bench)

    def unfused():
        d = torch.mm(dy, wd)
        if gated:
            zz, uu = pre[:, :n].float(), pre[:, n:].float()
            torch.cat([d * uu * df(zz), d * f(zz)], 1, out=out)
        else:
            torch.mul(d, df(pre.float()), out=out)
    out.fill_(float("nan"))
    timed(rows, base, "cublas_then_torch_elementwise", unfused, lambda: rel_err(out, want), bench)

    cands = variants_of(tg, tg.candidates(False, m, n, k, dtype, tma=True, table=tg._BWD_CONFIGS))
    runs = [(c._replace(prefetch=p), "1") for c in cands for p in ((False,) if c.persistent else (False, True))]
    runs += [(cands[0]._replace(prefetch=p), "0") for p in (False, True)]
    if ONLY_CONFIGS:
        runs = [(tg.Config(*c)._replace(prefetch=p), "1") for c in ONLY_CONFIGS for p in (False, True)]
    for cfg, subtile in runs:
        for fast in FAST_TANH:
            os.environ["FUSED_MLP_BWD_SUBTILE"] = subtile
            os.environ["FUSED_MLP_FAST_TANH"] = fast
            out.fill_(float("nan"))
            timed(rows, {**base, "config": list(cfg), "prefetch": cfg.prefetch, "subtile": subtile == "1",
                         "fast_tanh": fast == "1"},
                  f"{label(cfg)} prefetch={int(cfg.prefetch)} subtile={subtile}" + (" fast_tanh" if fast == "1" else ""),
                  lambda: tg.linear_dact(dy, wd, True, pre, out, act_id, gated=gated, config=cfg),
                  lambda: rel_err(out, want), bench)
    os.environ.pop("FUSED_MLP_BWD_SUBTILE", None)
    os.environ.pop("FUSED_MLP_FAST_TANH", None)


def fwd_case(tg, acts, name, gated, m, k, n, act, bench, rows) -> None:
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    w1 = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * k**-0.5
    f = acts.torch_activation(act)
    act_id = acts.ACTIVATION_IDS[act]
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    bg = bu = None
    if gated:
        w2 = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * k**-0.5
        gd, ud = x.double() @ w1.double().t(), x.double() @ w2.double().t()
        if GATED_BIAS:
            bg, bu = (torch.randn(n, device="cuda", dtype=dtype, generator=g) for _ in range(2))
            gd, ud = gd + bg.double(), ud + bu.double()
        want, want_pre = f(gd) * ud, torch.cat([gd, ud], 1)
        pre = torch.empty(m, 2 * n, device="cuda", dtype=dtype)
        w12 = torch.cat([w1, w2])
        timed(rows, {"kernel": "fwd", "case": name}, "cublas_x_wgu", lambda: torch.mm(x, w12.t()), None, bench)
        del w12
        # the MLP's second GEMM, for the split of the whole forward's time
        hh, wd = torch.randn(m, n, device="cuda", dtype=dtype, generator=g), w1.t().contiguous()
        timed(rows, {"kernel": "fwd", "case": name}, "cublas_down", lambda: torch.mm(hh, wd.t()), None, bench)
        del hh, wd
    else:
        b1 = torch.randn(n, device="cuda", dtype=dtype, generator=g)
        pd = x.double() @ w1.double().t() + b1.double()
        want, want_pre = f(pd), pd
        pre = torch.empty(m, n, device="cuda", dtype=dtype)
        timed(rows, {"kernel": "fwd", "case": name}, "cublas_linear_bias", lambda: torch.nn.functional.linear(x, w1, b1),
              None, bench)
    modes = (("infer", None), ("train", pre))  # train: the pre-activations stored too
    few_tokens = gated and m <= 512
    if few_tokens:  # (inference sizes: the training mode is not timed)
        modes = modes[:1]
    # (no larger tiles for the gated kernel: two 128 x 256 accumulators do not fit the registers)
    cands = variants_of(tg, tg.candidates(gated, m, n, k, dtype, tma=True), extra=not gated, few_tokens=few_tokens)
    if ONLY_CONFIGS:
        cands = [tg.Config(*c) for c in ONLY_CONFIGS]
    for mode, p, fast in ((mode, p, fast) for mode, p in modes for fast in FAST_TANH):
        os.environ["FUSED_MLP_FAST_TANH"] = fast
        for cfg in cands:
            def run(cfg=cfg, p=p):
                if gated:
                    tg.gated_linear(x, w1, w2, bg, bu, act_id, config=cfg, pre=p, out=out)
                else:
                    tg.linear_act(x, w1, b1, act_id, config=cfg, pre=p, out=out)

            def check(p=p):
                err = rel_err(out, want)
                return max(err, rel_err(p, want_pre)) if p is not None else err
            out.fill_(float("nan"))
            if p is not None:
                p.fill_(float("nan"))
            timed(rows, {"kernel": "fwd", "case": name, "mode": mode, "config": list(cfg), "fast_tanh": fast == "1",
                         **({"gated_bias": True} if gated and GATED_BIAS else {})},
                  f"{mode} {label(cfg)}" + (" fast_tanh" if fast == "1" else ""), run, check, bench)
    os.environ.pop("FUSED_MLP_FAST_TANH", None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/gemm_variants_h200.json"))
    ap.add_argument("--kernels", default="dh,fwd")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--persistent-narrow", action="store_true", help="also EXTRA_PERSISTENT_NARROW (see there)")
    ap.add_argument("--configs", default="",
                    help="only these configs (forward; dh with prefetch off and on): 'bm,bn,bk,group_m,warps,stages[,tma[,persistent]];...' "
                         "(tma / persistent as 0 or 1)")
    ap.add_argument("--gated-bias", action="store_true", help="the gated forward with gate and up biases")
    ap.add_argument("--fast-tanh", action="store_true",
                    help="time every variant with FUSED_MLP_FAST_TANH=0 and =1 (forward and dh)")
    args = ap.parse_args()
    global PERSISTENT_NARROW, GATED_BIAS, FAST_TANH
    GATED_BIAS = args.gated_bias
    FAST_TANH = ("0", "1") if args.fast_tanh else ("1",)
    PERSISTENT_NARROW = args.persistent_narrow
    for spec in filter(None, args.configs.split(";")):
        try:
            v = [int(t) for t in spec.split(",")]
        except ValueError:
            v = []
        if len(v) not in (6, 7, 8):
            ap.error(f"--configs: {spec!r} needs 6 to 8 integers")
        ONLY_CONFIGS.append(tuple(v[:6]) + tuple(bool(t) for t in v[6:]))
    if not torch.cuda.is_available():
        raise SystemExit("[gemm] needs a CUDA GPU")
    import triton.testing

    fm, tg = local_package("triton_gemm")
    rows: list = []

    def bench(fn) -> float:
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    kernels = args.kernels.split(",")
    for name in args.cases.split(","):
        for kernel, fn in (("dh", dh_case), ("fwd", fwd_case)):
            if kernel in kernels:
                print(f"[gemm] {kernel} {name}", flush=True)
                fn(tg, fm.activations, name, *CASES[name], bench, rows)
                timed_rows = [r for r in rows if r["case"] == name and r.get("kernel") == kernel and "ms" in r]
                ours = [r for r in timed_rows if "config" in r]
                for mode in sorted({r.get("mode") for r in ours}, key=str):
                    best = min((r for r in ours if r.get("mode") == mode), key=lambda r: r["ms"])
                    refs = ", ".join(f"{r['variant']} {r['ms'] * 1e3:.1f}" for r in timed_rows if "config" not in r)
                    print(f"[gemm] {kernel} {name}: best {best['variant']} {best['ms'] * 1e3:.1f} us ({refs})",
                          flush=True)

    write_report(args.out, rows)
    print(f"[gemm] wrote {args.out}")


if __name__ == "__main__":
    main()
