"""Activation names fused-mlp understands, their ids, and their plain-PyTorch definitions.

The ids are part of the compiled ops' schemas (`activation: int`) and must match
`fused_mlp::Activation` in kernel_src/common/activations.h.
"""

from __future__ import annotations

import math
import os
from typing import Callable

import torch
import torch.nn.functional as F

ACTIVATION_IDS: dict[str, int] = {
    "identity": 0,
    "silu": 1,
    "gelu_tanh": 2,
    "gelu": 3,
    "relu": 4,
    "relu2": 5,
    "quick_gelu": 6,
}

# The sigmoid-based activations the GPU kernels compute through one tanh.approx.f32 per
# element for 16-bit outputs (sigmoid(v) = (1 + tanh(v / 2)) / 2): their error is within a
# 16-bit output's rounding. FUSED_MLP_FAST_TANH=0 asks for the exact forms (Triton kernels).
TANH_FORMS = frozenset(ACTIVATION_IDS[a] for a in ("silu", "gelu_tanh", "quick_gelu"))


def tanh_forms_allowed() -> bool:
    """False where FUSED_MLP_FAST_TANH=0 (read at every call, like the package's other switches)."""
    return os.environ.get("FUSED_MLP_FAST_TANH", "1") != "0"


# Other spellings of the same functions (transformers' ACT2FN keys among them).
# gelu_new and gelu_fast are transformers' tanh-approximate GELU written two ways;
# both equal 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) up to rounding.
ALIASES: dict[str, str] = {
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_erf": "gelu",
    "relu_squared": "relu2",
    "linear": "identity",
    "none": "identity",
}

SUPPORTED_ACTIVATIONS: tuple[str, ...] = tuple(ACTIVATION_IDS) + tuple(ALIASES)


def canonical_activation(name: str) -> str:
    """The canonical name of `name`; ValueError naming the argument if unknown."""
    if not isinstance(name, str):
        raise TypeError(f"activation must be a string, got {type(name).__name__}")
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in ACTIVATION_IDS:
        raise ValueError(
            f"activation={name!r} is not supported; expected one of {sorted(SUPPORTED_ACTIVATIONS)}"
        )
    return key


def activation_id(name: str) -> int:
    return ACTIVATION_IDS[canonical_activation(name)]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


_TORCH_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda x: x,
    "silu": F.silu,
    "gelu_tanh": _gelu_tanh,
    "gelu": F.gelu,
    "relu": F.relu,
    "relu2": _relu2,
    "quick_gelu": _quick_gelu,
}


def torch_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The plain-PyTorch function for `name` (the reference every kernel is tested against)."""
    return _TORCH_FNS[canonical_activation(name)]


# sqrt(2 / pi), for the tanh-GELU derivative below.
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _d_silu(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


def _d_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    t = torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


def _d_gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * (1 + torch.erf(x * (1 / math.sqrt(2.0)))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _d_quick_gelu(x: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1 - s)


_TORCH_DERIVATIVES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": torch.ones_like,
    "silu": _d_silu,
    "gelu_tanh": _d_gelu_tanh,
    "gelu": _d_gelu,
    "relu": lambda x: (x > 0).to(x.dtype),
    "relu2": lambda x: 2 * F.relu(x),
    "quick_gelu": _d_quick_gelu,
}


# grad * act'(x) by ATen's own backward kernels where they exist: one pass and one rounding to
# the dtype (they compute in fp32 for 16-bit inputs), as eager autograd computes it. The rest,
# and any call whose result is to be differentiated again (double backward: silu_backward has no
# derivative in PyTorch), multiply by the formula above.
_TORCH_BACKWARDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "identity": lambda grad, x: grad,
    "silu": lambda grad, x: torch.ops.aten.silu_backward(grad, x),
    "gelu_tanh": lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate="tanh"),
    "gelu": lambda grad, x: torch.ops.aten.gelu_backward(grad, x, approximate="none"),
    "relu": lambda grad, x: torch.ops.aten.threshold_backward(grad, x, 0),
}


def torch_activation_backward(name: str, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """grad * act'(x), the backward of act at x as eager autograd computes it (see above);
    relu' is 0 at 0, as in torch_activation_derivative."""
    key = canonical_activation(name)
    fn = _TORCH_BACKWARDS.get(key)
    if fn is None or (torch.is_grad_enabled() and (grad.requires_grad or x.requires_grad)):
        return grad * _TORCH_DERIVATIVES[key](x)
    return fn(grad, x)


def torch_activation_derivative(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """d act(x) / dx in plain PyTorch (exact, not an approximation of the forward's rounding)."""
    return _TORCH_DERIVATIVES[canonical_activation(name)]
