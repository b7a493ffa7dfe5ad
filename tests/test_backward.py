"""Gradients of gated_mlp / gated_mlp_packed / mlp on every path, against float64 autograd.

CPU (always):
  - torch.autograd.gradcheck in float64 through the public functions (the reference
    path: plain-PyTorch gradients) for every activation, gated / packed / plain (linear and
    conv1d), with and without biases, recompute True / False
  - the fused backward's Triton kernels under Triton's interpreter (FUSED_MLP_INTERPRET=1),
    fp32 and fp16 on small odd shapes (bf16 dots are not trustworthy there), against float64
    autograd of reference.py: every activation, packed, conv1d, recompute in several chunks,
    both dx strategies, in place and not, partial requires_grad, the kernels one by one
  - torch.compile of a training step (reference path, and interpreted kernels)

GPU (@pytest.mark.gpu): the compiled kernels against float64 autograd over activations x
dtypes x M x layouts; every backward tile config; autotuning (the in-place kernel is tuned
on scratch); torch.compile; peak memory against eager.

Error bounds: relative Frobenius error of each gradient against float64 autograd on the
same (rounded) inputs. Eager PyTorch's own bf16 / fp16 autograd gets ~4e-3 / ~5e-4 on these
shapes (each gradient passes through up to three roundings: saved pre-activations, dg / du,
the GEMM output); the bounds leave ~5x margin: bf16 2e-2, fp16 3e-3. fp32 without TF32:
2e-5 (fp32 accumulation over K <= 4096); with TF32: 1e-2 (10-bit mantissa inputs).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import kernel_variants, need_interpreter, need_sm90, rel_err, sm90_template_args, spy

ACTS = ("identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu")
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2, torch.float64: 1e-12}
TOL_TF32 = 1e-2
GATED_NAMES = ("x", "gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias")
PLAIN_NAMES = ("x", "fc_weight", "fc_bias", "proj_weight", "proj_bias")


# ----------------------------------------------------------------------------- helpers


def _rand(*shape, dtype=torch.float32, device="cpu", scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(device=device, dtype=dtype)


def make_gated(m, d, h, o, dtype, device, bias, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    t = {
        "x": _rand(*lead, m, d, dtype=dtype, device=device, gen=g),
        "gate_weight": _rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g),
        "up_weight": _rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g),
        "down_weight": _rand(o, h, dtype=dtype, device=device, scale=h**-0.5, gen=g),
    }
    for name, n in (("gate_bias", h), ("up_bias", h), ("down_bias", o)):
        t[name] = _rand(n, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None
    t["dy"] = _rand(*lead, m, o, dtype=dtype, device=device, gen=g)
    return t


def make_plain(m, d, h, o, dtype, device, bias, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    fc = _rand(h, d, dtype=dtype, device=device, scale=d**-0.5, gen=g)
    proj = _rand(o, h, dtype=dtype, device=device, scale=h**-0.5, gen=g)
    if layout == "conv1d":
        fc, proj = fc.t().contiguous(), proj.t().contiguous()
    return {
        "x": _rand(m, d, dtype=dtype, device=device, gen=g),
        "fc_weight": fc,
        "fc_bias": _rand(h, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None,
        "proj_weight": proj,
        "proj_bias": _rand(o, dtype=dtype, device=device, scale=0.5, gen=g) if bias else None,
        "dy": _rand(m, o, dtype=dtype, device=device, gen=g),
    }


def _leaves(t, names, dtype=None, device=None, requires=None):
    """Fresh leaf copies of t[name] (None stays None), requiring grad (all, or those in `requires`)."""
    out = {}
    for n in names:
        v = t[n]
        if v is None:
            out[n] = None
            continue
        v = v.detach().to(dtype=dtype or v.dtype, device=device or v.device).clone()
        out[n] = v.requires_grad_(requires is None or n in requires)
    return out


def ref_grads_gated(fm, t, act):
    """float64 autograd of reference.gated_mlp: {name: grad}."""
    a = _leaves(t, GATED_NAMES, torch.float64, "cpu")
    y = fm.reference.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], act,
                               a["gate_bias"], a["up_bias"], a["down_bias"])
    y.backward(t["dy"].double().cpu())
    return {n: v.grad for n, v in a.items() if v is not None}


def ref_grads_plain(fm, t, act, layout):
    a = _leaves(t, PLAIN_NAMES, torch.float64, "cpu")
    y = fm.reference.mlp(a["x"], a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], act, layout)
    y.backward(t["dy"].double().cpu())
    return {n: v.grad for n, v in a.items() if v is not None}


def grads_gated(fm, t, act, recompute=False, requires=None):
    a = _leaves(t, GATED_NAMES, requires=requires)
    y = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], act, gate_bias=a["gate_bias"],
                     up_bias=a["up_bias"], down_bias=a["down_bias"], recompute=recompute)
    y.backward(t["dy"])
    return {n: v.grad for n, v in a.items() if v is not None}


def grads_packed(fm, t, act, recompute=False):
    """gated_mlp_packed on [Wg; Wu] (and [bg; bu]); the packed grads split back into halves."""
    h = t["gate_weight"].shape[0]
    x = t["x"].detach().clone().requires_grad_()
    w = torch.cat([t["gate_weight"], t["up_weight"]]).requires_grad_()
    wd = t["down_weight"].detach().clone().requires_grad_()
    b = None if t["gate_bias"] is None else torch.cat([t["gate_bias"], t["up_bias"]]).requires_grad_()
    bd = None if t["down_bias"] is None else t["down_bias"].detach().clone().requires_grad_()
    y = fm.gated_mlp_packed(x, w, wd, act, gate_up_bias=b, down_bias=bd, recompute=recompute)
    y.backward(t["dy"])
    out = {"x": x.grad, "gate_weight": w.grad[:h], "up_weight": w.grad[h:], "down_weight": wd.grad}
    if b is not None:
        out.update(gate_bias=b.grad[:h], up_bias=b.grad[h:], down_bias=bd.grad)
    return out


def grads_plain(fm, t, act, layout, recompute=False):
    a = _leaves(t, PLAIN_NAMES)
    y = fm.mlp(a["x"], a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], act, layout,
               recompute=recompute)
    y.backward(t["dy"])
    return {n: v.grad for n, v in a.items() if v is not None}


def check_grads(got, ref, tol, what):
    assert set(got) == set(ref), f"{what}: gradients of {sorted(got)} != {sorted(ref)}"
    for name in ref:
        g = got[name]
        assert g is not None, f"{what}: no gradient for {name}"
        assert g.shape == ref[name].shape, f"{what}: {name}.grad shape {tuple(g.shape)} != {tuple(ref[name].shape)}"
        err = rel_err(g.cpu(), ref[name])
        assert err <= tol, f"{what}: {name}.grad relative error {err:.3e} > {tol:.1e}"


def module(fm, name):
    return importlib.import_module(f"{fm.__name__}.{name}")


@pytest.fixture
def cpu_reference(fused_mlp, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return fused_mlp


@pytest.fixture
def interpret(fused_mlp, monkeypatch):
    """CPU tensors through the fused backward's Triton kernels under the interpreter."""
    need_interpreter(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_INTERPRET", "1")
    monkeypatch.delenv("FUSED_MLP_BWD_DX", raising=False)
    monkeypatch.delenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", raising=False)
    monkeypatch.delenv("FUSED_MLP_BACKWARD", raising=False)
    assert fused_mlp.dispatch.backward_choice(torch.zeros(2, 4), "gated").path == "triton-interpret"
    return fused_mlp


# ----------------------------------------------------------------------------- CPU: gradcheck (reference path)


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_gradcheck_float64(cpu_reference, act, bias, recompute):
    fm = cpu_reference
    t = make_gated(3, 4, 5, 3, torch.float64, "cpu", bias, seed=1, lead=(2,))
    a = _leaves(t, GATED_NAMES)
    names = [n for n in GATED_NAMES if a[n] is not None]

    def gated(*args):
        kw = dict(zip(names, args))
        return fm.gated_mlp(kw["x"], kw["gate_weight"], kw["up_weight"], kw["down_weight"], act,
                            gate_bias=kw.get("gate_bias"), up_bias=kw.get("up_bias"), down_bias=kw.get("down_bias"),
                            recompute=recompute)

    assert torch.autograd.gradcheck(gated, [a[n] for n in names])
    w = torch.cat([t["gate_weight"], t["up_weight"]]).requires_grad_()
    b = torch.cat([t["gate_bias"], t["up_bias"]]).requires_grad_() if bias else None
    packed_args = (a["x"], w, a["down_weight"]) + ((b,) if bias else ())
    assert torch.autograd.gradcheck(
        lambda x, w, wd, *b: fm.gated_mlp_packed(x, w, wd, act, gate_up_bias=b[0] if b else None, recompute=recompute),
        packed_args)
    for layout in ("linear", "conv1d"):
        p = _leaves(make_plain(3, 4, 5, 3, torch.float64, "cpu", bias, layout, seed=2), PLAIN_NAMES)
        if bias:
            args = [p[n] for n in PLAIN_NAMES]
            fn = lambda *z: fm.mlp(*z, act, layout, recompute=recompute)  # noqa: E731
        else:
            args = [p["x"], p["fc_weight"], p["proj_weight"]]
            fn = lambda x, w1, w2: fm.mlp(x, w1, None, w2, None, act, layout, recompute=recompute)  # noqa: E731
        assert torch.autograd.gradcheck(fn, args), f"mlp {layout}"


@pytest.mark.parametrize("act", ACTS)
def test_activation_backward_matches_derivative(fused_mlp, act):
    """activations.torch_activation_backward (the reference backward's grad * act'(x)): ATen's
    backward kernel where one exists, the formula when a graph is being built (double
    backward) and for the others. Both equal grad * torch_activation_derivative in float64; in
    bf16 the kernel form is the float64 value rounded once (ATen computes it in fp32), within
    half a bf16 ulp plus fp32's own error, where the formula would round every step."""
    acts = fused_mlp.activations
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4096, generator=gen, dtype=torch.float64) * 3
    x[:3] = torch.tensor([0.0, -0.0, 1e-30], dtype=torch.float64)  # relu' at 0 is 0, as in the kernels
    grad = torch.randn(4096, generator=gen, dtype=torch.float64)
    want = grad * acts.torch_activation_derivative(act)(x)
    assert torch.allclose(acts.torch_activation_backward(act, grad, x), want, rtol=1e-12, atol=1e-14)
    with torch.enable_grad():
        graphed = acts.torch_activation_backward(act, grad, x.clone().requires_grad_())
    assert torch.allclose(graphed.detach(), want, rtol=1e-12, atol=1e-14)
    if act in ("silu", "gelu_tanh", "gelu", "relu"):
        gb, xb = grad.bfloat16(), x.bfloat16()
        got = acts.torch_activation_backward(act, gb, xb).double()
        exact = gb.double() * acts.torch_activation_derivative(act)(xb.double())
        half_ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(1e-30))) - 8)
        # + 2^-17 |grad|: fp32's own error, which for x << 0 is the whole value (1 + tanh(.) and
        # 1 + erf(.) cancel: ATen's fp32 tanh-GELU backward gives 0 at x = -5.06 for 1.07e-6 |grad|).
        assert ((got - exact).abs() <= half_ulp + 2.0**-17 * gb.double().abs()).all(), act


@pytest.mark.parametrize("recompute", [False, True])
def test_gradgradcheck_float64(cpu_reference, recompute):
    """create_graph=True: the backward is differentiable (PyTorch ops on recomputed
    pre-activations), on every path."""
    fm = cpu_reference
    t = make_gated(3, 4, 5, 3, torch.float64, "cpu", True, seed=3)
    a = _leaves(t, GATED_NAMES)
    names = list(GATED_NAMES)
    assert torch.autograd.gradgradcheck(
        lambda *z: fm.gated_mlp(z[0], z[1], z[2], z[3], "gelu_tanh", gate_bias=z[4], up_bias=z[5], down_bias=z[6],
                                recompute=recompute), [a[n] for n in names])
    p = _leaves(make_plain(3, 4, 5, 3, torch.float64, "cpu", True, "conv1d", seed=4), PLAIN_NAMES)
    assert torch.autograd.gradgradcheck(lambda *z: fm.mlp(*z, "silu", "conv1d", recompute=recompute),
                                        [p[n] for n in PLAIN_NAMES])


