#!/usr/bin/env python3
"""Decode-time (few-token) SwiGLU MLP on a GPU: fused-mlp's decode kernels against the
weight-read floor and their peers.

In one process this measures
  * device-to-device copy bandwidth (a large ``dst.copy_(src)``, bytes read + written):
    the floor of an MLP step is its weight bytes over this bandwidth;
  * per case (Llama-3-8B's MLP, D=4096 H=14336, at M = 1, 16, 64 tokens; Llama-3.2-1B's,
    D=2048 H=8192, at M = 1; bfloat16):
        ours        fused_mlp.decode.gated_mlp (two launches: gate_up, down)
        eager       F.linear x3 + silu + mul
        compile     torch.compile (default mode, static shapes) of eager
        liger       Liger-Kernel's fused silu*mul between cuBLAS linears, if importable
        gemms_only  the three F.linear alone
    plus ours split into its two kernels (gate_up, down) against their own floors;
  * a crossover sweep, M in 1..128 on the 8B shape: ours, eager (cuBLAS) and fused-mlp's
    general path (fused_mlp.gated_mlp with the decode path switched off), so the
    dispatcher's DECODE_MAX_M can be set where ours stops winning.
Every implementation's output is checked against the float64 reference before it is
timed. Two timings of everything:
    events  triton.testing.do_bench medians (L2 flushed before every call; includes the
            host launch overhead the GPU waits for)
    graph   the callable captured 10 times in one CUDA graph, replayed, CUDA-event timed,
            median of 7 repetitions (no host overhead: what a decode loop under CUDA graphs
            sees). Where one set of weights would fit in a few L2s (the 1B case), the
            captured calls cycle through enough weight copies that nothing stays in L2.
A table goes to stdout and the numbers to JSON (--out).

Tuning aid (not run by default): --sweep-configs times the two decode kernels over the
block shapes the environment variables FUSED_MLP_DECODE_KS / _RW / _LINEAR_ROWS select.

fused-mlp is loaded the way users load it, ``kernels.get_kernel("org/fused-mlp",
version=1)``, from the Hub cache in KERNELS_CACHE (default .hub-cache/ next to this
repository), offline unless HF_HUB_OFFLINE says otherwise.

Usage:
    python benchmarks/bench_decode.py [--out benchmarks/results/decode_<card>.json] [--sweep-configs]
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
REPO_ID = "org/fused-mlp"
os.environ.setdefault("KERNELS_CACHE", str(ROOT / ".hub-cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _common import default_out, rel_err, run_info  # noqa: E402
from _common import copy_bandwidth as _copy_bandwidth  # noqa: E402

DEVICE = "cuda"
DTYPE = torch.bfloat16
# (case, M, D, H)
CASES = [
    ("swiglu_m1_d4096_h14336_bf16", 1, 4096, 14336),
    ("swiglu_m16_d4096_h14336_bf16", 16, 4096, 14336),
    ("swiglu_m64_d4096_h14336_bf16", 64, 4096, 14336),
    ("swiglu_m1_d2048_h8192_bf16", 1, 2048, 8192),
]
CROSSOVER_M = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]
CROSSOVER_SHAPE = (4096, 14336)
# Relative norm error against float64: ours rounds h and the output to bf16; the peers
# round g, u, act(g) and the product as well. All well inside 2e-2.
TOL = 2e-2
COPY_BYTES = 1 << 30
GRAPH_INNER = 10  # calls captured per graph
GRAPH_REPS = 7
GRAPH_TARGET_MS = 25.0


# ----------------------------------------------------------------------------- timing


def bench_events(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def bench_graph(fn: Callable[[int], object], inner: int = GRAPH_INNER) -> float:
    """Median ms per call of fn(i), i = 0..inner-1 captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(inner):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(inner):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    per_replay = max(start.elapsed_time(end) / 3, 1e-3)
    n = max(3, int(GRAPH_TARGET_MS / per_replay))
    samples = []
    for _ in range(GRAPH_REPS):
        start.record()
        for _ in range(n):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / (n * inner))
    del graph
    return float(statistics.median(samples))


