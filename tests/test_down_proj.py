"""The block's second GEMM (triton_gemm.down_linear): F.linear, or K split by hand (a batched
cuBLAS GEMM with fp32 partial sums, then _sum_parts_kernel), or on sm_90a builds for M <= 128
the one-kernel down_gemm_sm90, where that measures faster.

FUSED_MLP_DOWN_SPLIT: "graphs" (the default: the timed choice in CUDA-graph captures, F.linear in
eager calls), "auto" (the timed choice everywhere), "2" / "4" / "kernel" (forced where allowed), "0" (F.linear).

CPU (always): the reduction kernel under Triton's interpreter, the switch's validation and modes,
and that CPU problems never take the split form.
GPU (@pytest.mark.gpu, sm_90): split_linear and down_gemm_sm90 against float64 on awkward shapes
(and both weight layouts for the split), the ops with each form forced, the timed choice and its
cache, CUDA-graph capture (with the programmatic edges inside the graph; the default mode's
choice only there), torch.compile(fullgraph=True) and torch.compile(mode="reduce-overhead").
"""

from __future__ import annotations

import contextlib
import statistics

import pytest
import torch
import torch.nn.functional as F

from conftest import need_interpreter, need_sm90, poison_like, rel_err, spy, submodule

TOL = {torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.fixture
def tg(fused_mlp):
    pytest.importorskip("triton")
    return submodule(fused_mlp, "triton_gemm")


def _rand(*shape, dtype=torch.float32, device="cpu", scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_sum_parts_interpreted(fused_mlp, parts, out_dtype, bias):
    """The reduction on odd sizes (M x N not a multiple of its block): fp32 sum of the parts plus
    the bias, rounded once to the output's dtype."""
    it = need_interpreter(fused_mlp).interpreted_module()
    m, n = 3, 347
    p = _rand(parts, m, n, seed=parts)
    b = _rand(n, dtype=out_dtype, seed=7) if bias else None
    out = poison_like(torch.empty(m, n, dtype=out_dtype))
    it.sum_parts(p, b, out)
    ref = p.double().sum(0) + (b.double() if bias else 0.0)
    assert rel_err(out, ref) < (1e-6 if out_dtype == torch.float32 else 1e-3)
    # the sum itself, not a single part: dropping any part would be far off
    assert rel_err(p[0].double(), ref) > 0.1


def test_kept_launcher(tg):
    """The launcher sum_parts and the GEMM plans keep: the compiled kernel indexed by a 3-D grid,
    or None where Triton's compiled kernel lacks what its launcher needs."""
    class Compiled:
        run, packed_metadata = object(), object()

        def __getitem__(self, grid):
            return ("launcher", grid)

    assert tg._kept_launcher(Compiled(), (5,)) == ("launcher", (5, 1, 1))
    assert tg._kept_launcher(Compiled(), (5, 2, 3)) == ("launcher", (5, 2, 3))
    assert tg._kept_launcher(object(), (5, 1, 1)) is None


@pytest.fixture
def fake_cuda(tg, monkeypatch):
    """CPU tensors dressed as CUDA ones for down_parts, with no eager call seen yet; returns a
    one-item list whose value says whether a CUDA-graph capture is under way (False at first)."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(tg, "_DOWN_EAGER_SEEN", set())
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    return capturing


def test_switch_is_validated(tg, monkeypatch):
    h, w = torch.zeros(2, 16), torch.zeros(4, 16)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "3")
    with pytest.raises(ValueError, match="FUSED_MLP_DOWN_SPLIT"):
        tg.down_parts(h, w, None)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "2")
    assert tg.down_parts(h, w, None) == 1  # CPU: F.linear, whatever the switch says
    assert tg.split_parts_allowed(h, w, None) == ()


def test_switch_modes(tg, monkeypatch, fake_cuda):
    """With the size / device rule faked to allow both splits: "0" never looks at the tensors, a
    forced count is taken only where allowed, an untimed bucket (FUSED_MLP_AUTOTUNE=0) is F.linear
    and caches nothing, a cached choice is reused without timing: by "auto" in every call, by
    "graphs" (the default) only in a capture."""
    h, w = torch.zeros(40, 64), torch.zeros(8, 64)
    capturing = fake_cuda
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: pytest.fail("the rule checked while off"))
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "0")
    assert tg.down_parts(h, w, None) == 1
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2, 4))
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    for mode, parts in (("0", 1), ("off", 1), ("2", 2), ("4", 4)):
        monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", mode)
        assert tg.down_parts(h, w, None) == parts, mode
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2,))
    assert tg.down_parts(h, w, None) == 1  # "4" where only 2 is allowed
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setattr(tg, "_device_key", lambda i: ("fake", (9, 0)))
    monkeypatch.setattr(tg, "_device_time_ms", lambda fn: pytest.fail("timed while FUSED_MLP_AUTOTUNE=0"))
    key = ((40 + 31) // 32, 8, 64, h.dtype, ("fake", (9, 0)), False, True)
    for mode in ("auto", "graphs", None):  # None: unset, the default
        if mode is None:
            monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT")
        else:
            monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", mode)
        tg._DOWN_CHOICE.clear()
        for capturing[0] in (False, True):
            assert tg.down_parts(h, w, None) == 1 and tg._DOWN_CHOICE == {}, (mode, capturing)
        tg._DOWN_CHOICE[key] = 2
        capturing[0] = False
        assert tg.down_parts(h, w, None) == (2 if mode == "auto" else 1), mode
        capturing[0] = True
        assert tg.down_parts(h, w, None) == 2, mode
        tg._DOWN_CHOICE[key] = 4  # a cached count the rule no longer allows
        assert tg.down_parts(h, w, None) == 1, mode


def test_untimed_bucket_is_timed_once_by_an_eager_call(tg, monkeypatch, fake_cuda):
    """The default mode times the forms on an eager call (fake timings: split 2 fastest), caches
    the choice, still returns F.linear there, and the capture then takes the split."""
    h, w = torch.zeros(40, 64), torch.zeros(8, 64)
    monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT", raising=False)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2, 4))
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    monkeypatch.setattr(tg, "_DOWN_TIMES", {})
    monkeypatch.setattr(tg, "_device_key", lambda i: ("fake", (9, 0)))
    monkeypatch.setattr(tg, "_on_device", lambda t: contextlib.nullcontext())
    # the forms' callables are timed in the order F.linear, 2, 4 (x 3 rounds)
    fake = iter([1.0, 0.9, 0.95] * 3)
    timed = []
    monkeypatch.setattr(tg, "_device_time_ms", lambda fn: timed.append(fn) or next(fake))
    capturing = fake_cuda
    assert tg.down_parts(h, w, None) == 1 and len(timed) == 9
    assert list(tg._DOWN_CHOICE.values()) == [2]
    assert list(tg._DOWN_TIMES.values()) == [{1: 1.0, 2: 0.9, 4: 0.95}]
    # the next eager calls of these tensors' kind skip the rule and the timing
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: pytest.fail("the rule checked again"))
    assert tg.down_parts(h, w, None) == 1 and len(timed) == 9
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2, 4))
    capturing[0] = True
    assert tg.down_parts(h, w, None) == 2 and len(timed) == 9
    # M above the split's range: F.linear at once
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: pytest.fail("the rule checked at M 513"))
    capturing[0] = False
    assert tg.down_parts(torch.zeros(513, 64), w, None) == 1


def test_eager_calls_skip_the_rule_with_autotuning_off(tg, monkeypatch, fake_cuda):
    """FUSED_MLP_AUTOTUNE=0, default mode: an eager call would time nothing, so it returns
    F.linear without the rule's host time; a capture then finds nothing cached (F.linear), and
    with autotuning switched back on the next eager call times the forms for later captures."""
    h, w = torch.zeros(40, 64), torch.zeros(8, 64)
    monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT", raising=False)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    monkeypatch.setattr(tg, "_DOWN_TIMES", {})
    monkeypatch.setattr(tg, "_device_key", lambda i: ("fake", (9, 0)))
    monkeypatch.setattr(tg, "_on_device", lambda t: contextlib.nullcontext())
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: pytest.fail("the rule checked"))
    capturing = fake_cuda
    for _ in range(2):
        assert tg.down_parts(h, w, None) == 1
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2, 4))
    capturing[0] = True
    assert tg.down_parts(h, w, None) == 1 and tg._DOWN_CHOICE == {}  # nothing timed, nothing cached
    capturing[0] = False
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    fake = iter([1.0, 0.9, 0.95] * tg._DOWN_ROUNDS)
    monkeypatch.setattr(tg, "_device_time_ms", lambda fn: next(fake))
    assert tg.down_parts(h, w, None) == 1 and list(tg._DOWN_CHOICE.values()) == [2]
    capturing[0] = True
    assert tg.down_parts(h, w, None) == 2


@pytest.mark.parametrize(
    "rounds, expected",
    [
        # F.linear, split 2, split 4 per round. Split 4's one fast round (a min would pick it)
        # and F.linear's one slow round (a mean would let split 4 through) do not decide.
        ([(1.0, 0.95, 2.0), (3.0, 0.95, 0.1), (1.0, 0.95, 0.96)], 2),
        # the best split's median 0.995 of F.linear's: under _SPLIT_MIN_GAIN, F.linear stays
        ([(1.0, 0.995, 1.2), (1.0, 0.5, 1.2), (1.0, 0.995, 1.2)], 1),
    ],
)
def test_down_forms_are_judged_by_their_median_round(tg, monkeypatch, rounds, expected):
    key = ("bucket",)
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    monkeypatch.setattr(tg, "_DOWN_TIMES", {})
    monkeypatch.setattr(tg, "_on_device", lambda t: contextlib.nullcontext())
    assert tg._DOWN_ROUNDS == len(rounds)
    fake = iter([ms for r in rounds for ms in r])
    monkeypatch.setattr(tg, "_device_time_ms", lambda fn: next(fake))
    h, w = torch.zeros(4, 64), torch.zeros(8, 64)
    assert tg._time_down_forms(h, w, None, (2, 4), key) == expected
    assert tg._DOWN_CHOICE == {key: expected}
    medians = [statistics.median(form) for form in zip(*rounds)]
    assert tg._DOWN_TIMES[key] == dict(zip((1, 2, 4), medians))


@pytest.mark.parametrize("has_sleep", [True, False])
def test_device_time_sleeps_only_where_torch_can(tg, monkeypatch, has_sleep):
    """The forms' timing queues its calls behind torch.cuda._sleep (a private torch function);
    where a torch lacks it the calls are timed as they come instead of failing."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    slept, loops = [], []
    if has_sleep:
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: slept.append(cycles), raising=False)
    else:
        monkeypatch.delattr(torch.cuda, "_sleep", raising=False)
    monkeypatch.setattr(tg, "_loop_ms", lambda fn, reps: loops.append(reps) or 0.25)
    calls = []
    assert tg._device_time_ms(lambda: calls.append(1), reps=5) == 0.25
    assert len(calls) == 6 and loops == [5]  # one warm call, then the host-timed pass
    assert len(slept) == (1 if has_sleep else 0)
    if has_sleep:
        assert 2e5 <= slept[0] <= 2**40


def test_kernel_mode_and_the_one_kernel_form(tg, monkeypatch, fake_cuda):
    """FUSED_MLP_DOWN_SPLIT=kernel forces the sm_90a one-kernel form (code _ONE_KERNEL) where
    down_forms_allowed lists it, F.linear elsewhere; the timed choice can pick it like a split,
    and down_linear runs it through sm90.down with the programmatic edge. "kernel4" (a cluster-
    of-4 form, dropped in session 52) is an unknown mode now."""
    h, w = torch.zeros(40, 64), torch.zeros(8, 64)
    one = tg._ONE_KERNEL
    assert len({1, *tg._SPLIT_PARTS, one}) == len(tg._SPLIT_PARTS) + 2
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "kernel")
    monkeypatch.setattr(tg, "down_forms_allowed", lambda *a: (2, 4, one))
    assert tg.down_parts(h, w, None) == one
    monkeypatch.setattr(tg, "down_forms_allowed", lambda *a: (2, 4))
    assert tg.down_parts(h, w, None) == 1
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "kernel4")
    with pytest.raises(ValueError, match="FUSED_MLP_DOWN_SPLIT must be .*kernel or 0"):
        tg.down_parts(h, w, None)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "kernel")
    # timed: the one-kernel form fastest in every round
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    monkeypatch.setattr(tg, "_DOWN_TIMES", {})
    monkeypatch.setattr(tg, "_on_device", lambda t: contextlib.nullcontext())
    fake = iter([1.0, 0.95, 0.97, 0.9] * tg._DOWN_ROUNDS)  # F.linear, 2, 4, one kernel
    monkeypatch.setattr(tg, "_device_time_ms", lambda fn: next(fake))
    assert tg._time_down_forms(h, w, None, (2, 4, one), ("bucket",)) == one
    assert tg._DOWN_TIMES[("bucket",)] == {1: 1.0, 2: 0.95, 4: 0.97, one: 0.9}
    # down_linear's dispatch of the form
    ran = []
    monkeypatch.setattr(tg._sm90, "down", lambda *a: ran.append(a) or "y")
    monkeypatch.setattr(tg, "down_parts", lambda *a: one)
    b = torch.zeros(8)
    assert tg.down_linear(h, w, b) == "y"
    assert len(ran) == 1 and ran[0][0] is h and ran[0][1] is w and ran[0][2] is b and ran[0][3] is True
    assert len(ran[0]) == 4


