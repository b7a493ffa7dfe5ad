#!/usr/bin/env python3
"""Training-step benchmark (forward + backward) of fused-mlp against its peers, in one
process on one GPU.

    KERNELS_CACHE=.hub-cache HF_HUB_OFFLINE=1 python benchmarks/bench_train.py [--variants] [--cases geglu]

fused-mlp is loaded the way users load it: kernels.get_kernel("org/fused-mlp", version=1).

One step is y = f(x); y.backward(dy) with x and every weight (and bias) requiring grad;
the gradients are set to None between steps (do_bench's grad_to_none). Per case:

    ours            fused_mlp.gated_mlp / fused_mlp.mlp (saves the pre-activations)
    ours_recompute  the same with recompute=True (saves the inputs only)
    eager           F.linear + activation + multiply + F.linear, PyTorch autograd
    compile         torch.compile (default mode, static shapes, compiled afresh per case) of eager
    liger           Liger-Kernel's fused act*mul autograd functions between F.linear calls
                    (gated cases, if importable)
    floor           max(FLOPs / matmul rate, minimal bytes / copy bandwidth): 3x the forward's
                    FLOPs; x, weights and dy read once, y, dx and the weight gradients written

Before timing, every implementation's gradients are compared with fp32 eager autograd on
the same rounded inputs (TF32 off); a wrong one is reported and not timed. Timing "events":
triton.testing.do_bench, median, L2 flushed between steps. Peak memory: the most memory
allocated during one step over what was allocated before it (inputs, weights and dy
excluded; the gradients the step creates included).

--graph also times each step as one CUDA-graph replay (forward and backward captured
together, gradients written into the graph's own buffers): GPU time without the host's
launch overhead, a "graph" row next to each "events" row. Where the two differ, the events
timing measured Python and launches, not kernels.

--variants also times alternatives of our backward on the same cases:
    dx=triton       dx = dg Wg + du Wu by the dual-operand Triton kernel (default: cuBLAS
                    mm + addmm_, one mm for a packed weight)
    no_subtile      the dh kernel's epilogue on whole tiles (default: two column halves)
    recompute       recompute=True as the op runs it (next to its alternatives, same loop)
    recompute_chunk_256mb  recompute=True with fewer, larger hidden-column chunks
    recompute_plain_chunks recompute=True with every chunk in one buffer of the chunk budget
                    (FUSED_MLP_RECOMPUTE_IN_GRADS=0; default: chunks in [dWg; dWu]'s later rows)
    backward=reference     our forward, PyTorch ops for the backward (what the fusion is worth)
    not_in_place    dg | du into a new buffer (what retain_graph / torch.compile get)
    packed          gated_mlp_packed on one [2H, D] weight (dx and [dWg; dWu] in one GEMM each)
    forward_only    ours' training forward (saving g | u and h) and eager's forward with grad
                    enabled, no backward: the backward is the rest of the step
    kernel:*        our Triton kernels alone against cuBLAS GEMMs of the same shape (is the
                    Triton tile loop as fast as cuBLAS here?): the training forward's fused
                    gate/up kernel (storing h and g | u) vs x [Wg; Wu]^T; the dh kernel with its
                    derivative epilogue (in place) vs dy Wd; the dual-operand dx kernel vs
                    mm + addmm_

--profile also runs 5 steps of each implementation under torch.profiler and prints the GPU
kernels of one step with their times (profile_post.kernel_table), stored under "profile" in
the JSON: where each implementation's step time goes.

Output: a table on stdout, JSON in --out (rows of {case, timing, ours_ms, peers_ms,
ours_recompute_ms, peak_mem_mb, floor_ms}).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _common import default_out, graphed, module_version, rel_err, run_info  # noqa: E402  (same directory)
import bench_mlp  # noqa: E402
from bench_mlp import Case as ForwardCase  # noqa: E402
from bench_mlp import Timer, ceilings, eager_gated, eager_mlp, load_liger  # noqa: E402

PEERS = ("eager", "compile", "liger")
MEM_KEYS = ("ours", "ours_recompute") + PEERS
TOL = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}


class Case(ForwardCase):
    """A forward case of bench_mlp, timed as forward + backward."""

    @property
    def flops(self) -> float:
        return 3 * super().flops  # the backward is two GEMMs per forward GEMM

    @property
    def min_bytes(self) -> float:
        """x, dy, the weights read once; y, dx, the weight (and bias) gradients written once."""
        n_w = (3 if self.kind == "gated" else 2) * self.h * self.d
        n_b = (self.h + self.d) if self.bias else 0
        return float(4 * self.m * self.d + 2 * (n_w + n_b)) * torch.finfo(self.dtype).bits / 8


def all_cases() -> list[Case]:
    bf = torch.bfloat16
    return [
        Case("geglu_m8192_d768_h3072_bf16_train", "gated", "gelu_tanh", 8192, 768, 3072, bf, False),
        Case("swiglu_m4096_d4096_h14336_bf16_train", "gated", "silu", 4096, 4096, 14336, bf, False),
        Case("mlp_gelu_tanh_m8192_d768_h3072_bf16_train", "mlp", "gelu_tanh", 8192, 768, 3072, bf, True),
        # GPT-2's MLP: Conv1D weights [in, out] (kind "conv1d"), eager as GPT-2 runs it (addmm)
        Case("gpt2_mlp_conv1d_m8192_d768_h3072_bf16_train", "conv1d", "gelu_tanh", 8192, 768, 3072, bf, True),
    ]


def eager_conv1d(x, w1, b1, w2, b2, activation: str):
    """GPT-2's MLP as transformers' Conv1D computes it: addmm with the [in, out] weights."""
    h = bench_mlp._ACT[activation](torch.addmm(b1, x, w1))
    return torch.addmm(b2, h, w2)


# ----------------------------------------------------------------------------- implementations

def make_inputs(c: Case, seed: int, device: str = "cuda") -> dict:
    """bench_mlp's inputs (x, weights, biases) requiring grad, and dy."""
    t = bench_mlp.make_inputs(c, device, seed)
    del t["h_buf"]  # the forward benchmark's gemms_only input
    if c.kind == "conv1d":  # Conv1D's layout: the same weights transposed, contiguous
        t["w1"], t["w2"] = t["w1"].t().contiguous(), t["w2"].t().contiguous()
    for v in t.values():
        if v is not None:
            v.requires_grad_()
    g = torch.Generator(device=device).manual_seed(seed + 1)
    t["dy"] = torch.randn(c.m, c.d, generator=g, device=device, dtype=torch.float32).to(c.dtype)
    return t