def test_interpret_double_backward(interpret):
    """On the fused path too, create_graph=True gives a differentiable backward."""
    fm = interpret
    t = make_gated(9, 24, 40, 20, torch.float32, "cpu", True, seed=15)
    a = _leaves(t, GATED_NAMES)
    r = _leaves(t, GATED_NAMES, torch.float64)
    outs = []
    for v, f in ((a, fm.gated_mlp), (r, None)):
        if f is None:
            y = fm.reference.gated_mlp(v["x"], v["gate_weight"], v["up_weight"], v["down_weight"], "silu",
                                       v["gate_bias"], v["up_bias"], v["down_bias"])
        else:
            y = f(v["x"], v["gate_weight"], v["up_weight"], v["down_weight"], "silu", gate_bias=v["gate_bias"],
                  up_bias=v["up_bias"], down_bias=v["down_bias"])
        (gx,) = torch.autograd.grad(y, v["x"], t["dy"].to(y.dtype), create_graph=True)
        (ggw,) = torch.autograd.grad(gx.square().sum(), v["gate_weight"])
        outs.append(ggw)
    assert rel_err(outs[0], outs[1]) <= 1e-4


def test_cpu_training_uses_the_training_op(cpu_reference):
    """With grad the training op runs (saving pre-activations unless recompute); without, the
    inference op; both give the reference's output; float32 CPU grads match float64."""
    fm = cpu_reference
    t = make_gated(5, 8, 12, 6, torch.float32, "cpu", True)
    ref = ref_grads_gated(fm, t, "silu")
    for rec in (False, True):
        check_grads(grads_gated(fm, t, "silu", rec), ref, 1e-5, f"cpu fp32 recompute={rec}")
    with torch.no_grad():
        a = _leaves(t, GATED_NAMES)
        y0 = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                          gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"])
    assert y0.grad_fn is None
    a = _leaves(t, GATED_NAMES)
    y1 = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                      gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"])
    assert y1.grad_fn.name() == "GatedMlpTrainBackward"  # eager: the autograd.Function, no custom-op dispatch
    torch.testing.assert_close(y0, y1.detach())


def test_cpu_backward_choice(fused_mlp, monkeypatch):
    monkeypatch.delenv("FUSED_MLP_INTERPRET", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    d = fused_mlp.dispatch
    x = torch.zeros(3, 8)
    assert d.backward_choice(x, "gated").path == "reference"
    assert d.backward_choice(x.double(), "mlp").path == "reference"
    assert d.backward_choice(torch.zeros(3, 8, device="meta"), "gated").path == "reference"
    # decode.py is forward-only: where the forward would take it, training takes Triton
    monkeypatch.setattr(d, "choose", lambda *a, **k: d.Choice("decode", "test"))
    expect = "reference" if d._triton_gemm() is None else "triton"
    assert d.backward_choice(x, "gated").path == expect
    monkeypatch.setattr(d, "choose", lambda *a, **k: d.Choice("triton", "test"))
    assert d.backward_choice(torch.zeros(2**16, 8), "gated", hidden=2**15).path == "reference"  # 32-bit indexing
    assert d.backward_choice(x, "gated").path == "triton"
    monkeypatch.setenv("FUSED_MLP_BACKWARD", "reference")
    assert d.backward_choice(x, "gated").path == "reference"


def test_chunk_columns(fused_mlp):
    tb = module(fused_mlp, "triton_backward")
    assert tb.chunk_columns(100, 3072, 6, budget=10**9) == 3072  # fits: one chunk
    cols = tb.chunk_columns(8192, 3072, 6, budget=64 * 2**20)
    assert cols % 128 == 0 and 3 * 8192 * cols * 2 <= 64 * 2**20 * 1.2 and -(-3072 // cols) == 3
    assert tb.chunk_columns(8192, 100, 6, budget=1) == 100  # never below one tile of columns
    assert tb._chunks(300, 128) == [(0, 128), (128, 256), (256, 300)]


def test_recompute_plan(fused_mlp):
    """SwiGLU M 4096, d 4096, H 14336 in bf16 with the default 64 MB budget: the chunks hold
    g | u in the [dWg; dWu] rows of later chunks (each half of the token rows fits its half
    of them; h in the chunk's own dWg rows: h_own), cover the hidden columns in order, and
    only the last has a buffer of its own, at most 4 MB (was 60 MB: the recompute step's
    peak above its gradients). Without h_own each half also holds its h. d 768 (GeGLU
    M 8192) would need too many chunks and no weight gradient leaves no room: both take the
    equal chunks of the budget."""
    tb = module(fused_mlp, "triton_backward")
    m, d, hidden, budget = 4096, 4096, 14336, 64 * 2**20
    half = (m + 1) // 2
    for h_own, per_col in ((True, 2), (False, 3)):
        plan, cols = tb.recompute_plan(m, hidden, d, 2, budget, h_own=h_own)
        assert 2 < len(plan) <= tb.MAX_PLAN_CHUNKS
        assert [c[0] for c in plan] == [0] + [c[1] for c in plan[:-1]] and plan[-1][1] == hidden
        assert all(c[2] for c in plan[:-1]) and not plan[-1][2] and cols == hidden - plan[-1][0]
        for h0, h1, _ in plan[:-1]:
            n = h1 - h0
            assert n % 8 == 0 and n >= 8 and per_col * half * n <= (hidden - h1) * d
        assert m * per_col * cols * 2 <= budget // tb.TAIL_BUDGET_DIVISOR
        assert plan[0][1] - plan[0][0] > 2 * tb.chunk_columns(m, hidden, 6, budget)  # larger first chunk
    # h_own at M = d: each chunk takes half the columns left
    assert [b - a for a, b, _ in tb.recompute_plan(m, hidden, d, 2, budget, h_own=True)[0]] == \
        [7168, 3584, 1792, 896, 448, 224, 224]
    plain = [(a, b, False) for a, b in tb._chunks(3072, tb.chunk_columns(8192, 3072, 6, budget))]
    assert tb.recompute_plan(8192, 3072, 768, 2, budget) == (plain, plain[0][1])
    plain = [(a, b, False) for a, b in tb._chunks(hidden, tb.chunk_columns(m, hidden, 6, budget))]
    assert tb.recompute_plan(m, hidden, d, 2, budget, grads_free=False) == (plain, plain[0][1])


def test_as_one_weight(fused_mlp):
    tb = module(fused_mlp, "triton_backward")
    w = torch.randn(10, 4)
    one = tb.as_one_weight(w[:5], w[5:])
    assert one is not None and one.data_ptr() == w.data_ptr() and torch.equal(one, w)
    assert tb.as_one_weight(w[5:], w[:5]) is None
    assert tb.as_one_weight(torch.randn(5, 4), torch.randn(5, 4)) is None
    assert tb.as_one_weight(w[:4], w[5:9]) is None  # a gap
    assert tb.as_one_weight(w.t()[:2], w.t()[2:4]) is None  # columns, not rows


# ----------------------------------------------------------------------------- CPU: compile


@pytest.mark.parametrize("recompute", [False, True])
def test_cpu_compile_training_step(cpu_reference, recompute):
    """A whole training step (forward, loss, backward) under torch.compile (inductor, CPU)."""
    fm = cpu_reference
    torch._dynamo.reset()
    t = make_gated(5, 16, 24, 8, torch.float32, "cpu", True, lead=(2,))
    p = make_plain(7, 16, 24, 8, torch.float32, "cpu", True, "conv1d")

    def step(a, b):
        y = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "gelu_tanh",
                         gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"], recompute=recompute)
        w = torch.cat([a["gate_weight"], a["up_weight"]])
        y2 = fm.gated_mlp_packed(a["x"], w, a["down_weight"], "silu", recompute=recompute)
        z = fm.mlp(b["x"], b["fc_weight"], b["fc_bias"], b["proj_weight"], b["proj_bias"], "gelu", "conv1d",
                   recompute=recompute)
        loss = (y * a["x"].new_ones(()).add(y2)).square().sum() + z.square().sum()
        loss.backward()
        return loss

    compiled = torch.compile(step)
    a1, b1 = _leaves(t, GATED_NAMES), _leaves(p, PLAIN_NAMES)
    a2, b2 = _leaves(t, GATED_NAMES), _leaves(p, PLAIN_NAMES)
    torch.testing.assert_close(compiled(a1, b1), step(a2, b2), rtol=1e-5, atol=1e-5)
    for n in GATED_NAMES:
        torch.testing.assert_close(a1[n].grad, a2[n].grad, rtol=1e-4, atol=1e-5)
    for n in PLAIN_NAMES:
        torch.testing.assert_close(b1[n].grad, b2[n].grad, rtol=1e-4, atol=1e-5)
    # the forward in one graph (fullgraph), its backward run by autograd afterwards
    torch._dynamo.reset()
    fwd = torch.compile(lambda a: fm.gated_mlp_packed(a["x"], torch.cat([a["gate_weight"], a["up_weight"]]),
                                                      a["down_weight"], "relu2", recompute=recompute),
                        fullgraph=True)
    a1, a2 = _leaves(t, GATED_NAMES), _leaves(t, GATED_NAMES)
    fwd(a1).backward(t["dy"])
    fm.gated_mlp_packed(a2["x"], torch.cat([a2["gate_weight"], a2["up_weight"]]), a2["down_weight"], "relu2",
                        recompute=recompute).backward(t["dy"])
    for n in ("x", "gate_weight", "up_weight", "down_weight"):
        torch.testing.assert_close(a1[n].grad, a2[n].grad, rtol=1e-4, atol=1e-5)


def test_interpret_compile_training_step(interpret, monkeypatch):
    """The fused backward's custom ops (fake implementations) under torch.compile (aot_eager).
    The kernels' implementation only ever sees real tensors: while AOTAutograd traces the
    backward (fake / functional tensors) it must go through the op. (torch 2.11 reports
    is_compiling() False there; a backward that relied on it called the kernels with fake
    tensors on the GPU.)"""
    fm = interpret
    dispatch = module(fm, "dispatch")
    seen = []
    real_backward = dispatch.gated_mlp_backward

    def spy(*args, **kwargs):
        seen.append(type(args[0]))
        return real_backward(*args, **kwargs)

    monkeypatch.setattr(dispatch, "gated_mlp_backward", spy)
    torch._dynamo.reset()
    t = make_gated(13, 24, 40, 20, torch.float32, "cpu", True)

    def step(a):
        y = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                         gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"])
        y.backward(t["dy"])

    a = _leaves(t, GATED_NAMES)
    torch.compile(step, backend="aot_eager")(a)
    check_grads({n: v.grad for n, v in a.items()}, ref_grads_gated(fm, t, "silu"), TOL[torch.float32], "compiled")
    assert seen and all(tp is torch.Tensor for tp in seen), seen


# ----------------------------------------------------------------------------- CPU: interpreted kernels

INTERP_DTYPES = [torch.float32, torch.float16]
ODD_SMALL = (24, 40, 20)  # (D, H, O): no tile-size multiples (interpreter tiles are 32 x 32 x 16)


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("act", ACTS)
def test_interpret_gated(interpret, act, recompute, dtype):
    d, h, o = ODD_SMALL
    t = make_gated(37, d, h, o, dtype, "cpu", act != "relu", seed=3)
    check_grads(grads_gated(interpret, t, act, recompute), ref_grads_gated(interpret, t, act), TOL[dtype],
                f"gated {act} recompute={recompute}")


@pytest.mark.parametrize("dtype", INTERP_DTYPES)
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
@pytest.mark.parametrize("act", ["gelu_tanh", "relu", "identity", "gelu"])
def test_interpret_plain(interpret, act, layout, dtype):
    d, h, o = ODD_SMALL
    for rec in (False, True):
        t = make_plain(37, d, h, o, dtype, "cpu", act != "relu", layout, seed=4)
        check_grads(grads_plain(interpret, t, act, layout, rec), ref_grads_plain(interpret, t, act, layout),
                    TOL[dtype], f"mlp {layout} {act} recompute={rec}")


def _strided_leaf(v):
    """A leaf with v's values and stride 2 (not contiguous), requiring grad."""
    out = torch.empty_strided(v.shape, (2,), dtype=v.dtype, device=v.device).copy_(v)
    assert not out.is_contiguous()
    return out.requires_grad_()


@pytest.mark.parametrize("recompute", [False, True])
def test_interpret_strided_biases(interpret, recompute):
    """Bias parameters with stride 2: forward and gradients right (the kernels read biases
    contiguously; the entry points copy strided ones)."""
    d, h, o = ODD_SMALL
    t = make_gated(37, d, h, o, torch.float32, "cpu", True, seed=5)
    a = _leaves(t, GATED_NAMES)
    for n in ("gate_bias", "up_bias", "down_bias"):
        a[n] = _strided_leaf(t[n])
    y = interpret.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                            gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"],
                            recompute=recompute)
    y.backward(t["dy"])
    check_grads({n: v.grad for n, v in a.items()}, ref_grads_gated(interpret, t, "silu"), TOL[torch.float32],
                f"gated, strided biases, recompute={recompute}")
    p = make_plain(37, d, h, o, torch.float32, "cpu", True, "linear", seed=6)
    a = _leaves(p, PLAIN_NAMES)
    a["fc_bias"], a["proj_bias"] = _strided_leaf(p["fc_bias"]), _strided_leaf(p["proj_bias"])
    y = interpret.mlp(a["x"], a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], "gelu_tanh",
                      recompute=recompute)
    y.backward(p["dy"])
    check_grads({n: v.grad for n, v in a.items()}, ref_grads_plain(interpret, p, "gelu_tanh", "linear"),
                TOL[torch.float32], f"mlp, strided biases, recompute={recompute}")


