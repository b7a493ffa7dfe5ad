"""Helpers shared by the GPU comparison scripts (bench_*.py)."""

from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F


def module_version(name: str) -> Optional[str]:
    """`name.__version__`, or None where the module does not import."""
    try:
        return importlib.import_module(name).__version__
    except Exception:
        return None


# The package's switches (FUSED_MLP_*) as the script was started: taken at import, before a
# script sets any itself (an A/B's sides, a mode a script needs), so the command says what was typed.
_START_SWITCHES = tuple(f"{k}={shlex.quote(v)}" for k, v in sorted(os.environ.items()) if k.startswith("FUSED_MLP_"))


def run_info(device: str = "cuda") -> dict:
    """The head of every results file: GPU, torch and Triton versions, UTC date and the
    command line that made it, prefixed with the package's switches set when it started."""
    return {
        "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
        "triton": module_version("triton"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([*_START_SWITCHES, *(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])]),
    }


RESULTS = Path(__file__).resolve().parent / "results"


def gpu_tag(name: str) -> str:
    """The card's model in a results file's name: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA H200" -> "h200"; "gpu" where the name shows no model number."""
    m = re.search(r"\b([a-z]+[0-9]{2,4}[a-z]?)\b", name.lower())
    return m.group(1) if m else "gpu"


def default_out(stem: str, device: str = "cuda", suffix: str = ".json") -> Path:
    """results/<stem>_<card><suffix>, named after the GPU the script runs on (the device tool
    may lend an H100 where an H200 was asked for: its numbers must not land in an h200 file),
    `cpu` for a dry run."""
    tag = gpu_tag(torch.cuda.get_device_name()) if device == "cuda" and torch.cuda.is_available() else "cpu"
    return RESULTS / f"{stem}_{tag}{suffix}"


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


# The dtypes the scripts' --dtype options name.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def swiglu_operands(m: int = 4096, d: int = 4096, h: int = 14336, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """x [m, d], Wg and Wu [h, d], Wd [d, h] on the GPU (bf16 unless said), random with the
    weights scaled to keep the outputs O(1): the Llama-8B-sized SwiGLU block of the micro scripts."""
    bf = dict(device="cuda", dtype=dtype)
    return (torch.randn(m, d, **bf), torch.randn(h, d, **bf) * d**-0.5, torch.randn(h, d, **bf) * d**-0.5,
            torch.randn(d, h, **bf) * h**-0.5)


def swiglu_eager(x, wg, wu, wd):
    """The SwiGLU block as eager PyTorch runs it (three F.linear, SiLU, product): the micro
    scripts' peer, and what they hand torch.compile."""
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def warm_up(fn: Callable[[], object], calls: int = 2) -> None:
    """Run fn a few times on a side stream before a capture (lazy initialisation, autotuning
    and allocations happen outside the graph), then join the side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream().wait_stream(s)


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """A CUDA graph of one call of fn (warmed up on a side stream first); returns its replay."""
    warm_up(fn)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def median_us(fn: Callable[[], object], rep: int = 200) -> float:
    """triton.testing.do_bench's median (L2 flushed between runs), in microseconds."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")) * 1e3


def l2_evictor(kind: str = "fill") -> Callable[[], object]:
    """A call that evicts L2 before a timed call by touching 256 MiB: `fill` writes it (as
    do_bench does; the timed call then writes the dirty lines back to DRAM), `read` sums it
    (the lines it leaves are clean). The buffer is made once per evictor."""
    buf = torch.ones(64 << 20, device="cuda")
    total = torch.empty((), device="cuda")
    if kind == "fill":
        return lambda: buf.fill_(1.0)
    if kind == "read":
        return lambda: torch.sum(buf, dim=0, out=total)
    raise ValueError(f"eviction must be 'fill' or 'read', got {kind!r}")


def call_order(names: list, cycle: int) -> list:
    """The order of cycle `cycle` in an interleaved loop: names rotated by the cycle, so that over
    len(names) cycles each implementation runs once in every position (none always right after
    the same one)."""
    k = cycle % len(names)
    return names[k:] + names[:k]


def interleaved_us(fns: dict, eviction: str = "fill", reps: int = 40, rounds: int = 3) -> dict:
    """{name: (median us, [each round's median])}: the calls of `fns` (CUDA-graph replays, say)
    timed by events, interleaved call by call (rep i starts at the i-th name: call_order), L2 evicted
    before each call by l2_evictor(eviction)."""
    evict = l2_evictor(eviction)
    names = list(fns)
    per_round: dict = {n: [] for n in names}
    for _ in range(rounds):
        events: dict = {n: [] for n in names}
        for i in range(reps):
            for n in call_order(names, i):
                evict()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fns[n]()
                e.record()
                events[n].append((s, e))
        torch.cuda.synchronize()
        for n, v in events.items():
            per_round[n].append(statistics.median(s.elapsed_time(e) * 1e3 for s, e in v))
    return {n: (statistics.median(v), v) for n, v in per_round.items()}


def replay_rounds_us(replays: dict, rounds: int, reps: int, calls: int) -> dict:
    """{name: {"us": median over rounds, "rounds": [us per call, one value per round]}}: each
    replay (a CUDA graph's, say, of `calls` calls) run once untimed, then timed by events around
    `reps` replays; the names interleaved round by round (call_order)."""
    res: dict = {n: [] for n in replays}
    names = list(replays)
    for r in range(rounds):
        for n in call_order(names, r):
            replays[n]()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                replays[n]()
            b.record()
            torch.cuda.synchronize()
            res[n].append(a.elapsed_time(b) * 1e3 / (reps * calls))
    return {n: {"us": statistics.median(v), "rounds": v} for n, v in res.items()}


def trace_events(prof, cats: tuple = ("kernel",)) -> list:
    """The events of a finished torch.profiler run whose category is in `cats` ("kernel",
    "gpu_memset", "gpu_memcpy", "cpu_op", ...), sorted by start time, as the run's Chrome trace
    holds them: unlike prof.events(), a kernel's entry there carries its grid and block. Once
    per run: torch exports a run's trace only once."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return sorted((e for e in trace["traceEvents"] if e.get("cat") in cats), key=lambda e: e["ts"])


def local_package(*submodules: str):
    """fused-mlp as users load it (kernels.get_kernel), from this checkout's staged Hub cache
    (.hub-cache, offline) unless KERNELS_CACHE / HF_HUB_OFFLINE say otherwise: the package
    and the named submodules (e.g. "triton_gemm"). Call before anything imports `kernels`."""
    root = Path(__file__).resolve().parents[1]
    os.environ.setdefault("KERNELS_CACHE", str(root / ".hub-cache"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kernels import get_kernel

    fm = get_kernel("org/fused-mlp", version=1)
    return (fm, *(importlib.import_module(f"{fm.__name__}.{name}") for name in submodules))


def write_report(path, rows: list, device: str = "cuda", **extra) -> None:
    """The results JSON: run_info(device), `extra`, then the rows; nothing if path is None."""
    if path is None:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({**run_info(device), **extra, "rows": rows}, indent=1) + "\n")


def with_env(fn: Callable[[], object], name: str, value: str) -> Callable[[], object]:
    """fn with the environment variable `name` set to `value` for the length of each call (and
    restored after): an A/B of a switch the ops read at every call, in one process. Not
    unittest.mock.patch.dict(os.environ, ...): it restores the whole environment after each call,
    ~350 us of host time per call here against ~6, inside the timed calls."""
    def call():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return fn()
        finally:
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
    return call