def test_down_forms_allowed_adds_the_one_kernel_form_where_usable(tg, monkeypatch):
    monkeypatch.setattr(tg, "split_parts_allowed", lambda *a: (2,))
    monkeypatch.setattr(tg._sm90, "down_usable", lambda *a: False)
    h, w = torch.zeros(4, 64), torch.zeros(8, 64)
    assert tg.down_forms_allowed(h, w, None) == (2,)
    monkeypatch.setattr(tg._sm90, "down_usable", lambda *a: True)
    assert tg.down_forms_allowed(h, w, None) == (2, tg._ONE_KERNEL)


def test_sm90_down_usable_rule(tg, monkeypatch):
    """The one-kernel form's rule (sm90.down_usable), with the build and the GPU faked: 16-bit,
    0 < M <= 128, W [N, K] K-contiguous with N a multiple of 8, aligned rows, a matching bias,
    not switched off; and never for CPU tensors."""
    sm90 = tg._sm90
    bf = torch.bfloat16
    h, w, b = torch.zeros(128, 64, dtype=bf), torch.zeros(16, 64, dtype=bf), torch.zeros(16, dtype=bf)
    assert not sm90.down_usable(h, w, b)  # CPU tensors
    monkeypatch.setattr(sm90, "_HAS_DOWN_OP", True)
    monkeypatch.setattr(sm90, "_device_ok", lambda index: True)
    monkeypatch.setattr(sm90, "_index", lambda t: 0)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.delenv("FUSED_MLP_SM90", raising=False)
    assert sm90.down_usable(h, w, b) and sm90.down_usable(h[:1], w, None)
    assert not sm90.down_usable(torch.zeros(129, 64, dtype=bf), w, b)  # M > 128
    assert not sm90.down_usable(h[:0], w, b)  # M = 0
    assert not sm90.down_usable(h.float(), w.float(), None)  # fp32
    assert not sm90.down_usable(h, w.half(), None)  # mixed dtypes
    assert not sm90.down_usable(h, torch.zeros(12, 64, dtype=bf), None)  # N % 8
    assert not sm90.down_usable(h, torch.zeros(16, 48, dtype=bf), None)  # K mismatch
    assert not sm90.down_usable(h, w.t().contiguous().t(), None)  # W N-contiguous (Conv1D's view)
    assert not sm90.down_usable(h[:, 1:], w[:, 1:], None)  # rows not 16-byte aligned
    assert not sm90.down_usable(h, w, b.float())  # bias dtype
    monkeypatch.setattr(sm90, "_HAS_DOWN_OP", False)
    assert not sm90.down_usable(h, w, b)  # a build without the op
    monkeypatch.setattr(sm90, "_HAS_DOWN_OP", True)
    monkeypatch.setenv("FUSED_MLP_SM90", "0")
    assert not sm90.down_usable(h, w, b)


