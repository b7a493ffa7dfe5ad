"""The one place that decides which implementation computes an MLP for given inputs.

Every public function (functional.py) and every layer goes through here; no other
module picks a kernel. Inputs arrive 2-D ([M, D]), validated, activation canonical.

Paths, by (device, dtype, shape):

    "decode"           CUDA, bf16/fp16, 0 < M <= DECODE_MAX_M[capability] (gated MLPs: the
                       card's DECODE_MAX_M_BY_CARD entry where it has one), nn.Linear layout
                       with unit-stride weight rows, decode.py present and available:
                       decode.py's small-M kernels
    "triton"           CUDA, fp16/bf16/fp32, compute capability >= 8.0, Triton importable:
                       triton_gemm (fused first GEMM + epilogue, cuBLAS second GEMM; the
                       plain MLP's first GEMM with a bias and gelu_tanh / relu may run as
                       cuBLASLt's epilogue instead, where timing says it is faster; on
                       sm_90 the gated first GEMM, the plain one (nn.Linear layout) and the
                       backward's dh GEMM are sm90.py's warp-specialized CUDA kernels
                       wherever their dtype and layout conditions hold)
    "triton-interpret" FUSED_MLP_INTERPRET=1 or TRITON_INTERPRET=1, CPU tensors (fp16/bf16/fp32):
                       the same Triton kernels under Triton's interpreter (CI without a GPU);
                       "reference" instead where this Triton's interpreter cannot run with
                       this NumPy (triton_gemm.interpreter_blocker)
    "cpu-act-and-mul"  CPU gated MLP, fp16/bf16/fp32, with this build's compiled CPU act_and_mul:
                       gate and up GEMMs into the two halves of one [M, 2H] buffer, then act_and_mul
    "reference"        everything else (float64, meta, other devices, older GPUs, no Triton,
                       tensors too large for 32-bit indexing): reference.py

`explain(x2d, kind)` says which path would run, without running it.

Training (forward with autograd, then backward), `backward_choice`:

    "triton"           where the forward would take "triton" or "decode" (decode.py is
                       forward-only): the training forward stores the pre-activations from
                       the fused kernel, and the backward is triton_backward.py (dh GEMM with
                       the activation's derivative in its epilogue, cuBLAS for the rest)
    "triton-interpret" the same under Triton's interpreter
    "reference"        everything else: plain-PyTorch gradients (functional.py), the path
                       gradcheck runs in float64; also everywhere with FUSED_MLP_BACKWARD=reference

On "triton" with sm_90, eager training with the pre-activations saved runs as one C++ autograd
node where both sm_90a kernels take the shapes: the gated MLP (packed or not, with or without
biases: `sm90_train`) and the plain MLP in nn.Linear's or Conv1D's layout (`sm90_mlp_train`);
the same kernels as triton_backward.py in the same order, without Python between them.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from . import act_and_mul as _act_and_mul
from . import reference
from . import sm90 as _sm90
from . import triton_backward
from .activations import activation_id, torch_activation

Tensor = torch.Tensor

_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_DECODE_DTYPES = (torch.float16, torch.bfloat16)
# The Triton kernels index with 32-bit offsets; larger tensors go to cuBLAS (reference).
_MAX_NUMEL = 2**31 - 1

# ---- decode hook ----------------------------------------------------------------------
# Largest M (tokens) for which decode.py's kernels beat the Triton path, by compute
# capability. (9, 0): measured on the H200 (benchmarks/results/decode_h200.json,
# "crossover", Llama-3-8B MLP, CUDA-graph replay): decode 90.8/90.7/92.0 us against
# Triton 92.3/91.8/92.2 us at M = 1/4/8, then 100.3 against 92.7 us at M = 16.
# (8, 0): no A100 was available to measure; it takes the H200's value until measured.
# Capabilities not listed never take the decode path.
DECODE_MAX_M: dict[tuple[int, int], int] = {
    (8, 0): 8,
    (9, 0): 8,
}
# Gated MLPs only, per card (torch.cuda.get_device_name, exact), where that card's own crossover
# was measured and differs from its capability's entry above (the H100 and the H200 share
# (9, 0)); it applies only where the capability has an entry.
# "NVIDIA H200": benchmarks/results/decode_h200_session77.json ("crossover", Llama-3-8B MLP):
# the general path of today (sm_90a gate/up kernel + the timed down GEMM) runs 113-116 us at
# M 1-16 under CUDA graphs, the decode kernels 92-101 us; behind from M 32 (NOTES, session 77).
DECODE_MAX_M_BY_CARD: dict[str, int] = {
    "NVIDIA H200": 16,
}


def _decode_module():
    """decode.py (always part of the package; a function so that tests can stand in for it)."""
    from . import decode

    return decode


@functools.lru_cache(maxsize=None)
def _decode_available(device: torch.device) -> bool:
    return bool(_decode_module().available(device))


@functools.lru_cache(maxsize=None)
def _card_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _decode_max_m(device: torch.device, cap: tuple[int, int], kind: str = "gated") -> int:
    """The largest M for the decode path for an MLP of `kind` ("gated" / "mlp"); 0 where this
    build has no decode kernels."""
    limit = DECODE_MAX_M.get(cap, 0)
    # a card's entry refines its capability's: none where the capability has none (an emptied
    # DECODE_MAX_M switches the decode path off everywhere, as the tests and benchmarks do)
    if limit > 0 and kind == "gated" and device.type == "cuda" and DECODE_MAX_M_BY_CARD:
        index = device.index if device.index is not None else torch.cuda.current_device()
        limit = DECODE_MAX_M_BY_CARD.get(_card_name(index), limit)
    if limit <= 0 or not _decode_available(device):
        return 0
    return min(limit, _decode_module().MAX_M)


# ---- Triton -------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _triton_gemm():
    """The triton_gemm module, or None where Triton cannot be imported."""
    try:
        from . import triton_gemm
    except ImportError:
        return None
    return triton_gemm


@functools.lru_cache(maxsize=None)
def _interpreter_blocker() -> Optional[str]:
    """triton_gemm.interpreter_blocker() (why Triton's interpreter cannot run here, or None),
    asked once: it depends only on the installed Triton and NumPy."""
    return _triton_gemm().interpreter_blocker()


def _interpret_requested() -> bool:
    on = ("1", "true", "yes", "on")
    return (os.environ.get("FUSED_MLP_INTERPRET", "").lower() in on
            or os.environ.get("TRITON_INTERPRET", "").lower() in on)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


# ---- the choice ---------------------------------------------------------------------


class Choice(NamedTuple):
    path: str
    reason: str


def _span(t: Tensor) -> int:
    """1 + the largest element offset the kernels compute for t (its numel when contiguous;
    more for a strided view, e.g. columns of a wider buffer)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))