def params(t: dict) -> list:
    return [v for k, v in t.items() if k != "dy" and v is not None]


def forward_fns(c: Case, t: dict, fm, compiled, liger) -> dict:
    """name -> zero-argument forward (returns y); None where not applicable."""
    x, act = t["x"], c.activation
    if c.kind == "gated":
        wg, wu, wd = t["wg"], t["wu"], t["wd"]
        fns = {
            "ours": lambda: fm.gated_mlp(x, wg, wu, wd, act),
            "ours_recompute": lambda: fm.gated_mlp(x, wg, wu, wd, act, recompute=True),
            "eager": lambda: eager_gated(x, wg, wu, wd, act),
            "compile": (lambda: compiled["gated"](x, wg, wu, wd, act)) if compiled else None,
            "liger": None,
        }
        if liger is not None and act in liger:
            fn = liger[act]
            fns["liger"] = lambda: F.linear(fn(F.linear(x, wg), F.linear(x, wu)), wd)
        return fns
    w1, b1, w2, b2 = t["w1"], t["b1"], t["w2"], t["b2"]
    if c.kind == "conv1d":
        return {
            "ours": lambda: fm.mlp(x, w1, b1, w2, b2, act, "conv1d"),
            "ours_recompute": lambda: fm.mlp(x, w1, b1, w2, b2, act, "conv1d", recompute=True),
            "eager": lambda: eager_conv1d(x, w1, b1, w2, b2, act),
            "compile": (lambda: compiled["conv1d"](x, w1, b1, w2, b2, act)) if compiled else None,
            "liger": None,
        }
    return {
        "ours": lambda: fm.mlp(x, w1, b1, w2, b2, act),
        "ours_recompute": lambda: fm.mlp(x, w1, b1, w2, b2, act, recompute=True),
        "eager": lambda: eager_mlp(x, w1, b1, w2, b2, act),
        "compile": (lambda: compiled["mlp"](x, w1, b1, w2, b2, act)) if compiled else None,
        "liger": None,  # Liger has no plain-MLP kernel
    }


