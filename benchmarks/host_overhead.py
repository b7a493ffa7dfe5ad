#!/usr/bin/env python3
"""Host (CPU) time per call of fused-mlp's public functions against eager, layer by layer,
and a cProfile of one public call. A call whose host time exceeds its GPU time is
launch-bound: `events` timings then measure Python, not kernels.

    KERNELS_CACHE=... HF_HUB_OFFLINE=1 python benchmarks/host_overhead.py [--out FILE] [--train]

Layers of one gated_mlp call (each timed alone, after warm-up, no synchronisation inside
the loop): public op -> dispatcher -> gated_linear (tuner lookup + launch) -> _launch
(flags, descriptors, Triton's launch) -> the bare Triton launch with every argument
prepared, and cuBLAS for the down projection.

--train-pieces (with --train): the gated step's pieces one by one (train_pieces), with and
without TMA.

--train: host time of one training step (forward + backward, gradients set to None) at
m8192 d768 h3072 bf16, ours (GeGLU, plain MLP) against eager, in loops of 20 steps (short
enough that the launch queue never fills and blocks the host), and a cProfile of the plain
MLP's steps by own time. bench_train.py --graph showed these steps' events timing 0.65 ms
above their GPU time (session 3).

--sync-check (with --train): each of those training steps once more under
torch.cuda.set_sync_debug_mode("warn"), listing every synchronizing CUDA call PyTorch makes in
it (a copy to the host, a stream or device synchronize) with the Python lines that made it.
Session 17 measured ours' GeGLU step at ~1.2 ms of host time where its pieces add up to ~0.38
and its GPU time is ~0.59: a hidden wait on the GPU would look like that. Session 18 found none.

--blocking-check (with --train): each step's host time as is, behind a GPU sleep, and at a
small M (blocking_check): whether that host time is waiting on the GPU by another route (a
call that blocks without PyTorch's sync check seeing it).
Session 18: it does not (results/host_overhead_h200_train_session18.txt).

--engine-check (with --train): the gated step's host time through autograd's engine against
its forward and backward called directly, and the engine's own cost (engine_check), in
interleaved rounds: this host's timings drift too much for single loops to compare.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import os
import pstats
import statistics
import threading
import time
import traceback
import warnings
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from kernels import get_kernel


def host_us(fn, n: int = 300, before=None) -> float:
    """Host us per call of fn: the minimum of three loops of n calls, after 20 warm-up calls.
    before(), if given, runs ahead of each loop, untimed, with the GPU idle."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):  # the minimum of three loops: host timings on a shared machine are noisy
        if before is not None:
            before()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    return best


def profile(fn, calls: int, say, title: str, by: str = "tottime", rows: int = 25, chars: int = 7000) -> None:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    say_stats(pr, say, title, by, rows, chars)


def say_stats(pr: cProfile.Profile, say, title: str, by: str = "tottime", rows: int = 25, chars: int = 7000) -> None:
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(by).print_stats(rows)
    say(f"## cProfile of {title}, by {'own' if by == 'tottime' else by} time")
    say(s.getvalue()[:chars])


