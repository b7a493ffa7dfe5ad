"""The benchmark scripts' own logic (CPU): how bench_mlp summarizes interleaved rounds, what
profile_post counts as a kernel, how gemm_variants reads --configs. Their GPU numbers
are only as good as this bookkeeping."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import need_interpreter, submodule

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str, path: Path):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_ratio_per_round_uses_the_best_real_peer_of_each_round():
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    runs = {"ours": [1.0, 2.0, 3.0], "eager": [2.0, 2.0, 6.0], "compile": [4.0, 1.0, 5.0], "liger": [],
            "gemms_only": [0.1, 0.1, 0.1]}  # gemms_only is a reference, never "the best peer"
    assert bm.ratio_per_round(runs) == [0.5, 2.0, 0.6]
    # a peer that failed partway (fewer rounds) counts only where it has a time
    runs = {"ours": [1.0, 1.0], "eager": [4.0, 4.0], "compile": [2.0]}
    assert bm.ratio_per_round(runs) == [0.5, 0.25]
    assert bm.ratio_per_round({"ours": [1.0]}) == []


def test_bench_mlp_repeats_dry_run(tmp_path):
    out = tmp_path / "fwd.json"
    env = dict(os.environ)
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "mlp_gelu_tanh_m8192_d768_h3072_bf16", "--skip-peers", "compile,liger",
         "--repeats", "3", "--out", str(out), "--plot", str(tmp_path / "p.png")],
        capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 1
    row = rows[0]
    assert sorted(row["rounds_ms"]) == ["eager", "gemms_only", "ours"]
    assert all(len(v) == 3 for v in row["rounds_ms"].values())
    assert row["ours_ms"] == statistics.median(row["rounds_ms"]["ours"])
    assert row["peers_ms"]["eager"] == statistics.median(row["rounds_ms"]["eager"])
    want = [o / e for o, e in zip(row["rounds_ms"]["ours"], row["rounds_ms"]["eager"])]
    assert row["ratio_per_round"] == want
    assert "rounds" in res.stdout  # the table shows the per-round spread


@pytest.mark.parametrize("reverse", [False, True])
def test_bench_mlp_case_order(tmp_path, reverse):
    out = tmp_path / "fwd.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "mlp_gelu_tanh_m8192", "--skip-peers", "compile,liger", "--out", str(out),
         "--plot", str(tmp_path / "p.png")] + (["--reverse"] if reverse else []),
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    cases = [r["case"] for r in json.loads(out.read_text())["rows"]]
    want = ["mlp_gelu_tanh_m8192_d768_h3072_bf16", "mlp_gelu_tanh_m8192_d768_h3072_fp16"]
    assert cases == (want[::-1] if reverse else want)


def test_bench_mlp_twice(tmp_path):
    """--twice runs each case again right after itself, and each row names its place in the process."""
    out = tmp_path / "fwd.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "mlp_gelu_tanh_m8192_d768_h3072_bf16", "--skip-peers", "compile,liger", "--twice",
         "--pause-s", "0.1", "--out", str(out), "--plot", str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["place"]) for r in rows] == [("mlp_gelu_tanh_m8192_d768_h3072_bf16", 0),
                                                      ("mlp_gelu_tanh_m8192_d768_h3072_bf16", 1)]
    assert res.stdout.count("mlp_gelu_tanh_m8192_d768_h3072_bf16 done in") == 2


def test_bench_mlp_placements(tmp_path):
    """--placements P times every implementation on P allocations of the inputs and pools their
    rounds: the row's median is over all P x repeats rounds, each placement's median kept."""
    out = tmp_path / "fwd.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "mlp_gelu_tanh_m8192_d768_h3072_bf16", "--skip-peers", "compile,liger", "--placements", "3",
         "--repeats", "2", "--out", str(out), "--plot", str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    for name in ("ours", "eager", "gemms_only"):
        assert len(row["rounds_ms"][name]) == 6 and len(row["placement_ms"][name]) == 3
    assert row["ours_ms"] == statistics.median(row["rounds_ms"]["ours"])
    assert row["peers_ms"]["eager"] == statistics.median(row["rounds_ms"]["eager"])
    assert len(row["ratio_per_round"]) == 6


@pytest.mark.parametrize("flag", ["--placements", "--repeats"])
def test_bench_mlp_rejects_counts_below_one(tmp_path, flag):
    """Zero placements or rounds would time nothing: a usage error naming the flag, before any work."""
    out = tmp_path / "fwd.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "mlp_gelu_tanh_m8192_d768_h3072_bf16", flag, "0", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and f"{flag} must be >= 1" in res.stderr
    assert not out.exists()


def test_merge_placements_pairs_rounds_within_each_placement():
    """A peer that failed on one placement must not shift the other placements' ratios."""
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    first = ({"ours": 1.0, "eager": 2.0, "compile": None}, {"rounds_ms": {"ours": [1.0, 1.0], "eager": [2.0, 2.0]}})
    second = ({"ours": 3.0, "eager": 6.0, "compile": 4.0},
              {"rounds_ms": {"ours": [3.0, 3.0], "eager": [6.0, 6.0], "compile": [4.0, 4.0]}})
    times, extra = bm.merge_placements([first, second])
    assert extra["ratio_per_round"] == [0.5, 0.5, 0.75, 0.75]
    assert times == {"ours": 2.0, "eager": 4.0, "compile": 4.0}
    assert extra["placement_ms"] == {"ours": [1.0, 3.0], "eager": [2.0, 6.0], "compile": [4.0]}


