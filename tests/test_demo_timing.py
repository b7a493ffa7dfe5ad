"""tools/demo_models.bench_interleaved, the demo's timing of ours against eager: the functions'
blocks take turns and the first of each round rotates, so a clock that drifts over the run (a
card warming to its power limit) falls on every function alike instead of on whichever went second."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _demo_models():
    spec = importlib.util.spec_from_file_location("demo_models", ROOT / "tools" / "demo_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_drift_falls_on_both_alike():
    """Two equal functions on a clock that slows 1% with every block (timed one after the
    other, the second would read ~6% slower): in turns, their medians agree."""
    dm = _demo_models()
    calls: list = []

    def time_ms(fn):
        calls.append(fn())
        return 1.0 + 0.01 * len(calls)  # each block 1% slower than the one before

    t = dm.bench_interleaved({"a": lambda: "a", "b": lambda: "b"}, rounds=6, time_ms=time_ms)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert abs(t["a"] / t["b"] - 1) < 0.005, t


def test_each_function_gets_every_round():
    dm = _demo_models()
    seen: dict = {}

    def time_ms(fn):
        name = fn()
        seen[name] = seen.get(name, 0) + 1
        return {"x": 3.0, "y": 1.0, "z": 2.0}[name]

    t = dm.bench_interleaved({n: (lambda n=n: n) for n in "xyz"}, rounds=4, time_ms=time_ms)
    assert seen == {"x": 4, "y": 4, "z": 4}
    assert t == {"x": 3.0, "y": 1.0, "z": 2.0}
