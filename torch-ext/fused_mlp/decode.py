"""Few-token ("decode") MLP path: whole MLPs for M = 1..64 rows at the speed of reading
their weights (kernel_src/cuda/decode_mlp.cu).

Each projection streams every weight row once for all M rows of x:

    gate_up(x2d, gate_weight, up_weight, gate_bias, up_bias, activation)
        -> act(x Wg^T + bg) * (x Wu^T + bu)                          [M, hidden]
    linear(x2d, weight, bias, activation="identity") -> act(x W^T + b) [M, out]
    gated_mlp(x2d, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)
        -> linear(gate_up(...), down_weight, down_bias)               (two launches)
    mlp(x2d, fc_weight, fc_bias, proj_weight, proj_bias, activation)
        -> linear(linear(x2d, fc_weight, fc_bias, activation), proj_weight, proj_bias)

x2d is [M, D] with M <= MAX_M; weights are nn.Linear's [out, in] with unit stride in
the last dimension (rows may be strided: gate_up_weight[:h] / [h:] slices of a packed
weight work without a copy). float32, float16 and bfloat16; fp32 accumulation. The
compiled ops exist only in CUDA builds: check `available(device)` first.

These are inference kernels: they have no derivative, and called with an argument that
requires grad (grad mode on), under a torch.func transform or inside a forward-AD dual level
they raise; fused_mlp.gated_mlp / mlp / linear_act support all three. The dispatcher calls
the unchecked forms (_gated_mlp, _mlp, _linear) on its inference path.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._autodiff import autodiff_wanted, refuse_autodiff
from ._ops import add_op_namespace_prefix, ops
from .act_and_mul import has_compiled_kernel
from .activations import activation_id

Tensor = torch.Tensor

MAX_M = 64
"""The most rows of x the decode kernels take; use the general path above it."""

_OPS = ("decode_gate_up", "decode_linear")


def _op_defined(name: str) -> bool:
    # False (not an error) for ops this build does not define, e.g. in the CPU variant.
    return torch._C._dispatch_has_kernel(add_op_namespace_prefix(name))


# The compiled ops only write `out` and return nothing, so their fake (meta)
# implementations have nothing to do; registered so torch.compile can trace them.
if _op_defined("decode_gate_up"):
    torch.library.register_fake(add_op_namespace_prefix("decode_gate_up"))(
        lambda out, x, gate_weight, up_weight, gate_bias, up_bias, activation: None
    )
if _op_defined("decode_linear"):
    torch.library.register_fake(add_op_namespace_prefix("decode_linear"))(
        lambda out, x, weight, bias, activation: None
    )


def available(device: torch.device | str) -> bool:
    """Whether this build has the compiled decode kernels for `device` (CUDA builds only)."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    return all(has_compiled_kernel(name, device) for name in _OPS)


def _x2d(x2d: Tensor) -> Tensor:
    if not isinstance(x2d, torch.Tensor) or x2d.dim() != 2:
        raise ValueError(f"x2d must be a 2-D tensor [M, dim], got {getattr(x2d, 'shape', type(x2d))}")
    if x2d.shape[0] > MAX_M:
        raise ValueError(
            f"x2d has {x2d.shape[0]} rows; the decode path takes at most {MAX_M} "
            "(use fused_mlp.gated_mlp / fused_mlp.mlp, which pick the general path)"
        )
    if not x2d.is_contiguous():
        x2d = x2d.contiguous()
    if not torch.compiler.is_compiling() and x2d.data_ptr() % 16:
        # A view at an odd offset: the tensor-core kernels want 16-byte aligned rows of x.
        # x has at most MAX_M rows, so the copy is small; without it the op takes its
        # CUDA-core fallback (as it does under torch.compile, where this is not checked).
        # Which of the two is faster was not measured.
        x2d = x2d.clone()
    return x2d


def _unit_stride(b: Optional[Tensor]) -> Optional[Tensor]:
    """The kernels read biases contiguously (and check it): a strided view is copied."""
    return b if b is None or b.stride(0) == 1 or b.shape[0] <= 1 else b.contiguous()