def train_step(fwd, dy, retain=False):
    def step():
        fwd().backward(dy, retain_graph=retain)
    return step


def fresh_step(step, ps):
    """The step with the gradients set to None first (each step allocates its own)."""
    def fresh():
        for p in ps:
            p.grad = None
        step()
    return fresh


def graphed_step(step, ps):
    """A CUDA graph of one training step (_common.graphed), the gradients set to None
    before each warm-up step and inside the capture, so the captured backward allocates
    them in the graph's memory; returns its replay."""
    return graphed(fresh_step(step, ps))


def reference_grads(c: Case, t: dict) -> list:
    """fp32 eager autograd on the same rounded inputs, without TF32."""
    f = {k: (v.detach().float().requires_grad_() if v is not None and k != "dy" else v) for k, v in t.items()}
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if c.kind == "gated":
            y = eager_gated(f["x"], f["wg"], f["wu"], f["wd"], c.activation)
        elif c.kind == "conv1d":
            y = eager_conv1d(f["x"], f["w1"], f["b1"], f["w2"], f["b2"], c.activation)
        else:
            y = eager_mlp(f["x"], f["w1"], f["b1"], f["w2"], f["b2"], c.activation)
        y.backward(t["dy"].float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return [p.grad for p in params(f)]


def grads_of(step, ps) -> list:
    for p in ps:
        p.grad = None
    step()
    out = [p.grad.detach().clone() for p in ps]
    for p in ps:
        p.grad = None
    return out


def peak_mb(step, ps):
    """Peak allocation during one step above what was allocated before it, in MB (None on CPU)."""
    if not torch.cuda.is_available() or ps[0].device.type != "cuda":
        return None
    for p in ps:
        p.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    for p in ps:
        p.grad = None
    return peak / 1e6


@contextlib.contextmanager
def env(**kv):
    old = {k: os.environ.get(k) for k in kv}
    os.environ.update({k: str(v) for k, v in kv.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ----------------------------------------------------------------------------- main


def fmt(v, spec="8.3f") -> str:
    return f"{'n/a':>{spec.split('.')[0]}}" if v is None else format(v, spec)


def run(args) -> dict:
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("[bench] no CUDA device")
    from kernels import get_kernel

    fm = get_kernel(args.repo_id, version=1)
    timer = Timer(device, quick=False)
    t0 = time.time()
    ceil = ceilings(timer, device, quick=False)
    print(f"[bench] copy bandwidth {ceil['copy_bytes_per_s'] / 1e9:.0f} GB/s (read+write), "
          f"bf16 matmul {ceil['bf16_matmul_flop_per_s'] / 1e12:.0f} TFLOP/s", flush=True)

    def bench(step, ps) -> float:
        if device != "cuda":  # a dry run of this script: plain wall-clock median
            return timer(step)
        import triton.testing

        return float(triton.testing.do_bench(step, warmup=args.warmup, rep=args.rep, grad_to_none=ps,
                                             return_mode="median"))

    cases = all_cases()
    if args.cases:
        pats = [p.strip() for p in args.cases.split(",") if p.strip()]
        cases = [c for c in cases if any(p in c.name for p in pats)]
    if args.shrink > 1:  # dry runs on small machines
        s = args.shrink
        cases = [Case(c.name, c.kind, c.activation, max(1, c.m // s), max(16, c.d // s), max(16, c.h // s),
                      torch.float32 if device == "cpu" else c.dtype, c.bias) for c in cases]
    skip = set(filter(None, (args.skip_peers or "").split(",")))
    liger = None if "liger" in skip else load_liger()

    rows, verification, variants, profiles = [], {}, {}, {}
    for i, c in enumerate(cases):
        tc = time.time()
        compiled = None
        if "compile" not in skip:
            torch._dynamo.reset()
            compiled = {"gated": torch.compile(eager_gated, dynamic=False),
                        "mlp": torch.compile(eager_mlp, dynamic=False),
                        "conv1d": torch.compile(eager_conv1d, dynamic=False)}
        t = make_inputs(c, seed=1000 + i, device=device)
        ps, dy = params(t), t["dy"]
        ref = reference_grads(c, t)
        fwds = forward_fns(c, t, fm, compiled, liger)
        steps = {name: (train_step(f, dy) if f is not None else None) for name, f in fwds.items()}

        checks = {}
        for name, step in steps.items():
            if step is None:
                continue
            try:
                errs = [rel_err(g, r) for g, r in zip(grads_of(step, ps), ref)]
            except Exception as e:  # report, do not time
                print(f"[bench] {c.name}: {name} failed: {type(e).__name__}: {e}", flush=True)
                steps[name] = None
                checks[name] = f"error: {type(e).__name__}: {e}"
                continue
            ok = max(errs) <= TOL[c.dtype]
            checks[name] = {"grad_rel_err": errs, "ok": ok}
            if not ok:
                print(f"[bench] {c.name}: {name} gradients WRONG (rel. errors {errs}); not timed", flush=True)
                steps[name] = None
        verification[c.name] = checks

        mem = {}
        for name, step in steps.items():
            try:
                mem[name] = peak_mb(step, ps) if step is not None else None
            except Exception as e:
                print(f"[bench] {c.name}: {name} failed: {type(e).__name__}: {e}", flush=True)
                steps[name] = mem[name] = None
        floor = max(c.flops / ceil["bf16_matmul_flop_per_s"], c.min_bytes / ceil["copy_bytes_per_s"]) * 1e3
        # --repeats R: R rounds, each timing every implementation once in turn (as bench_mlp.py)
        def no_grads(ps=ps):
            for p in ps:
                p.grad = None

        # --alternate-ms: the implementations timed call by call, interleaved (bench_mlp.alternating)
        alt = {"method": "alternating calls"} if args.alternate_ms else {}

        def alternating(before=None):
            """timed_rounds' time_all for --alternate-ms, or None (one do_bench per implementation)."""
            if not args.alternate_ms:
                return None
            return lambda fns: bench_mlp.alternating(fns, args.alternate_ms, device, before=before)

        times, rounds = bench_mlp.timed_rounds(c.name, "events", steps, lambda step: bench(step, ps), args.repeats,
                                               alternating(no_grads))
        rows.append({
            "case": c.name,
            "timing": "events",
            "ours_ms": times["ours"],
            "peers_ms": {p: times.get(p) for p in PEERS},
            "ours_recompute_ms": times["ours_recompute"],
            "peak_mem_mb": {k: mem.get(k) for k in MEM_KEYS},
            "floor_ms": floor,
            **alt,
            **rounds,
        })
        if args.graph and device == "cuda":
            import triton.testing

            replays = {}
            for name, step in steps.items():
                replays[name] = None
                if step is None:
                    continue
                try:
                    replays[name] = graphed_step(step, ps)
                except Exception as e:  # reported, the row says n/a
                    print(f"[bench] {c.name}: graph capture of {name} failed: {type(e).__name__}: {e}", flush=True)
            for p in ps:
                p.grad = None
            gtimes, grounds = bench_mlp.timed_rounds(
                c.name, "graph", replays,
                lambda replay: float(triton.testing.do_bench(replay, warmup=args.warmup, rep=args.rep,
                                                             return_mode="median")), args.repeats,
                alternating())
            del replays
            row = {k: v for k, v in rows[-1].items() if k not in ("rounds_ms", "ratio_per_round")}
            rows.append({**row, "timing": "graph", "ours_ms": gtimes["ours"],
                         "peers_ms": {p: gtimes.get(p) for p in PEERS},
                         "ours_recompute_ms": gtimes["ours_recompute"], **grounds})
        if args.variants:
            variants[c.name] = run_variants(c, t, fm, bench, fwds, ref)
        if args.profile and device == "cuda":
            profiles[c.name] = profile_steps(c.name, steps, ps)
        del t, ps, dy, ref, fwds, steps
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"[bench] {c.name} done in {time.time() - tc:.1f}s", flush=True)

    tg = sys.modules.get(fm.__name__ + ".triton_gemm")
    tuned = {repr(k): list(v) for k, v in getattr(tg, "_TUNED", {}).items()} if tg is not None else {}
    res = {
        **run_info(device),
        "rows": rows,
        "ceilings": ceil,
        "verification": verification,
        "tuned_configs": tuned,
        "liger": module_version("liger_kernel"),
        "wall_s": round(time.time() - t0, 1),
    }
    if args.variants:
        res["variants"] = variants
    if args.profile:
        res["profile"] = profiles
    return res


def profile_steps(case: str, steps: dict, ps: list, n: int = 5) -> dict:
    """The GPU kernels of one training step per implementation (torch.profiler over n steps)."""
    from torch.profiler import ProfilerActivity, profile

    from profile_post import kernel_table

    out = {}
    for name, step in steps.items():
        if step is None:
            continue
        fresh = fresh_step(step, ps)
        for _ in range(3):
            fresh()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fresh()
            torch.cuda.synchronize()
        rows = kernel_table(prof, n)
        total = sum(r[2] for r in rows)
        print(f"[profile] {case} {name}: {sum(r[1] for r in rows):.0f} kernels, {total:.1f} us of GPU time per step")
        for kname, calls, us in rows[:14]:
            print(f"[profile]    {kname[:100]:100s} {calls:4.1f} {us:8.1f}")
        out[name] = {"gpu_us_per_step": total,
                     "kernels": [{"name": k, "calls_per_step": c, "us_per_step": u} for k, c, u in rows]}
    for p in ps:
        p.grad = None
    return out


def run_variants(c: Case, t: dict, fm, bench, fwds, ref) -> dict:
    """Our backward's alternatives, each verified then timed (ms) with its peak memory (MB)."""
    ps, dy, x, act = params(t), t["dy"], t["x"], c.activation
    cand = {
        "default": (fwds["ours"], {}, False),
        "dx=triton": (fwds["ours"], {"FUSED_MLP_BWD_DX": "triton"}, False),
        "no_subtile": (fwds["ours"], {"FUSED_MLP_BWD_SUBTILE": "0"}, False),
        "not_in_place": (fwds["ours"], {}, True),
        "recompute_chunk_256mb": (fwds["ours_recompute"], {"FUSED_MLP_RECOMPUTE_CHUNK_MB": "256"}, False),
        "recompute": (fwds["ours_recompute"], {}, False),
        "recompute_plain_chunks": (fwds["ours_recompute"], {"FUSED_MLP_RECOMPUTE_IN_GRADS": "0"}, False),
        "backward=reference": (fwds["ours"], {"FUSED_MLP_BACKWARD": "reference"}, False),
    }
    packed_ps = None
    if c.kind == "gated":
        w = torch.cat([t["wg"], t["wu"]]).detach().requires_grad_()
        packed_ps = [x, w, t["wd"]]
        cand["packed"] = (lambda: fm.gated_mlp_packed(x, w, t["wd"], act), {}, False)
    out = {}
    for name, (fwd, kv, retain) in cand.items():
        vps = packed_ps if name == "packed" else ps
        step = train_step(fwd, dy, retain)
        try:
            with env(**kv):
                g = grads_of(step, vps)
                if name == "packed":  # split the packed gradient back into gate | up
                    g = [g[0], g[1][: c.h], g[1][c.h:], g[2]]
                errs = [rel_err(a, b) for a, b in zip(g, ref)]
                ok = max(errs) <= TOL[c.dtype]
                out[name] = {"ok": ok, "grad_rel_err": max(errs),
                             "ms": bench(step, vps) if ok else None, "peak_mem_mb": peak_mb(step, vps)}
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    # forward only (with grad enabled: ours runs its training forward), no backward
    for name in ("ours", "eager"):
        fwd = fwds[name]

        def fwd_only(fwd=fwd):
            fwd()

        out[f"forward_only:{name}"] = {"ms": bench(fwd_only, ps)}
    out.update(kernel_variants(c, t, fm, bench))
    for name, r in out.items():
        extra = "" if r.get("ok", True) else " WRONG"
        print(f"[bench]   {c.name:45s} {name:24s} {fmt(r.get('ms'))} ms  peak {fmt(r.get('peak_mem_mb'), '9.1f')} MB"
              f"{extra}{'  ' + r['error'] if 'error' in r else ''}", flush=True)
    return out


def kernel_variants(c: Case, t: dict, fm, bench) -> dict:
    """Our kernels one by one against cuBLAS GEMMs of the same shape (ms)."""
    import importlib

    tg = importlib.import_module(fm.__name__ + ".triton_gemm")
    if t["x"].device.type == "cpu":  # dry run
        tg = tg.interpreted_module()
    act_id = fm.activations.ACTIVATION_IDS[c.activation]
    x, dy = t["x"].detach(), t["dy"].detach()
    out = {}
    if c.kind == "conv1d":  # the kernels below take nn.Linear's layout
        return out
    with torch.no_grad():
        if c.kind == "gated":
            wg, wu, wd = t["wg"].detach(), t["wu"].detach(), t["wd"].detach()
            wgu = torch.cat([wg, wu])
            gu = torch.empty(c.m, 2 * c.h, device=x.device, dtype=x.dtype)
            out["kernel:fwd_fused_store"] = {
                "ms": bench(lambda: tg.gated_linear(x, wg, wu, None, None, act_id, pre=gu), [])}
            out["kernel:fwd_fused_nostore"] = {
                "ms": bench(lambda: tg.gated_linear(x, wg, wu, None, None, act_id), [])}
            out["kernel:fwd_cublas_x_wgu"] = {"ms": bench(lambda: torch.mm(x, wgu.t()), [])}
            out["kernel:dh_fused_inplace"] = {
                "ms": bench(lambda: tg.linear_dact(dy, wd, True, gu, gu, act_id, gated=True), [])}
            out["kernel:dh_cublas"] = {"ms": bench(lambda: torch.mm(dy, wd), [])}
            dx = torch.empty_like(x)
            out["kernel:dx_dual_triton"] = {
                "ms": bench(lambda: tg.dual_matmul(gu[:, :c.h], gu[:, c.h:], wg, wu, dx), [])}
            out["kernel:dx_cublas_mm_addmm"] = {
                "ms": bench(lambda: torch.mm(gu[:, :c.h], wg, out=dx).addmm_(gu[:, c.h:], wu), [])}
            out["kernel:dx_cublas_one_mm"] = {"ms": bench(lambda: torch.mm(gu, wgu, out=dx), [])}
            out["kernel:dw_gate_up_one_gemm"] = {"ms": bench(lambda: torch.mm(gu.t(), x), [])}
            out["kernel:dw_down"] = {"ms": bench(lambda: torch.mm(dy.t(), gu[:, :c.h]), [])}
        else:
            w1, b1, w2 = t["w1"].detach(), t["b1"], t["w2"].detach()
            b1 = None if b1 is None else b1.detach()
            pre = torch.empty(c.m, c.h, device=x.device, dtype=x.dtype)
            out["kernel:fwd_fused_store"] = {"ms": bench(lambda: tg.linear_act(x, w1, b1, act_id, pre=pre), [])}
            with mock.patch.dict(os.environ, {"FUSED_MLP_CUBLASLT": "0"}):  # our kernel, not cuBLASLt's epilogue
                out["kernel:fwd_fused_nostore"] = {"ms": bench(lambda: tg.linear_act(x, w1, b1, act_id), [])}
            out["kernel:fwd_cublas"] = {"ms": bench(lambda: F.linear(x, w1, b1), [])}
            out["kernel:dh_fused_inplace"] = {
                "ms": bench(lambda: tg.linear_dact(dy, w2, True, pre, pre, act_id, gated=False), [])}
            out["kernel:dh_cublas"] = {"ms": bench(lambda: torch.mm(dy, w2), [])}
    return out


def print_table(res: dict) -> None:
    head = (f"{'case':45s} {'ours':>8s} {'ours_rc':>8s} " + " ".join(f"{p:>8s}" for p in PEERS)
            + f" {'floor':>8s} {'ours/best':>9s} | peak MB: " + " ".join(f"{k:>9s}" for k in MEM_KEYS)
            + f" {'ours/eager':>10s} {'rc/eager':>8s}")
    print(head)
    print("-" * len(head))
    for r in res["rows"]:
        peers = r["peers_ms"]
        real = [peers[p] for p in PEERS if peers.get(p) is not None]
        best = min(real) if real else None
        ours = r["ours_ms"]
        ratio = f"{ours / best:9.3f}" if ours and best else f"{'n/a':>9s}"
        mem = r["peak_mem_mb"]
        eager_mem = mem.get("eager")
        m_ratio = f"{mem['ours'] / eager_mem:10.2f}" if mem.get("ours") and eager_mem else f"{'n/a':>10s}"
        rc_ratio = (f"{mem['ours_recompute'] / eager_mem:8.2f}" if mem.get("ours_recompute") and eager_mem
                    else f"{'n/a':>8s}")
        label = r["case"] if r.get("timing", "events") == "events" else f"{r['case']} ({r['timing']})"
        line = (f"{label:45s} {fmt(ours)} {fmt(r['ours_recompute_ms'])} "
                + " ".join(fmt(peers.get(p)) for p in PEERS) + f" {r['floor_ms']:8.3f} {ratio} | "
                + "          " + " ".join(fmt(mem.get(k), "9.1f") for k in MEM_KEYS) + f" {m_ratio} {rc_ratio}")
        print(line + bench_mlp.rounds_text(r))
    print("times in ms (median of do_bench, forward + backward); ours/best: against the fastest of "
          "eager, compile, liger; peak MB: allocated during one step above what was allocated before it"
          + (bench_mlp.ROUNDS_FOOTER if any(r.get("ratio_per_round") for r in res["rows"]) else ""))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names (e.g. geglu,swiglu)")
    p.add_argument("--variants", action="store_true", help="also time our backward's alternatives (see above)")
    p.add_argument("--graph", action="store_true", help="also time each step as a CUDA-graph replay (see above)")
    p.add_argument("--profile", action="store_true", help="also list each step's GPU kernels (see above)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results (default benchmarks/results/mlp_train_<card>.json, e.g. _h200)")
    p.add_argument("--repo-id", default="org/fused-mlp")
    p.add_argument("--skip-peers", default="", help="comma-separated: compile, liger")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of timing per case, interleaved across implementations; each row gives the "
                        "medians, every round's times and ours / best peer per round (default 1)")
    p.add_argument("--alternate-ms", type=float, default=0.0,
                   help="time the implementations call by call, interleaved (bench_mlp.alternating; each round "
                        "as many cycles as fit this many ms) instead of one do_bench each (default 0: do_bench)")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=200, help="do_bench repetition time, ms")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": dry run of the script
    p.add_argument("--shrink", type=int, default=1, help=argparse.SUPPRESS)  # divide all sizes (dry runs)
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    args.out = args.out or default_out("mlp_train", args.device)
    res = run(args)
    print_table(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"[bench] results: {args.out} ({res['wall_s']}s)")


if __name__ == "__main__":
    main()
