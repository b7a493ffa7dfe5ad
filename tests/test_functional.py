"""gated_mlp / gated_mlp_packed / mlp against the float64 reference, on every path.

CPU (always): the reference and CPU act-and-mul paths, the argument checks and their
messages, torch.compile(fullgraph=True), float64 gradcheck, and the Triton kernels under
Triton's interpreter (FUSED_MLP_INTERPRET=1; fp32 and fp16 on small odd shapes; bf16 dots
are not trustworthy under the interpreter, so bf16 is tested on the GPU only).

GPU (@pytest.mark.gpu): the compiled Triton kernels over M x dtype x biases x activations
x layouts, every tile config, autotuning, torch.compile, CUDA graphs, the dispatcher's choice.

Every output is checked for NaN/Inf (rel_err is inf then) and against an error bound.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import kernel_variants, need_interpreter, need_sm90, rel_err, sm90_template_args, spy, submodule

ACTS = ("identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu")
# Relative (Frobenius) error bounds against the float64 reference.
TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}
TOL_TF32 = 1e-2


# ----------------------------------------------------------------------------- helpers


def _rand(*shape, dtype=torch.float32, device="cpu", scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def make_gated(m, d, h, o, dtype, device, bias, seed=0, lead=None):
    """x [*lead, m, d] (or [m, d]), gate/up [h, d], down [o, h], optional biases."""
    g = torch.Generator().manual_seed(seed)
    shape = (*lead, m, d) if lead else (m, d)
    t = dict(
        x=_rand(*shape, dtype=dtype, device=device, gen=g),
        gate_weight=_rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g),
        up_weight=_rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g),
        down_weight=_rand(o, h, dtype=dtype, device=device, scale=h**-0.5, gen=g),
    )
    for name, n in (("gate_bias", h), ("up_bias", h), ("down_bias", o)):
        t[name] = _rand(n, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None
    return t


def make_plain(m, d, h, o, dtype, device, bias, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    fc = _rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g)
    proj = _rand(o, h, dtype=dtype, device=device, scale=h**-0.5, gen=g)
    if layout == "conv1d":  # GPT-2 Conv1D keeps [in, out]
        fc, proj = fc.t().contiguous(), proj.t().contiguous()
    return dict(
        x=_rand(m, d, dtype=dtype, device=device, gen=g),
        fc_weight=fc,
        fc_bias=_rand(h, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None,
        proj_weight=proj,
        proj_bias=_rand(o, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None,
    )


def _f64(t):
    return {k: (v.double().cpu() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def ref_gated(fm, t, act):
    r = _f64(t)
    return fm.reference.gated_mlp(r["x"], r["gate_weight"], r["up_weight"], r["down_weight"], act,
                                  r["gate_bias"], r["up_bias"], r["down_bias"])


def ref_plain(fm, t, act, layout):
    r = _f64(t)
    return fm.reference.mlp(r["x"], r["fc_weight"], r["fc_bias"], r["proj_weight"], r["proj_bias"], act, layout)


def run_gated(fm, t, act):
    return fm.gated_mlp(t["x"], t["gate_weight"], t["up_weight"], t["down_weight"], act,
                        gate_bias=t["gate_bias"], up_bias=t["up_bias"], down_bias=t["down_bias"])


def run_packed(fm, t, act):
    """gated_mlp_packed on one [2H, D] weight (and [2H] bias) built from t."""
    gu = torch.cat([t["gate_weight"], t["up_weight"]])
    gub = None if t["gate_bias"] is None else torch.cat([t["gate_bias"], t["up_bias"]])
    return fm.gated_mlp_packed(t["x"], gu, t["down_weight"], act, gate_up_bias=gub, down_bias=t["down_bias"])


def run_plain(fm, t, act, layout):
    return fm.mlp(t["x"], t["fc_weight"], t["fc_bias"], t["proj_weight"], t["proj_bias"], act, layout)


def check(out, ref, tol, what=""):
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    err = rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


# ----------------------------------------------------------------------------- CPU: reference paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "relu2"])
def test_cpu_gated_and_packed(fused_mlp, dtype, bias, act, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    t = make_gated(5, 40, 72, 24, dtype, "cpu", bias, lead=(2,))
    ref = ref_gated(fused_mlp, t, act)
    check(run_gated(fused_mlp, t, act), ref, TOL[dtype], "gated_mlp")
    check(run_packed(fused_mlp, t, act), ref, TOL[dtype], "gated_mlp_packed")


def test_cpu_paths_chosen(fused_mlp, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    explain = fused_mlp.dispatch.explain
    x32, x64 = torch.zeros(3, 8), torch.zeros(3, 8, dtype=torch.float64)
    compiled = submodule(fused_mlp, "act_and_mul").has_compiled_kernel("act_and_mul", x32.device)
    assert explain(x32, "gated") == ("cpu-act-and-mul" if compiled else "reference")
    assert explain(x32, "mlp") == "reference"
    assert explain(x64, "gated") == "reference"
    assert explain(torch.zeros(3, 8, device="meta"), "gated") == "reference"
    assert ":" in explain(x32, "gated", verbose=True)
    with pytest.raises(ValueError, match="kind"):
        explain(x32, "conv")


@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("bias", [False, True])
def test_cpu_mlp(fused_mlp, layout, bias, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    t = make_plain(7, 40, 72, 24, torch.float32, "cpu", bias, layout)
    check(run_plain(fused_mlp, t, "gelu_tanh", layout), ref_plain(fused_mlp, t, "gelu_tanh", layout),
          TOL[torch.float32], "mlp")


def test_cpu_aliases_and_empty(fused_mlp):
    t = make_gated(4, 16, 24, 8, torch.float32, "cpu", False)
    a = run_gated(fused_mlp, t, "swish")
    b = run_gated(fused_mlp, t, "silu")
    torch.testing.assert_close(a, b)
    t0 = make_gated(0, 16, 24, 8, torch.float32, "cpu", True)
    assert run_gated(fused_mlp, t0, "silu").shape == (0, 8)


def test_decode_hook_wiring(fused_mlp, monkeypatch):
    """The dispatcher's decode hook: limits, and the arguments decode.py receives."""
    import types

    d = fused_mlp.dispatch
    calls = []
    fake = types.SimpleNamespace(
        MAX_M=8,
        available=lambda device: True,
        _gated_mlp=lambda *a: calls.append(("gated", a)) or fused_mlp.reference.gated_mlp(*a),
        _mlp=lambda *a: calls.append(("mlp", a)) or fused_mlp.reference.mlp(*a),
    )
    monkeypatch.setattr(d, "_decode_module", lambda: fake)
    d._decode_available.cache_clear()
    try:
        monkeypatch.setattr(d, "DECODE_MAX_M", {(9, 0): 16, (8, 0): 4})
        assert d._decode_max_m(torch.device("cpu"), (9, 0)) == 8  # capped by decode.MAX_M
        assert d._decode_max_m(torch.device("cpu"), (8, 0)) == 4
        assert d._decode_max_m(torch.device("cpu"), (8, 6)) == 0  # not measured: never
        # a card's own entry (gated MLPs only), over its capability's; no GPU needed: the card's
        # name and decode.py are stand-ins
        cuda0 = torch.device("cuda", 0)
        monkeypatch.setattr(d, "DECODE_MAX_M", {(9, 0): 4})
        monkeypatch.setattr(d, "DECODE_MAX_M_BY_CARD", {"NVIDIA H200": 6})
        monkeypatch.setattr(d, "_card_name", lambda index: "NVIDIA H200")
        assert d._decode_max_m(cuda0, (9, 0)) == d._decode_max_m(cuda0, (9, 0), "gated") == 6
        assert d._decode_max_m(cuda0, (9, 0), "mlp") == 4
        assert d._decode_max_m(cuda0, (8, 6)) == 0  # no entry for the capability: none for the card
        monkeypatch.setattr(d, "_card_name", lambda index: "NVIDIA H100 80GB HBM3")
        assert d._decode_max_m(cuda0, (9, 0)) == 4
        assert d._decode_max_m(torch.device("cpu"), (9, 0)) == 4
        monkeypatch.setattr(d, "choose", lambda *a, **k: d.Choice("decode", "test"))
        t = make_gated(2, 16, 24, 8, torch.float32, "cpu", True)
        check(run_gated(fused_mlp, t, "swish"), ref_gated(fused_mlp, t, "silu"), TOL[torch.float32], "decode")
        p = make_plain(2, 16, 24, 8, torch.float32, "cpu", True, "linear")
        check(run_plain(fused_mlp, p, "gelu", "linear"), ref_plain(fused_mlp, p, "gelu", "linear"),
              TOL[torch.float32], "decode mlp")
    finally:
        d._decode_available.cache_clear()
    (k1, a1), (k2, a2) = calls
    assert k1 == "gated" and a1[4] == "silu" and a1[5] is t["gate_bias"] and a1[7] is t["down_bias"]
    assert k2 == "mlp" and a2[5] == "gelu" and a2[2] is p["fc_bias"] and len(a2) == 6


# ----------------------------------------------------------------------------- CPU: argument checks