def _too_large(*tensors: Optional[Tensor]) -> bool:
    # The Triton kernels compute offsets in 32 bits: what counts is the span, not numel
    # (the same for a contiguous tensor: the cheap test, on every call, comes first).
    return any(t is not None and not (t.is_contiguous() and t.numel() <= _MAX_NUMEL) and _span(t) > _MAX_NUMEL
               for t in tensors)


@functools.lru_cache(maxsize=None)
def _cuda_choice(path: str, cap: tuple[int, int], dtype: torch.dtype) -> Choice:
    """The Choice of the two CUDA kernel paths, built once (this runs on every call)."""
    if path == "decode":
        return Choice("decode", f"M <= DECODE_MAX_M for capability {cap}, {dtype}")
    return Choice("triton", f"CUDA capability {cap}, {dtype}")


def choose(x: Tensor, kind: str, weights: tuple = (), hidden: int = 0,
           weight_layout: str = "linear") -> Choice:
    """The path for x [M, D] of an MLP of `kind` ("gated" or "mlp"), with a reason."""
    if kind not in ("gated", "mlp"):
        raise ValueError(f"kind={kind!r} must be 'gated' or 'mlp'")
    dtype = x.dtype
    if dtype not in _TRITON_DTYPES:
        return Choice("reference", f"dtype {dtype} runs on the reference path")
    m = x.shape[0]
    if m * hidden > _MAX_NUMEL or _too_large(x, *weights):
        return Choice("reference", "a tensor spans more than 2**31 - 1 elements (32-bit indexing)")
    dev = x.device
    if dev.type == "cuda":
        tg = _triton_gemm()
        if tg is not None and tg.INTERPRETED and _interpret_requested():
            if (blocker := _interpreter_blocker()) is not None:
                return Choice("reference", f"interpretation requested but {blocker}")
            return Choice("triton-interpret", "TRITON_INTERPRET=1 was set when Triton kernels were loaded")
        cap = _capability(dev.index if dev.index is not None else torch.cuda.current_device())
        if cap < (8, 0):
            return Choice("reference", f"compute capability {cap} < (8, 0)")
        if (0 < m <= _decode_max_m(dev, cap, kind) and dtype in _DECODE_DTYPES
                and (kind == "gated" or weight_layout == "linear")
                and all(w.stride(-1) == 1 for w in weights)):  # decode.py reads unit-stride rows
            return _cuda_choice("decode", cap, dtype)
        if tg is None:
            return Choice("reference", "Triton is not importable")
        return _cuda_choice("triton", cap, dtype)
    if dev.type == "cpu":
        if _interpret_requested():
            if _triton_gemm() is None:
                return Choice("reference", "interpretation requested but Triton is not importable")
            if (blocker := _interpreter_blocker()) is not None:
                return Choice("reference", f"interpretation requested but {blocker}")
            return Choice("triton-interpret", "FUSED_MLP_INTERPRET / TRITON_INTERPRET is set")
        if kind == "gated" and _act_and_mul.has_compiled_kernel("act_and_mul", dev):
            return Choice("cpu-act-and-mul", "CPU with this build's compiled act_and_mul")
        return Choice("reference", "CPU")
    return Choice("reference", f"device type {dev.type!r}")


