"""Tests of the few-token ("decode") MLP kernels: fused_mlp.decode.

Every GPU result is compared with fused_mlp.reference evaluated in float64 on the same
(rounded) inputs, on fresh random inputs, with the compiled ops writing into
NaN-poisoned outputs. The CPU test runs in CI: the CPU build has no decode ops.
"""

from __future__ import annotations

import pytest
import torch

from conftest import poison_like, rel_err, submodule

ACTIVATIONS = ("identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Norm-wise relative error bounds: one or two roundings to the output dtype (fp32
# accumulation inside), fp32 accumulation error for float32.
TOL = {torch.bfloat16: 1.2e-2, torch.float16: 2e-3, torch.float32: 2e-5}
MS = (1, 2, 7, 16, 33, 64)


@pytest.fixture(scope="module")
def dec(fused_mlp):
    return submodule(fused_mlp, "decode")


# ----------------------------------------------------------------------------- CPU (CI)


def test_decode_not_available_on_cpu(fused_mlp, dec):
    assert dec.MAX_M == 64
    assert dec.available(torch.device("cpu")) is False
    if torch.version.cuda is None:
        # The CPU variant defines no decode ops at all.
        assert dec.available(torch.device("cuda")) is False
        assert not hasattr(fused_mlp.ops, "decode_gate_up")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_refuses_autodiff(fused_mlp, dec, device):
    """The decode kernels have no derivative: where one would be wanted they raise (before
    any kernel runs, so the CPU build checks it too) instead of returning a result without
    its gradient or tangent. The dispatcher's own calls take the unchecked forms."""
    import torch.autograd.forward_ad as fwAD

    x = torch.randn(2, 16, device=device)
    wg, wu, wd = (torch.randn(24, 16, device=device) for _ in range(3))
    wd = wd.t().contiguous()
    w = torch.nn.Parameter(torch.randn(24, 16, device=device))  # a model's weight: requires grad
    with pytest.raises(RuntimeError, match="decode.gate_up has no derivative.*gate_weight requires grad"):
        dec.gate_up(x, w, wu)
    with pytest.raises(RuntimeError, match="decode.linear has no derivative.*bias requires grad"):
        dec.linear(x, wg, torch.zeros(24, device=device, requires_grad=True))
    with pytest.raises(RuntimeError, match="decode.gated_mlp has no derivative.*x2d requires grad"):
        dec.gated_mlp(x.clone().requires_grad_(), wg, wu, wd)
    with pytest.raises(RuntimeError, match="decode.mlp has no derivative.*proj_weight requires grad"):
        dec.mlp(x, wg, None, torch.nn.Parameter(wd), None, "gelu")
    with pytest.raises(RuntimeError, match="decode.gated_mlp has no derivative.*torch.func transform"):
        torch.func.vmap(lambda t: dec.gated_mlp(t[None], wg, wu, wd))(x)
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="decode.linear has no derivative.*forward-mode AD"):
            dec.linear(fwAD.make_dual(x, torch.ones_like(x)), wg)
    if dec.available(torch.device(device)):
        with torch.no_grad():  # grad mode off: a Parameter is fine
            got = dec.gate_up(x, w, wu)
        want = fused_mlp.reference.act_and_mul(torch.cat([x.double() @ w.detach().double().t(),
                                                          x.double() @ wu.double().t()], 1), "silu")
        assert rel_err(got, want) <= TOL[torch.float32]


# ----------------------------------------------------------------------------- helpers


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float32, generator=gen) * scale).to(dtype)


def _weights(n, k, dtype, gen):
    # Pre-activations of order 1 for x ~ N(0, 1).
    return _randn((n, k), dtype, gen, scale=k**-0.5)


def _maybe_bias(n, dtype, gen, with_bias):
    return _randn((n,), dtype, gen, scale=0.5) if with_bias else None


def _d(t):
    return None if t is None else t.double()


