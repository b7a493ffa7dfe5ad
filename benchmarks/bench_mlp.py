#!/usr/bin/env python3
"""Forward-pass benchmark of fused-mlp against its peers, in one process on one GPU.

    KERNELS_CACHE=... HF_HUB_OFFLINE=1 python benchmarks/bench_mlp.py [--quick] [--cases swiglu]

fused-mlp is loaded the way users load it: kernels.get_kernel("org/fused-mlp", version=1).

First the two ceilings of this GPU are measured: device copy bandwidth (bytes read +
written per second) and the bf16 matmul rate (8192^3 on random data). Then, per case:

    ours        fused_mlp.gated_mlp / fused_mlp.mlp
    eager       3 F.linear + activation + multiply (gated); Linear+bias, act, Linear+bias (plain)
    compile     torch.compile (default mode, static shapes, compiled afresh per case) of eager
    liger       Liger-Kernel's fused act*mul (swiglu / geglu) between cuBLAS linears, if importable
    gemms_only  the GEMMs alone (no activation, no multiply): what the block costs in cuBLAS
    floor       max(FLOPs / matmul rate, minimal bytes / copy bandwidth); the bf16 rate is
                used for fp16 too (same tensor-core peak on A100 / H100 / H200)

Every output is first checked against an fp32 reference (a failing implementation is
reported and gets no time). Timing "events": triton.testing.do_bench, median, L2 flushed
between runs; timing "graph" (M <= 128, and d <= 1024): the same, replaying a CUDA graph
of one call, which removes the CPU launch overhead. "ours / best" compares with the
fastest of eager, compile and liger (gemms_only and the floor are references, not implementations).
--alternate-ms T: instead of one do_bench per implementation, the implementations' calls are
timed one by one, interleaved (each round: as many cycles of one call each as fit T ms), so
that at the power limit all see the same clocks; such rows carry "method": "alternating calls".

Output: a table on stdout, JSON in --out (rows of {case, timing, ours_ms, peers_ms,
floor_ms}), and a PNG next to it if matplotlib is importable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import call_order, default_out, graphed, module_version, rel_err, run_info  # noqa: E402

REAL_PEERS = ("eager", "compile", "liger")
PEERS = REAL_PEERS + ("gemms_only",)
GRAPH_MAX_M = 128
# Also graph-timed: cases whose GPU work is short enough (d <= 1024) that host time per
# call can show in the events timing; the graph row is the GPU-only time next to it.
GRAPH_MAX_D = 1024
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


@dataclass
class Case:
    name: str
    kind: str  # "gated" or "mlp"
    activation: str
    m: int
    d: int
    h: int
    dtype: torch.dtype
    bias: bool

    @property
    def flops(self) -> float:
        gemms = 3 if self.kind == "gated" else 2
        return 2.0 * self.m * self.d * self.h * gemms

    @property
    def min_bytes(self) -> float:
        """Read x and the weights (and biases) once, write y once."""
        n_w = (3 if self.kind == "gated" else 2) * self.h * self.d
        n_b = (self.h + self.d) if self.bias else 0
        return float(2 * self.m * self.d + n_w + n_b) * torch.finfo(self.dtype).bits / 8


def all_cases() -> list[Case]:
    cases = []
    for dt, suffix in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        cases.append(Case(f"geglu_m8192_d768_h3072_{suffix}", "gated", "gelu_tanh", 8192, 768, 3072, dt, False))
        for m in (128, 512, 4096, 16384):
            cases.append(Case(f"swiglu_m{m}_d4096_h14336_{suffix}", "gated", "silu", m, 4096, 14336, dt, False))
        cases.append(Case(f"mlp_gelu_tanh_m8192_d768_h3072_{suffix}", "mlp", "gelu_tanh", 8192, 768, 3072, dt, True))
    return cases


# ----------------------------------------------------------------------------- timing


class Timer:
    def __init__(self, device: str, quick: bool):
        self.device = device
        self.warmup, self.rep = (5, 20) if quick else (25, 100)

    def __call__(self, fn) -> float:
        if self.device == "cuda":
            import triton.testing

            return float(triton.testing.do_bench(fn, warmup=self.warmup, rep=self.rep, return_mode="median"))
        fn()  # CPU (a dry run of this script): plain wall-clock median
        times = []
        for _ in range(5):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]


_FLUSH: dict = {}


def _flush_buffer() -> torch.Tensor:
    """256 MB on the current GPU, zeroed before each timed call to flush the L2 (made once)."""
    dev = torch.cuda.current_device()
    if dev not in _FLUSH:
        _FLUSH[dev] = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    return _FLUSH[dev]


def _drop(fns: dict, names: list, n: str, e: Exception) -> None:
    print(f"[bench] alternating: {n} failed: {type(e).__name__}: {e}; dropped", flush=True)
    fns[n] = None
    names.remove(n)


def alternating(fns: dict, budget_ms: float, device: str, before=None) -> dict:
    """{name: median ms}: every implementation timed call by call with the implementations
    interleaved (cycle c calls each once, starting with a different one each cycle), L2 flushed
    before each call and events around it as do_bench does. At the power limit the clocks follow
    the last seconds of load: timed one block after another, each implementation runs at the
    clock the blocks before it left (our identical call moved by 2.4% between the first and the
    last place of a round, NOTES session 22); interleaved call by call, all see the same clocks.
    Cycles: as many as fit budget_ms (estimated from one warm call each), 5 to 200. before():
    run ahead of each call, untimed (bench_train: the parameters' gradients set to None, as
    do_bench's grad_to_none). An implementation that raises is reported, left out of the result
    and set to None in `fns` (so later rounds of timed_rounds skip it); the others go on."""
    before = before or (lambda: None)
    names = [n for n, f in fns.items() if f is not None]
    if device != "cuda":  # CPU dry run: one timed call each
        out = {}
        for n in list(names):
            before()
            t = time.perf_counter()
            try:
                fns[n]()
            except Exception as e:
                _drop(fns, names, n, e)
                continue
            out[n] = (time.perf_counter() - t) * 1e3
        return out
    flush = _flush_buffer()
    est = 0.0
    for n in list(names):
        try:
            before()
            fns[n]()
            torch.cuda.synchronize()
            before()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fns[n]()
            e.record()
            e.synchronize()
        except Exception as err:
            _drop(fns, names, n, err)
            continue
        est += s.elapsed_time(e) + 0.07  # + the flush
    cycles = int(min(200, max(5, budget_ms / max(est, 1e-3))))
    events = {n: [] for n in names}
    for c in range(cycles):
        for n in call_order(list(names), c):
            before()
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            try:
                fns[n]()
            except Exception as err:
                _drop(fns, names, n, err)
                del events[n]
                continue
            e.record()
            events[n].append((s, e))
    torch.cuda.synchronize()
    return {n: statistics.median(s.elapsed_time(e) for s, e in v) for n, v in events.items()}


def ceilings(timer: Timer, device: str, quick: bool) -> dict:
    """Copy bandwidth (read + write) and the bf16 matmul rate of this device."""
    n = (1 << 28) if device == "cuda" else (1 << 22)  # 512 MiB of bf16 per buffer on the GPU
    src = torch.empty(n, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    bw = 2 * src.numel() * src.element_size() / (ms * 1e-3)
    del src, dst
    s = 8192 if device == "cuda" else 512
    a = torch.randn(s, s, dtype=torch.bfloat16, device=device)
    b = torch.randn(s, s, dtype=torch.bfloat16, device=device)
    ms = timer(lambda: torch.mm(a, b))
    rate = 2.0 * s**3 / (ms * 1e-3)
    return {"copy_bytes_per_s": bw, "bf16_matmul_flop_per_s": rate, "matmul_size": s, "copy_buffer_bytes": n * 2}


# ----------------------------------------------------------------------------- implementations

_ACT = {
    "silu": F.silu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
}


def eager_gated(x, wg, wu, wd, activation: str):
    return F.linear(_ACT[activation](F.linear(x, wg)) * F.linear(x, wu), wd)


def eager_mlp(x, w1, b1, w2, b2, activation: str):
    return F.linear(_ACT[activation](F.linear(x, w1, b1)), w2, b2)


def load_liger():
    try:
        from liger_kernel.ops.geglu import LigerGELUMulFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as e:  # not installed, or not importable with this torch/triton
        print(f"[bench] Liger-Kernel not available: {type(e).__name__}: {e}", flush=True)
        return None
    return {"silu": LigerSiLUMulFunction.apply, "gelu_tanh": LigerGELUMulFunction.apply}


def make_inputs(c: Case, device: str, seed: int) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(c.dtype)

    t = {"x": rnd(c.m, c.d)}
    if c.kind == "gated":
        t.update(wg=rnd(c.h, c.d, scale=c.d**-0.5), wu=rnd(c.h, c.d, scale=c.d**-0.5),
                 wd=rnd(c.d, c.h, scale=c.h**-0.5))
    else:
        t.update(w1=rnd(c.h, c.d, scale=c.d**-0.5), b1=rnd(c.h, scale=0.1) if c.bias else None,
                 w2=rnd(c.d, c.h, scale=c.h**-0.5), b2=rnd(c.d, scale=0.1) if c.bias else None)
    t["h_buf"] = rnd(c.m, c.h)  # input of the last GEMM for gemms_only
    return t


def reference(c: Case, t: dict) -> torch.Tensor:
    """fp32 on the same (rounded) inputs, without TF32."""
    f = {k: (v.float() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        if c.kind == "gated":
            return eager_gated(f["x"], f["wg"], f["wu"], f["wd"], c.activation)
        return eager_mlp(f["x"], f["w1"], f["b1"], f["w2"], f["b2"], c.activation)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def implementations(c: Case, t: dict, fm, compiled, liger) -> dict:
    """name -> zero-argument callable returning the output (None where n/a)."""
    x, act = t["x"], c.activation
    if c.kind == "gated":
        wg, wu, wd = t["wg"], t["wu"], t["wd"]
        impl = {
            "ours": lambda: fm.gated_mlp(x, wg, wu, wd, act),
            "eager": lambda: eager_gated(x, wg, wu, wd, act),
            "compile": (lambda: compiled["gated"](x, wg, wu, wd, act)) if compiled else None,
            "liger": None,
        }
        if liger is not None and act in liger:
            fn = liger[act]
            impl["liger"] = lambda: F.linear(fn(F.linear(x, wg), F.linear(x, wu)), wd)
        hb = t["h_buf"]

        def gemms():
            F.linear(x, wg)
            F.linear(x, wu)
            return F.linear(hb, wd)

        impl["gemms_only"] = gemms
    else:
        w1, b1, w2, b2 = t["w1"], t["b1"], t["w2"], t["b2"]
        impl = {
            "ours": lambda: fm.mlp(x, w1, b1, w2, b2, act),
            "eager": lambda: eager_mlp(x, w1, b1, w2, b2, act),
            "compile": (lambda: compiled["mlp"](x, w1, b1, w2, b2, act)) if compiled else None,
            "liger": None,  # Liger has no plain-MLP kernel
        }
        hb = t["h_buf"]

        def gemms():
            F.linear(x, w1, b1)
            return F.linear(hb, w2, b2)

        impl["gemms_only"] = gemms
    return impl


# ----------------------------------------------------------------------------- main


def ratio_per_round(runs: dict) -> list:
    """Per round: ours over the fastest real peer of that same round."""
    out = []
    for r, ours in enumerate(runs.get("ours", [])):
        peers = [runs[p][r] for p in REAL_PEERS if len(runs.get(p, [])) > r]
        if peers:
            out.append(ours / min(peers))
    return out


def timed_rounds(case: str, mode: str, fns: dict, time_one, repeats: int,
                 time_all=None) -> tuple[dict, dict]:
    """({name: median ms or None}, extra row fields): `repeats` rounds, each timing every
    fns[name] (None: not timed) once in turn with time_one(fn), or, given time_all, all of them
    at once with time_all(fns) -> {name: ms} (alternating above); with repeats > 1 the extra
    fields hold every round's times and ours / the best peer per round."""
    runs = {name: [] for name in fns}
    live = dict(fns)
    for _ in range(repeats):
        if time_all is not None:
            for name, ms in time_all(live).items():
                runs[name].append(ms)
            for name, fn in live.items():  # dropped by time_all (it raised): untimed, as below
                if fn is None and fns[name] is not None:
                    runs[name] = []
            continue
        for name, fn in live.items():
            if fn is None:
                continue
            try:
                runs[name].append(time_one(fn))
            except Exception as e:
                print(f"[bench] {case} ({mode}): timing {name} failed: {type(e).__name__}: {e}", flush=True)
                live[name], runs[name] = None, []
    times = {name: (statistics.median(v) if v else None) for name, v in runs.items()}
    extra = {}
    if repeats > 1:
        extra = {"rounds_ms": {n: v for n, v in runs.items() if v},
                 "ratio_per_round": ratio_per_round(runs)}
    return times, extra


def merge_placements(results: list) -> tuple[dict, dict]:
    """timed_rounds' results for each placement of a case's inputs, as one: with one placement
    unchanged; with more, every placement's rounds pooled (the row's median is over all of them)
    and each placement's own median kept (`placement_ms`). Ours / the best peer is taken round by
    round within each placement, so an implementation missing from one placement shifts nothing."""
    if len(results) == 1:
        return results[0]
    runs: dict = {}
    medians: dict = {}
    ratios: list = []
    for times, extra in results:
        per = extra.get("rounds_ms") or {n: [t] for n, t in times.items() if t is not None}
        ratios += ratio_per_round(per)
        for n in per:
            runs.setdefault(n, []).extend(per[n])
            medians.setdefault(n, []).append(times[n])
    times = {n: (statistics.median(runs[n]) if n in runs else None) for n in results[0][0]}
    return times, {"rounds_ms": runs, "ratio_per_round": ratios, "placement_ms": medians}


def alternating_rounds(fns: dict, budget_ms: float, device: str, repeats: int, before=None) -> tuple[dict, dict]:
    """timed_rounds with alternating calls, for scripts outside the record's table (the micro
    A/Bs): ({name: median ms over the rounds}, {name: [ms of each round]})."""
    times, extra = timed_rounds("", "alternating", fns, None, repeats,
                                lambda live: alternating(live, budget_ms, device, before=before))
    return times, extra.get("rounds_ms", {n: [t] for n, t in times.items() if t is not None})


def rounds_text(row: dict) -> str:
    """A table line's tail for a row timed in rounds: the spread of ours / best per round."""
    r = row.get("ratio_per_round")
    return f"  rounds {min(r):.3f}-{max(r):.3f} (median {statistics.median(r):.3f}, n={len(r)})" if r else ""


ROUNDS_FOOTER = "; rounds: ours / best peer of the same round"


def fmt(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def run(args) -> dict:
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("[bench] no CUDA device")
    from kernels import get_kernel

    fm = get_kernel(args.repo_id, version=1)
    timer = Timer(device, args.quick)
    t0 = time.time()
    ceil = ceilings(timer, device, args.quick)
    print(f"[bench] copy bandwidth {ceil['copy_bytes_per_s'] / 1e9:.0f} GB/s (read+write), "
          f"bf16 matmul {ceil['bf16_matmul_flop_per_s'] / 1e12:.0f} TFLOP/s ({time.time() - t0:.1f}s)", flush=True)

    cases = all_cases()
    if args.quick:
        cases = [c for c in cases if c.dtype == torch.bfloat16]
    if args.cases:
        pats = [p.strip() for p in args.cases.split(",") if p.strip()]
        cases = [c for c in cases if any(p in c.name for p in pats)]
    if args.reverse:
        cases = cases[::-1]
    # each case's inputs come from a seed fixed by its place in the selection, so --twice runs
    # the same values again (in new allocations)
    seeded = [(c, 1000 + i) for i, c in enumerate(cases)]
    if args.twice:
        seeded = [cs for cs in seeded for _ in range(2)]
    if args.shrink > 1:  # dry runs on small machines
        s = args.shrink
        seeded = [(Case(c.name, c.kind, c.activation, max(1, c.m // s), max(16, c.d // s), max(16, c.h // s),
                        c.dtype, c.bias), seed) for c, seed in seeded]
    skip = set(filter(None, (args.skip_peers or "").split(",")))

    liger = None if "liger" in skip else load_liger()

    rows, verification = [], {}
    for place, (c, seed) in enumerate(seeded):
        if place and args.pause_s > 0:
            time.sleep(args.pause_s)  # the GPU idle between cases (its clocks and temperature recover)
        tc = time.time()
        compiled = None
        if "compile" not in skip:
            # A fresh static-shape compilation per case: the best torch.compile can do for
            # this shape (and no recompilation limit reached across cases).
            torch._dynamo.reset()
            compiled = {"gated": torch.compile(eager_gated, dynamic=False),
                        "mlp": torch.compile(eager_mlp, dynamic=False)}
        # --placements P: the same input values allocated P times (each copy kept alive, so each
        # lies elsewhere in GPU memory); where the weights lie moves each implementation's time
        # at few tokens by up to ~1 us, independently of the others (NOTES, session 38)
        ts = [make_inputs(c, device, seed=seed) for _ in range(args.placements)]
        ref = reference(c, ts[0])
        impls = [implementations(c, t, fm, compiled, liger) for t in ts]
        if args.ours_twice:
            for impl in impls:
                if impl.get("ours") is not None:
                    # the same call timed again, last in each round: the method's own bias and spread
                    impl["ours_again"] = impl["ours"]
        checks = {}
        with torch.inference_mode():
            for impl in impls:
                for name, fn in impl.items():
                    if fn is None or name in ("gemms_only", "ours_again"):
                        continue
                    try:
                        err = rel_err(fn(), ref)
                    except Exception as e:  # report, do not time
                        print(f"[bench] {c.name}: {name} failed: {type(e).__name__}: {e}", flush=True)
                        impl[name] = None
                        checks[name] = f"error: {type(e).__name__}"
                        continue
                    ok = err <= TOL[c.dtype]
                    if name not in checks or (isinstance(checks[name], dict) and err > checks[name]["rel_err"]):
                        checks[name] = {"rel_err": err, "ok": ok}  # the worst placement's
                    if not ok:
                        print(f"[bench] {c.name}: {name} is WRONG (rel. error {err:.2e} > {TOL[c.dtype]:.0e}); "
                              "not timed", flush=True)
                        impl[name] = None
        for name in impls[0]:  # an implementation wrong or failing on any placement is not timed on any
            if any(impl[name] is None for impl in impls):
                for impl in impls:
                    impl[name] = None
        verification[c.name] = checks
        floor = max(c.flops / ceil["bf16_matmul_flop_per_s"], c.min_bytes / ceil["copy_bytes_per_s"]) * 1e3

        graph = c.m <= GRAPH_MAX_M or c.d <= GRAPH_MAX_D
        modes = ["events"] + (["graph"] if graph and device == "cuda" else [])
        for mode in modes:
            # --repeats R: R rounds, each timing every implementation once in turn, so that
            # a drift of the GPU's clocks or of the host touches all of them alike; the row
            # holds each one's median over the rounds, and every round's time.
            time_all = (lambda fns: alternating(fns, args.alternate_ms, device)) if args.alternate_ms else None
            per_placement = []
            for impl in impls:
                with torch.inference_mode():
                    calls = {name: (graphed(fn) if mode == "graph" else fn) if fn is not None else None
                             for name, fn in impl.items()}
                    per_placement.append(timed_rounds(c.name, mode, calls, timer, args.repeats, time_all))
                    del calls
            times, rounds = merge_placements(per_placement)
            rows.append({
                "case": c.name,
                "timing": mode,
                "place": place,
                "ours_ms": times.pop("ours"),
                "peers_ms": {p: times.get(p) for p in PEERS},
                "floor_ms": floor,
                **({"method": "alternating calls"} if args.alternate_ms else {}),
                **({"ours_again_ms": times.get("ours_again")} if "ours_again" in times else {}),
                **rounds,
            })
        del ts, ref, impls
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"[bench] {c.name} done in {time.time() - tc:.1f}s", flush=True)

    tg = sys.modules.get(fm.__name__ + ".triton_gemm")
    tuned, cublaslt, down = {}, {}, {}
    if tg is not None:
        tuned = {repr(k): list(v) for k, v in getattr(tg, "_TUNED", {}).items()}
        # the plain first GEMM's timed choice: True where cuBLASLt's epilogue ran instead of ours
        cublaslt = {repr(k): v for k, v in getattr(tg, "_CUBLASLT_CHOICE", {}).items()}
        # the down projection's timed choice (1: F.linear, else the K split) and its timings in us
        down_times = getattr(tg, "_DOWN_TIMES", {})
        down = {repr(k): {"parts": v, "us": {str(p): t * 1e3 for p, t in down_times.get(k, {}).items()}}
                for k, v in getattr(tg, "_DOWN_CHOICE", {}).items()}
    return {
        **run_info(device),
        "rows": rows,
        "ceilings": ceil,
        "verification": verification,
        "tuned_configs": tuned,
        "cublaslt_choice": cublaslt,
        "down_choice": down,
        "liger": module_version("liger_kernel"),
        "wall_s": round(time.time() - t0, 1),
    }


def print_table(res: dict) -> None:
    head = f"{'case':40s} {'timing':6s} {'ours':>8s} " + " ".join(f"{p:>10s}" for p in PEERS)
    head += f" {'floor':>8s} {'ours/best':>9s} {'ours/floor':>10s}"
    print(head)
    print("-" * len(head))
    for r in res["rows"]:
        peers = r["peers_ms"]
        real = [peers[p] for p in REAL_PEERS if peers.get(p) is not None]
        best = min(real) if real else None
        ours = r["ours_ms"]
        ratio = f"{ours / best:9.3f}" if ours and best else f"{'n/a':>9s}"
        over_floor = f"{ours / r['floor_ms']:10.2f}" if ours else f"{'n/a':>10s}"
        line = f"{r['case']:40s} {r['timing']:6s} {fmt(ours):>8s} "
        line += " ".join(f"{fmt(peers.get(p)):>10s}" for p in PEERS)
        line += f" {r['floor_ms']:8.4f} {ratio} {over_floor}"
        again = r.get("ours_again_ms")
        pl = r.get("placement_ms", {}).get("ours")
        if pl:
            line += f"  ours over {len(pl)} placements {min(pl):.4f}-{max(pl):.4f}"
        print(line + rounds_text(r) + (f"  ours timed again last: {again:.4f} ({again / ours:.3f} x)" if again and ours
                                       else ""))
    print("times in ms (median); ours/best: against the fastest of eager, compile, liger"
          + (ROUNDS_FOOTER if any(r.get("ratio_per_round") for r in res["rows"]) else ""))


def plot(res: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib not importable: no plot")
        return
    rows = res["rows"]
    names = ["ours"] + list(PEERS)
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) * len(names) / 3 + 2))
    height = 0.8 / len(names)
    for j, name in enumerate(names):
        vals = []
        for r in rows:
            v = r["ours_ms"] if name == "ours" else r["peers_ms"].get(name)
            vals.append(v / r["floor_ms"] if v else 0.0)
        ys = [i + j * height for i in range(len(rows))]
        ax.barh(ys, vals, height=height, label=name)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))])
    ax.set_yticklabels([f"{r['case']} [{r['timing']}]" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("time / floor (1.0 = the roofline floor; lower is better)")
    ax.set_title(f"MLP forward on {res['gpu']} (torch {res['torch']}, triton {res['triton']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"[bench] plot: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=None, help="comma-separated substrings of case names (e.g. swiglu,geglu_m8192)")
    p.add_argument("--quick", action="store_true", help="bf16 cases only, shorter timing")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON results (default benchmarks/results/mlp_forward_<card>.json, e.g. _h200)")
    p.add_argument("--plot", type=Path, default=None, help="PNG path (default: --out with .png)")
    p.add_argument("--repo-id", default="org/fused-mlp")
    p.add_argument("--skip-peers", default="", help="comma-separated: compile, liger")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of timing per case and mode, interleaved across implementations; "
                        "the row gives each one's median (default 1)")
    p.add_argument("--alternate-ms", type=float, default=0.0,
                   help="time the implementations call by call, interleaved (each round: as many cycles "
                        "as fit this many ms), instead of one do_bench per implementation; rows get "
                        "\"method\": \"alternating calls\" (default 0: do_bench)")
    p.add_argument("--ours-twice", action="store_true",
                   help="time fused-mlp's call a second time, last in each round (row field ours_again_ms): "
                        "the timing method's bias between the first and the last place of a round")
    p.add_argument("--reverse", action="store_true",
                   help="run the selected cases in the reverse order (session 37 saw a case's place in the "
                        "process move its times; session 38 traced that to its one allocation: --placements)")
    p.add_argument("--placements", type=int, default=1,
                   help="allocate each case's inputs this many times (same values, other addresses) and "
                        "pool the rounds of all: the row's median is over where the weights lie (default 1)")
    p.add_argument("--twice", action="store_true",
                   help="run each selected case twice in a row, with the same input values (rows carry "
                        "their \"place\" in the process)")
    p.add_argument("--pause-s", type=float, default=0.0,
                   help="seconds the GPU stays idle before each case after the first (default 0)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": dry run of the script
    p.add_argument("--shrink", type=int, default=1, help=argparse.SUPPRESS)  # divide all sizes (dry runs)
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.placements < 1:
        p.error("--placements must be >= 1")
    args.out = args.out or default_out("mlp_forward", args.device)
    res = run(args)
    print_table(res)
    for k, v in res["down_choice"].items():
        print(f"[bench] down projection {k}: {v['parts']} part(s); timed " + ", ".join(f"{p}: {t:.1f} us" for p, t in v["us"].items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"[bench] results: {args.out} ({res['wall_s']}s)")
    plot(res, args.plot or args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