@pytest.mark.parametrize("dx_mode", ["cublas", "triton"])
@pytest.mark.parametrize("recompute", [False, True])
def test_interpret_packed_and_dx_modes(interpret, monkeypatch, dx_mode, recompute):
    monkeypatch.setenv("FUSED_MLP_BWD_DX", dx_mode)
    d, h, o = ODD_SMALL
    t = make_gated(29, d, h, o, torch.float32, "cpu", True, seed=5, lead=(2,))
    ref = ref_grads_gated(interpret, t, "silu")
    check_grads(grads_packed(interpret, t, "silu", recompute), ref, TOL[torch.float32], f"packed {dx_mode}")
    check_grads(grads_gated(interpret, t, "silu", recompute), ref, TOL[torch.float32], f"gated {dx_mode}")


@pytest.mark.parametrize("dx_mode", ["cublas", "triton"])
def test_interpret_recompute_in_chunks(interpret, monkeypatch, dx_mode):
    """A budget small enough for three hidden-column chunks (128, 128, 44 of 300): weight
    gradients written block by block, dx accumulated."""
    monkeypatch.setenv("FUSED_MLP_BWD_DX", dx_mode)
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", "0.01")
    tb = module(interpret, "triton_backward")
    assert tb.chunk_columns(37, 300, 12) == 128
    t = make_gated(37, 24, 300, 20, torch.float32, "cpu", True, seed=6)
    ref = ref_grads_gated(interpret, t, "gelu_tanh")
    check_grads(grads_gated(interpret, t, "gelu_tanh", True), ref, TOL[torch.float32], "gated chunks")
    check_grads(grads_packed(interpret, t, "gelu_tanh", True), ref, TOL[torch.float32], "packed chunks")
    for layout in ("linear", "conv1d"):
        p = make_plain(37, 24, 300, 20, torch.float32, "cpu", True, layout, seed=7)
        check_grads(grads_plain(interpret, p, "quick_gelu", layout, True),
                    ref_grads_plain(interpret, p, "quick_gelu", layout), TOL[torch.float32], f"mlp {layout} chunks")


@pytest.mark.parametrize("m, d, h_own", [(16, 64, True), (45, 40, False), (1, 64, True)])
def test_interpret_recompute_in_weight_grads(interpret, monkeypatch, m, d, h_own):
    """recompute_plan's chunks with g | u in the rows of [dWg; dWu] that later chunks write
    (the token rows in two halves, 45 an odd count, 1 a single part) and h in the chunk's own
    dWg rows (M <= d) or after each half's g | u (M > d), then the last columns in a buffer
    of their own: every gradient right, gated and packed, with and without biases."""
    tb = module(interpret, "triton_backward")
    if m == 1:  # 512 x 12 bytes is 6 KB; the tail's 128 bytes fit budget / 16
        budget, hidden, want = 4096, 512, [(496, True), (16, False)]
    elif h_own:  # M 16 x 512 x 12 bytes is 96 KB; the tail's 1.5 KB fits budget / 16
        budget, hidden, want = 80 * 1024, 512, [(408, True), (80, True), (24, False)]
    else:  # fewer, larger chunks than budget / 16 would give (interpreter time)
        budget, hidden, want = 128 * 1024, 256, [(88, True), (56, True), (40, True), (24, True), (48, False)]
        monkeypatch.setattr(tb, "TAIL_BUDGET_DIVISOR", 4)
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", str(budget / 2**20))
    plan, cols = tb.recompute_plan(m, hidden, d, 4, h_own=h_own)
    assert [(b - a, g) for a, b, g in plan] == want and cols == want[-1][0]
    for bias in (True, False):
        t = make_gated(m, d, hidden, 24, torch.float32, "cpu", bias, seed=8)
        ref = ref_grads_gated(interpret, t, "silu")
        check_grads(grads_gated(interpret, t, "silu", True), ref, TOL[torch.float32], f"gated in grads {bias}")
        check_grads(grads_packed(interpret, t, "silu", True), ref, TOL[torch.float32], f"packed in grads {bias}")


def test_interpret_in_place_and_retain_graph(interpret, monkeypatch):
    """The saved pre-activations are overwritten by their gradients only when nobody can
    read them again: with retain_graph=True a second backward gives the same gradients."""
    fm = interpret
    d = fm.dispatch
    used = []
    for name in ("gated_mlp_backward", "mlp_backward"):
        orig = getattr(d, name)
        monkeypatch.setattr(d, name, lambda *a, _o=orig, _n=name, **k: used.append((_n, a[-1])) or _o(*a, **k))
    t = make_gated(21, 24, 40, 20, torch.float32, "cpu", True, seed=8)
    ref = ref_grads_gated(fm, t, "silu")
    a = _leaves(t, GATED_NAMES)
    y = fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                     gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"])
    y.backward(t["dy"], retain_graph=True)
    first = {n: v.grad.clone() for n, v in a.items()}
    y.backward(t["dy"])
    for n, v in a.items():
        torch.testing.assert_close(v.grad, 2 * first[n])
    check_grads(first, ref, TOL[torch.float32], "retained graph")
    # (the last backward may consume them)
    assert used == [("gated_mlp_backward", False), ("gated_mlp_backward", True)]
    used.clear()
    check_grads(grads_gated(fm, t, "silu"), ref, TOL[torch.float32], "in place")
    grads_gated(fm, t, "silu", recompute=True)  # nothing saved: its own buffers, always in place
    assert used == [("gated_mlp_backward", True), ("gated_mlp_backward", False)]
    used.clear()
    p = make_plain(21, 24, 40, 20, torch.float32, "cpu", True, "linear")
    check_grads(grads_plain(fm, p, "gelu", "linear"), ref_grads_plain(fm, p, "gelu", "linear"),
                TOL[torch.float32], "plain in place")
    grads_plain(fm, p, "gelu", "linear", recompute=True)
    assert used == [("mlp_backward", True), ("mlp_backward", False)]


def test_interpret_partial_requires_grad(interpret):
    """Only what is needed is computed: frozen weights (x only), frozen input (weights only)."""
    fm = interpret
    t = make_gated(19, 24, 40, 20, torch.float32, "cpu", True, seed=9)
    ref = ref_grads_gated(fm, t, "gelu")
    for requires in (("x",), ("gate_weight", "down_bias"), ("up_weight", "up_bias", "down_weight")):
        got = grads_gated(fm, t, "gelu", requires=requires)
        assert {n for n, g in got.items() if g is not None} == set(requires)
        check_grads({n: got[n] for n in requires}, {n: ref[n] for n in requires}, TOL[torch.float32],
                    f"requires {requires}")
    p = make_plain(19, 24, 40, 20, torch.float32, "cpu", True, "conv1d", seed=10)
    a = _leaves(p, PLAIN_NAMES, requires=("proj_weight",))
    fm.mlp(a["x"], a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], "gelu", "conv1d").backward(p["dy"])
    assert a["x"].grad is None and a["fc_weight"].grad is None
    ref_w = ref_grads_plain(fm, p, "gelu", "conv1d")["proj_weight"]
    check_grads({"proj_weight": a["proj_weight"].grad}, {"proj_weight": ref_w}, TOL[torch.float32], "proj only")


def test_interpret_weight_grads_share_one_gemm(interpret):
    """dWg and dWu are the row halves of one [2H, D] tensor; autograd keeps them as given."""
    fm = interpret
    t = make_gated(11, 24, 40, 20, torch.float32, "cpu", False, seed=11)
    a = _leaves(t, GATED_NAMES)
    fm.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu").backward(t["dy"])
    gw, uw = a["gate_weight"].grad, a["up_weight"].grad
    assert gw.untyped_storage().data_ptr() == uw.untyped_storage().data_ptr()
    assert uw.data_ptr() == gw.data_ptr() + gw.numel() * gw.element_size()
    assert gw.is_contiguous() and uw.is_contiguous()


def test_interpret_edge_shapes(interpret):
    """M = 0 and 1, and an expanded (stride-0) output gradient, as y.sum().backward() gives."""
    fm = interpret
    for m in (0, 1):
        t = make_gated(m, 24, 40, 20, torch.float32, "cpu", True, seed=12, lead=(1,))
        got = grads_gated(fm, t, "silu")
        ref = ref_grads_gated(fm, t, "silu")
        for n in ref:
            assert got[n].shape == ref[n].shape
            torch.testing.assert_close(got[n], ref[n].float(), rtol=1e-4, atol=1e-6)
    t = make_gated(7, 24, 40, 20, torch.float32, "cpu", True, seed=13, lead=(2,))
    t["dy"] = torch.ones(()).expand(t["dy"].shape)
    check_grads(grads_gated(fm, t, "relu2"), ref_grads_gated(fm, t, "relu2"), TOL[torch.float32], "expanded dy")
    p = make_plain(7, 24, 40, 20, torch.float32, "cpu", True, "conv1d", seed=14)
    p["dy"] = torch.ones(()).expand(p["dy"].shape)
    check_grads(grads_plain(fm, p, "silu", "conv1d"), ref_grads_plain(fm, p, "silu", "conv1d"), TOL[torch.float32],
                "expanded dy, plain")