def test_interpreted_ops_reject_a_bad_switch(fused_mlp, monkeypatch):
    """The switch is read by the Triton path's down projection: a bad value is a clear error
    there too (here through the interpreter on CPU tensors)."""
    need_interpreter(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_INTERPRET", "1")
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "many")
    x, wg, wu, wd = torch.randn(3, 8), torch.randn(16, 8), torch.randn(16, 8), torch.randn(8, 16)
    with pytest.raises(ValueError, match="FUSED_MLP_DOWN_SPLIT"):
        fused_mlp.gated_mlp(x, wg, wu, wd, "silu")
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "off")
    y = fused_mlp.gated_mlp(x, wg, wu, wd, "silu")
    assert rel_err(y, fused_mlp.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), "silu")) < 1e-5


# ----------------------------------------------------------------------------- GPU

# A down weight larger than the L2 of an H100 / H200 (50-60 MB): 3000 x 17408 bf16 is 104 MB.
# Small gate/up weights (D = 64) keep the first GEMM cheap.
BIG_O, BIG_H, SMALL_D = 3000, 17408, 64


@pytest.fixture
def gpu_tg(tg, fused_mlp, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the split form is offered on sm_90+ only (measured on the H200)")
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    monkeypatch.setattr(tg, "_DOWN_CHOICE", {})
    monkeypatch.setattr(tg, "_DOWN_EAGER_SEEN", set())  # eager calls of earlier tests
    return tg


def _exact(h, w, b):
    y = h.double().cpu() @ w.double().cpu().t()
    return y + b.double().cpu() if b is not None else y


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1, 7, 64), (5, 130, 256), (77, 1000, 2048), (512, 4096, 14336)])
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_split_linear_matches_float64(gpu_tg, dtype, m, n, k, layout, bias):
    """Both split counts, on any shape split_linear accepts (it does not check the size rule):
    within F.linear's own error against float64 (both round an fp32 sum once)."""
    h = _rand(m, k, dtype=dtype, device="cuda", seed=m)
    w = _rand(n, k, dtype=dtype, device="cuda", scale=k**-0.5, seed=n)
    if layout == "conv1d":
        w = w.t().contiguous().t()  # [N, K] view of a [K, N] tensor, as mlp() passes Conv1D's
    b = _rand(n, dtype=dtype, device="cuda", scale=0.5, seed=3) if bias else None
    exact = _exact(h, w, b)
    lin = rel_err(F.linear(h, w, b).cpu(), exact)
    for parts in (2, 4):
        y = gpu_tg.split_linear(h, w, b, parts)
        assert y.dtype == dtype and y.shape == (m, n)
        err = rel_err(y.cpu(), exact)
        assert err <= 1.25 * lin + 1e-4, (parts, err, lin)
        # the second call launches through the kept launcher: the same bits
        assert torch.equal(gpu_tg.split_linear(h, w, b, parts), y)