def explain(x: Tensor, kind: str = "gated", weight_layout: str = "linear", verbose: bool = False) -> str:
    """Which path an MLP of `kind` ("gated" / "mlp") would take for 2-D x: the path name
    ("decode", "triton", "triton-interpret", "cpu-act-and-mul", "reference"), or with
    verbose=True "name: reason". Shapes beyond x (the 32-bit index limit) are not considered."""
    c = choose(x, kind, weight_layout=weight_layout)
    return f"{c.path}: {c.reason}" if verbose else c.path


def _kernels(path: str):
    mod = _triton_gemm()
    return mod.interpreted_module() if path == "triton-interpret" else mod


# ---- entry points (called by functional.py) ----------------------------------------


def gated_mlp_forward(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    activation: str,
    gate_bias: Optional[torch.Tensor],
    up_bias: Optional[torch.Tensor],
    down_bias: Optional[torch.Tensor],
) -> torch.Tensor:
    hidden = gate_weight.shape[0]
    path = choose(x, "gated", (gate_weight, up_weight, down_weight), hidden).path
    if path in ("triton", "triton-interpret"):
        return _kernels(path).gated_mlp(
            x, gate_weight, up_weight, down_weight, activation_id(activation), gate_bias, up_bias, down_bias)
    if path == "decode":
        return _decode_module()._gated_mlp(
            x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)
    if path == "cpu-act-and-mul":
        return _cpu_gated_mlp(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)
    return reference.gated_mlp(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)


def mlp_forward(
    x: torch.Tensor,
    fc_weight: torch.Tensor,
    fc_bias: Optional[torch.Tensor],
    proj_weight: torch.Tensor,
    proj_bias: Optional[torch.Tensor],
    activation: str,
    weight_layout: str,
) -> torch.Tensor:
    hidden = fc_weight.shape[1] if weight_layout == "conv1d" else fc_weight.shape[0]
    path = choose(x, "mlp", (fc_weight, proj_weight), hidden, weight_layout).path
    if path in ("triton", "triton-interpret"):
        return _kernels(path).mlp(
            x, fc_weight, fc_bias, proj_weight, proj_bias, activation_id(activation), weight_layout)
    if path == "decode":
        return _decode_module()._mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation)
    return reference.mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout)


def linear_act_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    activation: str,
    weight_layout: str,
) -> torch.Tensor:
    """act(x W^T + b) for 2-D x: one GEMM with the bias and activation in its epilogue
    (chosen like the plain MLP, whose first GEMM it is)."""
    hidden = weight.shape[1] if weight_layout == "conv1d" else weight.shape[0]
    path = choose(x, "mlp", (weight,), hidden, weight_layout).path
    if path in ("triton", "triton-interpret"):
        return _kernels(path).linear_act(x, weight, bias, activation_id(activation), weight_layout)
    if path == "decode":
        return _decode_module()._linear(x, weight, bias, activation)
    return reference.linear_act(x, weight, bias, activation, weight_layout)


def _gate_up_halves(x, gate_weight, up_weight, gate_bias, up_bias) -> Tensor:
    """g | u [M, 2H]: the gate and up GEMMs written straight into the halves of one buffer
    (no concatenation)."""
    m, hidden = x.shape[0], gate_weight.shape[0]
    gu = torch.empty((m, 2 * hidden), device=x.device, dtype=x.dtype)
    for w, b, half in ((gate_weight, gate_bias, gu[:, :hidden]), (up_weight, up_bias, gu[:, hidden:])):
        if b is None:
            torch.mm(x, w.t(), out=half)
        else:
            torch.addmm(b, x, w.t(), out=half)
    return gu


