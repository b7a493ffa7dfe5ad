"""Public MLP functions, each a torch.library custom op (with a fake implementation,
so torch.compile and CUDA graphs see through it) registered under this build's op
namespace.

    gated_mlp(x, gate_weight, up_weight, down_weight, activation="silu", *, biases...)
    gated_mlp_packed(x, gate_up_weight, down_weight, activation="silu", *, biases...)
    mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation="gelu_tanh", weight_layout="linear")

Weights are nn.Linear's [out, in] (or GPT-2 Conv1D's [in, out] with
weight_layout="conv1d"); `x` may have any leading dimensions.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import dispatch
from ._ops import add_op_namespace_prefix
from .activations import canonical_activation, torch_activation, torch_activation_derivative

Tensor = torch.Tensor
# float64 runs on the reference path (gradcheck, exact comparisons).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# ----------------------------------------------------------------------------- checks


def _check_tensor(name: str, t: Tensor, x: Tensor, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}; all tensors must be on one device")
    if t.dtype != x.dtype:
        raise ValueError(f"{name} has dtype {t.dtype} but x has dtype {x.dtype}; they must match")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")


def _check_x(x: Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (the model dimension)")
    if x.dtype not in _DTYPES:
        raise ValueError(f"x has dtype {x.dtype}; supported: float32, float16, bfloat16 (float64 on the reference path)")


def _check_gated(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias) -> None:
    _check_x(x)
    if not isinstance(gate_weight, torch.Tensor) or gate_weight.dim() != 2:
        raise ValueError("gate_weight must be a 2-D tensor [hidden, dim] (nn.Linear layout)")
    hidden, dim = gate_weight.shape
    if x.shape[-1] != dim:
        raise ValueError(f"x.shape[-1] is {x.shape[-1]} but gate_weight expects dim {dim} (shape [hidden, dim])")
    _check_tensor("gate_weight", gate_weight, x, (hidden, dim))
    _check_tensor("up_weight", up_weight, x, (hidden, dim))
    if not isinstance(down_weight, torch.Tensor) or down_weight.dim() != 2 or down_weight.shape[1] != hidden:
        raise ValueError(f"down_weight must be [out, {hidden}], got {tuple(getattr(down_weight, 'shape', ()))}")
    _check_tensor("down_weight", down_weight, x, tuple(down_weight.shape))
    for name, b, n in (("gate_bias", gate_bias, hidden), ("up_bias", up_bias, hidden),
                       ("down_bias", down_bias, down_weight.shape[0])):
        if b is not None:
            _check_tensor(name, b, x, (n,))


# ----------------------------------------------------------------------------- backward
# Plain-PyTorch backward, recomputing the pre-activations from the saved inputs.


def _sum_rows(t: Tensor) -> Tensor:
    return t.sum(0)


def _gated_backward(ctx, grad_out):
    x, gate_w, up_w, down_w, gate_b, up_b, down_b = ctx.saved_tensors
    act = ctx.activation
    x2 = x.reshape(-1, x.shape[-1])
    dy = grad_out.reshape(-1, grad_out.shape[-1])
    g = torch.nn.functional.linear(x2, gate_w, gate_b)
    u = torch.nn.functional.linear(x2, up_w, up_b)
    a = torch_activation(act)(g)
    h = a * u
    dh = dy @ down_w
    dg = dh * u * torch_activation_derivative(act)(g)
    du = dh * a
    dx = (dg @ gate_w + du @ up_w).reshape(x.shape)
    return (
        dx, dg.t() @ x2, du.t() @ x2, dy.t() @ h, None,
        _sum_rows(dg) if gate_b is not None else None,
        _sum_rows(du) if up_b is not None else None,
        _sum_rows(dy) if down_b is not None else None,
    )


def _save_all(ctx, inputs, output):
    ctx.activation = inputs[4]
    ctx.save_for_backward(*inputs[:4], *inputs[5:8])


# ----------------------------------------------------------------------------- gated MLP


@torch.library.custom_op(add_op_namespace_prefix("gated_mlp"), mutates_args=())
def _gated_mlp_op(
    x: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    activation: str,
    gate_bias: Optional[Tensor],
    up_bias: Optional[Tensor],
    down_bias: Optional[Tensor],
) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = dispatch.gated_mlp_forward(x2, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)
    return y.reshape(*x.shape[:-1], down_weight.shape[0])


@_gated_mlp_op.register_fake
def _(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias):
    return x.new_empty(*x.shape[:-1], down_weight.shape[0])


_gated_mlp_op.register_autograd(_gated_backward, setup_context=_save_all)


def gated_mlp(
    x: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    activation: str = "silu",
    *,
    gate_bias: Optional[Tensor] = None,
    up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
) -> Tensor:
    """down(act(gate(x)) * up(x)) with weights in nn.Linear layout [out, in]."""
    act = canonical_activation(activation)
    _check_gated(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias)
    return _gated_mlp_op(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias)


def gated_mlp_packed(
    x: Tensor,
    gate_up_weight: Tensor,
    down_weight: Tensor,
    activation: str = "silu",
    *,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
) -> Tensor:
    """Gated MLP with one [2H, D] gate_up projection, gate first (Phi-3, GLM).

    The gate and up halves are row slices of the packed weight (views, no copy)."""
    if not isinstance(gate_up_weight, torch.Tensor) or gate_up_weight.dim() != 2 or gate_up_weight.shape[0] % 2:
        raise ValueError(
            f"gate_up_weight must be a 2-D tensor [2 * hidden, dim] with an even first dimension, "
            f"got shape {tuple(getattr(gate_up_weight, 'shape', ()))}"
        )
    h = gate_up_weight.shape[0] // 2
    gate_b = up_b = None
    if gate_up_bias is not None:
        if not isinstance(gate_up_bias, torch.Tensor) or tuple(gate_up_bias.shape) != (2 * h,):
            raise ValueError(f"gate_up_bias must have shape ({2 * h},), got {tuple(getattr(gate_up_bias, 'shape', ()))}")
        gate_b, up_b = gate_up_bias[:h], gate_up_bias[h:]
    return gated_mlp(
        x, gate_up_weight[:h], gate_up_weight[h:], down_weight, activation,
        gate_bias=gate_b, up_bias=up_b, down_bias=down_bias,
    )


# ----------------------------------------------------------------------------- plain MLP


def _mlp_backward(ctx, grad_out):
    x, fc_w, fc_b, proj_w, proj_b = ctx.saved_tensors
    act, layout = ctx.activation, ctx.weight_layout
    x2 = x.reshape(-1, x.shape[-1])
    dy = grad_out.reshape(-1, grad_out.shape[-1])
    w1 = fc_w.t() if layout == "conv1d" else fc_w  # [hidden, dim]
    w2 = proj_w.t() if layout == "conv1d" else proj_w  # [out, hidden]
    pre = torch.nn.functional.linear(x2, w1, fc_b)
    h = torch_activation(act)(pre)
    dh = dy @ w2
    dpre = dh * torch_activation_derivative(act)(pre)
    dx = (dpre @ w1).reshape(x.shape)
    d_w1 = dpre.t() @ x2
    d_w2 = dy.t() @ h
    if layout == "conv1d":
        d_w1, d_w2 = d_w1.t(), d_w2.t()
    return (
        dx, d_w1, _sum_rows(dpre) if fc_b is not None else None,
        d_w2, _sum_rows(dy) if proj_b is not None else None, None, None,
    )


def _mlp_save(ctx, inputs, output):
    ctx.activation, ctx.weight_layout = inputs[5], inputs[6]
    ctx.save_for_backward(*inputs[:5])


@torch.library.custom_op(add_op_namespace_prefix("mlp"), mutates_args=())
def _mlp_op(
    x: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str,
    weight_layout: str,
) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = dispatch.mlp_forward(x2, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout)
    return y.reshape(*x.shape[:-1], y.shape[-1])


@_mlp_op.register_fake
def _(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout):
    out = proj_weight.shape[1] if weight_layout == "conv1d" else proj_weight.shape[0]
    return x.new_empty(*x.shape[:-1], out)


_mlp_op.register_autograd(_mlp_backward, setup_context=_mlp_save)


def mlp(
    x: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str = "gelu_tanh",
    weight_layout: str = "linear",
) -> Tensor:
    """proj(act(fc(x))) with biases. weight_layout="linear": nn.Linear weights [out, in];
    "conv1d": GPT-2 Conv1D weights [in, out], used as they are (no transposed copy)."""
    act = canonical_activation(activation)
    if weight_layout not in ("linear", "conv1d"):
        raise ValueError(f"weight_layout={weight_layout!r} must be 'linear' or 'conv1d'")
    _check_x(x)
    for name, w in (("fc_weight", fc_weight), ("proj_weight", proj_weight)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise ValueError(f"{name} must be a 2-D tensor")
    conv = weight_layout == "conv1d"
    dim, hidden = fc_weight.shape if conv else (fc_weight.shape[1], fc_weight.shape[0])
    if x.shape[-1] != dim:
        raise ValueError(
            f"x.shape[-1] is {x.shape[-1]} but fc_weight {tuple(fc_weight.shape)} expects dim {dim} "
            f"(weight_layout={weight_layout!r})"
        )
    _check_tensor("fc_weight", fc_weight, x, tuple(fc_weight.shape))
    p_in = proj_weight.shape[0] if conv else proj_weight.shape[1]
    if p_in != hidden:
        raise ValueError(f"proj_weight {tuple(proj_weight.shape)} does not take the hidden size {hidden}")
    _check_tensor("proj_weight", proj_weight, x, tuple(proj_weight.shape))
    out = proj_weight.shape[1] if conv else proj_weight.shape[0]
    if fc_bias is not None:
        _check_tensor("fc_bias", fc_bias, x, (hidden,))
    if proj_bias is not None:
        _check_tensor("proj_bias", proj_bias, x, (out,))
    return _mlp_op(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout)