def _big_gated(dtype, m, bias=False):
    t = dict(x=_rand(m, SMALL_D, dtype=dtype, device="cuda", seed=m),
             gate_weight=_rand(BIG_H, SMALL_D, dtype=dtype, device="cuda", scale=SMALL_D**-0.5, seed=1),
             up_weight=_rand(BIG_H, SMALL_D, dtype=dtype, device="cuda", scale=SMALL_D**-0.5, seed=2),
             down_weight=_rand(BIG_O, BIG_H, dtype=dtype, device="cuda", scale=BIG_H**-0.5, seed=3))
    t["down_bias"] = _rand(BIG_O, dtype=dtype, device="cuda", scale=0.5, seed=4) if bias else None
    return t


def _ref_gated(fm, t):
    r = {k: (v.double().cpu() if v is not None else None) for k, v in t.items()}
    return fm.reference.gated_mlp(r["x"], r["gate_weight"], r["up_weight"], r["down_weight"], "silu",
                                  None, None, r["down_bias"])


def _big_keys(tg) -> list:
    """The down-choice cache's keys for the big down weight (BIG_O x BIG_H)."""
    return [k for k in tg._DOWN_CHOICE if k[1:3] == (BIG_O, BIG_H)]


def _eager_warm_up(fn):
    """fn() on a side stream, as one warms up before a capture; joined and synchronized."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    return y


def _check_the_ops(fm, m):
    """gated_mlp, and mlp in both layouts, on the big down weight with biases (bf16, M rows):
    each within the dtype's bound of float64."""
    dtype = torch.bfloat16
    t = _big_gated(dtype, m, bias=True)
    y = fm.gated_mlp(t["x"], t["gate_weight"], t["up_weight"], t["down_weight"], "silu", down_bias=t["down_bias"])
    assert rel_err(y.cpu(), _ref_gated(fm, t)) < TOL[dtype]
    for layout in ("linear", "conv1d"):
        fc, proj = t["gate_weight"], t["down_weight"]
        if layout == "conv1d":
            fc, proj = fc.t().contiguous(), proj.t().contiguous()
        fc_b = _rand(BIG_H, dtype=dtype, device="cuda", scale=0.5, seed=5)
        y = fm.mlp(t["x"], fc, fc_b, proj, t["down_bias"], "gelu_tanh", weight_layout=layout)
        r = {k: v.double().cpu() for k, v in dict(x=t["x"], fc=fc, fb=fc_b, p=proj, pb=t["down_bias"]).items()}
        ref = fm.reference.mlp(r["x"], r["fc"], r["fb"], r["p"], r["pb"], "gelu_tanh", layout)
        assert rel_err(y.cpu(), ref) < TOL[dtype], layout


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["2", "4"])
@pytest.mark.parametrize("m", [1, 77, 512, 513])
def test_gpu_ops_with_the_split_forced(fused_mlp, gpu_tg, monkeypatch, split, m):
    """gated_mlp and mlp (both layouts, with biases) with FUSED_MLP_DOWN_SPLIT forcing a split:
    taken where the rule allows (M <= 512), F.linear above; right either way."""
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", split)
    calls = spy(monkeypatch, gpu_tg, "split_linear", lambda a: a[3])
    _check_the_ops(fused_mlp, m)
    assert calls == ([int(split)] * 3 if m <= 512 else [])