def test_errors_name_the_argument(fused_mlp):
    fm = fused_mlp
    t = make_gated(3, 16, 24, 8, torch.float32, "cpu", True)
    x, wg, wu, wd = t["x"], t["gate_weight"], t["up_weight"], t["down_weight"]
    with pytest.raises(ValueError, match="up_weight.*dtype"):
        fm.gated_mlp(x, wg, wu.half(), wd)
    with pytest.raises(ValueError, match="down_bias.*dtype"):
        fm.gated_mlp(x, wg, wu, wd, down_bias=t["down_bias"].double())
    with pytest.raises(ValueError, match=r"x.shape\[-1\]"):
        fm.gated_mlp(x[:, :15], wg, wu, wd)
    with pytest.raises(ValueError, match="up_weight.*shape"):
        fm.gated_mlp(x, wg, wu[:20], wd)
    with pytest.raises(ValueError, match="down_weight"):
        fm.gated_mlp(x, wg, wu, wd[:, :20])
    with pytest.raises(ValueError, match="gate_bias.*shape"):
        fm.gated_mlp(x, wg, wu, wd, gate_bias=t["gate_bias"][:5])
    with pytest.raises(ValueError, match="gate_weight.*device"):
        fm.gated_mlp(x, wg.to("meta"), wu, wd)
    with pytest.raises(ValueError, match="activation"):
        fm.gated_mlp(x, wg, wu, wd, "tanhh")
    with pytest.raises(ValueError, match="x has dtype"):
        fm.gated_mlp(x.int(), wg, wu, wd)
    with pytest.raises(ValueError, match="gate_up_weight"):
        fm.gated_mlp_packed(x, torch.cat([wg, wu])[:-1], wd)
    with pytest.raises(ValueError, match="gate_up_bias"):
        fm.gated_mlp_packed(x, torch.cat([wg, wu]), wd, gate_up_bias=t["gate_bias"])
    p = make_plain(3, 16, 24, 8, torch.float32, "cpu", True, "linear")
    with pytest.raises(ValueError, match="weight_layout"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"], p["proj_bias"], "gelu", "transposed")
    with pytest.raises(ValueError, match="fc_weight"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"], p["proj_bias"], "gelu", "conv1d")
    with pytest.raises(ValueError, match="proj_weight"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"][:, :20], p["proj_bias"], "gelu")
    with pytest.raises(ValueError, match="fc_bias.*shape"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"][:3], p["proj_weight"], p["proj_bias"], "gelu")
    with pytest.raises(ValueError, match="proj_weight.*device"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"].to("meta"), p["proj_bias"], "gelu")
    with pytest.raises(ValueError, match="activation"):
        fm.mlp(p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"], p["proj_bias"], "nope")


# ----------------------------------------------------------------------------- CPU: compile, gradcheck


def test_cpu_torch_compile_fullgraph(fused_mlp):
    torch._dynamo.reset()
    t = make_gated(5, 16, 24, 8, torch.float32, "cpu", True, lead=(2,))
    f = torch.compile(lambda x: run_gated(fused_mlp, {**t, "x": x}, "gelu_tanh"), fullgraph=True)
    check(f(t["x"]), ref_gated(fused_mlp, t, "gelu_tanh"), TOL[torch.float32], "compiled gated_mlp")
    p = make_plain(5, 16, 24, 8, torch.float32, "cpu", True, "conv1d")
    g = torch.compile(lambda x: run_plain(fused_mlp, {**p, "x": x}, "gelu", "conv1d"), fullgraph=True)
    check(g(p["x"]), ref_plain(fused_mlp, p, "gelu", "conv1d"), TOL[torch.float32], "compiled mlp")


# ----------------------------------------------------------------------------- CPU: Triton interpreter

@pytest.fixture
def interpret(fused_mlp, monkeypatch):
    """Route CPU tensors through the Triton kernels under Triton's interpreter."""
    need_interpreter(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_INTERPRET", "1")
    assert fused_mlp.dispatch.explain(torch.zeros(2, 4), "gated") == "triton-interpret"
    return fused_mlp


INTERP_DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("tma", [False, True, "persistent"])
@pytest.mark.parametrize("kind", ["gated", "plain", "plain_kn", "bwd_plain", "bwd_gated"])
def test_launch_plan_matches_kernel_signature(fused_mlp, tma, kind):
    """A launch plan's argument layout (8 tensors, then `ints`, then the compile-time values
    in `tail`) is exactly its kernel's parameter list: the direct launcher of later calls
    (CompiledKernel[grid]) takes every argument by position, so a kernel signature edit
    that the plan code missed must fail here, not launch with shifted arguments."""
    pytest.importorskip("triton")
    tg = submodule(fused_mlp, "triton_gemm")
    if tg.INTERPRETED:
        pytest.skip("the compiled-mode module is loaded interpreted in this process")
    m, k, n = 40, 64, 48
    x = torch.zeros(m, k)
    w1 = torch.zeros(k, n) if kind == "plain_kn" else torch.zeros(n, k)
    w2 = torch.zeros(n, k) if kind == "gated" else None
    bwd = {"bwd_plain": tg.BWD_PLAIN, "bwd_gated": tg.BWD_GATED}.get(kind, tg.FWD)
    out = torch.zeros(m, 2 * n if kind == "bwd_gated" else n)
    pre = torch.zeros_like(out)
    h = torch.zeros(m, n) if bwd != tg.FWD else None
    cfg = tg.Config(32, 32, 32, 4, 4, 2, bool(tma), tma == "persistent")
    plan = tg._make_plan(cfg, x, w1, w2, kind == "plain_kn", True, False, out, 1, pre, h, bwd)
    params = plan.kernel.params
    assert plan.kernel is (tg._fused_linear_kernel_tma if tma else tg._fused_linear_kernel)
    assert 8 + len(plan.ints) + len(plan.tail) == len(params)
    assert not any(p.is_constexpr for p in params[: 8 + len(plan.ints)])
    tail = params[8 + len(plan.ints):]
    assert all(p.is_constexpr for p in tail)
    assert plan.tail == tuple(plan.consts[p.name] for p in tail)
    assert set(plan.consts) - {p.name for p in tail} == {"num_warps", "num_stages", *tg.COMPILE_OPTIONS}
    assert {k: plan.consts[k] for k in tg.COMPILE_OPTIONS} == tg.COMPILE_OPTIONS
    assert plan.ints[:3] == (m, n, k)
    # cdiv(40, 32) * cdiv(48, 32) tiles; persistent: one program per SM on a GPU, two for
    # CPU tensors (the interpreter)
    assert plan.grid == ((2,) if tma == "persistent" else (2 * 2,))
    if tma:
        assert plan.consts["PERSISTENT"] == (tma == "persistent")
        assert not (plan.consts["PERSISTENT"] and plan.consts["PREFETCH"])


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_interpret_gated(interpret, dtype, m, bias, act):
    t = make_gated(m, 40, 72, 24, dtype, "cpu", bias, seed=m)
    check(run_gated(interpret, t, act), ref_gated(interpret, t, act), TOL[dtype], f"gated {act}")


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("m", [3, 64])
def test_interpret_packed(interpret, dtype, m):
    t = make_gated(m, 40, 72, 24, dtype, "cpu", True, seed=m, lead=(1,))
    check(run_packed(interpret, t, "silu"), ref_gated(interpret, t, "silu"), TOL[dtype], "packed")


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("act", ACTS)
def test_interpret_mlp(interpret, dtype, m, layout, act):
    bias = act != "relu"  # one activation without biases
    t = make_plain(m, 40, 72, 24, dtype, "cpu", bias, layout, seed=m)
    check(run_plain(interpret, t, act, layout), ref_plain(interpret, t, act, layout), TOL[dtype], f"mlp {act}")


def _strided(b):
    """The same values as a non-contiguous view (every other element of a wider buffer)."""
    v = torch.stack([b, torch.full_like(b, float("nan"))], 1)[:, 0]
    assert not v.is_contiguous() and torch.equal(v, b)
    return v


def _with_strided_biases(t):
    return {k: (_strided(v) if k.endswith("bias") and v is not None else v) for k, v in t.items()}


@pytest.mark.parametrize("m", [1, 5])
def test_interpret_strided_biases(interpret, m):
    """Biases that are strided views (every other element of a buffer) are read by value:
    the kernels index biases contiguously, so the entry points copy such views."""
    t = _with_strided_biases(make_gated(m, 40, 72, 24, torch.float32, "cpu", True, seed=m))
    check(run_gated(interpret, t, "silu"), ref_gated(interpret, t, "silu"), TOL[torch.float32], "gated")
    for layout in ("linear", "conv1d"):
        p = _with_strided_biases(make_plain(m, 40, 72, 24, torch.float32, "cpu", True, layout, seed=m))
        check(run_plain(interpret, p, "gelu", layout), ref_plain(interpret, p, "gelu", layout), TOL[torch.float32],
              f"mlp {layout}")


def test_interpret_kernel_configs_and_strides(interpret):
    """The kernels themselves, with tile configs that hit the even-K path, uneven groups
    and single-program grids, and weights given through unusual strides."""
    tg = submodule(interpret, "triton_gemm").interpreted_module()
    C = tg.Config
    ids = interpret.activations.ACTIVATION_IDS
    g = torch.Generator().manual_seed(3)
    x = _rand(37, 48, gen=g)
    wt = _rand(48, 72, gen=g, scale=48**-0.5)  # [D, H]: wt.t() is a [H, D] view with strides (1, H)
    wu = _rand(72, 96, gen=g, scale=48**-0.5)[:, ::2]  # [H, D] with a K stride of 2
    b = _rand(72, gen=g)
    xd, wgd, wud, bd = x.double(), wt.t().double(), wu.double(), b.double()
    ref = torch.nn.functional.silu(xd @ wgd.t() + bd) * (xd @ wud.t())
    for cfg in (C(16, 16, 16, 1, 4, 1), C(32, 64, 16, 3, 4, 1), C(64, 128, 64, 8, 4, 1)):
        out = tg.gated_linear(x, wt.t(), wu, b, None, ids["silu"], config=cfg)
        check(out, ref, TOL[torch.float32], f"gated_linear {cfg}")
        out = tg.linear_act(x, wt, b, ids["gelu"], "conv1d", config=cfg)
        check(out, torch.nn.functional.gelu(xd @ wt.double() + bd), TOL[torch.float32], f"linear_act {cfg}")
    # the TMA kernel (descriptors zero-fill past the edges): contiguous rows, packed gate/up
    wgu = _rand(144, 48, gen=g, scale=48**-0.5)
    ref_p = torch.nn.functional.silu(xd @ wgu[:72].double().t() + bd) * (xd @ wgu[72:].double().t())
    for cfg in (C(32, 32, 16, 2, 4, 1, True), C(16, 64, 32, 1, 4, 1, True)):
        check(tg.gated_linear(x, wgu[:72], wgu[72:], b, None, ids["silu"], config=cfg), ref_p,
              TOL[torch.float32], f"gated_linear {cfg}")
        check(tg.linear_act(x, wt.contiguous(), b, ids["gelu"], "conv1d", config=cfg),
              torch.nn.functional.gelu(xd @ wt.double() + bd), TOL[torch.float32], f"linear_act {cfg}")
    # a non-contiguous x (every other row) and K = 0
    xs = _rand(74, 48, gen=g)[::2]
    check(tg.gated_linear(xs, wt.t(), wu, None, None, ids["relu2"]),
          torch.relu(xs.double() @ wgd.t()) ** 2 * (xs.double() @ wud.t()), TOL[torch.float32], "strided x")
    z = tg.linear_act(torch.zeros(5, 0), torch.zeros(8, 0), b[:8], ids["identity"])
    torch.testing.assert_close(z, b[:8].expand(5, 8))


def test_candidates_and_tma_eligibility(fused_mlp):
    pytest.importorskip("triton")
    tg = submodule(fused_mlp, "triton_gemm")
    for gated in (True, False):
        for m in (1, 100, 5000):
            for dtype in (torch.bfloat16, torch.float32):
                cands = tg.candidates(gated, m, 344, 200, dtype, tma=True)
                assert cands and len(cands) == len(set(cands)) and len(cands) <= 11
                assert not cands[0].tma  # the untimed default is the pointer kernel
                assert all(c.tma for c in cands if c.persistent)
                # persistent kernels: measured faster for the plain forward only
                assert any(c.persistent for c in cands) == (not gated and m > 64 and dtype != torch.float32)
                bwd = tg.candidates(False, m, 344, 200, dtype, tma=True, table=tg._BWD_CONFIGS)
                assert not any(c.persistent for c in bwd)
                assert all(c.block_m <= max(16, tg.m_bucket(m)) for c in cands)
                assert any(c.tma for c in cands) == (m > 64 and dtype != torch.float32)
    assert tg.m_bucket(777) == 1024 and tg.m_bucket(1) == 16
    w = torch.zeros(344, 200, dtype=torch.bfloat16)
    x = torch.zeros(7, 200, dtype=torch.bfloat16)
    assert tg._tma_compatible(x, w, w[:172])
    assert not tg._tma_compatible(x, w.t())  # last stride not 1
    assert tg._tma_compatible(x[:, :199], w[:, :199])  # a view: rows are still 400 bytes apart
    assert not tg._tma_compatible(torch.zeros(7, 199, dtype=torch.bfloat16))  # rows of 398 bytes
    assert not tg._tma_compatible(torch.zeros(7, 201, dtype=torch.bfloat16)[:, 1:])  # base not 16-byte aligned


def test_interpret_compile_fullgraph(interpret):
    torch._dynamo.reset()
    t = make_gated(3, 40, 72, 24, torch.float32, "cpu", True)
    f = torch.compile(lambda x: run_gated(interpret, {**t, "x": x}, "silu"), fullgraph=True, backend="aot_eager")
    check(f(t["x"]), ref_gated(interpret, t, "silu"), TOL[torch.float32], "compiled, interpreted")


def test_works_without_triton(tmp_path):
    """The package imports and runs (reference path) where `import triton` fails."""
    script = (
        "import sys; sys.modules['triton'] = None\n"
        "import os, torch\n"
        "from kernels import get_kernel\n"
        "fm = get_kernel('org/fused-mlp', version=1)\n"
        "os.environ['FUSED_MLP_INTERPRET'] = '1'\n"
        "x, w, wd = torch.randn(3, 8), torch.randn(16, 8), torch.randn(4, 16)\n"
        "assert fm.dispatch.explain(x, 'gated') == 'reference', fm.dispatch.explain(x, 'gated', verbose=True)\n"
        "torch.testing.assert_close(fm.gated_mlp(x, w, w, wd), fm.reference.gated_mlp(x, w, w, wd))\n"
        "torch.testing.assert_close(fm.mlp(x, w, None, wd, None), fm.reference.mlp(x, w, None, wd, None))\n"
        "print('ok')\n"
    )
    env = {**os.environ, "KERNELS_CACHE": os.environ["KERNELS_CACHE"], "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_interpreter_blocker_versions(fused_mlp):
    """Triton up to 3.6 with NumPy 2.4 or later cannot run the interpreted kernels
    (triton-lang/triton#9171); the reason names both versions and the way out."""
    pytest.importorskip("triton")
    blocker = submodule(fused_mlp, "triton_gemm").interpreter_blocker
    msg = blocker("3.6.0", "2.4.6")
    assert msg is not None and "3.6.0" in msg and "2.4.6" in msg and "numpy<2.4" in msg and "#9171" in msg
    assert blocker("3.5.1", "2.4.0rc1") is not None and blocker("3.6", "2.4rc1") is not None
    for ok in (("3.7.0", "2.4.6"), ("3.10.0", "2.5.0"), ("3.6.0+git1234", "2.3.5"), ("3.4.0", "1.26.4"), ("3.7a0", "2.4.0")):
        assert blocker(*ok) is None, ok


def test_blocked_interpreter_falls_back_to_reference(fused_mlp, monkeypatch):
    """With the interpreter requested where it cannot run, the ops take the reference path
    (forward and training) and say why; a direct interpreted_module() call is a clear error."""
    pytest.importorskip("triton")
    tg = submodule(fused_mlp, "triton_gemm")
    reason = "Triton 3.6.0's interpreter cannot run with NumPy 2.4.6 (test)"
    monkeypatch.setattr(fused_mlp.dispatch, "_interpreter_blocker", lambda: reason)
    monkeypatch.setattr(tg, "interpreter_blocker", lambda: reason)
    monkeypatch.setenv("FUSED_MLP_INTERPRET", "1")
    x = torch.randn(3, 8, dtype=torch.float32)
    assert fused_mlp.dispatch.explain(x, "gated", verbose=True) == f"reference: interpretation requested but {reason}"
    assert fused_mlp.dispatch.backward_choice(x, "mlp").path == "reference"
    t = make_gated(3, 8, 16, 4, torch.float32, "cpu", True, seed=4)
    check(run_gated(fused_mlp, t, "silu"), ref_gated(fused_mlp, t, "silu"), 1e-6, "gated, blocked interpreter")
    grads = []
    for f in (fused_mlp.gated_mlp, fused_mlp.reference.gated_mlp):
        xg = t["x"].clone().requires_grad_()
        f(xg, t["gate_weight"], t["up_weight"], t["down_weight"], "silu").sum().backward()
        grads.append(xg.grad)
    check(grads[0], grads[1], 1e-6, "dx, blocked interpreter")
    with pytest.raises(RuntimeError, match="NumPy 2.4.6"):
        tg.interpreted_module.__wrapped__()


# ----------------------------------------------------------------------------- GPU

GPU_MS = [1, 3, 64, 777, 4096]
# Odd sizes: nothing is a multiple of a tile; (D, H, O).
ODD = (200, 344, 136)


def _gpu_tol(dtype):
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return TOL_TF32
    return TOL[dtype]


@pytest.fixture
def gpu(fused_mlp, monkeypatch):
    """The compiled Triton path (decode.py's small-M kernels kept out of the way) with one
    untimed config per shape (fewer compilations)."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    return fused_mlp


# fp32 without TF32 uses FMA dots, slow to compile: one M for it (and M=64 in the TF32 test).
GPU_MATRIX = [(dt, m) for dt in (torch.bfloat16, torch.float16) for m in GPU_MS] + [(torch.float32, 777)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m", GPU_MATRIX)
@pytest.mark.parametrize("bias", [False, True])
def test_gpu_matrix(gpu, dtype, m, bias):
    d, h, o = ODD
    t = make_gated(m, d, h, o, dtype, "cuda", bias, seed=m)
    ref = ref_gated(gpu, t, "silu")
    check(run_gated(gpu, t, "silu").cpu(), ref, _gpu_tol(dtype), "gated")
    check(run_packed(gpu, t, "silu").cpu(), ref, _gpu_tol(dtype), "packed")
    for layout in ("linear", "conv1d"):
        p = make_plain(m, d, h, o, dtype, "cuda", bias, layout, seed=m)
        check(run_plain(gpu, p, "gelu_tanh", layout).cpu(), ref_plain(gpu, p, "gelu_tanh", layout),
              _gpu_tol(dtype), f"mlp {layout}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 777])
@pytest.mark.parametrize("act", ACTS)
def test_gpu_activations(gpu, m, act):
    d, h, o = ODD
    t = make_gated(m, d, h, o, torch.bfloat16, "cuda", True, seed=m)
    check(run_gated(gpu, t, act).cpu(), ref_gated(gpu, t, act), TOL[torch.bfloat16], f"gated {act}")
    p = make_plain(m, d, h, o, torch.bfloat16, "cuda", True, "linear", seed=m)
    check(run_plain(gpu, p, act, "linear").cpu(), ref_plain(gpu, p, act, "linear"), TOL[torch.bfloat16], f"mlp {act}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_every_config(fused_mlp, dtype, monkeypatch):
    """Every tile config the tuner may pick (TMA variants on sm_90+ included) computes the
    right thing on this GPU, or does not fit it (which the tuner skips). fp32 with TF32
    (quicker to compile)."""
    from triton.runtime.errors import OutOfResources

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)

    tg = submodule(fused_mlp, "triton_gemm")
    ids = fused_mlp.activations.ACTIVATION_IDS
    tma = (False, True) if torch.cuda.get_device_capability() >= (9, 0) and dtype != torch.float32 else (False,)
    d, h, _ = ODD  # rows of 400 / 688 bytes: TMA-compatible
    t = make_gated(777, d, h, 8, dtype, "cuda", True)
    x, wg, wu, bg, bu = t["x"], t["gate_weight"], t["up_weight"], t["gate_bias"], t["up_bias"]
    r = _f64(t)
    ref_g = torch.nn.functional.silu(r["x"] @ r["gate_weight"].t() + r["gate_bias"]) * (
        r["x"] @ r["up_weight"].t() + r["up_bias"])
    ref_p = torch.nn.functional.gelu(r["x"] @ r["gate_weight"].t() + r["gate_bias"], approximate="tanh")
    assert tg._tma_compatible(x, wg, wu)
    ran = 0
    for gated, table in ((True, tg._GATED_CONFIGS), (False, tg._PLAIN_CONFIGS)):
        for cfgs in table.values():
            for cfg in [v for c in cfgs for v in kernel_variants(c, tma)]:
                if dtype == torch.float32:
                    cfg = cfg._replace(block_k=max(16, cfg.block_k // 2))
                try:
                    if gated:
                        out = tg.gated_linear(x, wg, wu, bg, bu, ids["silu"], config=cfg)
                    else:
                        out = tg.linear_act(x, wg, bg, ids["gelu_tanh"], config=cfg)
                    torch.cuda.synchronize()
                except OutOfResources:
                    continue
                check(out.cpu(), ref_g if gated else ref_p, _gpu_tol(dtype), f"{'gated' if gated else 'plain'} {cfg}")
                ran += 1
    assert ran > 0


@pytest.mark.gpu
def test_gpu_autotune_caches_a_config(fused_mlp, monkeypatch):
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # the Triton tuner's test: keep the gated GEMM on Triton
    tg = submodule(fused_mlp, "triton_gemm")
    t = make_gated(300, 256, 512, 128, torch.bfloat16, "cuda", False)
    out = run_gated(fused_mlp, t, "silu")
    check(out.cpu(), ref_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16], "autotuned")
    keys = [k for k in tg._TUNED if k[:4] == (True, 512, 512, 256)]
    assert keys, list(tg._TUNED)
    # another M of the same bucket reuses the config (no re-tuning), and is right
    t2 = make_gated(400, 256, 512, 128, torch.bfloat16, "cuda", False, seed=4)
    n = len(tg._TUNED)
    check(run_gated(fused_mlp, t2, "silu").cpu(), ref_gated(fused_mlp, t2, "silu"), TOL[torch.bfloat16], "same bucket")
    assert len(tg._TUNED) == n


@pytest.mark.gpu
def test_gpu_launch_plans(fused_mlp, monkeypatch):
    """A repeated shape reuses its launch plan, and every property the plan depends on
    (alignment of x, the TMA switch, the activation) gets a plan of its own: all right."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # plans are the Triton kernels' 
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    tg = submodule(fused_mlp, "triton_gemm")
    t = make_gated(200, 256, 512, 128, torch.bfloat16, "cuda", True)
    check(run_gated(fused_mlp, t, "silu").cpu(), ref_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16], "first")
    n = len(tg._PLANS)
    assert n >= 1
    for seed in (1, 2):  # same shape, new data: the plan is reused
        t2 = make_gated(200, 256, 512, 128, torch.bfloat16, "cuda", True, seed=seed)
        check(run_gated(fused_mlp, t2, "silu").cpu(), ref_gated(fused_mlp, t2, "silu"), TOL[torch.bfloat16], "reuse")
    assert len(tg._PLANS) == n
    # x at an offset of 2 bytes (not TMA-compatible): another plan, still right
    buf = torch.empty(200 * 256 + 1, dtype=torch.bfloat16, device="cuda")
    xs = buf[1:].view(200, 256)
    xs.copy_(t["x"])
    check(run_gated(fused_mlp, {**t, "x": xs}, "silu").cpu(), ref_gated(fused_mlp, t, "silu"),
          TOL[torch.bfloat16], "unaligned x")
    assert len(tg._PLANS) == n + 1
    monkeypatch.setenv("FUSED_MLP_TMA", "0")
    check(run_gated(fused_mlp, t, "gelu_tanh").cpu(), ref_gated(fused_mlp, t, "gelu_tanh"), TOL[torch.bfloat16],
          "TMA off, other activation")
    assert len(tg._PLANS) == n + 2


@pytest.mark.gpu
def test_gpu_tf32_follows_torch(gpu, monkeypatch):
    d, h, o = ODD
    t = make_gated(64, d, h, o, torch.float32, "cuda", False)
    ref = ref_gated(gpu, t, "silu")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    check(run_gated(gpu, t, "silu").cpu(), ref, TOL[torch.float32], "fp32 without TF32")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    check(run_gated(gpu, t, "silu").cpu(), ref, TOL_TF32, "fp32 with TF32")


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph(gpu):
    torch._dynamo.reset()
    t = make_gated(64, 256, 512, 256, torch.bfloat16, "cuda", True, lead=(2,))
    f = torch.compile(lambda x: run_gated(gpu, {**t, "x": x}, "silu"), fullgraph=True)
    check(f(t["x"]).cpu(), ref_gated(gpu, t, "silu"), TOL[torch.bfloat16], "compiled gated")
    p = make_plain(64, 256, 512, 256, torch.bfloat16, "cuda", True, "conv1d")
    g = torch.compile(lambda x: run_plain(gpu, {**p, "x": x}, "gelu_tanh", "conv1d"), fullgraph=True)
    check(g(p["x"]).cpu(), ref_plain(gpu, p, "gelu_tanh", "conv1d"), TOL[torch.bfloat16], "compiled mlp")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 777])
@pytest.mark.parametrize("dispatch", ["triton", "default"])
def test_gpu_cuda_graph(fused_mlp, monkeypatch, m, dispatch):
    """Capture and replay; "default" lets the dispatcher pick (decode.py for small M, if there)."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    if dispatch == "triton":
        monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    gpu = fused_mlp
    t = make_gated(m, 256, 512, 256, torch.bfloat16, "cuda", True)
    p = make_plain(m, 256, 512, 256, torch.bfloat16, "cuda", True, "linear")
    static_x, static_xp = t["x"].clone(), p["x"].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compile, tune) outside the capture
        run_gated(gpu, {**t, "x": static_x}, "silu")
        run_plain(gpu, {**p, "x": static_xp}, "gelu_tanh", "linear")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run_gated(gpu, {**t, "x": static_x}, "silu")
        yp = run_plain(gpu, {**p, "x": static_xp}, "gelu_tanh", "linear")
    for seed in (10, 11):
        t2 = make_gated(m, 256, 512, 256, torch.bfloat16, "cuda", True, seed=seed)
        p2 = make_plain(m, 256, 512, 256, torch.bfloat16, "cuda", True, "linear", seed=seed)
        static_x.copy_(t2["x"])
        static_xp.copy_(p2["x"])
        graph.replay()
        torch.cuda.synchronize()
        check(y.cpu(), ref_gated(gpu, {**t, "x": t2["x"]}, "silu"), TOL[torch.bfloat16], "graph gated")
        check(yp.cpu(), ref_plain(gpu, {**p, "x": p2["x"]}, "gelu_tanh", "linear"), TOL[torch.bfloat16], "graph mlp")


@pytest.mark.gpu
def test_gpu_dispatch_choice(fused_mlp):
    d = fused_mlp.dispatch
    cap = torch.cuda.get_device_capability()
    x = torch.zeros(4096, 64, device="cuda", dtype=torch.bfloat16)
    expected = "triton" if cap >= (8, 0) else "reference"
    assert d.explain(x, "gated") == expected
    assert d.explain(x, "mlp", "conv1d") == expected
    assert d.explain(x.float(), "gated") == expected
    assert d.explain(x.double(), "gated") == "reference"
    small = x[:1]
    decode_m = d._decode_max_m(small.device, cap) if cap >= (8, 0) else 0
    want_small = "decode" if decode_m >= 1 else expected
    assert d.explain(small, "gated") == want_small
    assert d.explain(small, "mlp", "conv1d") == expected  # decode.py takes the linear layout only
    assert d.explain(small.float(), "gated") == expected  # decode.py takes 16-bit inputs only
    gated_m, plain_m = (d._decode_max_m(small.device, cap, k) if cap >= (8, 0) else 0 for k in ("gated", "mlp"))
    if gated_m > plain_m:  # a card with its own entry (DECODE_MAX_M_BY_CARD): gated MLPs only
        assert d.explain(x[:gated_m], "gated") == "decode"
        assert d.explain(x[:gated_m], "mlp") == expected
        assert d.explain(x[:gated_m + 1], "gated") == expected


# ----------------------------------------------------------------------------- linear_act


def make_linear(m, d, n, dtype, device, bias, layout, seed=0, lead=()):
    """x [*lead, m, d], weight [n, d] ("linear") or [d, n] ("conv1d"), bias [n] or None."""
    g = torch.Generator().manual_seed(seed)
    w = _rand(n, d, dtype=dtype, device=device, scale=d**-0.5, gen=g)
    if layout == "conv1d":
        w = w.t().contiguous()
    return dict(
        x=_rand(*lead, m, d, dtype=dtype, device=device, gen=g),
        weight=w,
        bias=_rand(n, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None,
    )


def ref_linear_act(fm, t, act, layout):
    r = _f64(t)
    return fm.reference.linear_act(r["x"], r["weight"], r["bias"], act, layout)


def run_linear_act(fm, t, act, layout):
    return fm.linear_act(t["x"], t["weight"], t["bias"], act, layout)


@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_cpu_linear_act(fused_mlp, layout, bias, act, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    t = make_linear(5, 16, 24, torch.float32, "cpu", bias, layout, lead=(2,))
    out = run_linear_act(fused_mlp, t, act, layout)
    assert out.shape == (2, 5, 24)
    check(out, ref_linear_act(fused_mlp, t, act, layout), TOL[torch.float32], f"linear_act {act} {layout}")
    if act == "gelu":  # the default activation
        check(fused_mlp.linear_act(t["x"], t["weight"], t["bias"], weight_layout=layout),
              ref_linear_act(fused_mlp, t, "gelu", layout), TOL[torch.float32], "linear_act default")


def test_cpu_linear_act_compile_fullgraph(fused_mlp):
    torch._dynamo.reset()
    t = make_linear(5, 16, 24, torch.float32, "cpu", True, "conv1d", lead=(2,))
    f = torch.compile(lambda x: run_linear_act(fused_mlp, {**t, "x": x}, "gelu_tanh", "conv1d"), fullgraph=True)
    check(f(t["x"]), ref_linear_act(fused_mlp, t, "gelu_tanh", "conv1d"), TOL[torch.float32], "compiled linear_act")


@pytest.mark.parametrize("act", ACTS)
def test_linear_act_gradcheck_float64(fused_mlp, act):
    for layout in ("linear", "conv1d"):
        for bias in (True, False):
            t = make_linear(3, 4, 5, torch.float64, "cpu", bias, layout, seed=3, lead=(2,))
            if bias:
                args = [t[k].requires_grad_() for k in ("x", "weight", "bias")]
                assert torch.autograd.gradcheck(lambda *a: fused_mlp.linear_act(*a, act, layout), args)
            else:
                args = [t[k].requires_grad_() for k in ("x", "weight")]
                assert torch.autograd.gradcheck(lambda *a: fused_mlp.linear_act(*a, None, act, layout), args)


def test_linear_act_errors_name_the_argument(fused_mlp):
    fm = fused_mlp
    t = make_linear(3, 16, 24, torch.float32, "cpu", True, "linear")
    x, w, b = t["x"], t["weight"], t["bias"]
    with pytest.raises(ValueError, match="weight_layout"):
        fm.linear_act(x, w, b, "gelu", "transposed")
    with pytest.raises(ValueError, match="activation"):
        fm.linear_act(x, w, b, "tanhh")
    with pytest.raises(ValueError, match="x has dtype"):
        fm.linear_act(x.int(), w, b)
    with pytest.raises(TypeError, match="x must be"):
        fm.linear_act(x.tolist(), w, b)
    with pytest.raises(ValueError, match="weight must be a 2-D"):
        fm.linear_act(x, w[0], b)
    with pytest.raises(ValueError, match=r"x.shape\[-1\]"):
        fm.linear_act(x[:, :15], w, b)
    with pytest.raises(ValueError, match=r"x.shape\[-1\]"):
        fm.linear_act(x, w, b, "gelu", "conv1d")  # [24, 16] read as [in, out]
    with pytest.raises(ValueError, match="weight.*dtype"):
        fm.linear_act(x, w.half(), b)
    with pytest.raises(ValueError, match="weight.*device"):
        fm.linear_act(x, w.to("meta"), b)
    with pytest.raises(ValueError, match="bias.*shape"):
        fm.linear_act(x, w, b[:5])
    with pytest.raises(ValueError, match="bias.*dtype"):
        fm.linear_act(x, w, b.double())


@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("act", ACTS)
def test_interpret_linear_act(interpret, layout, act):
    """The Triton GEMM + bias + activation epilogue, interpreted (fp32; fp16 for one activation)."""
    bias = act != "relu"  # one activation without a bias
    for dtype in ([torch.float32, torch.float16] if act == "gelu" else [torch.float32]):
        t = make_linear(3, 40, 72, dtype, "cpu", bias, layout, seed=5)
        assert interpret.dispatch.choose(t["x"], "mlp", (t["weight"],), 72, layout).path == "triton-interpret"
        check(run_linear_act(interpret, t, act, layout), ref_linear_act(interpret, t, act, layout), TOL[dtype],
              f"linear_act {act} {layout} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 777])
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("decode", [False, True])
def test_gpu_linear_act_bf16(fused_mlp, monkeypatch, m, layout, decode):
    """bf16 linear_act on the Triton path (and, decode=True, wherever dispatch sends small M)."""
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    if not decode:
        monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    d, h, _ = ODD
    for act in ("gelu", "gelu_tanh", "relu"):
        t = make_linear(m, d, h, torch.bfloat16, "cuda", True, layout, seed=m)
        check(run_linear_act(fused_mlp, t, act, layout).cpu(), ref_linear_act(fused_mlp, t, act, layout),
              TOL[torch.bfloat16], f"linear_act bf16 {act} {layout} M={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cublaslt", ["1", "0"])
def test_gpu_cublaslt_candidate(gpu, monkeypatch, dtype, cublaslt):
    """The plain forward's first GEMM with a bias and gelu_tanh / relu runs as cuBLASLt's
    epilogue (torch._addmm_activation) when FUSED_MLP_CUBLASLT allows it (the untimed
    default), as our kernel otherwise; other activations and bias-free calls never take
    it; both are right against float64 (mlp and linear_act, both layouts, awkward M)."""
    monkeypatch.setenv("FUSED_MLP_CUBLASLT", cublaslt)
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # the choice between cuBLASLt and Triton
    calls = []
    real = torch._addmm_activation

    def counting(*args, **kwargs):
        calls.append(kwargs.get("use_gelu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_addmm_activation", counting)
    d, h, o = ODD
    tol = _gpu_tol(dtype)
    # M = 1 and a strided bias: operands cuBLASLt may refuse, where PyTorch falls back to
    # addmm + its own activation (which must be the same tanh GELU: fp32's bound tells)
    p = make_plain(1, d, h, o, dtype, "cuda", True, "linear", seed=1)
    p["fc_bias"] = _strided(p["fc_bias"])
    calls.clear()
    check(run_plain(gpu, p, "gelu_tanh", "linear").cpu(), ref_plain(gpu, p, "gelu_tanh", "linear"), tol,
          f"mlp M=1, strided bias, {dtype}")
    assert calls == ([True] if cublaslt == "1" else []), calls
    for m in (3, 777):
        for layout in ("linear", "conv1d"):
            for act, bias in (("gelu_tanh", True), ("relu", True), ("gelu", True), ("gelu_tanh", False)):
                calls.clear()
                p = make_plain(m, d, h, o, dtype, "cuda", bias, layout, seed=m)
                check(run_plain(gpu, p, act, layout).cpu(), ref_plain(gpu, p, act, layout), tol,
                      f"mlp {act} bias={bias} {layout} M={m} {dtype}")
                t = make_linear(m, d, h, dtype, "cuda", bias, layout, seed=m + 1)
                check(run_linear_act(gpu, t, act, layout).cpu(), ref_linear_act(gpu, t, act, layout), tol,
                      f"linear_act {act} bias={bias} {layout} M={m} {dtype}")
                eligible = cublaslt == "1" and bias and act in ("gelu_tanh", "relu")
                assert calls == ([act == "gelu_tanh"] * 2 if eligible else []), (act, bias, layout, calls)


@pytest.mark.gpu
@pytest.mark.parametrize("m,decode", [(1, False), (1, True), (777, False)])  # (777 is past decode.py's M)
def test_gpu_strided_biases(fused_mlp, monkeypatch, m, decode):
    """Strided bias views on every CUDA path (Triton; decode.py for small M): right values."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setenv("FUSED_MLP_CUBLASLT", "0")
    if not decode:
        monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    d, h, o = ODD
    t = _with_strided_biases(make_gated(m, d, h, o, torch.bfloat16, "cuda", True, seed=m))
    check(run_gated(fused_mlp, t, "silu").cpu(), ref_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16], "gated")
    p = _with_strided_biases(make_plain(m, d, h, o, torch.bfloat16, "cuda", True, "linear", seed=m))
    check(run_plain(fused_mlp, p, "gelu_tanh", "linear").cpu(), ref_plain(fused_mlp, p, "gelu_tanh", "linear"),
          TOL[torch.bfloat16], "mlp")


@pytest.mark.gpu
def test_gpu_cublaslt_choice_is_timed_and_cached(gpu, monkeypatch):
    """With autotuning on, cuBLASLt and our kernel are timed once per shape bucket; the
    choice is cached and the result is right whichever won."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    monkeypatch.setenv("FUSED_MLP_CUBLASLT", "1")
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # the choice between cuBLASLt and Triton
    tg = submodule(gpu, "triton_gemm")
    d, h, o = ODD
    p = make_plain(500, d, h, o, torch.bfloat16, "cuda", True, "linear", seed=7)
    check(run_plain(gpu, p, "relu", "linear").cpu(), ref_plain(gpu, p, "relu", "linear"), TOL[torch.bfloat16], "timed")
    keys = [k for k in tg._CUBLASLT_CHOICE if k[:3] == (512, h, d)]
    assert len(keys) == 1, list(tg._CUBLASLT_CHOICE)
    n = len(tg._CUBLASLT_CHOICE)
    p2 = make_plain(400, d, h, o, torch.bfloat16, "cuda", True, "linear", seed=8)  # same bucket
    check(run_plain(gpu, p2, "relu", "linear").cpu(), ref_plain(gpu, p2, "relu", "linear"), TOL[torch.bfloat16],
          "same bucket")
    assert len(tg._CUBLASLT_CHOICE) == n


def test_dispatch_counts_the_span_of_strided_views(fused_mlp):
    """The Triton kernels index in 32 bits: a strided view whose elements are few but lie far
    apart (rows of a wider buffer) must take the reference path, like a large tensor."""
    dispatch = fused_mlp.dispatch
    w = torch.empty(16, 8, device="meta")
    near = torch.empty(0, device="meta").as_strided((4, 8), (8, 1))
    far = torch.empty(0, device="meta").as_strided((4, 8), (2**30, 1))  # 32 elements, span 3 * 2**30 + 8
    assert dispatch._span(near) == 32 and dispatch._span(far) == 3 * 2**30 + 8
    assert not dispatch._too_large(near, w)
    assert dispatch._too_large(far, w)
    choice = dispatch.choose(far, "gated", (w, w, w.t()), 16)
    assert choice.path == "reference" and "32-bit" in choice.reason


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "quick_gelu"])
def test_gpu_fast_tanh(gpu, monkeypatch, dtype, act):
    """The default tanh.approx forms against FUSED_MLP_FAST_TANH=0: the sigmoid-based
    activations through one tanh.approx.f32. The forward must really change (a different kernel ran) and stay as
    close to float64 as the default forms, within a 16-bit output's rounding."""
    monkeypatch.setenv("FUSED_MLP_CUBLASLT", "0")  # the plain MLP's gelu_tanh on our kernel
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # the gated GEMM on the Triton kernel
    d, h, o = ODD
    t = make_gated(777, d, h, o, dtype, "cuda", True, seed=5)
    p = make_plain(777, d, h, o, dtype, "cuda", True, "linear", seed=6)
    ref_g, ref_p = ref_gated(gpu, t, act), ref_plain(gpu, p, act, "linear")
    for env in ("0", "1"):
        monkeypatch.setenv("FUSED_MLP_FAST_TANH", env)
        out_g, out_p = run_gated(gpu, t, act).cpu(), run_plain(gpu, p, act, "linear").cpu()
        if env == "0":
            base_g, base_p = out_g, out_p
            continue
        assert not torch.equal(out_g, base_g) and not torch.equal(out_p, base_p), "the fast form did not run"
        for out, base, ref, what in ((out_g, base_g, ref_g, "gated"), (out_p, base_p, ref_p, "mlp")):
            check(out, ref, TOL[dtype], f"{what} {act} fast")
            assert rel_err(out, ref) <= 1.5 * rel_err(base, ref) + 1e-4, f"{what} {act}: fast form less accurate"


# ----------------------------------------------------------------------------- sm_90a gate/up kernel


SM90_SHAPES = [(1, 64, 8), (3, 200, 136), (777, 520, 1000), (300, 1000, 264)]  # (M, K, N)


def _sm90_gate_up_inputs(m, k, n, dtype, bias, gen):
    """x [m, k], gate / up weights [n, k] and, with `bias`, their biases [n], on the GPU."""
    x = _rand(m, k, dtype=dtype, device="cuda", gen=gen)
    wg, wu = (_rand(n, k, dtype=dtype, device="cuda", scale=k**-0.5, gen=gen) for _ in range(2))
    bg, bu = ((_rand(n, dtype=dtype, device="cuda", scale=0.5, gen=gen) for _ in range(2)) if bias
              else (None, None))
    return x, wg, wu, bg, bu


def _gate_up_float64(x, wg, wu, bg, bu):
    """g and u, x W^T + b of the gate and up weights, in float64."""
    g = x.double() @ wg.double().t() + (0 if bg is None else bg.double())
    u = x.double() @ wu.double().t() + (0 if bu is None else bu.double())
    return g, u


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"])
def test_gpu_sm90_gate_up(fused_mlp, dtype, act):
    """The op against float64 on fresh inputs: awkward shapes (M = 1, sizes that are not
    tile multiples), with and without biases and the training store of g | u, both tile
    widths (block_n 112 and 128; 0 lets the op choose), outputs poisoned first."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS
    fn = fused_mlp.activations.torch_activation(act)
    for i, (m, k, n) in enumerate(SM90_SHAPES):
        for bias, train, block_n in ((False, False, 0), (True, False, 112), (True, False, 128),
                                     (False, True, 128), (True, True, 112)):
            gen = torch.Generator().manual_seed(100 * i + 2 * bias + train)
            x, wg, wu, bg, bu = _sm90_gate_up_inputs(m, k, n, dtype, bias, gen)
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            pre = torch.full((m, 2 * n), float("nan"), dtype=dtype, device="cuda") if train else None
            fused_mlp.ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, pre, ids[act], block_n)
            g, u = _gate_up_float64(x, wg, wu, bg, bu)
            what = f"M={m} K={k} N={n} {act} bias={bias} train={train} block_n={block_n}"
            check(out.cpu(), (fn(g) * u).cpu(), TOL[dtype], what)
            if train:
                check(pre.cpu(), torch.cat([g, u], 1).cpu(), TOL[dtype], what + " g | u")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sm90_fit_x(fused_mlp, monkeypatch, dtype):
    """The fitted box (the default; FUSED_MLP_SM90_FIT_X=0 gives back the 128-row box) cuts x's
    TMA box to M rows rounded up to 8 where M < 128: the stage's other rows keep what earlier
    launches left in shared memory (each run here follows one on rows of 1e4, so that those rows
    are likely not zeros; outputs NaN-poisoned), and only the stored rows count. The stored rows
    are the bits of the 128-row box, with the switch unset and at 1, inference and training
    (g | u), with and without biases, right against float64; M 128 and above are unchanged. The
    launch plan (gated_gemm_sm90_plan's last entry) shows which box each setting takes."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS
    k, n = 200, 1000
    big = torch.full((128, k), 1e4, dtype=dtype, device="cuda")
    for i, m in enumerate((1, 3, 8, 17, 64, 100, 127, 128, 130)):
        bias, train = i % 2 == 1, i % 3 == 2
        x, wg, wu, bg, bu = _sm90_gate_up_inputs(m, k, n, dtype, bias, torch.Generator().manual_seed(70 + i))
        fitted = min(-(-m // 8) * 8, 128)  # M rounded up to 8, at most one row block

        def run(fit):
            if fit is None:
                monkeypatch.delenv("FUSED_MLP_SM90_FIT_X", raising=False)
            else:
                monkeypatch.setenv("FUSED_MLP_SM90_FIT_X", fit)
            junk = torch.empty((128, n), dtype=dtype, device="cuda")  # leaves 1e4 rows in the stages
            fused_mlp.ops.gated_gemm_sm90(junk, big, wg, wu, None, None, None, ids["silu"], 0)
            out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            pre = torch.full((m, 2 * n), float("nan"), dtype=dtype, device="cuda") if train else None
            fused_mlp.ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, pre, ids["silu"], 0)
            return out, pre

        out, pre = run(None)
        what = f"M={m} bias={bias} train={train} {dtype}"
        assert fused_mlp.ops.gated_gemm_sm90_plan(m, n, 0, train)[5] == fitted, what
        for fit in ("1", "0"):
            out_f, pre_f = run(fit)
            box = fused_mlp.ops.gated_gemm_sm90_plan(m, n, 0, train)[5]
            assert box == (128 if fit == "0" else fitted), f"{what} FUSED_MLP_SM90_FIT_X={fit}"
            assert torch.equal(out, out_f), f"{what} FUSED_MLP_SM90_FIT_X={fit}"
            if train:
                assert torch.equal(pre, pre_f), f"{what} FUSED_MLP_SM90_FIT_X={fit}"
        g, u = _gate_up_float64(x, wg, wu, bg, bu)
        check(out.cpu(), (torch.nn.functional.silu(g) * u).cpu(), TOL[dtype], what)


@pytest.mark.gpu
def test_gpu_sm90_group_m(fused_mlp, monkeypatch):
    """FUSED_MLP_SM90_GROUP_M (row blocks that walk the columns together) changes the order of
    the tiles, not what they compute: every setting, including groups that do not divide the 17
    row blocks and a nonsense value (the default then), gives the default's bits, and the default
    is right against float64."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS
    m, k, n = 2100, 256, 1000  # 17 row blocks, partial column tiles
    gen = torch.Generator().manual_seed(31)
    x = _rand(m, k, dtype=torch.bfloat16, device="cuda", gen=gen)
    wg, wu = (_rand(n, k, dtype=torch.bfloat16, device="cuda", scale=k**-0.5, gen=gen) for _ in range(2))

    def run():
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        pre = torch.full((m, 2 * n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fused_mlp.ops.gated_gemm_sm90(out, x, wg, wu, None, None, pre, ids["silu"], 0)
        return out, pre

    monkeypatch.delenv("FUSED_MLP_SM90_GROUP_M", raising=False)
    out, pre = run()
    g, u = x.double() @ wg.double().t(), x.double() @ wu.double().t()
    check(out.cpu(), (fused_mlp.activations.torch_activation("silu")(g) * u).cpu(), TOL[torch.bfloat16], "default")
    for setting in ("1", "5", "8", "16", "64", "-3"):
        monkeypatch.setenv("FUSED_MLP_SM90_GROUP_M", setting)
        o, p = run()
        assert torch.equal(o, out) and torch.equal(p, pre), f"FUSED_MLP_SM90_GROUP_M={setting}"


def narrow_tail_rows(sms: int, col_tiles: int, split: int) -> int:
    """Row blocks for which the gated forward's host rule (narrow_tail_split, gated_gemm_sm90.cu)
    cuts the last round into `split` slices: at least 4 full rounds of `sms` tiles, and the last
    round's tiles at most sms / 4 (split 4) or more than that and at most sms / 2 (split 2)."""
    rb = -(-4 * sms // col_tiles)
    while True:
        rest = (rb * col_tiles) % sms
        if rb * col_tiles >= 4 * sms and rest and (rest * 4 <= sms if split == 4 else sms < rest * 4 <= 2 * sms):
            return rb
        rb += 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sm90_narrow_tail(fused_mlp, monkeypatch, dtype):
    """The narrow tail (FUSED_MLP_SM90_NARROW_TAIL, on unless 0): where the gated forward's
    persistent loop has at least 4 full rounds of 128-column tiles and a partial last round,
    each tile of that round is cut into 4 (or 2) column slices, one per CTA. N = 1000 gives 8
    column tiles, the last one partial (so is the last slice of it); the row counts come from the
    host's rule for this GPU's SM count, with a partial last row block (on the H200: 67 row
    blocks, 536 tiles = 4 x 132 + 8, 4 slices; 71, 568 = 4 x 132 + 40, 2 slices). Each slice sums
    the same K steps per column as the whole tile, so the default gives the bits of the loop
    without the tail, inference and training (g | u), with and without biases, and is right
    against float64, outputs poisoned first. Since the bits cannot tell, the launch plan
    (gated_gemm_sm90_plan, the host's own choice) shows that the tail is taken by default at
    these shapes and not with FUSED_MLP_SM90_NARROW_TAIL=0."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    k, n = 200, 1000
    for split, act, bias in ((4, "silu", False), (2, "gelu_tanh", True)):
        m = narrow_tail_rows(sms, -(-n // 128), split) * 128 - 50
        tiles = -(-m // 128) * -(-n // 128)
        monkeypatch.delenv("FUSED_MLP_SM90_NARROW_TAIL", raising=False)
        assert list(fused_mlp.ops.gated_gemm_sm90_plan(m, n, 128)) == [128, tiles, split, tiles // sms * sms, 0, 128], m
        monkeypatch.setenv("FUSED_MLP_SM90_NARROW_TAIL", "0")
        assert list(fused_mlp.ops.gated_gemm_sm90_plan(m, n, 128, True))[2] == 1, m
        x, wg, wu, bg, bu = _sm90_gate_up_inputs(m, k, n, dtype, bias, torch.Generator().manual_seed(50 + split))
        g, u = _gate_up_float64(x, wg, wu, bg, bu)
        ref = (fused_mlp.activations.torch_activation(act)(g) * u).cpu()
        for train in (False, True):
            got = {}
            for setting in ("0", None):
                if setting is None:
                    monkeypatch.delenv("FUSED_MLP_SM90_NARROW_TAIL", raising=False)
                else:
                    monkeypatch.setenv("FUSED_MLP_SM90_NARROW_TAIL", setting)
                out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                pre = torch.full((m, 2 * n), float("nan"), dtype=dtype, device="cuda") if train else None
                # 128-column tiles named, not left to pick_block_n: at the split-2 shape it takes
                # 112-column tiles (5 rounds of 112 columns cost less than 4 + a half of 128), and
                # the tail exists for 128-column tiles only, so both settings would run one path.
                fused_mlp.ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, pre, ids[act], 128)
                got[setting] = (out, pre)
            what = f"M={m} split={split} {act} bias={bias} train={train}"
            assert torch.equal(got[None][0], got["0"][0]), what
            if train:
                assert torch.equal(got[None][1], got["0"][1]), what + " g | u"
                check(got[None][1].cpu(), torch.cat([g, u], 1).cpu(), TOL[dtype], what + " g | u")
            check(got[None][0].cpu(), ref, TOL[dtype], what)


@pytest.mark.gpu
def test_gpu_sm90_plan(fused_mlp, monkeypatch):
    """The gated forward's launch plan (gated_gemm_sm90_plan: block_n, tiles, tail_split,
    tail_first, h_only, x's box rows) at the issue's SwiGLU shapes, as the notes describe it for a GPU with
    132 SMs (the H200): M 128 and 512 on 112-column tiles and the h-only kind for inference, not
    for training; M 4096 on 128-column tiles with its last round (20 tiles) in 4 slices; M 16384
    without a tail (80 tiles left over: more than half the SMs). Bad arguments are errors
    naming them."""
    need_sm90(fused_mlp)
    for name in ("FUSED_MLP_SM90_NARROW_TAIL", "FUSED_MLP_SM90_H_ONLY", "FUSED_MLP_SM90_FIT_X"):
        monkeypatch.delenv(name, raising=False)
    plan = fused_mlp.ops.gated_gemm_sm90_plan
    if torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count == 132:
        assert list(plan(128, 14336)) == [112, 128, 1, 0, 1, 128]
        assert list(plan(128, 14336, 0, True)) == [112, 128, 1, 0, 0, 128]
        assert list(plan(512, 14336)) == [112, 512, 1, 0, 1, 128]
        assert list(plan(4096, 14336)) == [128, 3584, 4, 3564, 0, 128]
        assert list(plan(16384, 14336)) == [128, 14336, 1, 0, 0, 128]
    monkeypatch.setenv("FUSED_MLP_SM90_H_ONLY", "0")
    assert list(plan(128, 14336))[4] == 0
    assert list(plan(1, 8, 128)) == [128, 1, 1, 0, 0, 8]
    with pytest.raises(RuntimeError, match="gated_gemm_sm90_plan takes block_n 0"):
        plan(128, 14336, 96)
    x = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(128, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="gated_gemm_sm90 takes block_n 0"):
        fused_mlp.ops.gated_gemm_sm90(out, x, w, w, None, None, None, 0, 96)
    with pytest.raises(RuntimeError, match="M and N"):
        plan(-1, 14336)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sm90_h_only(fused_mlp, monkeypatch, dtype):
    """Inference with at most 4 row blocks takes the h-only kind (the MMA groups stage h, 4 ring
    stages; the kernel name's Epi argument tells, as the results are the same bits), while
    training, 5 row blocks and FUSED_MLP_SM90_H_ONLY=0 take the kind that stages g and u.
    The h-only kind gives the other kind's bits (g and u are rounded before the activation
    either way) and is right against float64 with and without biases, at both tile widths and
    at M = 1, odd sizes and M = 512; training (pre given) is unaffected."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS

    def kind(m, setting, train):
        if setting is None:
            monkeypatch.delenv("FUSED_MLP_SM90_H_ONLY", raising=False)
        else:
            monkeypatch.setenv("FUSED_MLP_SM90_H_ONLY", setting)
        x, w = torch.randn(m, 64, device="cuda", dtype=dtype), torch.randn(64, 64, device="cuda", dtype=dtype)
        out = torch.empty(m, 64, device="cuda", dtype=dtype)
        pre = torch.empty(m, 128, device="cuda", dtype=dtype) if train else None
        epi = sm90_template_args(lambda: fused_mlp.ops.gated_gemm_sm90(out, x, w, w, None, None, pre, ids["silu"], 0))[3]
        return int(epi.rsplit(")", 1)[-1])  # "(fused_mlp::sm90::Epi)4" -> 4 (kGatedFwdH), 0 (kGatedFwd)

    assert [kind(512, None, False), kind(1, "1", False), kind(513, None, False), kind(512, None, True),
            kind(512, "0", False)] == [4, 4, 0, 0, 0]
    for i, (m, k, n) in enumerate([(1, 64, 8), (3, 200, 136), (300, 1000, 264), (512, 256, 1000)]):
        for act, bias, block_n in (("silu", False, 0), ("gelu_tanh", True, 112), ("relu2", True, 128)):
            x, wg, wu, bg, bu = _sm90_gate_up_inputs(m, k, n, dtype, bias, torch.Generator().manual_seed(40 + i))
            outs = {}
            for setting in ("0", "1"):
                monkeypatch.setenv("FUSED_MLP_SM90_H_ONLY", setting)
                out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                fused_mlp.ops.gated_gemm_sm90(out, x, wg, wu, bg, bu, None, ids[act], block_n)
                outs[setting] = out
                pre = torch.full((m, 2 * n), float("nan"), dtype=dtype, device="cuda")
                trained = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                fused_mlp.ops.gated_gemm_sm90(trained, x, wg, wu, bg, bu, pre, ids[act], block_n)
                assert torch.equal(trained, outs["0"]), f"training output, FUSED_MLP_SM90_H_ONLY={setting}"
            what = f"M={m} K={k} N={n} {act} bias={bias} block_n={block_n}"
            assert torch.equal(outs["1"], outs["0"]), what
            g, u = _gate_up_float64(x, wg, wu, bg, bu)
            check(outs["1"].cpu(), (fused_mlp.activations.torch_activation(act)(g) * u).cpu(), TOL[dtype], what)


@pytest.mark.gpu
def test_gpu_sm90_is_dispatched_with_fallbacks(fused_mlp, monkeypatch):
    """On sm_90 the gated forward (inference and training) runs the sm_90a kernel; hidden
    sizes that are not multiples of 8, fp32, a misaligned x and FUSED_MLP_SM90=0 take the
    Triton kernel. Every one is right."""
    need_sm90(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    sm90 = submodule(fused_mlp, "sm90")
    calls = spy(monkeypatch, sm90, "gate_up", lambda a: a[1].shape)  # x's shape
    d, h, o = ODD
    t = make_gated(777, d, h, o, torch.bfloat16, "cuda", True, seed=21)
    check(run_gated(fused_mlp, t, "gelu_tanh").cpu(), ref_gated(fused_mlp, t, "gelu_tanh"), TOL[torch.bfloat16], "sm90")
    assert calls == [(777, d)]
    x = t["x"].detach().clone().requires_grad_(True)
    run_gated(fused_mlp, {**t, "x": x}, "gelu_tanh").sum().backward()  # the training forward stores g | u
    assert len(calls) == 2 and x.grad is not None and torch.isfinite(x.grad).all()

    buf = torch.empty(777 * d + 1, dtype=torch.bfloat16, device="cuda")
    misaligned = buf[1:].view(777, d)
    misaligned.copy_(t["x"])
    cases = {
        "hidden 340": make_gated(777, d, 340, o, torch.bfloat16, "cuda", True, seed=22),
        "fp32": make_gated(777, d, h, o, torch.float32, "cuda", True, seed=23),
        "misaligned x": {**t, "x": misaligned},
    }
    for what, tc in cases.items():
        calls.clear()
        check(run_gated(fused_mlp, tc, "silu").cpu(), ref_gated(fused_mlp, tc, "silu"), _gpu_tol(tc["x"].dtype), what)
        assert calls == [], what
    monkeypatch.setenv("FUSED_MLP_FAST_TANH", "0")  # exact silu: the Triton kernel has it
    check(run_gated(fused_mlp, t, "silu").cpu(), ref_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16], "exact")
    assert calls == []
    check(run_gated(fused_mlp, t, "relu").cpu(), ref_gated(fused_mlp, t, "relu"), TOL[torch.bfloat16], "relu")
    assert len(calls) == 1  # relu has no tanh form: still the sm_90a kernel
    calls.clear()
    monkeypatch.delenv("FUSED_MLP_FAST_TANH")
    monkeypatch.setenv("FUSED_MLP_SM90", "0")
    check(run_gated(fused_mlp, t, "silu").cpu(), ref_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16], "off")
    assert calls == []


@pytest.mark.gpu
def test_gpu_sm90_rejects_bad_input(fused_mlp):
    """The op's own checks name the argument (the dispatcher never sends these)."""
    need_sm90(fused_mlp)
    op = fused_mlp.ops.gated_gemm_sm90
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, w, out = torch.randn(64, 64, **bf), torch.randn(64, 64, **bf), torch.empty(64, 64, **bf)
    with pytest.raises(RuntimeError, match="dtype"):
        op(out.float(), x.float(), w.float(), w.float(), None, None, None, 1)
    with pytest.raises(RuntimeError, match="out must be"):
        op(torch.empty(64, 32, **bf), x, w, w, None, None, None, 1)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        op(torch.empty(64, 16, **bf)[:, :12], x, w[:12], w[:12], None, None, None, 1)
    with pytest.raises(RuntimeError, match="gate_bias"):
        op(out, x, w, w, torch.zeros(63, **bf), None, None, 1)
    with pytest.raises(RuntimeError, match="activation id"):
        op(out, x, w, w, None, None, None, 99)
    with pytest.raises(RuntimeError, match="x's rows"):
        op(out, torch.empty(64 * 64 + 1, **bf)[1:].view(64, 64), w, w, None, None, None, 1)
    linear = fused_mlp.ops.linear_act_sm90
    with pytest.raises(RuntimeError, match=r"weight must be \[N, K\]"):
        linear(out, x, torch.randn(64, 32, **bf), None, None, 1, False)
    with pytest.raises(RuntimeError, match=r"weight must be \[K, N\]"):
        linear(out, x, torch.randn(32, 64, **bf), None, None, 1, True)
    with pytest.raises(RuntimeError, match="out must be"):
        linear(torch.empty(64, 64, **bf), x, torch.randn(64, 72, **bf), None, None, 1, True)
    with pytest.raises(RuntimeError, match="pre must be"):
        op(out, x, w, w, None, None, torch.empty(64, 64, **bf), 1)
    with pytest.raises(RuntimeError, match="block_n"):
        op(out, x, w, w, None, None, None, 1, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"])
def test_gpu_sm90_linear_act(fused_mlp, dtype, act):
    """linear_act_sm90 (the plain MLP's first GEMM + bias + activation) against float64,
    with and without bias and the training store of x W^T + b, the weight in nn.Linear's
    layout [N, K] and in Conv1D's [K, N] (weight_kn, read N-major), outputs poisoned first."""
    need_sm90(fused_mlp)
    ids = fused_mlp.activations.ACTIVATION_IDS
    fn = fused_mlp.activations.torch_activation(act)
    for i, (m, k, n) in enumerate(SM90_SHAPES):
        for bias, train in ((False, False), (True, False), (True, True)):
            gen = torch.Generator().manual_seed(200 + 2 * i + bias)
            x = _rand(m, k, dtype=dtype, device="cuda", gen=gen)
            w = _rand(n, k, dtype=dtype, device="cuda", scale=k**-0.5, gen=gen)
            b = _rand(n, dtype=dtype, device="cuda", scale=0.5, gen=gen) if bias else None
            z = x.double() @ w.double().t() + (0 if b is None else b.double())
            for kn in (False, True):
                out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
                pre = torch.full((m, n), float("nan"), dtype=dtype, device="cuda") if train else None
                fused_mlp.ops.linear_act_sm90(out, x, w.t().contiguous() if kn else w, b, pre, ids[act], kn)
                what = f"M={m} K={k} N={n} {act} bias={bias} train={train} weight_kn={kn}"
                check(out.cpu(), fn(z).cpu(), TOL[dtype], what)
                if train:
                    check(pre.cpu(), z.cpu(), TOL[dtype], what + " pre")


@pytest.mark.gpu
def test_gpu_sm90_linear_act_is_dispatched(fused_mlp, monkeypatch):
    """On sm_90 the plain MLP's first GEMM (nn.Linear's layout or Conv1D's, each read as it
    is) runs linear_act_sm90, ahead of cuBLASLt, where it has a tile per SM; fewer tiles keep
    the other candidates. All right."""
    need_sm90(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    sm90 = submodule(fused_mlp, "sm90")
    calls = spy(monkeypatch, sm90, "linear_act", lambda a: a[1].shape)  # x's shape
    d, h, o = ODD
    for layout, sms, want in (("linear", None, 0), ("conv1d", None, 0), ("linear", 1, 1), ("conv1d", 1, 1)):
        calls.clear()
        if sms is not None:  # 7 x 2 tiles at M = 777: enough only for 1 SM
            monkeypatch.setattr(sm90, "_sm_count", lambda index: sms)
        p = make_plain(777, d, h, o, torch.bfloat16, "cuda", True, layout, seed=41)
        check(run_plain(fused_mlp, p, "gelu_tanh", layout).cpu(), ref_plain(fused_mlp, p, "gelu_tanh", layout),
              TOL[torch.bfloat16], layout)
        assert len(calls) == want, (layout, sms)


@pytest.mark.gpu
def test_gpu_sm90_ops_keep_current_device(fused_mlp):
    """An sm_90a op on tensors of another GPU leaves the caller's current device as it was (the
    ops make their device's context current for the TMA encode, inside c10's device guard)."""
    need_sm90(fused_mlp)
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    ids = fused_mlp.activations.ACTIVATION_IDS
    bf = dict(device="cuda:1", dtype=torch.bfloat16)
    x, w = torch.randn(128, 64, **bf), torch.randn(64, 64, **bf)
    out = torch.empty(128, 64, **bf)
    with torch.cuda.device(0):
        fused_mlp.ops.gated_gemm_sm90(out, x, w, w, None, None, None, ids["silu"])
        fused_mlp.ops.linear_act_sm90(out, x, w, None, None, ids["relu"])
        assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    check(out.cpu(), torch.relu(x.double() @ w.double().t()).cpu(), TOL[torch.bfloat16], "on cuda:1")


# ----------------------------------------------------------------------------- autocast
# Under torch.autocast the four public functions cast their floating-point operands
# (float64 excepted) to autocast's dtype, as F.linear does, and run in it: the same bits
# as the same call on operands cast by hand, the autocast dtype out, gradients through
# the casts to float32 leaves.

AUTOCAST_FNS = ("gated_mlp", "gated_mlp_packed", "mlp", "linear_act")


def _autocast_case(fm, name, device, seed=0, m=7):
    """(tensors, call, eager) for one public function on odd shapes: call(t) runs it,
    eager(t) writes the same MLP with F.linear (what autocast would run unfused)."""
    F = torch.nn.functional
    d, h, o = 24, 40, 16
    if name in ("gated_mlp", "gated_mlp_packed"):
        t = make_gated(m, d, h, o, torch.float32, device, True, seed=seed, lead=(2,))
        act = "silu" if name == "gated_mlp" else "gelu_tanh"
        run = run_gated if name == "gated_mlp" else run_packed
        fn = F.silu if act == "silu" else (lambda v: F.gelu(v, approximate="tanh"))
        return (t, lambda t: run(fm, t, act),
                lambda t: F.linear(fn(F.linear(t["x"], t["gate_weight"], t["gate_bias"]))
                                   * F.linear(t["x"], t["up_weight"], t["up_bias"]), t["down_weight"], t["down_bias"]))
    if name == "mlp":
        t = make_plain(m, d, h, o, torch.float32, device, True, "conv1d", seed=seed)
        return (t, lambda t: run_plain(fm, t, "gelu", "conv1d"),
                lambda t: F.linear(F.gelu(F.linear(t["x"], t["fc_weight"].t(), t["fc_bias"])), t["proj_weight"].t(),
                                   t["proj_bias"]))
    t = make_linear(m, d, h, torch.float32, device, True, "linear", seed=seed)
    return (t, lambda t: run_linear_act(fm, t, "relu2", "linear"),
            lambda t: torch.relu(F.linear(t["x"], t["weight"], t["bias"])).square())


def _cast(t, dtype):
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def _leaves(t, dtype=None):
    """t's tensors as new leaves requiring grad (cast to dtype first if given)."""
    return {k: ((v.to(dtype) if dtype else v).detach().requires_grad_() if isinstance(v, torch.Tensor) else v)
            for k, v in t.items()}


def _no_interpreter(monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", AUTOCAST_FNS)
def test_cpu_autocast_casts_operands(fused_mlp, monkeypatch, name, dtype):
    _no_interpreter(monkeypatch)
    t, call, eager = _autocast_case(fused_mlp, name, "cpu")
    with torch.autocast("cpu", dtype=dtype):
        out = call(t)
        eager_out = eager(t)
    want = call(_cast(t, dtype))  # outside autocast, operands cast by hand
    assert out.dtype == dtype == eager_out.dtype
    assert torch.equal(out, want), name
    check(out.float(), eager_out.float(), TOL[dtype], f"{name} against eager autocast")
    # Mixed float dtypes are cast alike (eager autocast runs them too): x in the other
    # 16-bit dtype, the weights in float32.
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    mixed = {**t, "x": t["x"].to(other)}
    with torch.autocast("cpu", dtype=dtype):
        assert torch.equal(call(mixed), call(_cast(mixed, dtype))), name
    # float64 is left alone, as autocast leaves it: x float64 against cast weights is named.
    with torch.autocast("cpu", dtype=dtype), pytest.raises(ValueError, match="dtype"):
        call({**t, "x": t["x"].double()})


def test_cpu_autocast_off_leaves_float32(fused_mlp, monkeypatch):
    """Outside autocast, and in a region that turns it off, float32 stays float32."""
    _no_interpreter(monkeypatch)
    t, call, _ = _autocast_case(fused_mlp, "gated_mlp", "cpu")
    with torch.autocast("cpu", enabled=False):
        assert call(t).dtype == torch.float32
    check(call(t), ref_gated(fused_mlp, t, "silu"), TOL[torch.float32], "float32")


@pytest.mark.parametrize("name", AUTOCAST_FNS)
def test_cpu_autocast_backward(fused_mlp, monkeypatch, name):
    """Gradients of float32 leaves under autocast are those of the bf16 call, cast back."""
    _no_interpreter(monkeypatch)
    t, call, _ = _autocast_case(fused_mlp, name, "cpu", seed=5)
    leaves = _leaves(t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = call(leaves)
    assert y.dtype == torch.bfloat16
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y.backward(dy)
    by_hand = _leaves(t, torch.bfloat16)
    call(by_hand).backward(dy)
    for k, v in leaves.items():
        if isinstance(v, torch.Tensor):
            assert v.grad is not None and v.grad.dtype == torch.float32, k
            assert torch.equal(v.grad, by_hand[k].grad.float()), k


def test_cpu_autocast_compile_fullgraph(fused_mlp, monkeypatch):
    """torch.compile(fullgraph=True) with autocast around the compiled call and inside it."""
    _no_interpreter(monkeypatch)
    torch._dynamo.reset()
    t, call, _ = _autocast_case(fused_mlp, "gated_mlp", "cpu")
    want = call(_cast(t, torch.bfloat16))
    f = torch.compile(lambda x: call({**t, "x": x}), fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(t["x"])
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)
    assert f(t["x"]).dtype == torch.float32  # autocast off again: recompiled, not the bf16 graph

    def inside(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return call({**t, "x": x})

    out = torch.compile(inside, fullgraph=True)(t["x"])
    assert out.dtype == torch.bfloat16 and torch.equal(out, want)


def test_interpret_autocast(interpret):
    """The Triton kernels (interpreted) under autocast float16: the hand-cast call's bits."""
    for name in AUTOCAST_FNS:
        t, call, _ = _autocast_case(interpret, name, "cpu", m=5)
        with torch.autocast("cpu", dtype=torch.float16):
            out = call(t)
        assert out.dtype == torch.float16 and torch.equal(out, call(_cast(t, torch.float16))), name


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [3, 777])
def test_gpu_autocast(fused_mlp, monkeypatch, dtype, m):
    """On the GPU's kernels (decode at M 3, the fused GEMMs at 777): autocast's dtype out,
    the hand-cast call's bits, within the dtype's bound of the float64 reference, and
    gradients of float32 leaves as those of the hand-cast call."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")  # one config: both calls run the same kernel
    for name in AUTOCAST_FNS:
        t, call, formula = _autocast_case(fused_mlp, name, "cuda", seed=7, m=m)
        with torch.autocast("cuda", dtype=dtype):
            out = call(t)
        cast = _cast(t, dtype)
        assert out.dtype == dtype and torch.equal(out, call(cast)), name
        exact = formula(_f64(cast))  # the same formula in float64 on the cast operands
        check(out.cpu(), exact, TOL[dtype], f"{name} {dtype} M {m}")
        leaves, by_hand = _leaves(t), _leaves(t, dtype)
        with torch.autocast("cuda", dtype=dtype):
            y = call(leaves)
        dy = torch.randn(y.shape, device="cuda").to(dtype)
        y.backward(dy)
        call(by_hand).backward(dy)
        for k, v in leaves.items():
            if isinstance(v, torch.Tensor):
                assert v.grad.dtype == torch.float32, (name, k)
                assert rel_err(v.grad, by_hand[k].grad.float()) <= TOL[dtype], (name, k)


# ----------------------------------------------------------------------------- torch.func
# Under a torch.func transform the four public functions run their plain-PyTorch reference:
# the kernels take raw pointers (a transform's wrapped tensors have none) and the training
# autograd Functions are not written for transforms. The results are then the transform of
# the eager formula.

def _transforms(call, t):
    """{transform name: result} of grad (over every tensor), vmap (over x's first dimension),
    jvp (along x) and per-sample gradients (vmap of grad) of call on the tensors t."""
    tensors = {k: v for k, v in t.items() if isinstance(v, torch.Tensor)}
    rest = {k: v for k, v in t.items() if k not in tensors}

    def f(ts):
        return call({**rest, **ts})

    def per_x(x):
        return f({**tensors, "x": x})

    x = tensors["x"]
    tangent = torch.linspace(-1, 1, x.numel(), device=x.device, dtype=x.dtype).reshape(x.shape)
    return {
        "grad": torch.func.grad(lambda ts: f(ts).square().sum())(tensors),
        "vmap": torch.func.vmap(per_x)(tensors["x"]),
        "jvp": torch.func.jvp(per_x, (tensors["x"],), (tangent,))[1],
        "vmap_grad": torch.func.vmap(
            torch.func.grad(lambda x, ts: f({**ts, "x": x}).square().sum(), argnums=1), in_dims=(0, None)
        )(tensors["x"], tensors),
    }


@pytest.mark.parametrize("name", AUTOCAST_FNS)
def test_cpu_func_transforms(fused_mlp, monkeypatch, name):
    """grad, vmap, jvp and vmap(grad) through each public function equal the same transforms
    of the eager formula (before, grad raised, and vmap / jvp of the gated functions raised
    in the CPU path's out= matmul); outside a transform the gated functions do not call the
    reference (on the CPU, mlp and linear_act run it as their own path; the gated ones too
    where the build has no CPU act_and_mul kernel, as a CUDA variant loaded without a GPU)."""
    _no_interpreter(monkeypatch)
    t, call, eager = _autocast_case(fused_mlp, name, "cpu", seed=11)
    got, want = _transforms(call, t), _transforms(eager, t)
    for kind in want:
        torch.testing.assert_close(got[kind], want[kind], rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} {kind}: {m}")
    has_cpu_op = submodule(fused_mlp, "act_and_mul").has_compiled_kernel
    if name.startswith("gated") and has_cpu_op("act_and_mul", torch.device("cpu")):
        monkeypatch.setattr(fused_mlp.reference, name, _refuse)
        call(t)  # no transform: the CPU path's act-and-mul op, not the reference


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("name", AUTOCAST_FNS)
def test_cpu_forward_ad(fused_mlp, monkeypatch, name, requires_grad):
    """Inside a torch.autograd.forward_ad dual level (x dual, with and without a gradient
    wanted): the output's tangent is the eager formula's. Before, the gated functions and
    every training call raised (no jvp), and a kernel path would have dropped the tangent."""
    import torch.autograd.forward_ad as fwad

    _no_interpreter(monkeypatch)
    t, call, eager = _autocast_case(fused_mlp, name, "cpu", seed=17)
    tangent = torch.randn(t["x"].shape, generator=torch.Generator().manual_seed(3))
    out = {}
    for which, fn in (("ours", call), ("eager", eager)):
        with fwad.dual_level():
            x = fwad.make_dual(t["x"].detach().requires_grad_(requires_grad), tangent)
            primal, tan = fwad.unpack_dual(fn({**t, "x": x}))
            out[which] = (primal.detach(), tan)
    assert out["ours"][1] is not None, name
    torch.testing.assert_close(out["ours"], out["eager"], rtol=1e-5, atol=1e-5)


def _refuse(*args, **kwargs):
    raise AssertionError("the reference ran outside a torch.func transform")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [3, 777])
def test_gpu_func_transforms(fused_mlp, dtype, m):
    """The same on CUDA tensors (outside transforms M 3 takes the decode kernels, M 777 the
    fused GEMMs), and forward AD's tangent, which those kernels would drop: the transforms
    run and agree with the eager formula's within the dtype's bound (norm-wise: the packed
    reference computes gate and up in one GEMM where the formula uses two, so single
    elements may differ by more in bf16)."""
    import torch.autograd.forward_ad as fwad

    for name in AUTOCAST_FNS:
        t, call, eager = _autocast_case(fused_mlp, name, "cuda", seed=13, m=m)
        t = _cast(t, dtype)
        got, want = _transforms(call, t), _transforms(eager, t)
        for kind in want:
            w = want[kind]
            pairs = [(got[kind][k], w[k]) for k in w] if isinstance(w, dict) else [(got[kind], w)]
            for a, b in pairs:
                assert a.dtype == b.dtype and rel_err(a, b) <= TOL[dtype], (name, kind)
        tangent = torch.randn(t["x"].shape, device="cuda", dtype=dtype)
        tangents = []
        for fn in (call, eager):
            with torch.no_grad(), fwad.dual_level():
                tangents.append(fwad.unpack_dual(fn({**t, "x": fwad.make_dual(t["x"], tangent)})).tangent)
        assert tangents[0] is not None and rel_err(tangents[0], tangents[1]) <= TOL[dtype], name