def test_run_info_names_the_switches_set_at_start():
    """A results file's command carries the FUSED_MLP_* switches the script was started with,
    not those it set itself later (an A/B's sides)."""
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import _common; "
            "os.environ['FUSED_MLP_DOWN_SPLIT'] = 'auto'; os.environ['FUSED_MLP_LATER'] = '0'; "
            "print(_common.run_info('cpu')['command'])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSED_MLP_")}
    env["FUSED_MLP_DOWN_SPLIT"] = "2"
    res = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    command = res.stdout.strip().splitlines()[-1]
    assert command.startswith("FUSED_MLP_DOWN_SPLIT=2 ") and "auto" not in command and "LATER" not in command


def _event(name, us, cuda=True, annotation=False):
    return SimpleNamespace(
        name=name, is_user_annotation=annotation,
        device_type=torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU,
        time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_profile_kernel_table_skips_annotations_and_cpu_events():
    pp = _load("profile_post_under_test", BENCH / "profile_post.py")
    events = [
        _event("gemm", 10.0), _event("gemm", 12.0), _event("act", 3.0),
        _event("ours_forward", 30.0),                          # the record_function range, by name
        _event("user_range", 40.0, annotation=True),           # flagged as an annotation by torch
        _event("aten::mm", 99.0, cuda=False),                  # CPU side
    ]
    prof = SimpleNamespace(events=lambda: events)
    rows = pp.kernel_table(prof, steps=2, annotations=frozenset({"ours_forward"}))
    assert rows == [("gemm", 1.0, 11.0), ("act", 0.5, 1.5)]


def test_gemm_variants_configs_are_checked():
    for bad in ("128,128,64", "128,128,64,8,8,three"):
        res = subprocess.run([sys.executable, str(BENCH / "micro" / "gemm_variants.py"), "--configs", bad],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 2 and "--configs" in res.stderr and "6 to 8 integers" in res.stderr, bad


def test_timed_rounds_interleaves_and_drops_a_failing_implementation():
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    order = []

    def timer(name):
        def fn():
            order.append(name)
            if name == "liger" and len([o for o in order if o == "liger"]) == 2:
                raise RuntimeError("second round fails")
            return {"ours": 1.0, "eager": 2.0, "liger": 4.0}[name]
        return fn

    fns = {"ours": timer("ours"), "eager": timer("eager"), "compile": None, "liger": timer("liger")}
    times, extra = bm.timed_rounds("case", "events", fns, lambda fn: fn(), repeats=3)
    assert order == ["ours", "eager", "liger", "ours", "eager", "liger", "ours", "eager"]  # rounds, in turn
    assert times == {"ours": 1.0, "eager": 2.0, "compile": None, "liger": None}
    assert extra["rounds_ms"] == {"ours": [1.0] * 3, "eager": [2.0] * 3}
    assert extra["ratio_per_round"] == [0.5] * 3
    assert bm.timed_rounds("case", "events", fns, lambda fn: 1.0, repeats=1)[1] == {}  # one round: no extras


def test_timed_rounds_with_one_timer_for_all_and_the_alternating_order():
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    seen = []

    def time_all(fns):
        seen.append(sorted(n for n, f in fns.items() if f is not None))
        return {"ours": 1.0 + len(seen), "eager": 4.0}

    fns = {"ours": lambda: None, "eager": lambda: None, "compile": None}
    times, extra = bm.timed_rounds("case", "events", fns, None, repeats=3, time_all=time_all)
    assert seen == [["eager", "ours"]] * 3
    assert times == {"ours": 3.0, "eager": 4.0, "compile": None}
    assert extra["rounds_ms"] == {"ours": [2.0, 3.0, 4.0], "eager": [4.0] * 3}
    assert extra["ratio_per_round"] == [0.5, 0.75, 1.0]
    names = ["a", "b", "c"]
    orders = [bm.call_order(names, c) for c in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert all(sorted(o[i] for o in orders[:3]) == names for i in range(3))  # every position once


def test_alternating_drops_an_implementation_that_raises(capsys):
    """bench_mlp.alternating (CPU dry run): an implementation that raises in the second round
    is reported and dropped from that round on, as timed_rounds drops one with time_one; the
    others are timed in every round."""
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    calls = []

    def impl(name, fail_at=None):
        def fn():
            calls.append(name)
            if fail_at is not None and calls.count(name) == fail_at:
                raise RuntimeError("no kernel for this shape")
        return fn

    fns = {"ours": impl("ours"), "eager": impl("eager"), "compile": None, "liger": impl("liger", fail_at=2)}
    times, extra = bm.timed_rounds("case", "events", fns, None, repeats=3,
                                   time_all=lambda live: bm.alternating(live, 1.0, "cpu"))
    assert calls.count("ours") == calls.count("eager") == 3 and calls.count("liger") == 2
    assert times["liger"] is None and times["compile"] is None
    assert times["ours"] is not None and times["eager"] is not None
    assert sorted(extra["rounds_ms"]) == ["eager", "ours"] and len(extra["rounds_ms"]["ours"]) == 3
    assert "liger failed: RuntimeError: no kernel for this shape; dropped" in capsys.readouterr().out


def test_alternating_rounds_gives_medians_and_every_round(monkeypatch):
    """bench_mlp.alternating_rounds (the micro A/B scripts' timer): `repeats` rounds of
    alternating(fns, budget, device, before), the median per name and each round's time."""
    bm = _load("bench_mlp_under_test", BENCH / "bench_mlp.py")
    calls, times = [], iter([{"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 9.0}])

    def fake(fns, budget_ms, device, before=None):
        calls.append((sorted(fns), budget_ms, device, before))
        return next(times)

    monkeypatch.setattr(bm, "alternating", fake)
    before = object()
    med, per = bm.alternating_rounds({"a": lambda: None, "b": lambda: None}, 1500, "cpu", 3, before=before)
    assert calls == [(["a", "b"], 1500, "cpu", before)] * 3
    assert med == {"a": 2.0, "b": 2.0} and per == {"a": [3.0, 1.0, 2.0], "b": [1.0, 2.0, 9.0]}


def test_bench_mlp_alternating_dry_run(tmp_path):
    out = tmp_path / "fwd.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_mlp.py"), "--device", "cpu", "--shrink", "64",
         "--cases", "swiglu_m128_d4096_h14336_bf16", "--skip-peers", "compile,liger",
         "--repeats", "2", "--alternate-ms", "50", "--ours-twice", "--out", str(out), "--plot",
         str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["alternating calls"]
    assert sorted(rows[0]["rounds_ms"]) == ["eager", "gemms_only", "ours", "ours_again"]
    assert all(len(v) == 2 for v in rows[0]["rounds_ms"].values())
    assert rows[0]["ours_again_ms"] == statistics.median(rows[0]["rounds_ms"]["ours_again"])
    assert "ours_again" not in rows[0]["peers_ms"] and "timed again" in res.stdout


def test_bench_train_repeats_dry_run(tmp_path):
    out = tmp_path / "train.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_train.py"), "--device", "cpu", "--shrink", "64", "--cases", "geglu,gpt2",
         "--skip-peers", "compile,liger", "--repeats", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["geglu_m8192_d768_h3072_bf16_train", "gpt2_mlp_conv1d_m8192_d768_h3072_bf16_train"]
    for row in rows:  # the GPT-2 case: Conv1D weights, its gradients checked like the others'
        assert sorted(row["rounds_ms"]) == ["eager", "ours", "ours_recompute"]
        assert row["ours_ms"] == statistics.median(row["rounds_ms"]["ours"])
        assert len(row["ratio_per_round"]) == 2


def test_bench_train_alternating_dry_run(tmp_path):
    out = tmp_path / "train.json"
    res = subprocess.run(
        [sys.executable, str(BENCH / "bench_train.py"), "--device", "cpu", "--shrink", "64", "--cases", "swiglu",
         "--skip-peers", "compile,liger", "--repeats", "2", "--alternate-ms", "50", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["alternating calls"]
    assert sorted(rows[0]["rounds_ms"]) == ["eager", "ours", "ours_recompute"]
    assert all(len(v) == 2 for v in rows[0]["rounds_ms"].values())


def _host_overhead_dry(fm, monkeypatch, name: str, ran: list, us: float):
    """host_overhead.py loaded for a CPU dry run: the Triton interpreter, no CUDA
    synchronisation, and host_us running its function once (into `ran`) and giving `us`."""
    need_interpreter(fm)
    monkeypatch.setenv("FUSED_MLP_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    ho = _load(name, BENCH / "host_overhead.py")
    monkeypatch.setattr(ho, "host_us", lambda fn, n=300: (ran.append(fn()), us)[1])
    return ho


def test_host_overhead_train_pieces_dry_run(fused_mlp, monkeypatch):
    """host_overhead's per-piece table of the training step calls the package's internals
    by hand (private signatures that change): each piece runs once here, on CPU tensors
    through the Triton interpreter, so a stale call fails in CI, not on the device."""
    ran = []
    ho = _host_overhead_dry(fused_mlp, monkeypatch, "host_overhead_under_test", ran, 1.0)
    tg = submodule(fused_mlp, "triton_gemm").interpreted_module()
    lines = []
    ho.train_pieces(fused_mlp, tg, fused_mlp.dispatch, lines.append, m=16, d=32, h=48, dev="cpu")
    assert lines[0].startswith("## training step pieces") and len(lines) == len(ran) + 1 == 14
    assert all(line.rstrip().endswith("1.0") for line in lines[1:])


def test_host_overhead_engine_check_dry_run(fused_mlp, monkeypatch):
    """host_overhead's engine check (the gated step through autograd's engine against its
    pieces called directly, toy Functions, a Python thread) runs on CPU tensors through the
    Triton interpreter: each variant once per round, every table row printed, the profiled
    backward run inside the engine as well as on this thread."""
    ho = _host_overhead_dry(fused_mlp, monkeypatch, "host_overhead_engine_under_test", [], 2.0)
    lines = []
    ho.engine_check(fused_mlp, fused_mlp.dispatch, lines.append, m=16, d=32, h=48, dev="cpu")
    table = [ln for ln in lines if ln.startswith("  ") and "rounds" in ln]
    assert lines[0].startswith("## engine check") and len(table) == 7
    assert all(ln.split("rounds")[1].split() == ["2"] * 5 for ln in table)
    profiles = [ln for ln in lines if ln.startswith("## cProfile of 20 direct backwards")]
    assert len(profiles) == 2 and "inside the engine" in profiles[1]
    # the profile taken on the engine's side recorded the backward's calls (not an empty one)
    for p in profiles:
        assert int(lines[lines.index(p) + 1].split()[0]) > 100
    toys = [ln for ln in lines if ln.startswith("  toy Function step")]
    assert len(toys) == 2 and toys[1].split()[3] == "20"


def test_wrapper_overhead_dry_run(fused_mlp):
    """wrapper_overhead.py times the public gated_mlp with the dispatcher's kernels stubbed
    out: every row is a positive time, and the stubs are gone afterwards (the package is
    left as it was for the tests after this one)."""
    wo = _load("wrapper_overhead_under_test", BENCH / "micro" / "wrapper_overhead.py")
    disp = fused_mlp.dispatch
    originals = (disp.gated_mlp_train_forward, disp.gated_mlp_backward, disp.backward_choice)
    rows = wo.measure(fused_mlp, calls=10)
    assert list(rows) == ["ours gated_mlp step (kernels stubbed)", "do-nothing 4-input Function step",
                          "ours gated_mlp forward alone"]
    assert all(us > 0 for us in rows.values())
    assert (disp.gated_mlp_train_forward, disp.gated_mlp_backward, disp.backward_choice) == originals


def test_host_overhead_sync_check_reports_each_warned_sync(monkeypatch):
    """sync_check counts the warnings PyTorch raises in sync-debug mode per step and names the
    line that made each; the mode is switched on only around the checked run and off after it,
    also when the step raises. The notice PyTorch gives when the mode is switched on is not a
    synchronizing call (session 18 counted it as one)."""
    ho = _load("host_overhead_sync_under_test", BENCH / "host_overhead.py")
    modes = []

    def set_mode(mode):
        modes.append(mode)
        if mode == "warn":  # as torch.cuda.set_sync_debug_mode does
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def syncing():
        if modes and modes[-1] == "warn":  # as PyTorch: a warning only while the mode is on
            warnings.warn("called a synchronizing CUDA operation")

    def failing():
        raise RuntimeError("step failed")

    lines = []
    ho.sync_check({"two syncs": lambda: (syncing(), syncing()), "none": lambda: None}, lines.append)
    assert lines[0].startswith("## synchronizing CUDA calls")
    assert lines[1].split() == ["two", "syncs", "2", "synchronizing", "call(s)"]
    assert len(lines) == 5 and all("called a synchronizing CUDA operation <- " in ln for ln in lines[2:4])
    assert "test_benchmark_scripts.py:" in lines[2]
    assert lines[4].split() == ["none", "0", "synchronizing", "call(s)"]
    assert modes == ["warn", "default", "warn", "default"]
    with pytest.raises(RuntimeError, match="step failed"):
        ho.sync_check({"fails": failing}, lines.append)
    assert modes[-1] == "default"


def test_with_env_sets_the_switch_for_each_call_and_restores_it(monkeypatch):
    """_common.with_env (the in-process A/B of a switch the ops read per call): the variable
    holds the value during the call only, an earlier value comes back after it, also when the
    call raises."""
    common = _load("common_under_test", BENCH / "_common.py")
    name = "FUSED_MLP_TEST_WITH_ENV"
    monkeypatch.delenv(name, raising=False)
    seen = []
    fn = common.with_env(lambda: seen.append(os.environ.get(name)) or 7, name, "0")
    assert fn() == 7 and seen == ["0"] and name not in os.environ
    monkeypatch.setenv(name, "1")

    def boom():
        seen.append(os.environ.get(name))
        raise ValueError("boom")

    with pytest.raises(ValueError):
        common.with_env(boom, name, "0")()
    assert seen == ["0", "0"] and os.environ[name] == "1"


@pytest.mark.parametrize("layout", ["reserve:1", "model"])
def test_alloc_regime_dry_run(layout):
    """micro/alloc_regime.py's CPU dry run: every layout builds its operand sets (the model one
    through save_pretrained / from_pretrained) and the script checks each call against fp64."""
    pytest.importorskip("transformers")
    res = subprocess.run([sys.executable, str(BENCH / "micro" / "alloc_regime.py"), "--dry-run", "--layout", layout,
                          "--layers", "2", "--time-layers", "0,1"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("[alloc-regime] dry run:")][-1]
    want = ["ours_layer0", "ours_layer1", "ours_later"] if layout == "model" else ["ours_first", "ours_later"]
    assert all(f"'{n}'" in line for n in want), line


def test_trace_events_reads_the_profiled_run_in_start_order():
    """_common.trace_events (first_capture / graph_head_tail read kernels' grids from it): the
    events of the asked categories only, in start order, with the trace's own fields."""
    from torch.profiler import ProfilerActivity, profile, record_function

    common = _load("common_trace_under_test", BENCH / "_common.py")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("first_range"):
            torch.ones(8).sum()
        with record_function("second_range"):
            torch.zeros(8).sum()
    events = common.trace_events(prof, ("user_annotation", "cpu_op"))
    assert {e["cat"] for e in events} == {"user_annotation", "cpu_op"}  # no others (e.g. python_function)
    assert [e["name"] for e in events if e["cat"] == "user_annotation"] == ["first_range", "second_range"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


@pytest.mark.parametrize("rb,parts,hmode", [(64, 2, 0), (64, 2, 1), (64, 2, 2), (128, 4, 1), (128, 4, 2), (64, 1, 1),
                                            (128, 3, 1)])
def test_down_stream_expected_sink_matches_a_walk_over_the_ctas(rb, parts, hmode):
    """micro/down_stream.py checks the probe's landed bytes by a closed-form sum; here it is
    compared with a walk over the probe's CTAs as the kernel assigns them (down_stream.cu's
    coords: row block, K part; multicast pairs for h mode 2), each adding one word of its W_down
    box and of h's box per K step."""
    ds = _load("down_stream_under_test", BENCH / "micro" / "down_stream.py")
    n, k = 512, 1024
    gen = torch.Generator().manual_seed(rb + parts + hmode)
    wd = torch.randint(-2**15, 2**15, (n, k), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    h = torch.randint(-2**15, 2**15, (128, k), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    w32 = wd.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    h32 = h.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    ksteps, total = k // 64, 0
    for b in range(n // rb * parts):
        if hmode == 2:
            rank, cl = b % 2, b // 2
            part, rowblock = cl % parts, (cl // parts) * 2 + rank
        else:
            part, rowblock = b % parts, b // parts
        for step in range(ksteps * part // parts, ksteps * (part + 1) // parts):
            total += int(w32[rowblock * rb, step * 32])
            if hmode:
                total += int(h32[0, step * 32])
    assert ds.expected_sink(wd, h, rb, hmode) == total % (1 << 64)


def _verdict_rows(split2: dict, kernel: dict) -> list:
    rows = [{"eviction": ev, "form": "op_split2", "us": us} for ev, us in split2.items()]
    return rows + [{"eviction": ev, "form": "op_kernel", "us": us} for ev, us in kernel.items()]


SPLIT2 = {"fill": 110.0, "read": 108.0}


@pytest.mark.parametrize("split2,kernel,want", [
    (SPLIT2, {"fill": 109.0, "read": 107.4}, True),   # under by 1.0 and 0.6
    (SPLIT2, {"fill": 109.0, "read": 107.7}, False),  # read: 0.3 only
    (SPLIT2, {"fill": 111.0, "read": 106.0}, False),  # slower in fill
    (SPLIT2, {"fill": 100.0}, False),                 # no read row
    ({}, {}, False),                                  # nothing measured
])
def test_down_stream_verdict_needs_the_margin_in_every_eviction(split2, kernel, want):
    """The gate of session 51's device calls (down_stream.py --verdict, run from the branch that
    became main): the op with the one-kernel down GEMM must beat it with the split by the margin in both
    evictions, and a file without those rows (a build without the kernel) never passes."""
    ds = _load("down_stream_under_test", BENCH / "micro" / "down_stream.py")
    ok, text = ds.verdict(_verdict_rows(split2, kernel), 0.5)
    assert ok is want, text


@pytest.mark.parametrize("kernel,want", [({"fill": 109.0, "read": 107.4}, True), ({"fill": 109.0}, False)])
def test_down_stream_verdict_cli_exit_status(kernel, want, tmp_path):
    """--verdict FILE exits 0 where verdict() passes and 1 where it does not (the device command
    chains the benchmark on it); once per outcome, each a process that imports torch."""
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"rows": _verdict_rows(SPLIT2, kernel)}))
    r = subprocess.run([sys.executable, str(BENCH / "micro" / "down_stream.py"), "--verdict", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == (0 if want else 1), r.stdout + r.stderr
    assert r.stdout.startswith("[verdict] " + ("KERNEL WINS" if want else "no kernel form wins"))


def test_down_choice_report_reads_the_timed_choice(fused_mlp, monkeypatch, capsys):
    """down_stream.py's and op_mode_ab.py's `[choice]` lines: one per bucket the down
    projection's timing has seen, with each form's median and the form taken."""
    pytest.importorskip("triton")
    ds = _load("down_stream_under_test", BENCH / "micro" / "down_stream.py")
    tg = submodule(fused_mlp, "triton_gemm")
    key = (4, 4096, 14336, torch.bfloat16, ("cuda", (9, 0)), False, True)
    monkeypatch.setattr(tg, "_DOWN_TIMES", {key: {1: 0.0389, 2: 0.0381, 0: 0.0358}})
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {key: 0})
    (entry,) = ds.down_choice_report(tg)
    assert entry["m_bucket"] == 4 and entry["n"] == 4096 and entry["k"] == 14336 and entry["chosen"] == 0
    assert entry["ms"] == {"1": 0.0389, "2": 0.0381, "0": 0.0358}
    line = capsys.readouterr().out
    assert "[choice] M bucket 4 N 4096 K 14336" in line and "form 0 35.8 us -> form 0" in line


def test_down_stream_lists_its_gemm_modes_for_the_session_script():
    """gpu_session.sh's micro-down step checks each form down_stream.py --list-modes prints, so
    a form added to or dropped from the probe (session 52: pkg4) needs no edit of the script."""
    ds = _load("down_stream_under_test", BENCH / "micro" / "down_stream.py")
    r = subprocess.run([sys.executable, str(BENCH / "micro" / "down_stream.py"), "--list-modes"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == list(ds.MODES) and "pkg" in ds.MODES and "pkg4" not in ds.MODES
    session = (BENCH.parent / "tools" / "gpu_session.sh").read_text()
    assert "down_stream.py --list-modes" in session


def test_down_stream_refuses_an_unknown_gemm_mode_before_touching_the_gpu():
    """gpu_session.sh's micro-down step passes the forms whose checks passed as --modes; a name
    the script does not know is an error that names it, not a run without that form."""
    r = subprocess.run([sys.executable, str(BENCH / "micro" / "down_stream.py"), "--modes", "pair,quadd"],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "--modes: unknown ['quadd']" in r.stderr


def test_down_stream_diag_forms_are_launched_by_the_probe():
    """--diag's forms (session 51) pass GemmDiag bits to down_gemm_launch, which returns -1 for a
    value its switch has no kernel for (a failed run on the device, not a wrong row): every value
    the script passes has a case, and the bits the script names are the .cu's."""
    ds = _load("down_stream_under_test", BENCH / "micro" / "down_stream.py")
    src = (BENCH / "micro" / "down_stream.cu").read_text()
    bits = dict(re.findall(r"(kDiag\w+) = (\d+)", src.split("enum GemmDiag", 1)[1].split("};", 1)[0]))
    assert bits == {"kDiagNoMma": "1", "kDiagNoFinish": "2", "kDiagWait0": "4"}
    switch = src.split("switch (diag)", 1)[1].split("default:", 1)[0]
    cases = set()
    for expr in re.findall(r"case ([^:]+):", switch):
        cases.add(eval(expr, {k: int(v) for k, v in bits.items()}))  # "kDiagNoMma | kDiagNoFinish" -> 3
    for name, (stages, diag, right) in ds.DIAG_FORMS.items():
        assert diag in cases, name
        assert 2 <= stages <= 9, name  # the launch's own range
        assert right == (diag in (0, 4)), name  # only these two keep the result


@pytest.mark.parametrize("name,tag", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("", "gpu")])
def test_gpu_session_names_result_files_after_the_card(name, tag):
    """gpu_session.sh names its result files after the card nvidia-smi reports (the device tool
    may lend an H100 where an H200 was asked for), by the scripts' rule (_common.gpu_tag); its
    gpu_tag function, run on its own."""
    script = (ROOT / "tools" / "gpu_session.sh").read_text()
    (line,) = [s for s in script.splitlines() if s.startswith("gpu_tag() ")]
    r = subprocess.run(["bash", "-c", f"PY={sys.executable}\n" + line + '\ngpu_tag "$1"', "_", name],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == tag, r.stdout + r.stderr
    assert '"$OUT/mlp_forward_${GPU_TAG}.json"' in script and "_h200." not in script


def _on_an_h100_requiring_h200(tmp_path, *cmd: str) -> subprocess.CompletedProcess:
    """Runs `cmd` (a tools/ script and its arguments) with REQUIRE_CARD=H200, OUT=tmp_path/out,
    and a fake nvidia-smi first on PATH that names an H100."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "REQUIRE_CARD": "H200"}
    return subprocess.run(["bash", *cmd], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def test_gpu_suite_runs_nothing_on_another_card(tmp_path):
    """tools/gpu_suite.sh with REQUIRE_CARD=H200 on a machine whose nvidia-smi names an H100
    says so and runs nothing (no stage, no pytest): a device call that was lent another card
    costs only its start."""
    r = _on_an_h100_requiring_h200(tmp_path, str(ROOT / "tools" / "gpu_suite.sh"))
    assert r.returncode == 0 and "card: NVIDIA H100 80GB HBM3" in r.stdout and "not an H200: nothing run" in r.stdout
    assert list((tmp_path / "out").iterdir()) == []


def test_gpu_session_runs_nothing_on_another_card(tmp_path):
    """tools/gpu_session.sh with REQUIRE_CARD=H200 on a machine whose nvidia-smi names an H100
    says so in its log and runs no step (no stage, no probe, no result file)."""
    r = _on_an_h100_requiring_h200(tmp_path, str(ROOT / "tools" / "gpu_session.sh"), "stage", "micro-small-m")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "card: NVIDIA H100 80GB HBM3; not an H200: nothing run" in r.stdout
    assert "=== stage" not in r.stdout and "=== micro-small-m" not in r.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["session.log"]


def test_gpu_session_names_only_scripts_that_exist():
    """Every benchmarks/ or tools/ Python script gpu_session.sh runs is in the tree (a renamed
    probe would otherwise fail only on the device, after the machine's start)."""
    script = (ROOT / "tools" / "gpu_session.sh").read_text()
    named = set(re.findall(r"\b((?:benchmarks|tools)/[\w/]+\.py)\b", script))
    assert {"benchmarks/micro/general_small_m.py", "benchmarks/micro/decode_loop_ab.py"} <= named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, missing


def test_gpu_suite_covers_every_gpu_test_file():
    """Every test file with GPU-marked tests is in one of gpu_suite.sh's streams."""
    script = (ROOT / "tools" / "gpu_suite.sh").read_text()
    gpu_files = sorted(f.name for f in (ROOT / "tests").glob("test_*.py")
                       if f.name != Path(__file__).name and "pytest.mark.gpu" in f.read_text())
    assert gpu_files and "test_functional.py" in gpu_files
    missing = [f for f in gpu_files if f"tests/{f}" not in script]
    assert not missing, missing


def test_benchmarks_default_result_files_are_named_after_the_card(monkeypatch):
    """bench_mlp / bench_train / bench_act_and_mul / bench_decode write, by default, to
    results/<stem>_<card>.json (the same names as gpu_session.sh's), `cpu` for a dry run."""
    common = _load("common_out_under_test", BENCH / "_common.py")
    assert common.gpu_tag("NVIDIA H100 80GB HBM3") == "h100" and common.gpu_tag("NVIDIA H200") == "h200"
    assert common.gpu_tag("") == "gpu"
    assert common.default_out("mlp_forward", "cpu") == BENCH / "results" / "mlp_forward_cpu.json"
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(common.torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    assert common.default_out("decode").name == "decode_h100.json"
    for script in ("bench_mlp", "bench_train", "bench_act_and_mul", "bench_decode"):
        assert "_h200.json" not in (BENCH / f"{script}.py").read_text(), script


def test_kernels_benchmark_runner_loads_and_corrects_machine_info(monkeypatch):
    """tools/kernels_benchmark.py loads the Hub's runner without the `kernels` command's imports
    and fills in the GPU where kernels 0.17.2's collect_machine_info records "N/A" / "CPU" on
    a CUDA machine (it compares a Backend object with names); elsewhere it leaves the record."""
    kb = _load("kernels_benchmark_under_test", ROOT / "tools" / "kernels_benchmark.py")
    mod = kb.runner_module()
    assert callable(mod.run_benchmark)
    if torch.cuda.is_available() or not torch.version.cuda:
        # (A CUDA torch without a GPU is left out: kernels' own collector asks the driver for
        # the GPU's name there and raises; the runner has nothing to time on such a machine.)
        here = mod.collect_machine_info()
        assert here.pytorch_version == torch.__version__
        if not torch.cuda.is_available():
            assert here.gpu == "N/A"  # nothing to correct on a machine without a GPU
    cuda = type("CUDA", (), {"name": "cuda"})()  # hashable, as kernels' Backend objects are
    monkeypatch.setattr(mod, "_backend", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    info = mod.collect_machine_info()
    assert (info.gpu, info.backend) == ("NVIDIA H100 80GB HBM3", "CUDA 13.0")
    assert info.pytorch_version == torch.__version__  # the rest as the runner recorded it


def test_kernels_benchmark_runner_downloads_the_kernel_repo(monkeypatch):
    """For a Hub repository id, the runner (through tools/kernels_benchmark.py) downloads the
    Hub's kernel repository at v<version>, not a model repository of that name (kernels 0.17.2's
    runner passes no repo_type). The download is intercepted: no network."""
    import huggingface_hub

    kb = _load("kernels_benchmark_under_test", ROOT / "tools" / "kernels_benchmark.py")
    mod = kb.runner_module()
    calls = []

    class Intercepted(Exception):
        pass

    def fake_download(self, *args, **kwargs):
        calls.append(kwargs)
        raise Intercepted

    monkeypatch.setattr(huggingface_hub.HfApi, "snapshot_download", fake_download)
    monkeypatch.setattr(mod, "MISSING_DEPS", [])  # the table's tabulate: not reached before the download
    with pytest.raises(Intercepted):
        mod.run_benchmark(repo_id="no-such-org-here/fused-mlp", branch=None, version=1, iterations=1, warmup=0,
                          output=None, print_json=False)
    assert len(calls) == 1
    assert calls[0]["repo_type"] == "kernel"
    assert (calls[0]["repo_id"], calls[0]["revision"]) == ("no-such-org-here/fused-mlp", "v1")