# ----------------------------------------------------------------------------- helpers


def copy_bandwidth() -> float:
    return _copy_bandwidth(bench_events, DEVICE, COPY_BYTES)


def load_liger():
    try:
        from liger_kernel.ops.swiglu import swiglu_forward
    except Exception as e:  # not installed, or its imports fail on this torch
        return None, f"{type(e).__name__}: {e}"
    return swiglu_forward, None


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20) or (64 << 20))


class Weights:
    """`copies` sets of gate/up/down weights (copies > 1 only when one set is small
    enough that graph-replayed calls could find it in L2)."""

    def __init__(self, d: int, h: int, gen: torch.Generator):
        self.d, self.h = d, h
        self.bytes = 3 * d * h * DTYPE.itemsize
        self.copies = max(1, math.ceil(4 * l2_bytes() / self.bytes))
        self.sets = []
        for _ in range(self.copies):
            wg = (torch.randn(h, d, device=DEVICE, generator=gen) * d**-0.5).to(DTYPE)
            wu = (torch.randn(h, d, device=DEVICE, generator=gen) * d**-0.5).to(DTYPE)
            wd = (torch.randn(d, h, device=DEVICE, generator=gen) * h**-0.5).to(DTYPE)
            self.sets.append((wg, wu, wd))

    def __getitem__(self, i: int):
        return self.sets[i % self.copies]


def reference(fused_mlp, x: torch.Tensor, w) -> torch.Tensor:
    wg, wu, wd = w
    return fused_mlp.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), "silu")


def decode_module(fused_mlp):
    mod = getattr(fused_mlp, "decode", None)
    return mod if mod is not None else importlib.import_module(fused_mlp.__name__ + ".decode")


class GeneralPath:
    """fused_mlp.gated_mlp with the dispatcher's decode path switched off (its
    DECODE_MAX_M table emptied for the call), i.e. what runs above the threshold."""

    def __init__(self, fused_mlp):
        self.fm = fused_mlp
        self.dispatch = getattr(fused_mlp, "dispatch", None)
        self.ok = self.dispatch is not None and isinstance(getattr(self.dispatch, "DECODE_MAX_M", None), dict)

    def explain(self, x: torch.Tensor) -> str:
        if not self.ok:
            return "n/a"
        saved = dict(self.dispatch.DECODE_MAX_M)
        self.dispatch.DECODE_MAX_M.clear()
        try:
            return self.dispatch.explain(x, "gated")
        except Exception as e:  # noqa: BLE001
            return f"? ({e})"
        finally:
            self.dispatch.DECODE_MAX_M.update(saved)

    def __call__(self, x, wg, wu, wd):
        saved = dict(self.dispatch.DECODE_MAX_M)
        self.dispatch.DECODE_MAX_M.clear()
        try:
            return self.fm.gated_mlp(x, wg, wu, wd, "silu")
        finally:
            self.dispatch.DECODE_MAX_M.update(saved)


# ----------------------------------------------------------------------------- the run