def profiler_table(fn, calls: int, say, title: str, cuda: bool = False, rows: int = 30) -> None:
    """torch.profiler's table of `calls` calls of fn (after one), by CPU self time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    say(f"## torch.profiler, {title}, CPU self time")
    say(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60))


def sync_check(steps: dict, say) -> None:
    """Run each step once (after one warm-up run) with PyTorch warning at every synchronizing
    CUDA call, and report them: the warning's text and the innermost Python frames that made
    the call. Syncs inside Triton's launcher or cuBLAS are not seen, only PyTorch's own."""
    say("## synchronizing CUDA calls per training step (torch.cuda.set_sync_debug_mode('warn'))")
    for name, fn in steps.items():
        fn()
        torch.cuda.synchronize()
        found: list[str] = []

        def record(message, category, filename, lineno, file=None, line=None):
            if "prototype feature" in str(message):
                return  # set_sync_debug_mode's own notice, not a synchronizing call
            frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename][-3:]
            found.append(f"{str(message)[:100]} <- " + " <- ".join(
                f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames)))

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            shown, warnings.showwarning = warnings.showwarning, record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
                warnings.showwarning = shown
        torch.cuda.synchronize()
        say(f"  {name:<36} {len(found)} synchronizing call(s)")
        for f in found:
            say(f"    {f}")


def blocking_check(fm, say, steps: dict, sleep_ms: float = 20.0) -> None:
    """Does a step's host time depend on the GPU? Each step's loop of 20 timed three ways:
    as is; behind a GPU sleep of `sleep_ms` queued first (a call that waits for the GPU then
    waits for the sleep too, and the loop's time grows by up to sleep_ms; pure host work does
    not); and the same steps at m 256, where the GPU work is ~30x smaller (host work per
    step is the same at both sizes; time that scales with M is waiting)."""
    rate = torch.cuda.get_device_properties(0).clock_rate * 1e3  # Hz; the sleep counts cycles
    cycles = int(sleep_ms * 1e-3 * rate)

    def sleep():
        torch.cuda._sleep(cycles)

    small = training_steps(fm, m=256)
    say(f"## host us/step: as is / behind a {sleep_ms:.0f} ms GPU sleep (waits add up to "
        f"{sleep_ms * 1e3 / 20:.0f} us/step) / at m 256")
    for name, fn in steps.items():
        say(f"  {name:<36} {host_us(fn, n=20):8.1f} {host_us(fn, n=20, before=sleep):8.1f} "
            f"{host_us(small[name], n=20):8.1f}")


def gated_problem(fm, m: int, d: int, h: int, dev: str, dt: torch.dtype):
    """The GeGLU training step's tensors: (triton_backward, x, Wg, Wu, Wd, dy, their leaf
    copies [x, Wg, Wu, Wd], the NEED_* bits of every gradient, ours' step on the leaves)."""
    tb = importlib.import_module(fm.__name__ + ".triton_backward")
    x = torch.randn(m, d, device=dev, dtype=dt)
    wg, wu = (torch.randn(h, d, device=dev, dtype=dt) * d**-0.5 for _ in range(2))
    wd = torch.randn(d, h, device=dev, dtype=dt) * h**-0.5
    dy = torch.randn(m, d, device=dev, dtype=dt)
    leaves = [t.clone().requires_grad_() for t in (x, wg, wu, wd)]

    def step():
        for p in leaves:
            p.grad = None
        fm.gated_mlp(*leaves, "gelu_tanh").backward(dy)

    return tb, x, wg, wu, wd, dy, leaves, tb.NEED_DX | tb.NEED_DW_IN | tb.NEED_DW_OUT, step


def interleaved(timings: dict, say, title: str, width: int, rounds: int = 5) -> None:
    """Each of `timings` (name: a call returning us) in `rounds` interleaved rounds (this host's
    timings drift by 1.5x within a run), said as medians with every round."""
    got: dict[str, list[float]] = {k: [] for k in timings}
    for _ in range(rounds):
        for k, timed in timings.items():
            got[k].append(timed())
    say(title)
    for k, v in got.items():
        say(f"  {k:<{width}} {statistics.median(v):8.1f}   rounds {' '.join(f'{t:.0f}' for t in v)}")