def _ref_gate_up(fused_mlp, x, wg, wu, bg, bu, act):
    g = torch.nn.functional.linear(x.double(), wg.double(), _d(bg))
    u = torch.nn.functional.linear(x.double(), wu.double(), _d(bu))
    return fused_mlp.reference.act_and_mul(torch.cat([g, u], dim=-1), act)


def _ref_linear(fused_mlp, x, w, b, act):
    y = torch.nn.functional.linear(x.double(), w.double(), _d(b))
    return fused_mlp.activations.torch_activation(act)(y)


def _act_id(fused_mlp, act):
    return fused_mlp.activations.activation_id(act)


def _check(out, ref, dtype, what=""):
    assert out.dtype == dtype
    assert out.shape == ref.shape
    err = rel_err(out, ref)
    assert err <= TOL[dtype], f"{what}: relative error {err:.3e} > {TOL[dtype]:.1e}"


# ----------------------------------------------------------------------------- GPU tests

gpu = pytest.mark.gpu


@gpu
def test_available_on_cuda(dec):
    assert dec.available(torch.device("cuda")) is True
    assert dec.available("cuda:0") is True


@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D,H", [(1000, 3000), (256, 520), (64, 8)])
@pytest.mark.parametrize("M", MS)
def test_gate_up(fused_mlp, dec, M, D, H, dtype, with_bias):
    gen = _gen(1000 * M + D + H)
    x = _randn((M, D), dtype, gen)
    wg, wu = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen)
    bg, bu = _maybe_bias(H, dtype, gen, with_bias), _maybe_bias(H, dtype, gen, with_bias)
    ref = _ref_gate_up(fused_mlp, x, wg, wu, bg, bu, "silu")
    # Raw op into a poisoned output ...
    out = poison_like(torch.empty((M, H), device="cuda", dtype=dtype))
    fused_mlp.ops.decode_gate_up(out, x, wg, wu, bg, bu, _act_id(fused_mlp, "silu"))
    _check(out, ref, dtype, "ops.decode_gate_up")
    # ... and the Python face.
    _check(dec.gate_up(x, wg, wu, bg, bu, "silu"), ref, dtype, "decode.gate_up")


@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("K,N", [(3000, 1000), (1000, 3000), (512, 40), (64, 5000)])
@pytest.mark.parametrize("M", MS)
def test_linear(fused_mlp, dec, M, K, N, dtype, with_bias):
    gen = _gen(7 + 1000 * M + K + N)
    x = _randn((M, K), dtype, gen)
    w = _weights(N, K, dtype, gen)
    b = _maybe_bias(N, dtype, gen, with_bias)
    ref = _ref_linear(fused_mlp, x, w, b, "identity")
    out = poison_like(torch.empty((M, N), device="cuda", dtype=dtype))
    fused_mlp.ops.decode_linear(out, x, w, b, 0)
    _check(out, ref, dtype, "ops.decode_linear")
    _check(dec.linear(x, w, b), ref, dtype, "decode.linear")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("M", [1, 16, 40])
def test_activations(fused_mlp, dec, M, act, dtype):
    gen = _gen(31 * M + ACTIVATIONS.index(act))
    D, H = 512, 1032
    x = _randn((M, D), dtype, gen)
    wg, wu = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen)
    bg, bu = _maybe_bias(H, dtype, gen, True), _maybe_bias(H, dtype, gen, True)
    _check(dec.gate_up(x, wg, wu, bg, bu, act), _ref_gate_up(fused_mlp, x, wg, wu, bg, bu, act), dtype,
           f"gate_up {act}")
    _check(dec.linear(x, wg, bg, act), _ref_linear(fused_mlp, x, wg, bg, act), dtype, f"linear {act}")


@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", MS)
def test_gated_mlp(fused_mlp, dec, M, dtype, with_bias):
    gen = _gen(5 + M)
    D, H = 1024, 2816
    x = _randn((M, D), dtype, gen)
    wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
    bg, bu, bd = (_maybe_bias(n, dtype, gen, with_bias) for n in (H, H, D))
    y = dec.gated_mlp(x, wg, wu, wd, "silu", bg, bu, bd)
    ref = fused_mlp.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), "silu",
                                        _d(bg), _d(bu), _d(bd))
    _check(y, ref, dtype, "gated_mlp")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 7, 33])