@pytest.mark.parametrize("prefetch", [True, False])
def test_interpret_kernels(interpret, prefetch):
    """The kernels one by one: the forward storing pre-activations, the dh kernel (gated and
    plain, in place, with h, weights through [K, N] and [N, K] strides, uneven K; its
    epilogue's loads before or after the tile loop; pointer, TMA and persistent TMA
    kernels), the dual GEMM (accumulating)."""
    tg = module(interpret, "triton_gemm").interpreted_module()
    ids = interpret.activations.ACTIVATION_IDS
    acts = interpret.activations
    C = tg.Config
    g = torch.Generator().manual_seed(13)
    m, k, n = 37, 40, 72
    x = _rand(m, k, gen=g)
    wg, wu = _rand(n, k, gen=g, scale=k**-0.5), _rand(n, k, gen=g, scale=k**-0.5)
    bg = _rand(n, gen=g)
    xd = x.double()
    gd, ud = xd @ wg.double().t() + bg.double(), xd @ wu.double().t()
    for act in ("gelu_tanh", "relu2"):
        f, df = acts.torch_activation(act), acts.torch_activation_derivative(act)
        cfgs = (C(16, 16, 16, 1, 4, 1), C(32, 64, 32, 3, 4, 1), C(32, 32, 16, 2, 4, 1, True),
                C(16, 32, 16, 2, 4, 1, True, True))
        for cfg in (None,) + tuple(c._replace(prefetch=prefetch) for c in cfgs):
            pre = torch.full((m, 2 * n), float("nan"))
            h = tg.gated_linear(x, wg, wu, bg, None, ids[act], config=cfg, pre=pre)
            torch.testing.assert_close(pre.double(), torch.cat([gd, ud], 1), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h.double(), f(gd) * ud, rtol=1e-5, atol=1e-5)
            # dh kernel: dy [m, o] @ W [o, n] (nn.Linear's down weight: [K, N])
            o = 28
            dy, wd = _rand(m, o, gen=g), _rand(o, n, gen=g, scale=n**-0.5)
            dh = dy.double() @ wd.double()
            gr, ur = pre[:, :n].double(), pre[:, n:].double()
            want = torch.cat([dh * ur * df(gr), dh * f(gr)], 1)
            out, hb = torch.full_like(pre, float("nan")), torch.full((m, n), float("nan"))
            tg.linear_dact(dy, wd, True, pre, out, ids[act], gated=True, h=hb, config=cfg)
            torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(hb.double(), f(gr) * ur, rtol=1e-5, atol=1e-5)
            inplace = pre.clone()
            tg.linear_dact(dy, wd, True, inplace, inplace, ids[act], gated=True, config=cfg)
            torch.testing.assert_close(inplace, out)
            # plain, W as [N, K] (Conv1D's proj weight [hidden, out])
            wt = wd.t().contiguous()
            p1 = pre[:, :n].contiguous()
            outp = torch.full_like(p1, float("nan"))
            tg.linear_dact(dy, wt, False, p1, outp, ids[act], gated=False, config=cfg)
            torch.testing.assert_close(outp.double(), dh * df(gr), rtol=1e-5, atol=1e-5)
    # dual GEMM: out (+)= a1 @ w1 + a2 @ w2 with a1 | a2 the halves of one buffer
    a = _rand(m, 2 * n, gen=g)
    w1, w2 = _rand(n, k, gen=g), _rand(n, k, gen=g)
    want = a[:, :n].double() @ w1.double() + a[:, n:].double() @ w2.double()
    for cfg in (None, C(16, 16, 16, 1, 4, 1), C(64, 32, 32, 2, 4, 1)):
        out = torch.full((m, k), float("nan"))
        tg.dual_matmul(a[:, :n], a[:, n:], w1, w2, out, config=cfg)
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
        tg.dual_matmul(a[:, :n], a[:, n:], w1, w2, out, accumulate=True, config=cfg)
        torch.testing.assert_close(out.double(), 2 * want, rtol=1e-5, atol=1e-5)


def test_interpret_launches_pass_compile_options(interpret, monkeypatch):
    """Every Triton launch of a training step (the gated MLP with dx by the dual-operand
    kernel, the plain MLP), of the TMA and persistent forward kernels and of the split
    down projection's reduction passes triton_gemm.COMPILE_OPTIONS (FMA contraction on),
    so that a Triton whose default differs (3.10 turns it off) compiles the kernels as
    they were measured."""
    from triton.runtime.interpreter import InterpretedFunction

    tg = module(interpret, "triton_gemm").interpreted_module()
    assert tg.COMPILE_OPTIONS == {"enable_fp_fusion": True}
    launches = []
    run = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        launches.append((self.fn.__name__, {k: kwargs.get(k) for k in tg.COMPILE_OPTIONS}))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    monkeypatch.setenv("FUSED_MLP_BWD_DX", "triton")
    t = make_gated(5, 40, 72, 24, torch.float32, "cpu", True, seed=5)
    check_grads(grads_gated(interpret, t, "silu"), ref_grads_gated(interpret, t, "silu"), TOL[torch.float32],
                "gated, dx by the dual kernel")
    p = make_plain(5, 40, 72, 24, torch.float32, "cpu", True, "linear", seed=6)
    check_grads(grads_plain(interpret, p, "gelu", "linear"), ref_grads_plain(interpret, p, "gelu", "linear"),
                TOL[torch.float32], "plain")
    x, w = _rand(5, 32), _rand(48, 32)
    ids = interpret.activations.ACTIVATION_IDS
    for cfg in (tg.Config(16, 16, 16, 2, 4, 1, True), tg.Config(16, 16, 16, 2, 4, 1, True, True)):
        tg.linear_act(x, w, None, ids["relu"], "linear", config=cfg)
    tg.sum_parts(_rand(2, 3, 17), None, torch.empty(3, 17))
    assert {"_fused_linear_kernel", "_fused_linear_kernel_tma", "_dual_gemm_kernel", "_sum_parts_kernel"} <= {
        name for name, _ in launches}
    wrong = [(name, opts) for name, opts in launches if opts != tg.COMPILE_OPTIONS]
    assert not wrong, f"launches without the package's compile options: {wrong}"


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # exp(-x) -> inf: sigmoid(x) -> 0, as wanted
def test_interpret_derivatives_match_torch(interpret):
    """_activation_and_grad (the epilogue's act and act') equals activations.py on a grid,
    through the plain dh kernel with an identity-like weight: dpre = dh * act'(pre)."""
    tg = module(interpret, "triton_gemm").interpreted_module()
    acts = interpret.activations
    z = torch.linspace(-12, 12, 16 * 37).reshape(37, 16)
    eye = torch.eye(16)
    ones = torch.ones(37, 16)
    for act, i in acts.ACTIVATION_IDS.items():
        out, h = torch.empty_like(z), torch.empty_like(z)
        tg.linear_dact(ones, eye, True, z, out, i, gated=False, h=h)
        torch.testing.assert_close(out.double(), acts.torch_activation_derivative(act)(z.double()),
                                   rtol=2e-6, atol=2e-6, msg=lambda s: f"{act}' {s}")
        torch.testing.assert_close(h.double(), acts.torch_activation(act)(z.double()),
                                   rtol=2e-6, atol=2e-6, msg=lambda s: f"{act} {s}")


# ----------------------------------------------------------------------------- CPU: ahead-of-time compiles


def _aot_kernel(fn, types: dict, consts: dict, cap: int, num_warps: int, num_stages: int, package_options=True):
    """triton.compile for CUDA capability `cap` without a GPU (see _aot_compile), with the
    options the package's launches pass (triton_gemm.COMPILE_OPTIONS) unless package_options
    is False (Triton's defaults)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: ("constexpr" if n in consts else types.get(n, "i32")) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and not sig[n].startswith("tensordesc")}
    extra = sys.modules[fn.fn.__module__].COMPILE_OPTIONS if package_options else {}
    return triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", cap, 64 if cap >= 90 else 32),
                          options={"num_warps": num_warps, "num_stages": num_stages, **extra})


def _aot_compile(fn, types: dict, consts: dict, cap: int, num_warps: int, num_stages: int):
    """Compile a kernel for CUDA capability `cap` without a GPU: (registers, stack bytes,
    shared memory bytes), from the cubin's resource usage (cuobjdump). Pointers and the
    integer arguments are taken as multiples of 16, as a launch on the benchmarked shapes
    (dims 768, 3072, 4096, 14336) specializes them."""
    import re
    import subprocess
    import tempfile

    import triton.backends.nvidia as nv

    k = _aot_kernel(fn, types, consts, cap, num_warps, num_stages)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", res).group(1))
    stack = int(re.search(r"STACK:(\d+)", res).group(1))
    return regs, stack, k.metadata.shared


def _aot_tma_forward(tg, cfg, cap: int, gated: bool, activation: int, biases: tuple, store_pre: bool):
    """_aot_compile of the TMA forward kernel (bf16, nn.Linear weights) in config `cfg`."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    types = {"x_desc": f"tensordesc<bf16[{bm}, {bk}]>", "w1_desc": f"tensordesc<bf16[{bn}, {bk}]>",
             "w2_desc": f"tensordesc<bf16[{bn}, {bk}]>",
             **{n: "*bf16" for n in ("b1_ptr", "b2_ptr", "out_ptr", "pre_ptr", "h_ptr")}}
    consts = dict(GATED=gated, ACTIVATION=activation, HAS_B1=biases[0], HAS_B2=biases[1], STORE_PRE=store_pre, BWD=0,
                  STORE_H=False, SUBTILE=False, PREFETCH=False, W_KN=False, DOT_PRECISION="tf32", BLOCK_M=bm,
                  BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, PERSISTENT=cfg.persistent,
                  stride_on=1, stride_pn=1, stride_hn=1)
    return _aot_compile(tg._fused_linear_kernel_tma, types, consts, cap, cfg.num_warps, cfg.num_stages)