def _cpu_gated_mlp(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias):
    """g | u (_gate_up_halves), the compiled CPU act_and_mul into h, then the down GEMM."""
    gu = _gate_up_halves(x, gate_weight, up_weight, gate_bias, up_bias)
    h = torch.empty((x.shape[0], gate_weight.shape[0]), device=x.device, dtype=x.dtype)
    _act_and_mul.act_and_mul(h, gu, activation)
    return F.linear(h, down_weight, down_bias)


# ---- training: forward that saves, and the backward ------------------------------------

_FUSED_PATHS = ("triton", "triton-interpret")


def backward_choice(x: Tensor, kind: str, weights: tuple = (), hidden: int = 0,
                    weight_layout: str = "linear") -> Choice:
    """The path of the training forward and of the backward of an MLP of `kind` for x [M, D]:
    "triton", "triton-interpret" or "reference" (see the module docstring)."""
    if os.environ.get("FUSED_MLP_BACKWARD", "").lower() == "reference":
        return Choice("reference", "FUSED_MLP_BACKWARD=reference")
    c = choose(x, kind, weights, hidden, weight_layout)
    if c.path == "decode":
        if _triton_gemm() is None:
            return Choice("reference", "Triton is not importable")
        c = Choice("triton", "decode.py is forward-only; training takes the Triton path")
    if c.path not in _FUSED_PATHS:
        return Choice("reference", c.reason)
    width = 2 * hidden if kind == "gated" else hidden  # the saved pre-activations
    if x.shape[0] * width > _MAX_NUMEL:
        return Choice("reference", "the saved pre-activations exceed 2**31 - 1 elements (32-bit indexing)")
    return c


def _bias_ones(x2: Tensor, *biases: Optional[Tensor]) -> Optional[Tensor]:
    """M ones for a training node's bias gradients (triton_backward.column_sum's cached vector),
    or None where no bias is given."""
    if all(b is None for b in biases):
        return None
    return triton_backward.ones_vector(x2.shape[0], x2.device, x2.dtype)


def sm90_train(x: Tensor, gate_weight: Tensor, up_weight: Optional[Tensor], down_weight: Tensor, activation: str,
               gate_bias: Optional[Tensor] = None, up_bias: Optional[Tensor] = None,
               down_bias: Optional[Tensor] = None) -> Optional[Tensor]:
    """y of an eager training call of the gated MLP (pre-activations saved, x with any leading
    dimensions; up_weight None: gate_weight / gate_bias are the packed gate_up tensors) as
    train_sm90.cu's C++ autograd node, or None where that node does not take it: a path other
    than "triton", FUSED_MLP_BWD_DX=triton, or what sm90.train_usable refuses
    (FUSED_MLP_SM90_TRAIN=0 among it). On the device's host the Python training step cost ~730 us
    against ~240 for the work it runs (NOTES, sessions 18-19)."""
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    act = activation_id(activation)
    if (triton_backward.dx_mode() != "cublas"
            or not _sm90.train_usable(x2, gate_weight, up_weight, down_weight, act, gate_bias, up_bias)):
        return None
    wg, wu, _, _ = split_gate_up(gate_weight, up_weight, None, None)
    if backward_choice(x2, "gated", (wg, wu, down_weight), wg.shape[0]).path != "triton":
        return None
    return _sm90.train(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias,
                       _bias_ones(x2, gate_bias, up_bias, down_bias))


def sm90_mlp_train(x: Tensor, fc_weight: Tensor, fc_bias: Optional[Tensor], proj_weight: Tensor,
                   proj_bias: Optional[Tensor], activation: str, weight_layout: str) -> Optional[Tensor]:
    """y of an eager training call of the plain MLP (pre-activations saved; nn.Linear's or
    Conv1D's layout) as train_sm90.cu's C++ autograd node, or None where it does not take it
    (as sm90_train)."""
    conv = weight_layout == "conv1d"
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    act = activation_id(activation)
    if not _sm90.mlp_train_usable(x2, fc_weight, fc_bias, proj_weight, act, conv):
        return None
    hidden = fc_weight.shape[1] if conv else fc_weight.shape[0]
    if backward_choice(x2, "mlp", (fc_weight, proj_weight), hidden, weight_layout).path != "triton":
        return None
    return _sm90.mlp_train(x, fc_weight, fc_bias, proj_weight, proj_bias, act, _bias_ones(x2, fc_bias, proj_bias),
                           conv)


