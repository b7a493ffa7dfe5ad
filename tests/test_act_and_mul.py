"""Tests of the activation-and-multiply ops: out = act(x[..., :d]) * x[..., d:].

Every result is compared with fused_mlp.reference.act_and_mul evaluated in
float64 on the same (already rounded) input, so the only error left is the
kernel's fp32 arithmetic plus one rounding of the output to its dtype.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zlib

import pytest
import torch

from conftest import REPO_ID, ROOT, poison_like, rel_err, submodule

ACTIVATIONS = ["identity", "silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu"]
NAMED = {
    "silu_and_mul": "silu",
    "gelu_tanh_and_mul": "gelu_tanh",
    "gelu_and_mul": "gelu",
    "relu_and_mul": "relu",
    "relu2_and_mul": "relu2",
    "quick_gelu_and_mul": "quick_gelu",
}
# (op name, activation): the generic op with every activation, then the named ops.
OPS = [("act_and_mul", a) for a in ACTIVATIONS] + list(NAMED.items())
OP_IDS = [f"{op}[{act}]" if op == "act_and_mul" else op for op, act in OPS]

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Bounds on ||out - ref|| / ||ref||. The reference is exact (float64 on the same
# input), so the error is the output rounding plus fp32 arithmetic:
#   fp32: unit roundoff 6e-8, plus a few ulp from expf/tanhf/erff -> 1e-6;
#   fp16: unit roundoff 4.9e-4 (RMS of rounding ~3e-4)            -> 1e-3;
#   bf16: unit roundoff 3.9e-3 (RMS of rounding ~2.3e-3)          -> 1e-2.
TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}

# Input shapes [..., 2d]: one row, d = 1 and other odd d (rows that start off
# any 16-byte boundary on the CUDA side), a model-sized d, 3-D inputs; and two that the
# CPU kernel takes in several chunks of rows (kernel_src/cpu/act_and_mul.cpp, 2^18 output
# elements a chunk): 262 + 38 rows of d = 1000, and d = 300000, one row a chunk.
SHAPES = [
    (1, 2),
    (1, 2 * 3),
    (3, 2 * 5),
    (7, 2 * 1003),
    (1, 2 * 14336),
    (3, 2 * 14336),
    (5, 2 * 128),
    (2, 3, 2 * 64),
    (2, 5, 2 * 7),
    (300, 2 * 1000),
    (2, 2 * 300000),
]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def make_input(shape, dtype, device, seed=0, scale=2.0) -> torch.Tensor:
    """Fresh normal input (scaled so the activations' curved parts are exercised),
    drawn on `device` itself so that the large CUDA cases do not go through the host."""
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    return x.to(dtype)


def out_for(x: torch.Tensor) -> torch.Tensor:
    """A NaN-filled output buffer of the right shape: unwritten elements fail the check."""
    return poison_like(x[..., : x.shape[-1] // 2].contiguous())


def reference(fused_mlp, x: torch.Tensor, act: str) -> torch.Tensor:
    return fused_mlp.reference.act_and_mul(x.double(), act)


def call(fused_mlp, op: str, act: str, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if op == "act_and_mul":
        return fused_mlp.act_and_mul(out, x, act)
    return getattr(fused_mlp, op)(out, x)


def check_op(fused_mlp, op, act, x):
    out = out_for(x)
    res = call(fused_mlp, op, act, out, x)
    assert res is out, f"{op} must return the out tensor it was given"
    assert out.dtype == x.dtype and out.shape == x.shape[:-1] + (x.shape[-1] // 2,)
    ref = reference(fused_mlp, x, act)
    err = rel_err(out, ref)
    bound = TOL[x.dtype]
    if x.dtype == torch.float32:
        # The erf and tanh forms of GELU lose fp32 accuracy to cancellation in 1 + erf(x)
        # for x << 0 (about 300x at x = -3): with a handful of elements the norm-wise error
        # can reach 1e-5 (seen on the H200 for a single element), for PyTorch's own fp32
        # kernels too. So fp32 may be as far off as 4x PyTorch's error on the same input.
        bound = max(bound, 4 * rel_err(fused_mlp.reference.act_and_mul(x, act), ref))
    assert err <= bound, f"{op}[{act}] {tuple(x.shape)} {x.dtype}: rel err {err:.3g} (bound {bound:.3g})"


# --------------------------------------------------------------------------- #
# Results against the reference
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,act", OPS, ids=OP_IDS)
def test_matches_reference(fused_mlp, op, act, dtype, shape, device):
    seed = zlib.crc32(repr((op, act, dtype, shape, device)).encode())  # distinct, reproducible
    check_op(fused_mlp, op, act, make_input(shape, dtype, device, seed=seed))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alias,act", [("swish", "silu"), ("gelu_pytorch_tanh", "gelu_tanh"),
                                       ("GELU_NEW", "gelu_tanh"), ("relu_squared", "relu2")])
def test_activation_aliases(fused_mlp, alias, act, device):
    x = make_input((4, 2 * 40), torch.float32, device, seed=3)
    out = out_for(x)
    fused_mlp.act_and_mul(out, x, alias)
    assert rel_err(out, reference(fused_mlp, x, act)) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_default_activation_is_silu(fused_mlp, device):
    x = make_input((2, 2 * 24), torch.float32, device, seed=4)
    out = out_for(x)
    fused_mlp.act_and_mul(out, x)
    assert rel_err(out, reference(fused_mlp, x, "silu")) <= TOL[torch.float32]


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_are_not_modified(fused_mlp, device):
    x = make_input((3, 2 * 100), torch.bfloat16, device, seed=5)
    before = x.clone()
    fused_mlp.silu_and_mul(out_for(x), x)
    assert torch.equal(x, before)


@pytest.mark.parametrize("half", ["gate", "up"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cpu_out_may_be_one_half_of_a_row(fused_mlp, dtype, half):
    """One row: out may be the row's own gate or up half (both contiguous). The CPU kernel
    computes fp32 results in out itself only where out shares no memory with the input;
    here the result must still come from the values the row held before the call."""
    x = make_input((1, 2 * 1000), dtype, "cpu", seed=6)
    expected = reference(fused_mlp, x.clone(), "gelu_tanh")
    out = x[:, :1000] if half == "gate" else x[:, 1000:]
    fused_mlp.gelu_tanh_and_mul(out, x)
    assert rel_err(out, expected) <= TOL[dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8), (0, 0)], ids=str)
def test_empty_input(fused_mlp, shape, device):
    x = torch.empty(shape, device=device, dtype=torch.bfloat16)
    out = torch.empty(shape[:-1] + (shape[-1] // 2,), device=device, dtype=torch.bfloat16)
    res = fused_mlp.silu_and_mul(out, x)
    assert res is out and res.numel() == 0


# --------------------------------------------------------------------------- #
# Argument errors: each message names the offending argument
# --------------------------------------------------------------------------- #


def _bad_args(case: str, device: str):
    """(out, x, activation, expected exception types, regex on the message)."""
    f32, f16 = torch.float32, torch.float16
    x = torch.randn(4, 8, device=device)
    ok_out = torch.empty(4, 4, device=device)
    errs = (RuntimeError, ValueError)  # compiled op: RuntimeError; Python fallback: ValueError
    if case == "dtype_mismatch":
        return ok_out.to(f16), x.to(f32), "silu", errs, r"out has dtype .* but input has dtype"
    if case == "odd_last_dim":
        return torch.empty(4, 3, device=device), torch.randn(4, 7, device=device), "silu", errs, (
            r"last dimension of input must be even")
    if case == "out_not_half":
        return torch.empty(4, 5, device=device), x, "silu", errs, (
            r"(last dimension of out must be half of input|out\.shape .* must be input\.shape)")
    if case == "leading_dims":
        return torch.empty(3, 4, device=device), x, "silu", errs, (
            r"out\.shape .*(does not match input\.shape|must be input\.shape)")
    if case == "rank_mismatch":
        return torch.empty(4, 1, 4, device=device), x, "silu", errs, (
            r"(out has 3 dimensions but input has 2|out\.shape .* must be input\.shape)")
    if case == "int_dtype":
        xi = torch.randint(-5, 5, (4, 8), device=device, dtype=torch.int32)
        return torch.empty(4, 4, device=device, dtype=torch.int32), xi, "silu", errs, (
            r"input dtype .*[Ii]nt.* is not supported")
    if case == "unknown_activation":
        return ok_out, x, "swiglu_nope", ValueError, r"activation='swiglu_nope' is not supported"
    if case == "non_contiguous_input":
        xt = torch.randn(8, 4, device=device).t()  # shape (4, 8), strides (1, 4)
        return ok_out, xt, "silu", RuntimeError, r"input must be contiguous"
    if case == "non_contiguous_out":
        return torch.empty(4, 8, device=device)[:, ::2], x, "silu", RuntimeError, (
            r"out must be contiguous")
    raise AssertionError(case)


ERROR_CASES = ["dtype_mismatch", "odd_last_dim", "out_not_half", "leading_dims", "rank_mismatch",
               "int_dtype", "unknown_activation", "non_contiguous_input", "non_contiguous_out"]
# Only the compiled op insists on contiguity: the Python fallback computes through
# the reference, which takes any layout (see test_reference_fallback_layouts).
COMPILED_ONLY = {"non_contiguous_input", "non_contiguous_out"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ERROR_CASES)
def test_argument_errors(fused_mlp, case, device):
    mod = submodule(fused_mlp, "act_and_mul")
    if case in COMPILED_ONLY and not mod.has_compiled_kernel("act_and_mul", torch.device(device)):
        pytest.skip("this build has no compiled kernel for the device; the fallback accepts any layout")
    out, x, act, exc, msg = _bad_args(case, device)
    with pytest.raises(exc, match=msg):
        fused_mlp.act_and_mul(out, x, act)


@pytest.mark.parametrize("device", DEVICES)
def test_named_op_errors(fused_mlp, device):
    x = torch.randn(4, 8, device=device)
    with pytest.raises((RuntimeError, ValueError), match=r"out has dtype .* but input has dtype"):
        fused_mlp.gelu_tanh_and_mul(torch.empty(4, 4, device=device, dtype=torch.bfloat16), x)


@pytest.mark.parametrize("device", DEVICES)
def test_raw_op_rejects_unknown_activation_id(fused_mlp, device):
    if not submodule(fused_mlp, "act_and_mul").has_compiled_kernel("act_and_mul", torch.device(device)):
        pytest.skip(f"this build has no compiled {device} kernel")
    x = torch.randn(2, 8, device=device)
    with pytest.raises(RuntimeError, match=r"activation id 99 is not one of 0\.\.6"):
        fused_mlp.ops.act_and_mul(torch.empty(2, 4, device=device), x, 99)


# --------------------------------------------------------------------------- #
# No derivative: refused where one would be wanted (as torch's out= functions do)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [True, False], ids=["build", "fallback"])
def test_refuses_autodiff(fused_mlp, device, compiled, monkeypatch):
    """Without the refusal a gradient or tangent through these ops went missing silently
    (torch.func.grad returned zeros, a dual tensor's tangent was dropped, out had no grad_fn)."""
    import torch.autograd.forward_ad as fwAD

    if not compiled:
        monkeypatch.setattr(submodule(fused_mlp, "act_and_mul"), "has_compiled_kernel", lambda op, dev: False)
    x = make_input((3, 2 * 8), torch.float32, device, seed=31)

    def run(t, out=None):
        return fused_mlp.silu_and_mul(out if out is not None else out_for(t), t)

    with pytest.raises(RuntimeError, match="silu_and_mul has no derivative.*input requires grad"):
        run(x.clone().requires_grad_())
    with pytest.raises(RuntimeError, match="gelu_and_mul has no derivative.*out requires grad"):
        fused_mlp.act_and_mul(out_for(x).requires_grad_(), x, "gelu")
    with pytest.raises(RuntimeError, match="no derivative.*torch.func transform"):
        torch.func.grad(lambda t: run(t, torch.empty(3, 8, device=device)).sum())(x)
    with pytest.raises(RuntimeError, match="no derivative.*torch.func transform"):
        torch.func.vmap(lambda t: run(t, torch.empty(8, device=device)))(x)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="no derivative.*forward-mode AD"):
            run(dual)
    # What the message points to works under each of them, and plain calls still run.
    g = torch.func.grad(lambda t: fused_mlp.reference.act_and_mul(t, "silu").sum())(x)
    assert g.shape == x.shape and g.abs().sum() > 0
    with torch.no_grad():
        assert rel_err(run(x.clone().requires_grad_()), reference(fused_mlp, x, "silu")) <= TOL[torch.float32]
    assert rel_err(run(x), reference(fused_mlp, x, "silu")) <= TOL[torch.float32]


# --------------------------------------------------------------------------- #
# torch.compile and the reference fallback
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(fused_mlp, device):
    def f(x):
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
        return fused_mlp.silu_and_mul(out, x) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    x = make_input((6, 2 * 96), torch.bfloat16, device, seed=11)
    got = compiled(x)
    eager = f(x)
    if submodule(fused_mlp, "act_and_mul").has_compiled_kernel("act_and_mul", torch.device(device)):
        assert torch.equal(got, eager)  # the same kernel in both, opaque to the compiler
    else:
        # The reference fallback (e.g. CPU tensors under a CUDA build), which torch.compile
        # traces: inductor's fp32 act() may differ from ATen's in the last fp32 bit, which can
        # move the one bf16 rounding by one unit (the bound, eps * |value|, is one to two units).
        ulp = torch.finfo(torch.bfloat16).eps * eager.float().abs()
        assert ((got.float() - eager.float()).abs() <= ulp).all()
    assert rel_err(got, 2.0 * reference(fused_mlp, x, "silu")) <= TOL[torch.bfloat16]


@pytest.fixture
def fallback(fused_mlp, monkeypatch):
    """The package with its compiled kernels hidden from the Python wrappers."""
    monkeypatch.setattr(submodule(fused_mlp, "act_and_mul"), "has_compiled_kernel", lambda op, dev: False)
    return fused_mlp


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op,act", OPS, ids=OP_IDS)
def test_reference_fallback(fallback, op, act, dtype):
    # The fallback computes in fp32 with PyTorch ops and rounds once, as the kernels do;
    # the same bounds hold.
    check_op(fallback, op, act, make_input((3, 2 * 37), dtype, "cpu", seed=21))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_reference_fallback_rounds_once(fallback, dtype):
    """The fallback's half-precision output is act(g) * u in fp32 rounded once, bit for bit;
    the plain formula in the input dtype (act(g) rounded first) differs from it here, so the
    comparison would catch a fallback that went back to it."""
    x = make_input((64, 2 * 97), dtype, "cpu", seed=27)
    got = fallback.silu_and_mul(out_for(x), x)
    once = fallback.reference.act_and_mul(x.float(), "silu").to(dtype)
    twice = fallback.reference.act_and_mul(x, "silu")
    assert torch.equal(got, once)
    assert not torch.equal(once, twice)


@pytest.mark.parametrize("case", [c for c in ERROR_CASES if c not in COMPILED_ONLY])
def test_reference_fallback_errors(fallback, case):
    out, x, act, _, msg = _bad_args(case, "cpu")
    with pytest.raises(ValueError, match=msg):
        fallback.act_and_mul(out, x, act)


def test_reference_fallback_layouts(fallback):
    xt = make_input((96, 4), torch.float32, "cpu", seed=23).t()  # (4, 96), not contiguous
    out = out_for(xt)
    assert fallback.silu_and_mul(out, xt) is out
    assert rel_err(out, reference(fallback, xt, "silu")) <= TOL[torch.float32]


def test_reference_fallback_empty(fallback):
    x = torch.empty(0, 8)
    out = torch.empty(0, 4)
    assert fallback.relu_and_mul(out, x) is out


# --------------------------------------------------------------------------- #
# CUDA only
# --------------------------------------------------------------------------- #


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_cuda_model_size_bf16(fused_mlp, act):
    x = make_input((8192, 2 * 14336), torch.bfloat16, "cuda", seed=31)
    check_op(fused_mlp, "act_and_mul", act, x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [1, 3, 7, 9, 1003, 4100, 14335])
def test_cuda_unaligned_rows(fused_mlp, dtype, d):
    # d * elem_size not a multiple of 16: most rows start off a 16-byte boundary.
    check_op(fused_mlp, "silu_and_mul", "silu", make_input((33, 2 * d), dtype, "cuda", seed=d))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("offset", [1, 2, 3])
def test_cuda_unaligned_base_pointer(fused_mlp, dtype, offset):
    # d is a multiple of every vector width, but input / out start `offset`
    # elements into their storage, so 16-byte accesses would be misaligned.
    rows, d = 17, 512
    buf = make_input((rows * 2 * d + offset,), dtype, "cuda", seed=offset)
    x = buf[offset:].view(rows, 2 * d)
    out_buf = torch.full((rows * d + offset,), float("nan"), dtype=dtype, device="cuda")
    out = out_buf[offset:].view(rows, d)
    assert fused_mlp.gelu_tanh_and_mul(out, x) is out
    assert rel_err(out, reference(fused_mlp, x, "gelu_tanh")) <= TOL[dtype]
    assert torch.isnan(out_buf[:offset]).all(), "wrote before the start of out"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 31, 65, 1000, 70000])