def run(args) -> dict:
    from kernels import get_kernel

    t_start = time.time()
    fused_mlp = get_kernel(REPO_ID, version=1)
    dec = decode_module(fused_mlp)
    if not dec.available(torch.device(DEVICE)):
        raise SystemExit("[bench] this build has no decode kernels for CUDA")

    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(0)
    copy_gbps = copy_bandwidth()
    print(f"device copy: {copy_gbps:,.0f} GB/s (read + written); L2 {l2_bytes() / 2**20:.0f} MiB")
    liger, liger_why = load_liger()
    if liger is None:
        print(f"liger_kernel not used ({liger_why})")
    general = GeneralPath(fused_mlp)
    timings = [t for t in ("events", "graph") if t in args.timings]

    def time_it(kind: str, fn_w: Callable[[int], object]) -> Optional[float]:
        # fn_w(i) runs the implementation on weight set i. A failure (e.g. a peer that
        # cannot be captured in a CUDA graph) is reported and recorded as None.
        try:
            return bench_events(lambda: fn_w(0)) if kind == "events" else bench_graph(fn_w)
        except Exception as e:  # noqa: BLE001
            print(f"[bench] {kind} timing failed: {type(e).__name__}: {e}")
            torch.cuda.synchronize()
            return None

    rows = []
    weights_by_shape: dict[tuple[int, int], Weights] = {}
    for case, m, d, h in CASES:
        if args.cases and case not in args.cases:
            continue
        if (d, h) not in weights_by_shape:
            weights_by_shape[(d, h)] = Weights(d, h, gen)
        W = weights_by_shape[(d, h)]
        x = torch.randn(m, d, device=DEVICE, generator=gen).to(DTYPE)
        h_buf = torch.randn(m, h, device=DEVICE, generator=gen).to(DTYPE)
        ref = reference(fused_mlp, x, W[0])

        def eager(x, wg, wu, wd):
            return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)

        compiled = torch.compile(eager, dynamic=False)
        impls: dict[str, Callable[[int], torch.Tensor]] = {
            "ours": lambda i: dec.gated_mlp(x, *W[i], "silu"),
            "eager": lambda i: eager(x, *W[i]),
            "compile": lambda i: compiled(x, *W[i]),
            "gemms_only": lambda i: (F.linear(x, W[i][0]), F.linear(x, W[i][1]), F.linear(h_buf, W[i][2]))[2],
        }
        if liger is not None:
            impls["liger"] = lambda i: F.linear(liger(F.linear(x, W[i][0]), F.linear(x, W[i][1]))[2], W[i][2])
        parts = {
            "gate_up": lambda i: dec.gate_up(x, W[i][0], W[i][1], None, None, "silu"),
            "down": lambda i: dec.linear(h_buf, W[i][2]),
        }
        verified = {}
        for name, fn in impls.items():
            if name == "gemms_only":
                fn(0)
                continue
            err = rel_err(fn(0), ref)
            verified[name] = err
            if not err <= TOL:
                print(f"[bench] {case}/{name}: relative error {err:.3g} exceeds {TOL:g}; not timing it")
        h_ref = fused_mlp.reference.act_and_mul(
            torch.cat([F.linear(x.double(), W[0][0].double()), F.linear(x.double(), W[0][1].double())], -1), "silu")
        verified["ours.gate_up"] = rel_err(parts["gate_up"](0), h_ref)
        verified["ours.down"] = rel_err(parts["down"](0), F.linear(h_buf.double(), W[0][2].double()))
        del ref, h_ref
        floor_ms = W.bytes / (copy_gbps * 1e9) * 1e3
        part_floor = {"gate_up": 2 * d * h * DTYPE.itemsize / (copy_gbps * 1e9) * 1e3,
                      "down": d * h * DTYPE.itemsize / (copy_gbps * 1e9) * 1e3}
        for kind in timings:
            ms = {}
            for name, fn in impls.items():
                ok = name == "gemms_only" or verified.get(name, 0.0) <= TOL
                ms[name] = time_it(kind, fn) if ok else None
            part_ms = {name: (time_it(kind, fn) if verified[f"ours.{name}"] <= TOL else None)
                       for name, fn in parts.items()}
            peers = {k: ms.get(k) for k in ("eager", "compile", "liger", "gemms_only")}
            best_peer = min([v for k, v in peers.items() if k != "gemms_only" and v is not None], default=None)
            row = {
                "case": case,
                "timing": kind,
                "m": m, "d": d, "h": h,
                "weight_bytes": W.bytes,
                "weight_copies": W.copies,
                "ours_ms": ms["ours"],
                "peers_ms": peers,
                "floor_ms": floor_ms,
                "ours_over_floor": None if ms["ours"] is None else ms["ours"] / floor_ms,
                "ours_over_best_peer": None if ms["ours"] is None or best_peer is None else ms["ours"] / best_peer,
                "ours_parts_ms": part_ms,
                "parts_floor_ms": part_floor,
                "rel_err": verified,
            }
            rows.append(row)
            print_row(row)

    crossover = []
    if not args.no_crossover:
        d, h = CROSSOVER_SHAPE
        if (d, h) not in weights_by_shape:
            weights_by_shape[(d, h)] = Weights(d, h, gen)
        W = weights_by_shape[(d, h)]
        print(f"\ncrossover (d={d}, h={h}): ms per MLP")
        print(f"{'M':>4} {'timing':<7} {'ours':>9} {'eager':>9} {'general':>9}  general path")
        for m in CROSSOVER_M:
            x = torch.randn(m, d, device=DEVICE, generator=gen).to(DTYPE)
            ref = reference(fused_mlp, x, W[0])
            impls = {"eager": lambda i: F.linear(F.silu(F.linear(x, W[i][0])) * F.linear(x, W[i][1]), W[i][2])}
            if m <= dec.MAX_M:
                impls["ours"] = lambda i: dec.gated_mlp(x, *W[i], "silu")
            if general.ok and not args.skip_general:
                impls["general"] = lambda i: general(x, *W[i])
            good = {}
            for name, fn in impls.items():
                try:
                    err = rel_err(fn(0), ref)
                except Exception as e:  # noqa: BLE001  (the general path is someone else's moving target)
                    print(f"[bench] crossover M={m} {name}: {type(e).__name__}: {e}")
                    err = float("inf")
                good[name] = err <= TOL
            path = general.explain(x) if general.ok else "n/a"
            for kind in timings:
                entry = {"m": m, "timing": kind, "general_path": path}
                for name in ("ours", "eager", "general"):
                    fn = impls.get(name)
                    entry[f"{name}_ms"] = time_it(kind, fn) if fn is not None and good.get(name) else None
                crossover.append(entry)
                fmt = lambda v: f"{v:9.4f}" if v is not None else f"{'-':>9}"  # noqa: E731
                print(f"{m:>4} {kind:<7} {fmt(entry['ours_ms'])} {fmt(entry['eager_ms'])} "
                      f"{fmt(entry['general_ms'])}  {path}")
            del ref

    sweep = sweep_configs(dec, weights_by_shape, gen, timings) if args.sweep_configs else None

    report = {
        **run_info(),
        "copy_bandwidth_GBps": round(copy_gbps, 1),
        "l2_bytes": l2_bytes(),
        "liger": "measured" if liger is not None else f"not measured: {liger_why}",
        "notes": (
            "floor_ms = weight bytes / copy bandwidth. events: triton do_bench median (L2 flushed, host "
            "launch overhead included); graph: 10 calls per CUDA graph, replay median of 7, weights "
            "cycled through weight_copies sets so that no call finds its weights in L2."
        ),
        "rows": rows,
        "crossover": crossover,
        "config_sweep": sweep,
        "elapsed_s": round(time.time() - t_start, 1),
    }
    print_summary(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['elapsed_s']} s)")
    return report