def split_gate_up(gate_weight, up_weight, gate_bias, up_bias):
    """(Wg, Wu, bg, bu); up_weight None: gate_weight is the packed [2H, D] (and gate_bias [2H])."""
    if up_weight is not None:
        return gate_weight, up_weight, gate_bias, up_bias
    n = gate_weight.shape[0] // 2
    gb, ub = (None, None) if gate_bias is None else (gate_bias[:n], gate_bias[n:])
    return gate_weight[:n], gate_weight[n:], gb, ub


def gated_mlp_train_forward(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias):
    """(y, g | u [M, 2H], h [M, H]) for 2-D x: what the backward needs, from one pass.
    up_weight None: gate_weight (and gate_bias) are the packed gate_up tensors."""
    wg, wu, bg, bu = split_gate_up(gate_weight, up_weight, gate_bias, up_bias)
    path = backward_choice(x, "gated", (wg, wu, down_weight), wg.shape[0]).path
    if path in _FUSED_PATHS:
        return triton_backward.gated_train_forward(
            _kernels(path), x, wg, wu, down_weight, activation_id(activation), bg, bu, down_bias)
    gu = _gate_up_halves(x, wg, wu, bg, bu)
    hidden = wg.shape[0]
    h = torch_activation(activation)(gu[:, :hidden]) * gu[:, hidden:]
    return F.linear(h, down_weight, down_bias), gu, h


def gated_mlp_backward(dy, x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias,
                       gu, h, needs: int, inplace: bool, path: Optional[str] = None):
    """The fused backward (Triton paths): (dx, [dWg; dWu], dWd, [dbg; dbu], dbd), None where
    `needs` (triton_backward.NEED_* bits) leaves one out. gu / h: saved by
    gated_mlp_train_forward, or None to recompute them. path: backward_choice's, when the
    caller has it already."""
    wg, wu, bg, bu = split_gate_up(gate_weight, up_weight, gate_bias, up_bias)
    if path is None:
        c = backward_choice(x, "gated", (wg, wu, down_weight), wg.shape[0])
        if c.path not in _FUSED_PATHS:
            raise RuntimeError(f"fused_mlp: the fused backward cannot run on the {c.path!r} path ({c.reason})")
        path = c.path
    return triton_backward.gated_backward(
        _kernels(path), dy, x, wg, wu, down_weight, activation_id(activation), bg, bu, gu, h, needs, inplace)


def mlp_train_forward(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout):
    """(y, pre [M, H], h [M, H]) for 2-D x."""
    conv = weight_layout == "conv1d"
    hidden = fc_weight.shape[1] if conv else fc_weight.shape[0]
    path = backward_choice(x, "mlp", (fc_weight, proj_weight), hidden, weight_layout).path
    if path in _FUSED_PATHS:
        return triton_backward.mlp_train_forward(
            _kernels(path), x, fc_weight, fc_bias, proj_weight, proj_bias, activation_id(activation), weight_layout)
    pre = F.linear(x, fc_weight.t() if conv else fc_weight, fc_bias)
    h = torch_activation(activation)(pre)
    if h is pre:  # identity: a custom op's outputs must not alias each other
        h = pre.clone()
    return F.linear(h, proj_weight.t() if conv else proj_weight, proj_bias), pre, h


def mlp_backward(dy, x, fc_weight, fc_bias, proj_weight, activation, weight_layout, pre, h,
                 needs: int, inplace: bool, path: Optional[str] = None):
    """The fused backward of the plain MLP (Triton paths): (dx, dW1, dW2, db1, db2).
    path: backward_choice's, when the caller has it already."""
    if path is None:
        conv = weight_layout == "conv1d"
        hidden = fc_weight.shape[1] if conv else fc_weight.shape[0]
        c = backward_choice(x, "mlp", (fc_weight, proj_weight), hidden, weight_layout)
        if c.path not in _FUSED_PATHS:
            raise RuntimeError(f"fused_mlp: the fused backward cannot run on the {c.path!r} path ({c.reason})")
        path = c.path
    return triton_backward.mlp_backward(
        _kernels(path), dy, x, fc_weight, fc_bias, proj_weight, activation_id(activation), weight_layout,
        pre, h, needs, inplace)
