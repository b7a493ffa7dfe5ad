"""Activation-and-multiply ops: out[..., d] = act(x[..., :d]) * x[..., d:].

Same calling convention as kernels-community/activation: `op(out, x)` writes
into `out` and returns it. The compiled kernels (kernel_src/cuda, kernel_src/cpu)
run where this variant has one for the tensors' device; elsewhere (a CUDA variant
given CPU tensors, say) the reference computes the same function into `out`.

Like torch's out= functions they have no derivative: called with an argument that requires
grad (grad mode on), under a torch.func transform or inside a forward-AD dual level they
raise (use fused_mlp.reference.act_and_mul, or the layers, which fall back to it).
"""

from __future__ import annotations

import torch

from . import reference
from ._autodiff import autodiff_wanted, refuse_autodiff
from ._ops import add_op_namespace_prefix, ops
from .activations import ACTIVATION_IDS, canonical_activation

_NAMED = ("silu", "gelu_tanh", "gelu", "relu", "relu2", "quick_gelu")
_OP_NAMES = ("act_and_mul",) + tuple(f"{a}_and_mul" for a in _NAMED)

for _name in _OP_NAMES:
    # The ops only write `out`: nothing to compute for fake tensors.
    if _name == "act_and_mul":
        torch.library.register_fake(add_op_namespace_prefix(_name))(lambda out, input, activation: None)
    else:
        torch.library.register_fake(add_op_namespace_prefix(_name))(lambda out, input: None)


def _kernel_table() -> dict[tuple[str, str], bool]:
    """(op name, device type) -> whether this build registered a kernel of that op for
    that device, read once at import: a fixed property of the build, looked up as a
    constant by dynamo (a plain dict; torch.compiler.assume_constant_result would import
    torch._dynamo with the package, ~2.5 s)."""
    table = {}
    for name in _OP_NAMES + ("decode_gate_up", "decode_linear", "gated_gemm_sm90", "dact_gemm_sm90",
                                   "linear_act_sm90"):
        qualified = add_op_namespace_prefix(name)
        defined = torch._C._dispatch_has_kernel(qualified)  # False for ops this build lacks
        for device_type, key in (("cuda", "CUDA"), ("cpu", "CPU")):
            table[(name, device_type)] = defined and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)
    return table


_COMPILED = _kernel_table()


def has_compiled_kernel(op_name: str, device: torch.device) -> bool:
    """Whether this build registered a kernel of `op_name` for `device`'s type."""
    return _COMPILED.get((op_name, device.type), False)


def _check_args(out: torch.Tensor, x: torch.Tensor) -> None:
    # Mirrors check_act_and_mul_args in torch-ext/torch_binding.cpp for the fallback path.
    if x.dim() < 1:
        raise ValueError("input must have at least one dimension, got a scalar")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device} but input is on {x.device}; both must be on the same device")
    if out.dtype != x.dtype:
        raise ValueError(f"out has dtype {out.dtype} but input has dtype {x.dtype}; they must match")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"input dtype {x.dtype} is not supported (float32, float16, bfloat16)")
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of input must be even (gate and up halves), got {x.shape[-1]}")
    if out.shape[:-1] != x.shape[:-1] or out.shape[-1] * 2 != x.shape[-1]:
        raise ValueError(f"out.shape {tuple(out.shape)} must be input.shape[:-1] + ({x.shape[-1] // 2},)")


def act_and_mul(out: torch.Tensor, x: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """out = act(x[..., :d]) * x[..., d:] for any activation fused-mlp knows."""
    act = canonical_activation(activation)
    if autodiff_wanted(out, x):
        refuse_autodiff(f"{act}_and_mul", "fused_mlp.reference.act_and_mul(input, activation)", out=out, input=x)
    if has_compiled_kernel("act_and_mul", x.device):
        ops.act_and_mul(out, x, ACTIVATION_IDS[act])
    else:
        _check_args(out, x)
        # In fp32 and rounded once into out, as the compiled kernels do (in bf16 / fp16 the
        # plain formula would round act(g) first: up to one unit more in the last place).
        out.copy_(reference.act_and_mul(x.float(), act))
    return out


def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "silu")


def gelu_tanh_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "gelu_tanh")


def gelu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "gelu")


def relu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "relu")


def relu2_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "relu2")


def quick_gelu_and_mul(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return act_and_mul(out, x, "quick_gelu")