@pytest.mark.gpu
def test_gpu_split_rule_leaves_the_rest_to_F_linear(gpu_tg, monkeypatch):
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "2")
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, w = torch.randn(64, BIG_H, **bf), torch.randn(BIG_O, BIG_H, **bf)
    assert gpu_tg.down_parts(h, w, None) == 2
    assert gpu_tg.split_parts_allowed(h, w, None) == (2, 4)
    assert gpu_tg.down_parts(h[:, :BIG_H // 4].contiguous(), w[:, :BIG_H // 4], None) == 1  # 26 MB: fits L2
    assert gpu_tg.down_parts(h.float(), w.float(), None) == 1  # fp32
    assert gpu_tg.down_parts(h[:, 1:], w[:, 1:], None) == 1  # h not contiguous
    assert gpu_tg.split_parts_allowed(torch.randn(64, 8200, **bf), torch.randn(8000, 8200, **bf), None) == ()
    assert gpu_tg.split_parts_allowed(torch.randn(64, 8208, **bf), torch.randn(8000, 8208, **bf), None) == (2,)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["auto", None])  # None: the default, graphs
def test_gpu_choice_is_timed_once_and_cached(fused_mlp, gpu_tg, monkeypatch, mode):
    if mode is None:
        monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT", raising=False)
    else:
        monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", mode)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    t = _big_gated(torch.bfloat16, 100)
    timed = spy(monkeypatch, gpu_tg, "_device_time_ms", lambda a: 1)
    args = (t["x"], t["gate_weight"], t["up_weight"], t["down_weight"], "silu")
    y = fused_mlp.gated_mlp(*args)
    n_first = len(timed)
    # F.linear and both split counts, and the one-kernel form where this build has it, 3 rounds
    one_kernel = gpu_tg._sm90.down_usable(torch.empty(100, BIG_H, device="cuda", dtype=torch.bfloat16),
                                          t["down_weight"], None)
    assert n_first == 3 * (4 if one_kernel else 3)
    keys = _big_keys(gpu_tg)
    assert len(keys) == 1 and gpu_tg._DOWN_CHOICE[keys[0]] in (1, 2, 4, gpu_tg._ONE_KERNEL)
    y2 = fused_mlp.gated_mlp(*args)  # same bucket (M 97-128): no more timing
    assert len(timed) == n_first
    assert torch.equal(y, y2)
    assert rel_err(y.cpu(), _ref_gated(fused_mlp, dict(t, down_bias=None))) < TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("split", ["auto", "graphs", "2", "kernel"])
def test_gpu_cuda_graph(fused_mlp, gpu_tg, monkeypatch, split):
    """Captured in a CUDA graph: untimed, "auto" and "graphs" take F.linear and cache nothing; a
    forced split runs the batched GEMM and the reduction with its programmatic edge inside the
    graph, the forced one-kernel form its kernel with a programmatic edge from the gate/up
    kernel. The replay rewrites a poisoned output with the eager result."""
    if split == "kernel":
        _need_down_kernel(fused_mlp, gpu_tg)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", split)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    t = _big_gated(torch.bfloat16, 128, bias=True)
    args = (t["x"], t["gate_weight"], t["up_weight"], t["down_weight"], "silu")
    kw = dict(down_bias=t["down_bias"])
    # warm-up outside the capture: kernels compiled, configs timed
    eager = _eager_warm_up(lambda: fused_mlp.gated_mlp(*args, **kw))
    gpu_tg._DOWN_CHOICE.clear()  # as if this bucket had never been timed
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fused_mlp.gated_mlp(*args, **kw)
    if split != "2":
        assert gpu_tg._DOWN_CHOICE == {}
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y.cpu(), _ref_gated(fused_mlp, t)) < TOL[torch.bfloat16]
    if split in ("2", "kernel"):
        assert torch.equal(y, eager)