def test_cuda_row_counts(fused_mlp, rows):
    check_op(fused_mlp, "silu_and_mul", "silu", make_input((rows, 2 * 256), torch.bfloat16, "cuda", seed=rows))


@pytest.mark.gpu
def test_cuda_does_not_write_past_out(fused_mlp):
    rows, d = 9, 1003
    x = make_input((rows, 2 * d), torch.float16, "cuda", seed=41)
    guard = torch.full((rows * d + 64,), float("nan"), dtype=torch.float16, device="cuda")
    out = guard[: rows * d].view(rows, d)
    fused_mlp.silu_and_mul(out, x)
    assert rel_err(out, reference(fused_mlp, x, "silu")) <= TOL[torch.float16]
    assert torch.isnan(guard[rows * d:]).all()


@pytest.mark.gpu
def test_cuda_graph_capture(fused_mlp):
    x = make_input((64, 2 * 4096), torch.bfloat16, "cuda", seed=51)
    out = torch.empty(64, 4096, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        fused_mlp.silu_and_mul(out, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_mlp.silu_and_mul(out, x)
    for seed in (52, 53):
        x.copy_(make_input(x.shape, x.dtype, "cuda", seed=seed))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, reference(fused_mlp, x, "silu")) <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_cuda_runs_on_current_stream(fused_mlp):
    x = make_input((256, 2 * 2048), torch.bfloat16, "cuda", seed=61)
    out = out_for(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused_mlp.silu_and_mul(out, x)
        ref = reference(fused_mlp, x, "silu")
        err = rel_err(out, ref)  # ordered after the op on the same stream
    assert err <= TOL[torch.bfloat16]


@pytest.mark.gpu
def test_cuda_other_device(fused_mlp):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = make_input((16, 2 * 1024), torch.float16, "cuda:1", seed=71)
    out = out_for(x)
    with torch.cuda.device(0):  # the op must switch to the tensors' device itself
        fused_mlp.silu_and_mul(out, x)
    assert rel_err(out, reference(fused_mlp, x, "silu")) <= TOL[torch.float16]


@pytest.mark.gpu
def test_cuda_device_mismatch(fused_mlp):
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises((RuntimeError, ValueError), match=r"out is on cpu but input is on cuda"):
        fused_mlp.silu_and_mul(torch.empty(4, 4), x)


# --------------------------------------------------------------------------- #
# Loading a local build through LOCAL_KERNELS
# --------------------------------------------------------------------------- #


def test_local_kernels_override(tmp_path):
    build = ROOT / "build"
    if not any((d / "metadata.json").exists() for d in build.glob("*") if d.is_dir()):
        pytest.skip("no built variant in build/ (run tools/build_variant.py)")
    script = textwrap.dedent(
        f"""
        import torch
        from kernels import get_kernel

        m = get_kernel({REPO_ID!r}, version=1)
        assert m.__file__.startswith({str(build)!r}), m.__file__
        x = torch.randn(5, 2 * 33, generator=torch.Generator().manual_seed(0))
        out = torch.full((5, 33), float("nan"))
        assert m.silu_and_mul(out, x) is out
        ref = m.reference.act_and_mul(x.double(), "silu")
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-6, err
        print("LOADED", m.__file__)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KERNELS_", "HUGGINGFACE_"))}
    env.update(
        LOCAL_KERNELS=f"{REPO_ID}={build}",
        KERNELS_CACHE=str(tmp_path / "empty-cache"),  # nothing cached: only the override can answer
        HF_HOME=str(tmp_path / "hf-home"),
        HF_HUB_OFFLINE="1",
    )
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "LOADED" in res.stdout
