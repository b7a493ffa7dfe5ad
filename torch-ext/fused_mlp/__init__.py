"""fused-mlp: fused feed-forward (MLP) blocks for transformer models.

Load it from the Kernel Hub::

    from kernels import get_kernel
    fused_mlp = get_kernel("org/fused-mlp", version=1)
"""

from . import decode, layers, mapping, reference
from ._ops import ops
from .act_and_mul import (
    act_and_mul,
    gelu_and_mul,
    gelu_tanh_and_mul,
    quick_gelu_and_mul,
    relu2_and_mul,
    relu_and_mul,
    silu_and_mul,
)
from .activations import SUPPORTED_ACTIVATIONS, canonical_activation
from .functional import gated_mlp, gated_mlp_packed, linear_act, mlp

__all__ = [
    "SUPPORTED_ACTIVATIONS",
    "act_and_mul",
    "canonical_activation",
    "decode",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gated_mlp",
    "gated_mlp_packed",
    "layers",
    "linear_act",
    "mapping",
    "mlp",
    "ops",
    "quick_gelu_and_mul",
    "reference",
    "relu2_and_mul",
    "relu_and_mul",
    "silu_and_mul",
]