def engine_check(fm, disp, say, m: int = 8192, d: int = 768, h: int = 3072, dev: str = "cuda") -> None:
    """Where the gated step's host time goes between its pieces (~0.38 ms called one by one on
    this thread) and the whole step (~1.1 ms): the same backward called directly on this
    thread against through autograd's engine (which runs CUDA nodes on its own device
    thread); a do-nothing autograd Function's step with k small torch ops in its backward
    (the engine's cost per step and per op there) against the same k ops on this thread and on
    a plain Python thread; cProfile of the backward on each side; and torch.profiler's CPU self
    time of the direct path and of the step through the engine."""
    dt = torch.bfloat16 if dev == "cuda" else torch.float32  # (CPU: the tests' dry run)
    path = "triton" if dev == "cuda" else "triton-interpret"
    tb, x, wg, wu, wd, dy, leaves, every, engine = gated_problem(fm, m, d, h, dev, dt)

    def direct():
        _, gu_s, h_s = disp.gated_mlp_train_forward(x, wg, wu, wd, "gelu_tanh", None, None, None)
        disp.gated_mlp_backward(dy, x, wg, wu, wd, "gelu_tanh", None, None, gu_s, h_s, every, True, path=path)

    small = torch.randn(64, 64, device=dev)

    def toy_step(body):
        """A step of a do-nothing autograd Function (one 64 x 64 leaf) whose backward calls body()."""
        class Toy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a.view_as(a)

            @staticmethod
            def backward(ctx, g):
                body()
                return g

        leaf = torch.randn(64, 64, device=dev, requires_grad=True)
        seed = torch.ones(64, 64, device=dev)

        def step():
            leaf.grad = None
            Toy.apply(leaf).backward(seed)
        return step

    mm_count = [0]

    def ops_here():
        for _ in range(mm_count[0]):
            torch.mm(small, small)

    toy = toy_step(ops_here)
    _, gu0, h0 = disp.gated_mlp_train_forward(x, wg, wu, wd, "gelu_tanh", None, None, None)

    def backward_only():
        disp.gated_mlp_backward(dy, x, wg, wu, wd, "gelu_tanh", None, None, gu0, h0, every, False, path=path)

    engine_prof: list = [None]  # a cProfile.Profile to run inside the engine's backward, or None

    def profiled_backward():
        if engine_prof[0] is not None:
            engine_prof[0].enable()
        backward_only()
        if engine_prof[0] is not None:
            engine_prof[0].disable()

    # the direct backward (on tensors saved outside) as a Function's backward: the same work
    # inside the engine, without the op's own forward / backward wrappers
    wrapped = toy_step(profiled_backward)

    def on_thread(fn) -> float:  # host_us of fn, on a new Python thread
        res = []

        def body():
            if dev == "cuda":
                torch.cuda.set_device(0)
            res.append(host_us(fn, n=20))
        t = threading.Thread(target=body)
        t.start()
        t.join()
        return res[0]

    x_only = [leaves[0]] + [t.detach() for t in leaves[1:]]

    def engine_x_only():
        x_only[0].grad = None
        fm.gated_mlp(*x_only, "gelu_tanh").backward(dy)

    def forward_only():
        fm.gated_mlp(*leaves, "gelu_tanh")

    def here(fn):
        return lambda: host_us(fn, n=20)

    timings = {  # name: a call that times it, in us per step
        "ours gated step through the engine": here(engine),
        "the same forward + backward called directly": here(direct),
        "ours step, only x needing a gradient": here(engine_x_only),
        "ours forward alone (grad on, graph dropped)": here(forward_only),
        "the direct backward alone": here(backward_only),
        "the direct backward alone, on a Python thread": lambda: on_thread(backward_only),
        "the direct backward in a toy Function, through the engine": here(wrapped),
    }
    interleaved(timings, say, f"## engine check, host us/step (median of 5 interleaved rounds, each the min of 3 "
                f"loops of 20), m{m} d{d} h{h} {str(dt).removeprefix('torch.')}", width=58)
    # the backward's calls, by own time, where they run: on this thread, and on the engine's
    prof_here = cProfile.Profile()
    prof_engine = cProfile.Profile()
    engine_prof[0] = prof_engine
    for _ in range(20):
        prof_here.enable()
        backward_only()
        prof_here.disable()
        wrapped()
    torch.cuda.synchronize()
    engine_prof[0] = None
    for name, pr in (("on this thread", prof_here), ("inside the engine (a toy Function's backward)", prof_engine)):
        say_stats(pr, say, f"20 direct backwards {name}", rows=14, chars=5000)
    for k in (0, 20):
        mm_count[0] = k
        say(f"  toy Function step, {k:2d} small mm in backward  {host_us(toy, n=20):8.1f}   "
            f"the {k} mm here {host_us(ops_here, n=20):7.1f}, on a Python thread {on_thread(ops_here):7.1f}")
    for name, fn in (("direct", direct), ("through the engine", engine)):
        profiler_table(fn, 10, say, f"10 gated steps {name}", rows=14)


def leaf(dev: str, dt: torch.dtype, *shape, scale: float = 1.0) -> torch.Tensor:
    """A random tensor requiring grad (an input or a weight of a training step)."""
    return (torch.randn(*shape, device=dev, dtype=dt) * scale).requires_grad_()