@pytest.mark.gpu
def test_gpu_default_splits_in_captures_only(fused_mlp, gpu_tg, monkeypatch):
    """The default mode: the warm-up (eager) call times the forms and runs F.linear; with the
    bucket's choice then set to a split, eager calls still run F.linear and a capture runs the
    split, whose replay is right (not bit-equal to F.linear's: another order of the sum)."""
    monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT", raising=False)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    t = _big_gated(torch.bfloat16, 128, bias=True)
    args = (t["x"], t["gate_weight"], t["up_weight"], t["down_weight"], "silu")
    kw = dict(down_bias=t["down_bias"])
    calls = spy(monkeypatch, gpu_tg, "split_linear", lambda a: a[3])
    eager = _eager_warm_up(lambda: fused_mlp.gated_mlp(*args, **kw))
    keys = _big_keys(gpu_tg)
    assert len(keys) == 1
    n_timing = len(calls)  # the timing ran the split forms
    assert n_timing > 0
    gpu_tg._DOWN_CHOICE[keys[0]] = 2
    assert torch.equal(fused_mlp.gated_mlp(*args, **kw), eager) and len(calls) == n_timing
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fused_mlp.gated_mlp(*args, **kw)
    assert calls[n_timing:] == [2]
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(y.cpu(), _ref_gated(fused_mlp, t)) < TOL[torch.bfloat16]
    assert rel_err(y.float(), eager.float()) < TOL[torch.bfloat16]