def test_gated_mlp_packed_slices(fused_mlp, dec, M, dtype):
    """gate/up as row slices of one packed [2H, D] weight (different base pointers)."""
    gen = _gen(11 + M)
    D, H = 768, 2048
    x = _randn((M, D), dtype, gen)
    gate_up_w = _weights(2 * H, D, dtype, gen)
    gate_up_b = _randn((2 * H,), dtype, gen, 0.5)
    wd = _weights(D, H, dtype, gen)
    y = dec.gated_mlp(x, gate_up_w[:H], gate_up_w[H:], wd, "gelu_tanh", gate_up_b[:H], gate_up_b[H:], None)
    ref = fused_mlp.reference.gated_mlp_packed(x.double(), gate_up_w.double(), wd.double(), "gelu_tanh",
                                               gate_up_b.double(), None)
    _check(y, ref, dtype, "packed gated_mlp")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 16, 64])
def test_mlp(fused_mlp, dec, M, dtype):
    gen = _gen(17 + M)
    D, H = 768, 3072
    x = _randn((M, D), dtype, gen)
    fc_w, proj_w = _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
    fc_b, proj_b = _randn((H,), dtype, gen, 0.5), _randn((D,), dtype, gen, 0.5)
    y = dec.mlp(x, fc_w, fc_b, proj_w, proj_b, "gelu_tanh")
    ref = fused_mlp.reference.mlp(x.double(), fc_w.double(), _d(fc_b), proj_w.double(), _d(proj_b), "gelu_tanh")
    _check(y, ref, dtype, "mlp")


@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [1, 9, 33, 64])
def test_odd_dims_take_the_scalar_path(fused_mlp, dec, M, dtype):
    """D = 1001 (rows not 16-byte aligned): the CUDA-core path, still exact."""
    gen = _gen(23 + M)
    D, H = 1001, 333
    x = _randn((M, D), dtype, gen)
    wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
    bg = _randn((H,), dtype, gen, 0.5)
    _check(dec.gate_up(x, wg, wu, bg, None, "relu2"), _ref_gate_up(fused_mlp, x, wg, wu, bg, None, "relu2"),
           dtype, "gate_up D=1001")
    y = dec.gated_mlp(x, wg, wu, wd, "silu")
    ref = fused_mlp.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), "silu")
    _check(y, ref, dtype, "gated_mlp D=1001")