def sweep_configs(dec, weights_by_shape, gen, timings) -> list[dict]:
    """Time each decode kernel over the block shapes the tuning variables select."""
    d, h = CROSSOVER_SHAPE
    W = weights_by_shape.get((d, h)) or Weights(d, h, gen)
    keys = ("FUSED_MLP_DECODE_KS", "FUSED_MLP_DECODE_RW", "FUSED_MLP_DECODE_LINEAR_ROWS")
    saved = {k: os.environ.get(k) for k in keys}
    out = []
    print("\nconfig sweep (graph timing, ms):")
    try:
        for m in (1, 16, 64):
            x = torch.randn(m, d, device=DEVICE, generator=gen).to(DTYPE)
            hb = torch.randn(m, h, device=DEVICE, generator=gen).to(DTYPE)
            for op, rows_opts in (("gate_up", (None,)), ("down", ("16", "32"))):
                for lr in rows_opts:
                    for ks in (1, 2, 4, 8, 16):
                        for rw in (1, 2, 4):
                            if ks * rw > 16:
                                continue
                            os.environ["FUSED_MLP_DECODE_KS"] = str(ks)
                            os.environ["FUSED_MLP_DECODE_RW"] = str(rw)
                            if lr is None:
                                os.environ.pop("FUSED_MLP_DECODE_LINEAR_ROWS", None)
                                fn = lambda i: dec.gate_up(x, W[i][0], W[i][1], None, None, "silu")  # noqa: E731
                            else:
                                os.environ["FUSED_MLP_DECODE_LINEAR_ROWS"] = lr
                                fn = lambda i: dec.linear(hb, W[i][2])  # noqa: E731
                            ms = bench_graph(fn)
                            out.append({"m": m, "op": op, "ks": ks, "rw": rw, "linear_rows": lr, "graph_ms": ms})
            for op in ("gate_up", "down"):
                best = min((e for e in out if e["m"] == m and e["op"] == op), key=lambda e: e["graph_ms"])
                print(f"  M={m:<3} {op:<8} best ks={best['ks']} rw={best['rw']} rows={best['linear_rows']}: "
                      f"{best['graph_ms']:.4f}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


# ----------------------------------------------------------------------------- output


def _f(v, w=9, p=4):
    return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"


def print_row(row: dict) -> None:
    peers = row["peers_ms"]
    print(f"{row['case']:<30} {row['timing']:<6} ours {_f(row['ours_ms'])}  floor {_f(row['floor_ms'])}  "
          f"x{_f(row['ours_over_floor'], 5, 3)}  | eager {_f(peers['eager'])} compile {_f(peers['compile'])} "
          f"liger {_f(peers['liger'])} gemms {_f(peers['gemms_only'])}  | gate_up {_f(row['ours_parts_ms']['gate_up'])}"
          f" down {_f(row['ours_parts_ms']['down'])}", flush=True)


def print_summary(report: dict) -> None:
    print(f"\n{report['gpu']}, torch {report['torch']}, triton {report['triton']}; "
          f"copy {report['copy_bandwidth_GBps']:,.0f} GB/s")
    header = (f"{'case':<30} {'timing':<6} {'ours ms':>9} {'floor':>9} {'/floor':>7} {'eager':>9} "
              f"{'compile':>9} {'liger':>9} {'gemms':>9} {'/best':>6}")
    print(header)
    print("-" * len(header))
    for r in report["rows"]:
        p = r["peers_ms"]
        print(f"{r['case']:<30} {r['timing']:<6} {_f(r['ours_ms'])} {_f(r['floor_ms'])} "
              f"{_f(r['ours_over_floor'], 7, 3)} {_f(p['eager'])} {_f(p['compile'])} {_f(p['liger'])} "
              f"{_f(p['gemms_only'])} {_f(r['ours_over_best_peer'], 6, 3)}")


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="default benchmarks/results/decode_<card>.json")
    p.add_argument("--cases", nargs="*", default=None, help="subset of case names")
    p.add_argument("--timings", nargs="*", default=["events", "graph"], choices=["events", "graph"])
    p.add_argument("--no-crossover", action="store_true", help="skip the M sweep")
    p.add_argument("--skip-general", action="store_true", help="crossover without fused-mlp's general path")
    p.add_argument("--sweep-configs", action="store_true", help="also sweep the decode block shapes (tuning)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("[bench] needs a CUDA GPU")
    a.out = a.out or default_out("decode")
    run(a)


if __name__ == "__main__":
    main()
