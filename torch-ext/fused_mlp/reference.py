"""Plain-PyTorch reference implementations: the specification every kernel is tested against.

Each function computes in the dtype of its inputs with ordinary PyTorch ops, so the
result is what an unfused model computes; tests call them on float64 copies to get
an exact reference.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .activations import torch_activation


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(x[..., :d]) * x[..., d:] for x of shape [..., 2d]."""
    d = x.shape[-1] // 2
    return torch_activation(activation)(x[..., :d]) * x[..., d:]


def gated_mlp(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    activation: str = "silu",
    gate_bias: Optional[torch.Tensor] = None,
    up_bias: Optional[torch.Tensor] = None,
    down_bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), weights in nn.Linear layout [out, in]."""
    act = torch_activation(activation)
    h = act(F.linear(x, gate_weight, gate_bias)) * F.linear(x, up_weight, up_bias)
    return F.linear(h, down_weight, down_bias)


def gated_mlp_packed(
    x: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    activation: str = "silu",
    gate_up_bias: Optional[torch.Tensor] = None,
    down_bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Gated MLP with one [2H, D] projection whose first half is the gate (Phi-3, GLM)."""
    gu = F.linear(x, gate_up_weight, gate_up_bias)
    return F.linear(act_and_mul(gu, activation), down_weight, down_bias)


def mlp(
    x: torch.Tensor,
    fc_weight: torch.Tensor,
    fc_bias: Optional[torch.Tensor],
    proj_weight: torch.Tensor,
    proj_bias: Optional[torch.Tensor],
    activation: str = "gelu_tanh",
    weight_layout: str = "linear",
) -> torch.Tensor:
    """fc2(act(fc1(x))). weight_layout="linear": weights [out, in] (nn.Linear);
    "conv1d": weights [in, out] (GPT-2's Conv1D)."""
    h = linear_act(x, fc_weight, fc_bias, activation, weight_layout)
    return F.linear(h, proj_weight.t() if weight_layout == "conv1d" else proj_weight, proj_bias)


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: str = "gelu",
    weight_layout: str = "linear",
) -> torch.Tensor:
    """act(x W^T + b). weight_layout="linear": weight [out, in] (nn.Linear);
    "conv1d": weight [in, out] (GPT-2's Conv1D)."""
    if weight_layout == "conv1d":
        weight = weight.t()
    elif weight_layout != "linear":
        raise ValueError(f"weight_layout={weight_layout!r} must be 'linear' or 'conv1d'")
    return torch_activation(activation)(F.linear(x, weight, bias))