@pytest.mark.gpu
def test_gpu_compile_reduce_overhead(fused_mlp, gpu_tg, monkeypatch):
    """torch.compile(mode="reduce-overhead") (CUDA graphs through cudagraph trees) with the
    default mode: its warm-up call times the forms; with the choice then set to a split, the
    recorded graph runs it and the replays are right."""
    monkeypatch.delenv("FUSED_MLP_DOWN_SPLIT", raising=False)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    torch._dynamo.reset()
    t = _big_gated(torch.bfloat16, 128, bias=True)
    f = torch.compile(lambda x: fused_mlp.gated_mlp(x, t["gate_weight"], t["up_weight"], t["down_weight"],
                                                    "silu", down_bias=t["down_bias"]),
                      mode="reduce-overhead", fullgraph=True)
    calls = spy(monkeypatch, gpu_tg, "split_linear", lambda a: a[3])
    ref = _ref_gated(fused_mlp, t)
    y = f(t["x"]).clone()  # warm-up run (eager kernels): times the forms, runs F.linear
    keys = _big_keys(gpu_tg)
    assert len(keys) == 1 and rel_err(y.cpu(), ref) < TOL[torch.bfloat16]
    gpu_tg._DOWN_CHOICE[keys[0]] = 2
    n_timing = len(calls)
    for _ in range(3):  # recorded, then replayed
        y = f(t["x"]).clone()
        assert rel_err(y.cpu(), ref) < TOL[torch.bfloat16]
    assert calls[n_timing:] == [2]  # once, in the recording; replays do not call Python
    torch._dynamo.reset()


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(fused_mlp, gpu_tg, monkeypatch):
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "4")
    t = _big_gated(torch.float16, 40, bias=True)
    f = torch.compile(lambda x: fused_mlp.gated_mlp(x, t["gate_weight"], t["up_weight"], t["down_weight"],
                                                    "silu", down_bias=t["down_bias"]), fullgraph=True)
    calls = spy(monkeypatch, gpu_tg, "split_linear", lambda a: a[3])
    y = f(t["x"])
    assert calls == [4]
    assert rel_err(y.cpu(), _ref_gated(fused_mlp, t)) < TOL[torch.float16]


# ---- the one-kernel form (sm_90a: down_gemm_sm90)