def stepper(params: list, dy: torch.Tensor):
    """step(fwd): a zero-argument training step, the gradients of params set to None, then
    fwd().backward(dy)."""
    def step(fwd):
        def run():
            for p in params:
                p.grad = None
            fwd().backward(dy)
        return run
    return step


def training_steps(fm, m: int = 8192, d: int = 768, h: int = 3072, dev: str = "cuda") -> dict:
    """One training step each (forward + backward, gradients set to None) of ours and eager's
    gated and plain MLPs, as zero-argument calls."""
    dt = torch.bfloat16
    x = leaf(dev, dt, m, d)
    wg, wu, w1 = (leaf(dev, dt, h, d, scale=d**-0.5) for _ in range(3))
    wd, w2 = (leaf(dev, dt, d, h, scale=h**-0.5) for _ in range(2))
    b1, b2 = leaf(dev, dt, h), leaf(dev, dt, d)
    dy = torch.randn(m, d, device=dev, dtype=dt)
    step = stepper([x, wg, wu, w1, wd, w2, b1, b2], dy)
    steps = {
        "ours gated_mlp gelu_tanh": step(lambda: fm.gated_mlp(x, wg, wu, wd, "gelu_tanh")),
        "eager gated (3 linear + gelu + mul)": step(lambda: F.linear(
            F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd)),
        "ours mlp gelu_tanh +bias": step(lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh")),
        "eager mlp (linear + gelu + linear)": step(lambda: F.linear(
            F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)),
    }
    return steps


def train_host_time(fm, say, detail: bool = False, sync: bool = False, blocking: bool = False) -> None:
    m, d, h = 8192, 768, 3072
    steps = training_steps(fm, m, d, h)
    if sync:
        sync_check(steps, say)
    if blocking:
        blocking_check(fm, say, steps)
    say(f"## training step host us/step (min of 3 loops of 20 steps), m{m} d{d} h{h} bf16")
    for name, fn in steps.items():
        say(f"  {name:<36} {host_us(fn, n=20):8.1f}")
    profile(steps["ours mlp gelu_tanh +bias"], 20, say, "20 plain-MLP training steps (ours)")
    if not detail:
        return
    # where the gated step's host time goes: without TMA descriptors, torch.profiler's CPU
    # side (launch and driver calls included), cProfile by cumulative time
    gated = steps["ours gated_mlp gelu_tanh"]
    with mock.patch.dict(os.environ, {"FUSED_MLP_TMA": "0"}):  # part of the launch plans' key
        gated()
        torch.cuda.synchronize()
        say(f"  ours gated_mlp, FUSED_MLP_TMA=0        {host_us(gated, n=20):8.1f}")
    profiler_table(gated, 10, say, "10 gated training steps (ours)", cuda=True)
    profile(gated, 20, say, "20 gated training steps (ours)", by="cumulative", rows=45, chars=12000)


def train_pieces(fm, tg, disp, say, m: int = 8192, d: int = 768, h: int = 3072, dev: str = "cuda") -> None:
    """Host time of each piece of ours' gated training step (m8192 d768 h3072 bf16, saved
    g | u, one chunk), each called alone in loops of 20, next to the whole step and to
    eager's: where the step's host time goes, before any change to it."""
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    tb, x, wg, wu, wd, dy, leaves, every, step_ours = gated_problem(fm, m, d, h, dev, dt)
    act_id = fm.activations.ACTIVATION_IDS["gelu_tanh"]
    gu = torch.empty(m, 2 * h, device=dev, dtype=dt)
    hh = torch.empty(m, h, device=dev, dtype=dt)
    _, gu_s, h_s = disp.gated_mlp_train_forward(x, wg, wu, wd, "gelu_tanh", None, None, None)
    scratch = torch.empty_like(gu_s)
    dx, dwgu, dwd = torch.empty(m, d, device=dev, dtype=dt), torch.empty(2 * h, d, device=dev, dtype=dt), \
        torch.empty(d, h, device=dev, dtype=dt)

    def step_eager():
        for p in leaves:
            p.grad = None
        xl, a, b, c = leaves
        F.linear(F.gelu(F.linear(xl, a), approximate="tanh") * F.linear(xl, b), c).backward(dy)

    pieces = {
        "step: ours (forward + backward)": step_ours,
        "step: eager": step_eager,
        "forward: public gated_mlp, grad on": lambda: fm.gated_mlp(*leaves, "gelu_tanh"),
        "forward: dispatch.gated_mlp_train_forward": lambda: disp.gated_mlp_train_forward(
            x, wg, wu, wd, "gelu_tanh", None, None, None),
        "forward: dispatch.backward_choice": lambda: disp.backward_choice(x, "gated", (wg, wu, wd), h),
        "forward: tg.gated_linear (stores g | u)": lambda: tg.gated_linear(x, wg, wu, None, None, act_id, pre=gu),
        "forward: F.linear (down)": lambda: F.linear(hh, wd),
        "backward: dispatch.gated_mlp_backward": lambda: disp.gated_mlp_backward(
            dy, x, wg, wu, wd, "gelu_tanh", None, None, gu_s, h_s, every, False,
            path="triton" if dev == "cuda" else "triton-interpret"),
        "backward: tg.linear_dact (dh + derivative)": lambda: tg.linear_dact(
            dy, wd, True, gu_s, scratch, act_id, gated=True),
        "backward: torch.mm dWd = dy^T h": lambda: torch.mm(dy.t(), h_s, out=dwd),
        "backward: torch.mm [dWg; dWu] = dgu^T x": lambda: torch.mm(scratch.t(), x, out=dwgu),
        "backward: dx = dg Wg + du Wu (mm + addmm_)": lambda: tb._dx_gated(
            tg, dx, scratch, h, wg, wu, accumulate=False, mode="cublas"),
        "backward: 3 x torch.empty": lambda: (torch.empty((m, d), device=dev, dtype=dt),
                                              torch.empty((2 * h, d), device=dev, dtype=dt),
                                              torch.empty((d, h), device=dev, dtype=dt)),
    }
    say(f"## training step pieces, host us/call (min of 3 loops of 20 calls), m{m} d{d} h{h} {dt}, "
        f"FUSED_MLP_TMA={os.environ.get('FUSED_MLP_TMA', '(unset: on)')}")
    for name, fn in pieces.items():
        say(f"  {name:<46} {host_us(fn, n=20):8.1f}")


def node_pieces(fm, disp, say, m: int = 8192, d: int = 768, h: int = 3072, dev: str = "cuda") -> None:
    """Where the plain MLP's training step (C++ node, m8192 d768 h3072 bf16, biases) spends its
    host time, piece by piece, in interleaved rounds (this host drifts by 1.5x between loops):
    the whole step against eager's, the public forward, its Python before the node (the node
    replaced by a ready tensor), the dispatcher's checks one by one, the node's op called
    directly, its forward's two GEMMs, and the backward alone through the engine. Session 20
    measured the step at 344 us of host time against 445 us of GPU time."""
    dt = torch.bfloat16
    sm = importlib.import_module(fm.__name__ + ".sm90")
    act = fm.activations.ACTIVATION_IDS["gelu_tanh"]

    x, w1, w2 = leaf(dev, dt, m, d), leaf(dev, dt, h, d, scale=d**-0.5), leaf(dev, dt, d, h, scale=h**-0.5)
    b1, b2 = leaf(dev, dt, h), leaf(dev, dt, d)
    dy = torch.randn(m, d, device=dev, dtype=dt)
    params = [x, w1, b1, w2, b2]
    ones = disp._bias_ones(x, b1, b2)
    y0 = torch.randn(m, d, device=dev, dtype=dt)
    pre, hh = torch.empty(m, h, device=dev, dtype=dt), torch.empty(m, h, device=dev, dtype=dt)
    xd, w1d, b1d, w2d, b2d = (t.detach() for t in params)
    step = stepper(params, dy)
    ours = step(lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh"))
    eager = step(lambda: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2))
    ys: list = []

    def make_graphs():  # 20 forwards kept for the backward-only loop (untimed)
        ys.clear()
        for p in params:
            p.grad = None
        ys.extend(fm.mlp(x, w1, b1, w2, b2, "gelu_tanh") for _ in range(20))
        torch.cuda.synchronize()

    def backward_only() -> float:
        best = float("inf")
        for _ in range(3):
            make_graphs()
            t0 = time.perf_counter()
            for y in ys:
                y.backward(dy)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            best = min(best, (t1 - t0) / len(ys) * 1e6)
        ys.clear()
        return best

    def preamble():
        with mock.patch.object(sm, "mlp_train", lambda *a: y0):
            return host_us(lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh"), n=20)

    here = {
        "step: ours (C++ node)": ours,
        "step: eager": eager,
        "forward: public mlp, grad on": lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh"),
        "forward: the node's op called directly": lambda: sm.ops.mlp_train_sm90(x, w1, b1, w2, b2, ones, act),
        "forward: dispatch.sm90_mlp_train": lambda: disp.sm90_mlp_train(x, w1, b1, w2, b2, "gelu_tanh", "linear"),
        "  sm90.mlp_train_usable": lambda: sm.mlp_train_usable(x, w1, b1, w2, act),
        "  dispatch.backward_choice": lambda: disp.backward_choice(x, "mlp", (w1, w2), h),
        "  dispatch._bias_ones": lambda: disp._bias_ones(x, b1, b2),
        "kernel: linear_act_sm90 (pre and h)": lambda: sm.ops.linear_act_sm90(hh, xd, w1d, b1d, pre, act),
        "kernel: F.linear y = h W2^T + b2": lambda: F.linear(hh, w2d, b2d),
        "kernel: dact_gemm_sm90 (dpre)": lambda: sm.ops.dact_gemm_sm90(hh, dy, w2d, pre, act, False, True),
        "kernel: torch.mm dW2 = dy^T h": lambda: torch.mm(dy.t(), hh),
        "kernel: torch.mv db2 = dy^T 1": lambda: torch.mv(dy.t(), ones),
        "2 x torch.empty [M, H]": lambda: (torch.empty((m, h), device=dev, dtype=dt),
                                           torch.empty((m, h), device=dev, dtype=dt)),
    }
    timings = {k: (lambda fn=fn: host_us(fn, n=20)) for k, fn in here.items()}
    timings["forward: public mlp's Python (node stubbed)"] = preamble
    timings["backward alone, through the engine"] = backward_only
    interleaved(timings, say, f"## plain MLP node pieces, host us/call (median of 5 interleaved rounds, each the min "
                f"of 3 loops of 20), m{m} d{d} h{h} bf16, biases, gelu_tanh", width=50)
    profiler_table(ours, 10, say, "10 plain training steps (ours, C++ node)", rows=25)
    profile(lambda: fm.mlp(x, w1, b1, w2, b2, "gelu_tanh"), 200, say,
            "200 public mlp forwards with grad (C++ node)", rows=20, chars=5000)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("--train", action="store_true", help="training steps only (see the docstring)")
    ap.add_argument("--train-detail", action="store_true",
                    help="with --train: the gated step without TMA, torch.profiler and cProfile by cumulative time")
    ap.add_argument("--train-pieces", action="store_true",
                    help="with --train: host time of each piece of the gated training step (see train_pieces)")
    ap.add_argument("--sync-check", action="store_true",
                    help="with --train: the synchronizing CUDA calls of each training step (see sync_check)")
    ap.add_argument("--blocking-check", action="store_true",
                    help="with --train: whether each step's host time waits on the GPU (see blocking_check)")
    ap.add_argument("--node-pieces", action="store_true",
                    help="with --train: host time of the plain MLP's C++ training node, piece by piece (see node_pieces)")
    ap.add_argument("--engine-check", action="store_true",
                    help="with --train: the gated step through autograd's engine against called directly (see engine_check)")
    args = ap.parse_args()
    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    fm = get_kernel("org/fused-mlp", version=1)
    tg = importlib.import_module(fm.__name__ + ".triton_gemm")
    disp = importlib.import_module(fm.__name__ + ".dispatch")
    dev = "cuda"
    say(f"# host us/call (min of 3 loops of 300 calls), {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.train:
        if args.train_pieces:
            train_pieces(fm, tg, disp, say)
            with mock.patch.dict(os.environ, {"FUSED_MLP_TMA": "0"}):
                train_pieces(fm, tg, disp, say)
        if args.engine_check:
            engine_check(fm, disp, say)
        if args.node_pieces:
            node_pieces(fm, disp, say)
        train_host_time(fm, say, args.train_detail, args.sync_check, args.blocking_check)
        cases = {}
    else:
        cases = {"m128 d4096 h14336": (128, 4096, 14336), "m8192 d768 h3072": (8192, 768, 3072)}
    for name, (m, d, h) in cases.items():
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, d, device=dev, dtype=dt)
            wg, wu = (torch.randn(h, d, device=dev, dtype=dt) * d**-0.5 for _ in range(2))
            wd = torch.randn(d, h, device=dev, dtype=dt) * h**-0.5
            hh = torch.randn(m, h, device=dev, dtype=dt)
            b1 = torch.randn(h, device=dev, dtype=dt)
            b2 = torch.randn(d, device=dev, dtype=dt)
            act = tg_act = fm.activations.ACTIVATION_IDS["gelu_tanh"]
            fm.gated_mlp(x, wg, wu, wd, "gelu_tanh")  # tunes
            torch.cuda.synchronize()
            tma_ok = tg._tma_compatible(x, wg, wu)
            out = torch.empty(m, h, device=dev, dtype=dt)

            def launch(c, x=x, wg=wg, wu=wu, out=out, act=act):
                return tg._launch(c, x, wg, wu, False, None, None, out, act)
            # gated_mlp at these sizes may run the sm90 CUDA kernel, which leaves Triton's
            # config cache empty: _pick_config then tunes with this launch
            cfg = tg._pick_config(x, h, True, tma_ok, launch)
            layers = {
                "eager (3 linear + gelu + mul)": lambda: F.linear(
                    F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd),
                "public gated_mlp": lambda: fm.gated_mlp(x, wg, wu, wd, "gelu_tanh"),
                "public mlp (+bias)": lambda: fm.mlp(x, wg, b1, wd, b2, "gelu_tanh"),
                "dispatch.gated_mlp_forward": lambda: disp.gated_mlp_forward(
                    x, wg, wu, wd, "gelu_tanh", None, None, None),
                "triton_gemm.gated_linear": lambda: tg.gated_linear(x, wg, wu, None, None, tg_act),
                f"_launch (cfg tma={cfg.tma})": lambda: tg._launch(cfg, x, wg, wu, False, None, None, out, act),
                "_launch (pointer cfg)": lambda: tg._launch(cfg._replace(tma=False), x, wg, wu, False,
                                                            None, None, out, act),
                "_pick_config (cached)": lambda: tg._pick_config(x, h, True, tma_ok, launch),
                "_tma_compatible": lambda: tg._tma_compatible(x, wg, wu),
                "dispatch.choose": lambda: disp.choose(x, "gated", (wg, wu, wd), h),
                "torch.empty [M, H]": lambda: torch.empty((m, h), device=x.device, dtype=x.dtype),
                "F.linear (down)": lambda: F.linear(hh, wd),
            }
            if cfg.tma:
                import triton
                from triton.tools.tensor_descriptor import TensorDescriptor
                bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
                layers["3 x TensorDescriptor.from_tensor"] = lambda: (
                    TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(wg, [bn, bk]),
                    TensorDescriptor.from_tensor(wu, [bn, bk]))
                xd, w1d, w2d = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(wg, [bn, bk]),
                                TensorDescriptor.from_tensor(wu, [bn, bk]))
                grid = (triton.cdiv(m, bm) * triton.cdiv(h, bn),)
                flags = dict(GATED=True, ACTIVATION=act, HAS_B1=False, HAS_B2=False, STORE_PRE=False, BWD=0,
                             STORE_H=False, SUBTILE=False, PREFETCH=False, W_KN=False, DOT_PRECISION="tf32", BLOCK_M=bm,
                             BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
                             num_stages=cfg.num_stages, PERSISTENT=False, **tg.COMPILE_OPTIONS)
                layers["bare Triton launch (tma, prepared)"] = lambda: tg._fused_linear_kernel_tma[grid](
                    xd, w1d, w2d, out, out, out, out, out, m, h, d, out.stride(0), out.stride(1),
                    out.stride(0), out.stride(1), out.stride(0), out.stride(1), **flags)
            say(f"## gated {name} {dt}, config {tuple(cfg)}")
            for lname, fn in layers.items():
                say(f"  {lname:<36} {host_us(fn):8.1f}")
            if name.startswith("m8192") and dt == torch.bfloat16:
                profile(layers["public gated_mlp"], 200, say, "200 public gated_mlp calls (m8192 d768 bf16)")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