@gpu
@pytest.mark.parametrize("pad", [3, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_strided_and_misaligned_weights(fused_mlp, dec, pad, dtype):
    """Row strides that are (pad=8) or are not (pad=3) multiples of 16 bytes, and a base
    pointer one element off 16-byte alignment."""
    gen = _gen(29 + pad)
    M, D, H = 5, 512, 600
    x = _randn((M, D), dtype, gen)
    big_g = _weights(H, D + pad, dtype, gen)
    big_u = _weights(H, D + pad, dtype, gen)
    wg, wu = big_g[:, :D], big_u[:, pad:]
    assert wg.stride() == (D + pad, 1)
    flat = _weights(1, H * D + 1, dtype, gen).view(-1)
    w_off = flat[1:].view(H, D)  # data_ptr one element past an aligned allocation
    for a, b in ((wg, wu), (w_off, wu), (wg, w_off)):
        _check(dec.gate_up(x, a, b, None, None, "silu"), _ref_gate_up(fused_mlp, x, a, b, None, None, "silu"),
               dtype, "strided gate_up")
        _check(dec.linear(x, a, None, "gelu"), _ref_linear(fused_mlp, x, a, None, "gelu"), dtype,
               "strided linear")


@gpu
@pytest.mark.parametrize("M", [1, 16, 64])
def test_llama_shapes(fused_mlp, dec, M):
    """Real sizes (Llama-3-8B's MLP: D=4096, H=14336; Llama-3.2-1B's: D=2048, H=8192)."""
    dtype = torch.bfloat16
    for D, H in ((4096, 14336), (2048, 8192)):
        gen = _gen(M + D)
        x = _randn((M, D), dtype, gen)
        wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
        h = dec.gate_up(x, wg, wu, None, None, "silu")
        _check(h, _ref_gate_up(fused_mlp, x, wg, wu, None, None, "silu"), dtype, f"gate_up {D}x{H}")
        _check(dec.linear(h, wd), _ref_linear(fused_mlp, h, wd, None, "identity"), dtype, f"down {H}->{D}")
        del wg, wu, wd
        torch.cuda.empty_cache()


@gpu
@pytest.mark.parametrize(
    "env",
    [
        {"FUSED_MLP_DECODE_KS": "3", "FUSED_MLP_DECODE_RW": "2"},
        {"FUSED_MLP_DECODE_KS": "16", "FUSED_MLP_DECODE_RW": "1"},
        {"FUSED_MLP_DECODE_KS": "1", "FUSED_MLP_DECODE_RW": "4"},
        {"FUSED_MLP_DECODE_LINEAR_ROWS": "16"},
        {"FUSED_MLP_DECODE_LINEAR_ROWS": "32"},
        {"FUSED_MLP_DECODE_FORCE_SIMT": "1"},
    ],
    ids=lambda e: ",".join(f"{k.split('_')[-1]}={v}" for k, v in e.items()),
)
@pytest.mark.parametrize("M", [3, 24, 64])
def test_tuning_overrides(fused_mlp, dec, monkeypatch, env, M):
    """The block-shape overrides the benchmarks use for tuning give the same results."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    dtype = torch.bfloat16
    gen = _gen(41 + M)
    D, H = 1000, 1800
    x = _randn((M, D), dtype, gen)
    wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
    bd = _randn((D,), dtype, gen, 0.5)
    y = dec.gated_mlp(x, wg, wu, wd, "silu", None, None, bd)
    ref = fused_mlp.reference.gated_mlp(x.double(), wg.double(), wu.double(), wd.double(), "silu", None, None,
                                        bd.double())
    _check(y, ref, dtype, f"gated_mlp {env}")


@gpu
@pytest.mark.parametrize("M", [1, 16, 64])
def test_deterministic_and_cuda_graph(dec, M):
    dtype = torch.bfloat16
    gen = _gen(53 + M)
    D, H = 2048, 5632
    wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)
    x_static = _randn((M, D), dtype, gen)

    def fn():
        return dec.gated_mlp(x_static, wg, wu, wd, "silu")

    # Warm up on a side stream (as torch.cuda.graphs recommends), then capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_static = fn()

    for seed in range(3):
        x_new = _randn((M, D), dtype, _gen(1000 + seed))
        x_static.copy_(x_new)
        graph.replay()
        torch.cuda.synchronize()
        eager = dec.gated_mlp(x_new, wg, wu, wd, "silu")
        assert torch.equal(y_static, eager), "graph replay differs from eager"
        assert torch.equal(eager, dec.gated_mlp(x_new, wg, wu, wd, "silu")), "not deterministic"


@gpu
def test_torch_compile(fused_mlp, dec):
    dtype = torch.bfloat16
    gen = _gen(61)
    M, D, H = 4, 512, 1024
    x = _randn((M, D), dtype, gen)
    wg, wu, wd = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen), _weights(D, H, dtype, gen)

    def fn(x):
        return dec.gated_mlp(x, wg, wu, wd, "silu") * 2

    compiled = torch.compile(fn, fullgraph=True)
    assert torch.equal(compiled(x), fn(x))


@gpu
def test_errors(fused_mlp, dec):
    dtype = torch.bfloat16
    gen = _gen(71)
    D, H = 256, 512
    x = _randn((4, D), dtype, gen)
    wg, wu = _weights(H, D, dtype, gen), _weights(H, D, dtype, gen)
    out = torch.empty((4, H), device="cuda", dtype=dtype)
    op_gu, op_lin = fused_mlp.ops.decode_gate_up, fused_mlp.ops.decode_linear

    # Too many rows: the Python face and the op both point at the general path.
    x65 = _randn((65, D), dtype, gen)
    with pytest.raises(ValueError, match="at most 64"):
        dec.gate_up(x65, wg, wu, None, None, "silu")
    with pytest.raises(RuntimeError, match="at most 64"):
        op_gu(torch.empty((65, H), device="cuda", dtype=dtype), x65, wg, wu, None, None, 1)
    with pytest.raises(RuntimeError, match="at most 64"):
        op_lin(torch.empty((65, H), device="cuda", dtype=dtype), x65, wg, None, 0)

    # dtype mismatches name the argument.
    with pytest.raises(RuntimeError, match="up_weight has dtype"):
        op_gu(out, x, wg, wu.half(), None, None, 1)
    with pytest.raises(RuntimeError, match="gate_bias has dtype"):
        op_gu(out, x, wg, wu, torch.zeros(H, device="cuda"), None, 1)
    with pytest.raises(RuntimeError, match="out has dtype"):
        op_gu(out.float(), x, wg, wu, None, None, 1)
    with pytest.raises(RuntimeError, match="weight has dtype"):
        op_lin(out, x, wg.float(), None, 0)
    with pytest.raises(RuntimeError, match="dtype"):
        op_lin(out.double(), x.double(), wg.double(), None, 0)

    # Shapes.
    with pytest.raises(RuntimeError, match="up_weight has shape"):
        op_gu(out, x, wg, wu[:-1], None, None, 1)
    with pytest.raises(RuntimeError, match="gate_weight has shape"):
        op_gu(out, x, wg[:, :-8], wu, None, None, 1)
    with pytest.raises(RuntimeError, match="up_bias has shape"):
        op_gu(out, x, wg, wu, None, torch.zeros(H + 1, device="cuda", dtype=dtype), 1)
    with pytest.raises(RuntimeError, match="out has shape"):
        op_gu(out[:, :-1], x, wg, wu, None, None, 1)
    with pytest.raises(RuntimeError, match="out has shape"):
        op_lin(out[:3], x, wg, None, 0)
    with pytest.raises(RuntimeError, match="x must be 2-D"):
        op_lin(out, x[None], wg, None, 0)

    # Layout, device, activation.
    x_nc = _randn((D, 4), dtype, gen).t()
    assert x_nc.shape == x.shape and not x_nc.is_contiguous()
    with pytest.raises(RuntimeError, match="x must be contiguous"):
        op_lin(out, x_nc, wg, None, 0)
    with pytest.raises(RuntimeError, match="out must be contiguous"):
        op_lin(torch.empty((H, 4), device="cuda", dtype=dtype).t(), x, wg, None, 0)
    x_h = _randn((4, H), dtype, gen)  # wg.t() is [D, H] with strides (1, D)
    with pytest.raises(RuntimeError, match="unit stride"):
        op_lin(torch.empty((4, D), device="cuda", dtype=dtype), x_h, wg.t(), None, 0)
    with pytest.raises(RuntimeError, match="CUDA"):
        op_lin(out.cpu(), x.cpu(), wg.cpu(), None, 0)
    with pytest.raises(RuntimeError, match="same CUDA device|is on"):
        op_lin(out, x, wg.cpu(), None, 0)
    with pytest.raises(RuntimeError, match="activation id"):
        op_gu(out, x, wg, wu, None, None, 7)
    with pytest.raises(ValueError, match="activation"):
        dec.gate_up(x, wg, wu, None, None, "swiglu")

    # Empty inputs are fine.
    assert dec.gate_up(x[:0], wg, wu, None, None, "silu").shape == (0, H)