def _gate_up(x2d, gate_weight, up_weight, gate_bias, up_bias, activation) -> Tensor:
    act = activation_id(activation)
    x2d = _x2d(x2d)
    out = torch.empty((x2d.shape[0], gate_weight.shape[0]), dtype=x2d.dtype, device=x2d.device)
    ops.decode_gate_up(out, x2d, gate_weight, up_weight, _unit_stride(gate_bias), _unit_stride(up_bias), act)
    return out


def _linear(x2d, weight, bias, activation) -> Tensor:
    act = activation_id(activation)
    x2d = _x2d(x2d)
    out = torch.empty((x2d.shape[0], weight.shape[0]), dtype=x2d.dtype, device=x2d.device)
    ops.decode_linear(out, x2d, weight, _unit_stride(bias), act)
    return out


def _gated_mlp(x2d, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias) -> Tensor:
    h = _gate_up(x2d, gate_weight, up_weight, gate_bias, up_bias, activation)
    return _linear(h, down_weight, down_bias, "identity")


def _mlp(x2d, fc_weight, fc_bias, proj_weight, proj_bias, activation) -> Tensor:
    return _linear(_linear(x2d, fc_weight, fc_bias, activation), proj_weight, proj_bias, "identity")


def gate_up(
    x2d: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    gate_bias: Optional[Tensor] = None,
    up_bias: Optional[Tensor] = None,
    activation: str = "silu",
) -> Tensor:
    """act(x2d gate_weight^T + gate_bias) * (x2d up_weight^T + up_bias), shape [M, hidden]."""
    if autodiff_wanted(x2d, gate_weight, up_weight, gate_bias, up_bias):
        refuse_autodiff("fused_mlp.decode.gate_up", "fused_mlp.gated_mlp", x2d=x2d, gate_weight=gate_weight,
                        up_weight=up_weight, gate_bias=gate_bias, up_bias=up_bias)
    return _gate_up(x2d, gate_weight, up_weight, gate_bias, up_bias, activation)


def linear(x2d: Tensor, weight: Tensor, bias: Optional[Tensor] = None, activation: str = "identity") -> Tensor:
    """act(x2d weight^T + bias), shape [M, out]; activation "identity" for a plain linear."""
    if autodiff_wanted(x2d, weight, bias):
        refuse_autodiff("fused_mlp.decode.linear", "fused_mlp.linear_act", x2d=x2d, weight=weight, bias=bias)
    return _linear(x2d, weight, bias, activation)


def gated_mlp(
    x2d: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    activation: str = "silu",
    gate_bias: Optional[Tensor] = None,
    up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
) -> Tensor:
    """down(act(gate(x)) * up(x)) for few rows: two launches, [M, hidden] in between."""
    if autodiff_wanted(x2d, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias):
        refuse_autodiff("fused_mlp.decode.gated_mlp", "fused_mlp.gated_mlp", x2d=x2d, gate_weight=gate_weight,
                        up_weight=up_weight, down_weight=down_weight, gate_bias=gate_bias, up_bias=up_bias,
                        down_bias=down_bias)
    return _gated_mlp(x2d, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)


def mlp(
    x2d: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str = "gelu_tanh",
) -> Tensor:
    """proj(act(fc(x))) for few rows, nn.Linear weight layout only ([out, in])."""
    if autodiff_wanted(x2d, fc_weight, fc_bias, proj_weight, proj_bias):
        refuse_autodiff("fused_mlp.decode.mlp", "fused_mlp.mlp", x2d=x2d, fc_weight=fc_weight, fc_bias=fc_bias,
                        proj_weight=proj_weight, proj_bias=proj_bias)
    return _mlp(x2d, fc_weight, fc_bias, proj_weight, proj_bias, activation)


__all__ = ["MAX_M", "available", "gate_up", "gated_mlp", "linear", "mlp"]