def _need_down_kernel(fm, tg):
    need_sm90(fm)
    if not tg._sm90._HAS_DOWN_OP:
        pytest.skip("this build has no down_gemm_sm90")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(1, 8, 64), (5, 136, 256), (77, 1000, 2048), (100, 72, 3000), (128, 64, 72),
                                   (128, 4096, 14336)])
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_down_gemm_matches_float64(fused_mlp, gpu_tg, dtype, m, n, k, bias):
    """down_gemm_sm90 on shapes that are not multiples of its tiles (N past the last 64-row
    block, K past the last 64-column step, one step per K half, M of 1 and under 128), into a
    poisoned output: within F.linear's own error against float64 (both round an fp32 sum once);
    the same bits on a second call and with the programmatic edge."""
    _need_down_kernel(fused_mlp, gpu_tg)
    h = _rand(m, k, dtype=dtype, device="cuda", seed=m)
    w = _rand(n, k, dtype=dtype, device="cuda", scale=k**-0.5, seed=n)
    b = _rand(n, dtype=dtype, device="cuda", scale=0.5, seed=3) if bias else None
    exact = _exact(h, w, b)
    lin = rel_err(F.linear(h, w, b).cpu(), exact)
    outs = []
    for pdl in (False, False, True):
        out = poison_like(torch.empty(m, n, device="cuda", dtype=dtype))
        fused_mlp.ops.down_gemm_sm90(out, h, w, b, pdl)
        outs.append(out)
    err = rel_err(outs[0].cpu(), exact)
    assert err <= 1.25 * lin + 1e-4, (err, lin)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.gpu
def test_gpu_down_gemm_refuses_what_it_does_not_take(fused_mlp, gpu_tg):
    _need_down_kernel(fused_mlp, gpu_tg)
    bf = dict(device="cuda", dtype=torch.bfloat16)
    op = fused_mlp.ops.down_gemm_sm90
    h, w = torch.randn(128, 256, **bf), torch.randn(64, 256, **bf)
    with pytest.raises(RuntimeError, match="at most 128 rows of h"):
        op(torch.empty(129, 64, **bf), torch.randn(129, 256, **bf), w, None, False)
    with pytest.raises(RuntimeError, match=r"weight must be \[N, K\]"):
        op(torch.empty(128, 64, **bf), h, torch.randn(64, 128, **bf), None, False)
    with pytest.raises(RuntimeError, match="bfloat16 or float16"):
        op(torch.empty(128, 64, device="cuda"), h.float(), w.float(), None, False)
    with pytest.raises(RuntimeError, match="multiple of 8"):  # out's rows stay aligned: a view
        op(torch.empty(128, 64, **bf)[:, :60], h, w[:60], None, False)
    with pytest.raises(RuntimeError, match="out must be"):
        op(torch.empty(128, 32, **bf), h, w, None, False)
    with pytest.raises(RuntimeError, match="bias"):
        op(torch.empty(128, 64, **bf), h, w, torch.randn(32, **bf), False)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 77, 128, 129])
def test_gpu_ops_with_the_one_kernel_form_forced(fused_mlp, gpu_tg, monkeypatch, m):
    """gated_mlp and mlp (nn.Linear's layout, with biases; and Conv1D's, whose [N, K] view of
    the weight is not K-contiguous) with FUSED_MLP_DOWN_SPLIT=kernel: the kernel where its rule
    allows (M <= 128, K-contiguous weight), F.linear elsewhere; right either way."""
    _need_down_kernel(fused_mlp, gpu_tg)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "kernel")
    calls = spy(monkeypatch, gpu_tg._sm90, "down", lambda a: (a[0].shape[0], a[3]))
    _check_the_ops(fused_mlp, m)
    assert calls == ([(m, True)] * 2 if m <= 128 else [])  # gated_mlp and mlp's linear layout


@pytest.mark.gpu
def test_gpu_one_kernel_form_under_compile_fullgraph(fused_mlp, gpu_tg, monkeypatch):
    _need_down_kernel(fused_mlp, gpu_tg)
    monkeypatch.setenv("FUSED_MLP_DOWN_SPLIT", "kernel")
    torch._dynamo.reset()
    t = _big_gated(torch.float16, 40, bias=True)
    f = torch.compile(lambda x: fused_mlp.gated_mlp(x, t["gate_weight"], t["up_weight"], t["down_weight"],
                                                    "silu", down_bias=t["down_bias"]), fullgraph=True)
    calls = spy(monkeypatch, gpu_tg._sm90, "down", lambda a: a[0].shape[0])
    y = f(t["x"])
    assert calls == [40]
    assert rel_err(y.cpu(), _ref_gated(fused_mlp, t)) < TOL[torch.float16]
    torch._dynamo.reset()