@pytest.mark.parametrize("cap", [90, 80])
def test_aot_compile_backward_kernels(fused_mlp, cap):
    """The backward's kernels compile for sm_90 and sm_80 without a GPU, within the shared
    memory of an H100 / A100; the first two dh-kernel configs (gated epilogue, in two
    column halves; the second with its loads before the tile loop) do not spill."""
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no ASTSource / GPUTarget")
    tg = module(fused_mlp, "triton_gemm")
    smem_limit = 232448 if cap >= 90 else 166912
    ptrs = {n: "*bf16" for n in ("x_ptr", "w1_ptr", "w2_ptr", "b1_ptr", "b2_ptr", "out_ptr", "pre_ptr", "h_ptr")}
    unit = dict(stride_xk=1, stride_w1n=1, stride_w2n=1, stride_on=1, stride_pn=1, stride_hn=1)
    try:
        for cfg in tg._BWD_CONFIGS["large"][:2]:
            for bwd, act in ((2, "silu"), (2, "gelu_tanh"), (1, "gelu_tanh")):
                consts = dict(GATED=False, ACTIVATION=fused_mlp.activations.ACTIVATION_IDS[act], HAS_B1=False,
                              HAS_B2=False, STORE_PRE=False, BWD=bwd, STORE_H=False, SUBTILE=True,
                              PREFETCH=cfg.prefetch, EVEN_K=True,
                              DOT_PRECISION="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                              GROUP_M=cfg.group_m, **unit)
                regs, stack, smem = _aot_compile(tg._fused_linear_kernel, ptrs, consts, cap, cfg.num_warps,
                                                 cfg.num_stages)
                assert smem <= smem_limit, (cfg, smem)
                assert stack == 0, f"dh kernel {cfg} BWD={bwd} {act}: {regs} registers, {stack} bytes of stack"
        cfg = tg._GATED_CONFIGS["large"][0]
        consts = dict(GATED=True, ACTIVATION=1, HAS_B1=True, HAS_B2=True, STORE_PRE=True, BWD=0, STORE_H=False,
                      SUBTILE=False, PREFETCH=False, EVEN_K=False, DOT_PRECISION="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, stride_xk=1, stride_w1k=1, stride_w2k=1,
                      stride_on=1, stride_pn=1, stride_hn=1)
        assert _aot_compile(tg._fused_linear_kernel, ptrs, consts, cap, cfg.num_warps, cfg.num_stages)[2] <= smem_limit
        cfg = tg._PLAIN_CONFIGS["large"][0]
        dual = {n: "*bf16" for n in ("a1_ptr", "a2_ptr", "w1_ptr", "w2_ptr", "out_ptr")}
        consts = dict(ACCUMULATE=True, EVEN_K=True, DOT_PRECISION="tf32", BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                      BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, stride_ak=1, stride_w1n=1, stride_w2n=1, stride_on=1)
        assert _aot_compile(tg._dual_gemm_kernel, dual, consts, cap, cfg.num_warps, cfg.num_stages)[2] <= smem_limit
        if cap >= 90:  # the plain forward's first persistent TMA candidate, inference (sm_90+ only;
            # storing the pre-activations too, Triton 3.9 spills 24 bytes there)
            gelu_tanh = fused_mlp.activations.ACTIVATION_IDS["gelu_tanh"]
            cfg = tg._PLAIN_CONFIGS["large"][0]
            regs, stack, smem = _aot_tma_forward(tg, cfg._replace(persistent=True), cap, gated=False,
                                                 activation=gelu_tanh, biases=(True, False), store_pre=False)
            assert smem <= smem_limit and stack == 0, f"persistent {cfg}: {regs} registers, {stack} B stack, {smem} B"
            # The training forward's two-programs-per-SM candidate (gated, storing g | u, TMA):
            # it was chosen because it fits two programs per SM (session 7: 102 registers, 128 with
            # biases, 98 KB, Triton 3.9); a compiler that made it larger would lose that silently.
            cfg = tg.Config(128, 64, 64, 8, 8, 3)
            assert cfg in tg._GATED_CONFIGS["large"][: tg._TMA_VARIANTS]  # so the tuner also tries it as TMA
            regs, stack, smem = _aot_tma_forward(tg, cfg, cap, gated=True, activation=gelu_tanh, biases=(True, True),
                                                 store_pre=True)
            per_sm = min(65536 // (regs * cfg.num_warps * 32), smem_limit // smem)
            assert stack == 0 and per_sm >= 2, f"{cfg}: {regs} registers, {stack} B stack, {smem} B shared"
    except (FileNotFoundError, subprocess_error()) as e:  # no ptxas / cuobjdump in this Triton
        pytest.skip(f"cannot compile for CUDA here: {e}")


def subprocess_error():
    import subprocess

    return subprocess.CalledProcessError


# ----------------------------------------------------------------------------- GPU

GPU_MS = [1, 3, 64, 777, 4096]
ODD = (200, 344, 136)  # (D, H, O)


def _gpu_tol(dtype):
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return TOL_TF32
    return TOL[dtype]


@pytest.fixture
def gpu(fused_mlp, monkeypatch):
    """The compiled Triton path, one untimed config per shape (fewer compilations)."""
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    for name in ("FUSED_MLP_INTERPRET", "TRITON_INTERPRET", "FUSED_MLP_BWD_DX", "FUSED_MLP_RECOMPUTE_CHUNK_MB",
                 "FUSED_MLP_BACKWARD", "FUSED_MLP_BWD_SUBTILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fused_mlp.dispatch, "DECODE_MAX_M", {})
    assert fused_mlp.dispatch.backward_choice(torch.zeros(4, 8, device="cuda"), "gated").path == "triton"
    return fused_mlp


# fp32 without TF32 uses FMA dots, slow to compile: one M for it.
GPU_MATRIX = [(dt, m) for dt in (torch.bfloat16, torch.float16) for m in GPU_MS] + [(torch.float32, 777)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,m", GPU_MATRIX)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_gpu_matrix(gpu, dtype, m, bias, recompute):
    d, h, o = ODD
    tol = _gpu_tol(dtype)
    t = make_gated(m, d, h, o, dtype, "cuda", bias, seed=m)
    ref = ref_grads_gated(gpu, t, "silu")
    check_grads(grads_gated(gpu, t, "silu", recompute), ref, tol, "gated")
    check_grads(grads_packed(gpu, t, "silu", recompute), ref, tol, "packed")
    for layout in ("linear", "conv1d"):
        p = make_plain(m, d, h, o, dtype, "cuda", bias, layout, seed=m)
        check_grads(grads_plain(gpu, p, "gelu_tanh", layout, recompute), ref_grads_plain(gpu, p, "gelu_tanh", layout),
                    tol, f"mlp {layout}")


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTS)
def test_gpu_activations(gpu, act):
    """Every activation (the matrix above covers silu / gelu_tanh at every M)."""
    m = 777
    d, h, o = ODD
    t = make_gated(m, d, h, o, torch.bfloat16, "cuda", True, seed=m)
    check_grads(grads_gated(gpu, t, act), ref_grads_gated(gpu, t, act), TOL[torch.bfloat16], f"gated {act}")
    p = make_plain(m, d, h, o, torch.bfloat16, "cuda", True, "linear", seed=m)
    check_grads(grads_plain(gpu, p, act, "linear"), ref_grads_plain(gpu, p, act, "linear"), TOL[torch.bfloat16],
                f"mlp {act}")


@pytest.mark.gpu
def test_gpu_no_worse_than_eager(gpu):
    """At M=4096 each bf16 gradient is within 2x of eager PyTorch's own bf16 error."""
    d, h, o = 1024, 2816, 1024
    t = make_gated(4096, d, h, o, torch.bfloat16, "cuda", False, seed=1)
    ref = ref_grads_gated(gpu, t, "silu")
    ours = grads_gated(gpu, t, "silu")
    a = _leaves(t, GATED_NAMES)
    F.linear(F.silu(F.linear(a["x"], a["gate_weight"])) * F.linear(a["x"], a["up_weight"]),
             a["down_weight"]).backward(t["dy"])
    for n in ref:
        e_ours, e_eager = rel_err(ours[n].cpu(), ref[n]), rel_err(a[n].grad.cpu(), ref[n])
        assert e_ours <= 2 * e_eager + 1e-4, f"{n}: ours {e_ours:.2e} vs eager {e_eager:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dx_mode", ["cublas", "triton"])
def test_gpu_dx_modes_and_chunks(gpu, monkeypatch, dx_mode):
    monkeypatch.setenv("FUSED_MLP_BWD_DX", dx_mode)
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", "1")  # several chunks at this size
    d, h, o = ODD
    t = make_gated(777, d, h * 4, o, torch.bfloat16, "cuda", True, seed=2)
    ref = ref_grads_gated(gpu, t, "gelu_tanh")
    for rec in (False, True):
        check_grads(grads_gated(gpu, t, "gelu_tanh", rec), ref, TOL[torch.bfloat16], f"gated rec={rec}")
        check_grads(grads_packed(gpu, t, "gelu_tanh", rec), ref, TOL[torch.bfloat16], f"packed rec={rec}")


@pytest.mark.gpu
@pytest.mark.parametrize("m, d, h_own", [(256, 1024, True), (333, 256, False)])
def test_gpu_recompute_in_weight_grads(gpu, monkeypatch, m, d, h_own):
    """bf16 on the GPU kernels: recompute chunks whose g | u live in [dWg; dWu]'s later
    rows (two halves of the token rows; 333 an odd count) and h in the chunk's own dWg rows
    (M <= d) or after each half's g | u, then the last columns in their own buffer, against
    the plain chunks and float32 eager."""
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", "1")
    tb = module(gpu, "triton_backward")
    plan, _ = tb.recompute_plan(m, 4096, d, 2, h_own=h_own)
    assert sum(g for _, _, g in plan) >= 3 and not plan[-1][2]
    t = make_gated(m, d, 4096, 512, torch.bfloat16, "cuda", True, seed=9)
    ref = ref_grads_gated(gpu, t, "silu")
    got = grads_gated(gpu, t, "silu", True)
    check_grads(got, ref, TOL[torch.bfloat16], "gated in grads")
    check_grads(grads_packed(gpu, t, "silu", True), ref, TOL[torch.bfloat16], "packed in grads")
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_IN_GRADS", "0")
    check_grads(grads_gated(gpu, t, "silu", True), ref, TOL[torch.bfloat16], "gated plain chunks")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_every_backward_config(fused_mlp, dtype, monkeypatch):
    """Every tile config of the dh kernel and the dual GEMM (TMA variants on sm_90+) computes
    the right thing on this GPU, or does not fit it (the tuner skips those). fp32 (TF32):
    the first config of each size class only (fewer compilations)."""
    from triton.runtime.errors import OutOfResources

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    tg = module(fused_mlp, "triton_gemm")
    ids = fused_mlp.activations.ACTIVATION_IDS
    acts = fused_mlp.activations
    tma = (False, True) if torch.cuda.get_device_capability() >= (9, 0) and dtype != torch.float32 else (False,)
    d, n, m = 200, 344, 777
    g = torch.Generator().manual_seed(5)
    dy = _rand(m, d, dtype=dtype, device="cuda", gen=g)
    wd = _rand(d, n, dtype=dtype, device="cuda", gen=g, scale=d**-0.5)  # [K, N]
    pre = _rand(m, 2 * n, dtype=dtype, device="cuda", gen=g)
    dh = dy.double() @ wd.double()
    gr, ur = pre[:, :n].double(), pre[:, n:].double()
    f, df = acts.torch_activation("silu"), acts.torch_activation_derivative("silu")
    want = torch.cat([dh * ur * df(gr), dh * f(gr)], 1).cpu()
    a = _rand(m, 2 * n, dtype=dtype, device="cuda", gen=g)
    w1, w2 = _rand(n, d, dtype=dtype, device="cuda", gen=g), _rand(n, d, dtype=dtype, device="cuda", gen=g)
    want_dual = (a[:, :n].double() @ w1.double() + a[:, n:].double() @ w2.double()).cpu()
    ran = 0
    for table in tg._BWD_CONFIGS.values():
        table = table[:1] if dtype == torch.float32 else table
        # every config with the default epilogue, the first of each class also with the other
        # the first config also with the other prefetch setting
        runs = [v for c in table for v in kernel_variants(c, tma)] + [table[0]._replace(prefetch=not table[0].prefetch)]
        for cfg in runs:
            if dtype == torch.float32:
                cfg = cfg._replace(block_k=max(16, cfg.block_k // 2))
            out = torch.full_like(pre, float("nan"))
            try:
                tg.linear_dact(dy, wd, True, pre, out, ids["silu"], gated=True, config=cfg)
                torch.cuda.synchronize()
            except OutOfResources:
                continue
            assert rel_err(out.cpu(), want) <= _gpu_tol(dtype), f"dh kernel {cfg}"
            ran += 1
    for cfg in tg._PLAIN_CONFIGS["large"][: 2 if dtype == torch.float32 else None]:
        if dtype == torch.float32:
            cfg = cfg._replace(block_k=max(16, cfg.block_k // 2))
        out = torch.full((m, d), float("nan"), dtype=dtype, device="cuda")
        try:
            tg.dual_matmul(a[:, :n], a[:, n:], w1, w2, out, config=cfg)
            torch.cuda.synchronize()
        except OutOfResources:
            continue
        assert rel_err(out.cpu(), want_dual) <= _gpu_tol(dtype), f"dual {cfg}"
        ran += 1
    assert ran > 0


@pytest.mark.gpu
def test_gpu_autotune_in_place(gpu, monkeypatch):
    """With autotuning on, the first backward of a new shape times the in-place dh kernel
    on scratch: its gradients are right on that first call."""
    fused_mlp = gpu
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "1")
    tg = module(fused_mlp, "triton_gemm")
    for dx_mode in ("cublas", "triton"):
        monkeypatch.setenv("FUSED_MLP_BWD_DX", dx_mode)
        t = make_gated(1000 + (dx_mode == "triton"), 256, 520, 192, torch.bfloat16, "cuda", True, seed=3)
        check_grads(grads_gated(fused_mlp, t, "silu"), ref_grads_gated(fused_mlp, t, "silu"), TOL[torch.bfloat16],
                    f"first call, tuned ({dx_mode})")
        monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", "0.5")
        check_grads(grads_gated(fused_mlp, t, "silu", True), ref_grads_gated(fused_mlp, t, "silu"),
                    TOL[torch.bfloat16], f"recompute, tuned ({dx_mode})")
        monkeypatch.delenv("FUSED_MLP_RECOMPUTE_CHUNK_MB")
    assert any(k[-1] == "bwd_gated" for k in tg._TUNED if isinstance(k[-1], str))


@pytest.mark.gpu
def test_gpu_compile_training_step(gpu):
    torch._dynamo.reset()
    t = make_gated(64, 256, 512, 256, torch.bfloat16, "cuda", True, lead=(2,))

    def step(a):
        y = gpu.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu",
                          gate_bias=a["gate_bias"], up_bias=a["up_bias"], down_bias=a["down_bias"])
        y.backward(t["dy"])

    a = _leaves(t, GATED_NAMES)
    torch.compile(step)(a)
    check_grads({n: v.grad for n, v in a.items()}, ref_grads_gated(gpu, t, "silu"), TOL[torch.bfloat16],
                "compiled step")


def _peak_mb(fn) -> float:
    """Peak memory allocated by fn over what was allocated before it, in MB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 1e6


@pytest.mark.gpu
@pytest.mark.parametrize("m,d,h", [(4096, 1024, 4096), (4096, 4096, 14336)])
def test_gpu_memory_against_eager(gpu, m, d, h):
    """Peak memory of forward + backward (weight gradients included, inputs excluded):
    default <= eager; recompute <= 0.5 x eager. A mid-size case where activations dominate,
    and issue 4's SwiGLU size, where the weight gradients, y and dx alone are 0.49 of eager's
    peak (NOTES.md, sessions 21 and 25: recompute_plan keeps its chunks in the gradients)."""
    t = make_gated(m, d, h, d, torch.bfloat16, "cuda", False, seed=4)
    leaves = _leaves(t, GATED_NAMES)
    params = [leaves[n] for n in ("x", "gate_weight", "up_weight", "down_weight")]
    x, wg, wu, wd = params
    dy = t["dy"]

    def run(fn):
        def step():
            for p in params:
                p.grad = None
            fn().backward(dy)
        step()  # warm-up: compile, tune
        for p in params:
            p.grad = None
        return _peak_mb(step)

    eager = run(lambda: F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd))
    ours = run(lambda: gpu.gated_mlp(x, wg, wu, wd, "silu"))
    ours_rc = run(lambda: gpu.gated_mlp(x, wg, wu, wd, "silu", recompute=True))
    print(f"peak MB: eager {eager:.1f}, ours {ours:.1f}, ours recompute {ours_rc:.1f}")
    assert ours <= eager, (ours, eager)
    assert ours_rc <= 0.5 * eager, (ours_rc, eager)


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu2"])
def test_inference_ops_backward_gradcheck(fused_mlp, activation):
    """The inference custom ops (used for training only when called directly) carry a
    plain-PyTorch backward of their own: check it in float64."""
    F_ = fused_mlp.functional
    d = torch.float64
    g = torch.Generator().manual_seed(5)

    def leaf(*shape):
        return torch.randn(*shape, dtype=d, generator=g).requires_grad_()

    x, wg, wu, wd, bg, bd = leaf(2, 3, 8), leaf(12, 8), leaf(12, 8), leaf(8, 12), leaf(12), leaf(8)
    assert torch.autograd.gradcheck(
        lambda *t: F_._gated_mlp_op(t[0], t[1], t[2], t[3], activation, t[4], None, t[5]),
        (x, wg, wu, wd, bg, bd))
    fw, fb, pw = leaf(8, 12), leaf(12), leaf(12, 8)
    assert torch.autograd.gradcheck(
        lambda *t: F_._mlp_op(t[0], t[1], t[2], t[3], None, activation, "conv1d"), (x, fw, fb, pw))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 7), (777, 129), (4096, 1024)])
def test_gpu_column_sum(gpu, dtype, shape):
    """Bias gradients (column sums) by GEMV: as accurate as torch's sum against float64,
    within a factor 2, and no temporary of the input's size (torch's sum allocates ~2.75x
    its bf16 input at 8192 x 3072)."""
    tb = module(gpu, "triton_backward")
    t = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(7)).to(dtype)
    exact = t.double().sum(0)
    bound = 2 * rel_err(t.sum(0), exact) + 1e-3
    assert rel_err(tb.column_sum(t), exact) <= bound  # (also sets up cuBLAS's workspace)
    out = torch.full((shape[1],), float("nan"), device="cuda", dtype=dtype)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    tb.column_sum(t, out=out)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert rel_err(out, exact) <= bound
    if t.numel() >= 2**22:
        assert extra <= 2**20, f"column_sum allocated {extra} bytes for a {tuple(shape)} input"


@pytest.mark.gpu
def test_gpu_column_sum_ones_cache_and_graphs(gpu, monkeypatch):
    """column_sum's cached ones vector: right inside and after a CUDA graph capture that
    made the first one (not cached: its fill only runs on replay), and a graph captured on
    a cached vector still replays right after the cache has grown past it."""
    tb = module(gpu, "triton_backward")
    monkeypatch.setattr(tb, "_ONES", {})
    gen = torch.Generator("cuda").manual_seed(11)
    a = torch.randn(300, 40, device="cuda", generator=gen).to(torch.bfloat16)
    out = torch.empty(40, device="cuda", dtype=torch.bfloat16)
    exact = a.double().sum(0)
    bound = 2 * rel_err(a.sum(0), exact) + 1e-3
    torch.mv(a.t(), torch.ones(300, device="cuda", dtype=torch.bfloat16))  # cuBLAS set up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tb.column_sum(a, out=out)
    assert tb._ONES == {}, "a ones vector made during capture was cached"
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, exact) <= bound
    assert rel_err(tb.column_sum(a), exact) <= bound  # eager: makes and caches a vector
    (kept,) = tb._ONES.values()
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph2):
        tb.column_sum(a, out=out)  # on the cached vector
    big = torch.randn(5 * kept[-1].shape[0], 8, device="cuda", generator=gen).to(torch.bfloat16)
    assert rel_err(tb.column_sum(big), big.double().sum(0)) <= 2 * rel_err(big.sum(0), big.double().sum(0)) + 1e-3
    assert len(kept) == 2, "the cache did not grow (or dropped the vector a graph uses)"
    torch.cuda.empty_cache()
    out.fill_(float("nan"))
    graph2.replay()
    torch.cuda.synchronize()
    assert rel_err(out, exact) <= bound


@pytest.mark.parametrize("value", ["0", "-1", "64MB", "nan", "inf"])
def test_recompute_chunk_setting_is_checked(fused_mlp, monkeypatch, value):
    tb = module(fused_mlp, "triton_backward")
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", value)
    with pytest.raises(ValueError, match="FUSED_MLP_RECOMPUTE_CHUNK_MB"):
        tb.recompute_chunk_bytes()
    monkeypatch.setenv("FUSED_MLP_RECOMPUTE_CHUNK_MB", "0.5")
    assert tb.recompute_chunk_bytes() == 2**19


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "quick_gelu"])
def test_gpu_fast_tanh(gpu, monkeypatch, act):
    """The default tanh.approx forms against FUSED_MLP_FAST_TANH=0: the training forward and
    the dh kernel's derivative through tanh.approx.f32; bf16 gradients as close to float64 as the default
    forms' (and different from them: the fast kernels ran)."""
    monkeypatch.setenv("FUSED_MLP_SM90", "0")  # the training forward on the Triton kernel too
    d, h, o = ODD
    t = make_gated(777, d, h, o, torch.bfloat16, "cuda", True, seed=7)
    ref = ref_grads_gated(gpu, t, act)
    got = {}
    for env in ("0", "1"):
        monkeypatch.setenv("FUSED_MLP_FAST_TANH", env)
        got[env] = {n: g.cpu() for n, g in grads_gated(gpu, t, act).items()}
    check_grads(got["1"], ref, TOL[torch.bfloat16], f"gated {act} fast")
    assert any(not torch.equal(got["1"][n], got["0"][n]) for n in ref), "the fast form did not run"
    for n in ref:
        e_fast, e_base = rel_err(got["1"][n], ref[n]), rel_err(got["0"][n], ref[n])
        assert e_fast <= 1.5 * e_base + 1e-4, f"{act} {n}: fast {e_fast:.2e} against {e_base:.2e}"


def test_aot_fast_tanh_forms(fused_mlp):
    """FUSED_MLP_FAST_TANH's kernel forms compile for sm_90 without a GPU, with one
    tanh.approx.f32 and no exponential or division per element: the gated forward (TMA)
    and the dh kernel's derivative epilogue, for each sigmoid-based activation."""
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no ASTSource / GPUTarget")
    tg = module(fused_mlp, "triton_gemm")
    ids = fused_mlp.activations.ACTIVATION_IDS
    bm, bn, bk = 128, 64, 64
    fwd_types = {"x_desc": f"tensordesc<bf16[{bm}, {bk}]>", "w1_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                 "w2_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                 **{n: "*bf16" for n in ("b1_ptr", "b2_ptr", "out_ptr", "pre_ptr", "h_ptr")}}
    ptr_types = {n: "*bf16" for n in ("x_ptr", "w1_ptr", "w2_ptr", "b1_ptr", "b2_ptr", "out_ptr", "pre_ptr", "h_ptr")}
    try:
        for act in ("silu", "gelu_tanh", "quick_gelu"):
            fast = ids[act] + tg._FAST
            fwd = dict(GATED=True, ACTIVATION=fast, HAS_B1=False, HAS_B2=False, STORE_PRE=True, BWD=0,
                       STORE_H=False, SUBTILE=False, PREFETCH=False, W_KN=False, DOT_PRECISION="tf32",
                       BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PERSISTENT=False,
                       stride_on=1, stride_pn=1, stride_hn=1)
            dh = dict(GATED=False, ACTIVATION=fast, HAS_B1=False, HAS_B2=False, STORE_PRE=False, BWD=2,
                      STORE_H=True, SUBTILE=True, PREFETCH=False, EVEN_K=True, DOT_PRECISION="tf32",
                      BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, stride_xk=1, stride_w1n=1, stride_w2n=1,
                      stride_on=1, stride_pn=1, stride_hn=1)
            for fn, types, consts, warps in ((tg._fused_linear_kernel_tma, fwd_types, fwd, 8),
                                             (tg._fused_linear_kernel, ptr_types, dh, 4)):
                ptx = _aot_kernel(fn, types, consts, 90, warps, 3).asm["ptx"]
                assert "tanh.approx.f32" in ptx, (act, fn.__name__)
                assert "ex2.approx" not in ptx and "div.full.f32" not in ptx and "div.rn.f32" not in ptx, (act, fn.__name__)
    except (FileNotFoundError, subprocess_error()) as e:  # no ptxas in this Triton
        pytest.skip(f"cannot compile for CUDA here: {e}")


def test_aot_compile_options_keep_fma_contraction(fused_mlp, monkeypatch):
    """With Triton's default contraction turned off (TRITON_DEFAULT_FP_FUSION=0, the default
    Triton 3.10 announces), the package's compile options still give the kernel it was
    measured with: the gated forward's gelu_tanh epilogue keeps its fused multiply-adds (none
    without them). triton_gemm passes these options at every launch (test_interpret_launches_
    pass_compile_options), so its compiled kernels do not depend on that default."""
    pytest.importorskip("triton")
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no ASTSource / GPUTarget")
    tg = module(fused_mlp, "triton_gemm")
    ptr_types = {n: "*bf16" for n in ("x_ptr", "w1_ptr", "w2_ptr", "b1_ptr", "b2_ptr", "out_ptr", "pre_ptr", "h_ptr")}
    consts = dict(GATED=True, ACTIVATION=fused_mlp.activations.ACTIVATION_IDS["gelu_tanh"], HAS_B1=True, HAS_B2=True,
                  STORE_PRE=False, BWD=0, STORE_H=False, SUBTILE=False, PREFETCH=False, EVEN_K=True,
                  DOT_PRECISION="tf32", BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, stride_xk=1, stride_w1n=1,
                  stride_w2n=1, stride_on=1, stride_pn=1, stride_hn=1)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    monkeypatch.delenv("TRITON_FORCE_DISABLE_FP_FUSION", raising=False)
    try:
        ours, plain = (_aot_kernel(tg._fused_linear_kernel, ptr_types, consts, 90, 8, 3, package_options=p).asm["ptx"]
                       for p in (True, False))
    except (FileNotFoundError, subprocess_error()) as e:  # no ptxas in this Triton
        pytest.skip(f"cannot compile for CUDA here: {e}")
    assert "fma.rn.f32" in ours
    assert "fma.rn.f32" not in plain  # the switch is real: without the options, no contraction


def test_fast_tanh_is_default_for_16_bit_only(fused_mlp, monkeypatch):
    """The launch's ACTIVATION constant: the fast form by default for 16-bit outputs and the
    sigmoid-based activations, the exact form with FUSED_MLP_FAST_TANH=0, for fp32, for erf
    GELU, and always under the interpreter."""
    tg = module(fused_mlp, "triton_gemm")
    ids = fused_mlp.activations.ACTIVATION_IDS
    out16, out32 = torch.empty(2, 2, dtype=torch.bfloat16), torch.empty(2, 2)
    monkeypatch.setattr(tg, "INTERPRETED", False)
    monkeypatch.delenv("FUSED_MLP_FAST_TANH", raising=False)
    assert tg._kernel_activation(ids["silu"], out16) == ids["silu"] + tg._FAST
    assert tg._kernel_activation(ids["quick_gelu"], out16) == ids["quick_gelu"] + tg._FAST
    monkeypatch.setenv("FUSED_MLP_FAST_TANH", "0")
    assert tg._kernel_activation(ids["silu"], out16) == ids["silu"]
    monkeypatch.setenv("FUSED_MLP_FAST_TANH", "1")
    assert tg._kernel_activation(ids["gelu_tanh"], out16) == ids["gelu_tanh"] + tg._FAST
    assert tg._kernel_activation(ids["silu"], out32) == ids["silu"]
    assert tg._kernel_activation(ids["gelu"], out16) == ids["gelu"]  # erf GELU has no tanh form
    monkeypatch.setattr(tg, "INTERPRETED", True)
    assert tg._kernel_activation(ids["gelu_tanh"], out16) == ids["gelu_tanh"]


# ----------------------------------------------------------------------------- sm_90a dh kernel


# (M, K = model dim, N = hidden). The gated kind takes its narrow form (128 x 128 tiles, g | u
# loaded by TMA) for K <= 768 and the wide one above: the last two shapes.
DACT_SHAPES = [(1, 64, 8), (3, 136, 200), (777, 520, 1000), (300, 1000, 264), (129, 1032, 136)]


@pytest.mark.gpu
@pytest.mark.parametrize("narrow", ["default", "off"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ["identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"])
def test_gpu_sm90_dact(fused_mlp, dtype, act, narrow, monkeypatch):
    """dact_gemm_sm90 against float64: dh = dy @ W with the derivative epilogue, gated and
    plain, W as [K, N] (N-major) and, for the plain MLP, as [N, K] (K-major), in place and
    into a separate buffer (poisoned), on awkward shapes; narrow "off"
    (FUSED_MLP_SM90_NARROW_DH=0) runs the gated kind alone, its shapes of K <= 768 on the wide
    kind too."""
    need_sm90(fused_mlp)
    if narrow == "off":
        monkeypatch.setenv("FUSED_MLP_SM90_NARROW_DH", "0")
    acts = fused_mlp.activations
    f, df = acts.torch_activation(act), acts.torch_activation_derivative(act)
    aid = acts.ACTIVATION_IDS[act]
    tol = TOL[dtype]
    for i, (m, k, n) in enumerate(DACT_SHAPES):
        gen = torch.Generator().manual_seed(i)
        dy = torch.randn(m, k, generator=gen, dtype=torch.float64).to("cuda", dtype)
        w_nk = (torch.randn(n, k, generator=gen, dtype=torch.float64) * k**-0.5).to("cuda", dtype)
        w_kn = w_nk.t().contiguous()
        dh = dy.double() @ w_nk.double().t()
        # the switch only concerns the gated kind: "off" runs that one alone (drawn first, so its
        # inputs are the same as under "default")
        kinds = ((True, True),) if narrow == "off" else ((True, True), (False, True), (False, False))
        for gated, weight_kn in kinds:
            pre = torch.randn(m, 2 * n if gated else n, generator=gen, dtype=torch.float64).to("cuda", dtype)
            p64 = pre.double()
            if gated:
                g, u = p64[:, :n], p64[:, n:]
                want = torch.cat([dh * u * df(g), dh * f(g)], 1)
            else:
                want = dh * df(p64)
            for inplace in (False, True):
                out = pre.clone() if inplace else torch.full_like(pre, float("nan"))
                fused_mlp.ops.dact_gemm_sm90(out, dy, w_kn if weight_kn else w_nk, out if inplace else pre, aid,
                                             gated, weight_kn)
                what = f"M={m} K={k} N={n} {act} gated={gated} weight_kn={weight_kn} inplace={inplace}"
                err = rel_err(out.cpu(), want.cpu())
                assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


@pytest.mark.gpu
def test_gpu_sm90_dact_is_dispatched(fused_mlp, monkeypatch):
    """Training on sm_90 runs the dh kernel through linear_dact (gated and plain MLP, the
    nn.Linear and Conv1D layouts each as they are) where it has a tile per SM, the Triton
    kernel with fewer; gradients right."""
    need_sm90(fused_mlp)
    monkeypatch.setenv("FUSED_MLP_AUTOTUNE", "0")
    monkeypatch.setenv("FUSED_MLP_SM90_TRAIN", "0")  # the Python path's calls (the C++ nodes call the op)
    sm90 = module(fused_mlp, "sm90")
    calls = spy(monkeypatch, sm90, "dact", lambda a: a[2])  # w_kn
    d, h, o = ODD
    t = make_gated(777, d, h, o, torch.bfloat16, "cuda", True, seed=31)
    # 7 x 2 tiles: fewer than the SMs, so the Triton kernel
    check_grads(grads_gated(fused_mlp, t, "gelu_tanh"), ref_grads_gated(fused_mlp, t, "gelu_tanh"),
                TOL[torch.bfloat16], "few tiles")
    assert calls == []
    monkeypatch.setattr(sm90, "_sm_count", lambda index: 1)  # the same shapes taken as enough tiles
    check_grads(grads_gated(fused_mlp, t, "gelu_tanh"), ref_grads_gated(fused_mlp, t, "gelu_tanh"),
                TOL[torch.bfloat16], "gated")
    assert calls == [True]
    for layout in ("linear", "conv1d"):
        calls.clear()
        p = make_plain(777, d, h, o, torch.bfloat16, "cuda", True, layout, seed=32)
        check_grads(grads_plain(fused_mlp, p, "gelu_tanh", layout), ref_grads_plain(fused_mlp, p, "gelu_tanh", layout),
                    TOL[torch.bfloat16], f"plain {layout}")
        assert calls == [layout == "linear"]
    calls.clear()
    monkeypatch.setenv("FUSED_MLP_SM90", "0")
    check_grads(grads_gated(fused_mlp, t, "gelu_tanh"), ref_grads_gated(fused_mlp, t, "gelu_tanh"),
                TOL[torch.bfloat16], "off")
    assert calls == []


@pytest.mark.gpu
def test_gpu_sm90_dact_narrow_is_dispatched(fused_mlp, monkeypatch):
    """The gated dh op launches its narrow kind (template argument BN = 64) for K <= 768, and
    the wide one (BN = 128) above that or under FUSED_MLP_SM90_NARROW_DH=0: the kernel names
    torch.profiler records (their results are bit-identical, so only the names tell)."""
    need_sm90(fused_mlp)
    op = fused_mlp.ops.dact_gemm_sm90
    aid = fused_mlp.activations.ACTIVATION_IDS["gelu_tanh"]
    bf = dict(device="cuda", dtype=torch.bfloat16)

    def launched_bn(k, switch):
        if switch is None:
            monkeypatch.delenv("FUSED_MLP_SM90_NARROW_DH", raising=False)
        else:
            monkeypatch.setenv("FUSED_MLP_SM90_NARROW_DH", switch)
        dy, w, pre = torch.randn(256, k, **bf), torch.randn(k, 136, **bf), torch.randn(256, 272, **bf)
        return int(sm90_template_args(lambda: op(torch.empty_like(pre), dy, w, pre, aid, True, True))[2])

    assert launched_bn(768, None) == 64
    assert launched_bn(768, "0") == 128
    assert launched_bn(776, None) == 128


@pytest.mark.gpu
def test_gpu_sm90_dact_rejects_bad_input(fused_mlp):
    need_sm90(fused_mlp)
    op = fused_mlp.ops.dact_gemm_sm90
    bf = dict(device="cuda", dtype=torch.bfloat16)
    dy, w, pre = torch.randn(64, 64, **bf), torch.randn(64, 64, **bf), torch.randn(64, 128, **bf)
    with pytest.raises(RuntimeError, match="dtype"):
        op(pre.float(), dy.float(), w.float(), pre.float(), 1, True, True)
    with pytest.raises(RuntimeError, match="pre must be"):
        op(pre, dy, w, pre, 1, False, True)
    with pytest.raises(RuntimeError, match="out must have"):
        op(torch.empty(64, 64, **bf), dy, w, pre, 1, True, True)
    with pytest.raises(RuntimeError, match="weight must be"):
        op(pre, dy, torch.randn(32, 64, **bf), pre, 1, True, True)
    with pytest.raises(RuntimeError, match="weight must be"):
        op(pre[:, :64], dy, torch.randn(64, 32, **bf), pre[:, :64], 1, False, False)
    with pytest.raises(RuntimeError, match="weight_kn"):
        op(pre, dy, w, pre, 1, True, False)
    with pytest.raises(RuntimeError, match="activation id"):
        op(pre, dy, w, pre, 99, True, True)


# ----------------------------------------------------------------------------- the C++ training nodes

PACKED_NAMES = ("x", "gate_up_weight", "down_weight", "gate_up_bias", "down_bias")
NODE_NAMES = {"gated": GATED_NAMES, "packed": PACKED_NAMES, "plain": PLAIN_NAMES, "conv1d": PLAIN_NAMES}
NODE = {"gated": "GatedTrainSm90", "packed": "GatedTrainSm90", "plain": "PlainTrainSm90",
        "conv1d": "PlainTrainSm90"}
NODE_KINDS = tuple(NODE)  # "conv1d": the plain MLP with GPT-2's Conv1D weights ([in, out])


def _node_name(y) -> str:
    return y.grad_fn.name() if y.grad_fn is not None else ""


def make_node_case(kind, m, dtype, bias, seed):
    """Inputs of one MLP of `kind` ("gated", "packed": the gate_up weight [Wg; Wu], "plain",
    "conv1d") on ODD's sizes, on the GPU."""
    d, h, o = ODD
    if kind in ("plain", "conv1d"):
        return make_plain(m, d, h, o, dtype, "cuda", bias, _layout(kind), seed=seed)
    t = make_gated(m, d, h, o, dtype, "cuda", bias, seed=seed)
    if kind == "gated":
        return t
    return {"x": t["x"], "gate_up_weight": torch.cat([t["gate_weight"], t["up_weight"]]),
            "down_weight": t["down_weight"], "down_bias": t["down_bias"], "dy": t["dy"],
            "gate_up_bias": torch.cat([t["gate_bias"], t["up_bias"]]) if bias else None}


def _layout(kind) -> str:
    return "conv1d" if kind == "conv1d" else "linear"


def _node_call(fm, kind, a, act, x=None, **kw):
    """The public function of `kind` on the tensors a (x replaced by `x` if given)."""
    x = a["x"] if x is None else x
    if kind == "gated":
        return fm.gated_mlp(x, a["gate_weight"], a["up_weight"], a["down_weight"], act, gate_bias=a["gate_bias"],
                            up_bias=a["up_bias"], down_bias=a["down_bias"], **kw)
    if kind == "packed":
        return fm.gated_mlp_packed(x, a["gate_up_weight"], a["down_weight"], act, gate_up_bias=a["gate_up_bias"],
                                   down_bias=a["down_bias"], **kw)
    return fm.mlp(x, a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], act, _layout(kind), **kw)


def _node_ref(fm, kind, a, act):
    """reference.py's function of `kind` on the tensors a (float64 autograd through it)."""
    r = fm.reference
    if kind in ("plain", "conv1d"):
        return r.mlp(a["x"], a["fc_weight"], a["fc_bias"], a["proj_weight"], a["proj_bias"], act, _layout(kind))
    if kind == "gated":
        wg, wu, bg, bu = a["gate_weight"], a["up_weight"], a["gate_bias"], a["up_bias"]
    else:
        h = a["gate_up_weight"].shape[0] // 2
        wg, wu, b = a["gate_up_weight"][:h], a["gate_up_weight"][h:], a["gate_up_bias"]
        bg, bu = (None, None) if b is None else (b[:h], b[h:])
    return r.gated_mlp(a["x"], wg, wu, a["down_weight"], act, bg, bu, a["down_bias"])


def _node_ref_grads(fm, kind, t, act):
    a = _leaves(t, NODE_NAMES[kind], torch.float64, "cpu")
    _node_ref(fm, kind, a, act).backward(t["dy"].double().cpu())
    return {n: v.grad for n, v in a.items() if v is not None}


def _train(fm, kind, t, act, requires=None, lead_x=None):
    """(y, {name: grad}) of one eager training call of `kind` on t, dy = t["dy"]."""
    a = _leaves(t, NODE_NAMES[kind], requires=requires)
    x = a["x"] if lead_x is None else a["x"].view(*lead_x, -1, a["x"].shape[-1])
    y = _node_call(fm, kind, a, act, x)
    y.backward(t["dy"].view(y.shape))
    return y, {n: v.grad for n, v in a.items() if v is not None and v.grad is not None}


# Inputs that require grad in the partial cases (names of absent biases are ignored).
NODE_PARTIAL = {
    "gated": [{"gate_weight", "up_weight", "down_weight"}, {"x", "down_weight", "up_bias"}],
    "packed": [{"gate_up_weight", "down_bias"}, {"x"}],
    "plain": [{"fc_weight", "proj_weight", "proj_bias"}, {"x", "fc_bias"}],
    "conv1d": [{"fc_weight", "proj_bias"}, {"x", "proj_weight"}],
}


@pytest.mark.gpu
@pytest.mark.parametrize("train_fwd", ["fused", "unfused"])
@pytest.mark.parametrize("kind", NODE_KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sm90_train_node(gpu, monkeypatch, dtype, kind, train_fwd):
    """Eager training runs as train_sm90.cu's C++ autograd node where the sm_90a kernels take it
    (the SM count is patched so that small odd shapes do): the gated MLP and the packed one
    (GatedTrainSm90) and the plain MLP in nn.Linear's and Conv1D's layouts (PlainTrainSm90),
    with and without biases. Each gives the Python path's bits (FUSED_MLP_SM90_TRAIN=0: the same kernels in the
    same order) for every activation, x with leading dimensions, and only some inputs requiring
    grad; and is right against float64. The gated kinds both ways of their forward's gate/up
    stage (FUSED_MLP_SM90_TRAIN_FWD: the fused kernel storing g | u, or without biases cuBLAS +
    act_and_mul)."""
    need_sm90(gpu)
    if train_fwd == "unfused" and kind not in ("gated", "packed"):
        pytest.skip("the plain MLP's forward has no unfused form")
    monkeypatch.setenv("FUSED_MLP_SM90_TRAIN_FWD", train_fwd)
    monkeypatch.setattr(module(gpu, "sm90"), "_sm_count", lambda index: 1)
    for i, act in enumerate(ACTS):
        for bias in (False, True):
            t = make_node_case(kind, 777, dtype, bias, seed=70 + 2 * i + bias)
            cases = [("all", None, None)]
            if i == 0:
                cases += [("x [3, 259, D]", None, (3,))] + [(f"only {r}", r, None) for r in NODE_PARTIAL[kind]]
            for what, requires, lead in cases:
                what = f"{kind} {act} bias={bias} {what}"
                monkeypatch.delenv("FUSED_MLP_SM90_TRAIN", raising=False)
                y, got = _train(gpu, kind, t, act, requires, lead)
                assert NODE[kind] in _node_name(y), (what, _node_name(y))
                monkeypatch.setenv("FUSED_MLP_SM90_TRAIN", "0")
                y0, want = _train(gpu, kind, t, act, requires, lead)
                assert "Sm90" not in _node_name(y0), (what, _node_name(y0))
                assert torch.equal(y, y0), what
                assert set(got) == set(want), (what, sorted(got), sorted(want))
                for n in want:
                    assert torch.equal(got[n], want[n]), f"{what}: {n}.grad differs from the Python path's"
                if requires is None and lead is None:
                    check_grads(got, _node_ref_grads(gpu, kind, t, act), TOL[dtype], f"C++ node: {what}")


def test_train_forward_unfused_rule(fused_mlp, monkeypatch):
    """Which training forwards take cuBLAS + act_and_mul for the gate/up stage
    (sm90.train_forward_unfused): SwiGLU's M 4096, 4096 -> 14336 does, GeGLU d768 does not (the
    shapes measured in session 27: d 4096 from M 1024 up), FUSED_MLP_SM90_TRAIN_FWD overrides the rule,
    and gate / up biases keep the fused kernel either way."""
    rule = module(fused_mlp, "sm90").train_forward_unfused
    monkeypatch.delenv("FUSED_MLP_SM90_TRAIN_FWD", raising=False)
    assert rule(4096, 4096, 14336) and rule(1024, 4096, 14336)
    assert not rule(8192, 768, 3072) and not rule(4096, 2048, 8192) and not rule(512, 4096, 14336)
    monkeypatch.setenv("FUSED_MLP_SM90_TRAIN_FWD", "fused")
    assert not rule(4096, 4096, 14336)
    monkeypatch.setenv("FUSED_MLP_SM90_TRAIN_FWD", "unfused")
    assert rule(8192, 768, 3072)
    assert not rule(4096, 4096, 14336, biased=True)  # biases keep the fused kernel


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["gated", "packed"])
def test_gpu_sm90_train_forward_unfused_is_dispatched(gpu, monkeypatch, kind):
    """Where the rule says so (its bounds patched down to this small shape) the node's forward
    runs cuBLAS + act_and_mul and no gated_gemm_kernel, and the fused kernel otherwise or with
    biases: the kernels torch.profiler records; on the Python path (FUSED_MLP_SM90_TRAIN=0) too."""
    from torch.profiler import ProfilerActivity, profile

    need_sm90(gpu)
    sm90 = module(gpu, "sm90")
    monkeypatch.setattr(sm90, "_sm_count", lambda index: 1)
    monkeypatch.delenv("FUSED_MLP_SM90_TRAIN_FWD", raising=False)

    def forward_kernels(t):
        a = _leaves(t, NODE_NAMES[kind])
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            y = _node_call(gpu, kind, a, "silu")
            torch.cuda.synchronize()
        names = [e.name for e in prof.events()]
        return (any("gated_gemm_kernel<" in n for n in names), any("act_and_mul" in n for n in names),
                _node_name(y))

    for python_path in (False, True):
        if python_path:
            monkeypatch.setenv("FUSED_MLP_SM90_TRAIN", "0")
        for bias in (False, True):
            t = make_node_case(kind, 777, torch.bfloat16, bias, seed=91)
            what = f"python_path={python_path} bias={bias}"
            monkeypatch.setattr(sm90, "_UNFUSED_MIN_K", 1)
            monkeypatch.setattr(sm90, "_UNFUSED_MIN_MN", 1)
            fused, act_mul, name = forward_kernels(t)
            assert (fused, act_mul) == (bias, not bias), (what, name)
            assert ("Sm90" in name) != python_path, (what, name)
            monkeypatch.setattr(sm90, "_UNFUSED_MIN_K", 1 << 30)
            fused, act_mul, name = forward_kernels(t)
            assert (fused, act_mul) == (True, False), (what, name)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", NODE_KINDS)
def test_gpu_sm90_train_node_graph_kept_and_double_backward(gpu, monkeypatch, kind):
    """retain_graph=True keeps the saved pre-activations intact (a second backward adds the same
    gradients again); dy with zero strides (y.sum()) is copied for the kernels; create_graph=True
    gives a differentiable backward: its second-order gradients against float64 are within
    twice the Python path's own error (both are bf16 PyTorch ops, in different orders)."""
    need_sm90(gpu)
    monkeypatch.setattr(module(gpu, "sm90"), "_sm_count", lambda index: 1)
    names = NODE_NAMES[kind]
    t = make_node_case(kind, 777, torch.bfloat16, kind != "gated", seed=80)
    a = _leaves(t, names)
    y = _node_call(gpu, kind, a, "gelu_tanh")
    assert NODE[kind] in _node_name(y)
    y.backward(t["dy"], retain_graph=True)
    first = {n: v.grad.clone() for n, v in a.items() if v is not None}
    y.backward(t["dy"])
    for n, g in first.items():
        assert torch.equal(a[n].grad, 2 * g), f"{n}: the second backward read overwritten pre-activations"

    b = _leaves(t, names)
    _node_call(gpu, kind, b, "silu").sum().backward()  # dy: ones expanded, zero strides
    ones = {**t, "dy": torch.ones_like(t["dy"])}
    check_grads({n: b[n].grad for n in first}, _node_ref_grads(gpu, kind, ones, "silu"), TOL[torch.bfloat16],
                "y.sum()")

    r = _leaves(t, names, torch.float64, "cpu")
    (gxr,) = torch.autograd.grad(_node_ref(gpu, kind, r, "silu"), r["x"], t["dy"].double().cpu(), create_graph=True)
    (gxr**2).sum().backward()
    want = {n: r[n].grad for n in first}
    want["gx"] = gxr.detach()
    second = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("FUSED_MLP_SM90_TRAIN", setting)
        c = _leaves(t, names)
        y = _node_call(gpu, kind, c, "silu")
        assert (NODE[kind] in _node_name(y)) == (setting == "1")
        (gx,) = torch.autograd.grad(y, c["x"], t["dy"], create_graph=True)
        assert gx.requires_grad
        (gx.float() ** 2).sum().backward()
        second[setting] = {n: c[n].grad for n in first}
        second[setting]["gx"] = gx.detach()
    for n, w in want.items():
        if w is None:  # the output bias does not reach x's gradient: no second-order gradient
            assert all(second[s_][n] is None for s_ in second), n
            continue
        err = {s_: rel_err(second[s_][n].cpu(), w) for s_ in second}
        assert err["1"] <= 2 * err["0"] + 1e-3, f"create_graph: {n} error {err['1']:.2e} (Python path {err['0']:.2e})"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", NODE_KINDS)
def test_gpu_sm90_train_node_not_taken(gpu, monkeypatch, kind):
    """The Python Functions keep shapes with fewer dh tiles than SMs, recompute=True, fp32,
    FUSED_MLP_SM90_TRAIN=0 and FUSED_MLP_BWD_DX=triton (gated). The few-tile case is checked
    against float64 here; the others' gradients are test_gpu_matrix's and
    test_gpu_dx_modes_and_chunks'."""
    need_sm90(gpu)
    t = make_node_case(kind, 777, torch.bfloat16, True, seed=90)

    def node(tc, **kw):
        return _node_name(_node_call(gpu, kind, _leaves(tc, NODE_NAMES[kind]), "silu", **kw))

    assert NODE[kind] not in node(t)  # 7 x 2 dh tiles: fewer than the SMs
    _, got = _train(gpu, kind, t, "silu")
    check_grads(got, _node_ref_grads(gpu, kind, t, "silu"), TOL[torch.bfloat16], f"{kind}, few tiles")
    monkeypatch.setattr(module(gpu, "sm90"), "_sm_count", lambda index: 1)
    assert NODE[kind] in node(t)
    assert NODE[kind] not in node(t, recompute=True)
    assert NODE[kind] not in node({k: (v.float() if v is not None else None) for k, v in t.items()})
    envs = [("FUSED_MLP_SM90_TRAIN", "0")] + ([("FUSED_MLP_BWD_DX", "triton")] if kind in ("gated", "packed") else [])
    for env, value in envs:
        monkeypatch.setenv(env, value)
        assert NODE[kind] not in node(t), env
        monkeypatch.delenv(env)


@pytest.mark.gpu
def test_gpu_sm90_train_node_first_backward_of_a_process(fused_mlp, tmp_path):
    """The C++ node's backward as the very first CUDA work of autograd's worker thread (a fresh
    process): its kernels must not depend on an earlier runtime call having made the device's
    context current on that thread (cuTensorMapEncodeTiled failed with error 201 before
    check_common set the device)."""
    need_sm90(fused_mlp)
    script = (
        "import torch\n"
        "from kernels import get_kernel\n"
        "fm = get_kernel('org/fused-mlp', version=1)\n"
        "bf = dict(device='cuda', dtype=torch.bfloat16)\n"
        "x = torch.randn(4096, 1024, **bf).requires_grad_()\n"
        "wg, wu = (torch.randn(2816, 1024, **bf).div(32).requires_grad_() for _ in range(2))\n"
        "wd = torch.randn(1024, 2816, **bf).div(53).requires_grad_()\n"
        "y = fm.gated_mlp(x, wg, wu, wd, 'silu')\n"
        "assert 'GatedTrainSm90' in y.grad_fn.name(), y.grad_fn.name()\n"
        "y.backward(torch.randn_like(y))\n"
        "assert all(torch.isfinite(t.grad).all() for t in (x, wg, wu, wd))\n"
        "print('ok')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_sm90_train_node_not_on_cpu(fused_mlp):
    """On CPU tensors (and in builds without the sm_90a files) the dispatcher never offers the
    C++ nodes: sm90_train and sm90_mlp_train are None and training keeps the Python Functions."""
    t = make_gated(5, 8, 16, 8, torch.float32, "cpu", True)
    a = _leaves(t, GATED_NAMES)
    assert fused_mlp.dispatch.sm90_train(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu") is None
    y = fused_mlp.gated_mlp(a["x"], a["gate_weight"], a["up_weight"], a["down_weight"], "silu")
    assert "Sm90" not in _node_name(y) and y.grad_fn is not None
    p = _leaves(make_plain(5, 8, 16, 8, torch.float32, "cpu", True, "linear"), PLAIN_NAMES)
    args = (p["x"], p["fc_weight"], p["fc_bias"], p["proj_weight"], p["proj_bias"], "gelu_tanh")
    assert fused_mlp.dispatch.sm90_mlp_train(*args, "linear") is None
    y = fused_mlp.mlp(*args)
    assert "Sm90" not in _node_name(y) and y.grad_fn is not None
    c = _leaves(make_plain(5, 8, 16, 8, torch.float32, "cpu", True, "conv1d"), PLAIN_NAMES)
    args = (c["x"], c["fc_weight"], c["fc_bias"], c["proj_weight"], c["proj_bias"], "gelu_tanh")
    assert fused_mlp.dispatch.sm90_mlp_train(*args, "conv1d") is None
