"""Kernel Hub layers: drop-in forwards for the MLP blocks of transformers models.

`kernels.kernelize` swaps a module's `forward` for one of these (see fused_mlp.mapping);
the forward then runs with `self` being the model's own module, so it reads that
module's parameters and submodules. Each layer is stateless (no `__init__`, no members
besides `forward`, `can_torch_compile`, `has_backward`), as the Hub requires.

Every forward has two paths:

* fused: the module's projections are plain `nn.Linear` (or GPT-2 `Conv1D`) with
  plain float16 / bfloat16 / float32 tensors on CPU or CUDA, the activation is one
  fused-mlp computes exactly (read from the module instance, see `activation_name`),
  no dropout is active and no hooks sit on the submodules. Then the block runs as one
  call of `gated_mlp` / `gated_mlp_packed` / `mlp` (or, for BERT's BertIntermediate,
  the first half of an MLP, `linear_act`). Under torch.autocast those cast the operands
  to autocast's dtype as the projections would, so mixed float dtypes are fine there.
* original: anything else runs the block's original computation, written out below
  from the module's own submodules exactly as transformers writes it. An unknown
  activation, active dropout, float64, a quantized or wrapped projection, a
  tensor subclass, a torch.func transform (grad, vmap, jvp, ...) or a forward-AD dual
  level around the call: all of these get the original function, never a different one.

`FUSED_CALLS` / `ORIGINAL_CALLS` count, per layer name, which path ran in eager calls.
Under torch.compile they are left alone: dynamo would guard on the counter's value, and
every call of the compiled model would fail that guard and compile again. What a compiled
model runs shows in its graph (the op namespace's `gated_mlp`, `mlp`, ... calls).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from . import reference
from .act_and_mul import act_and_mul
from ._autodiff import autodiff_wanted, transform_active
from .functional import gated_mlp, gated_mlp_packed, linear_act, mlp

__all__ = [
    "FUSED_CALLS",
    "ORIGINAL_CALLS",
    "GatedMLP",
    "PackedGatedMLP",
    "Lfm2MLP",
    "Llama4TextMLP",
    "SeedOssMLP",
    "GraniteMoeSharedMLP",
    "UpDownMLP",
    "Fc1Fc2MLP",
    "Qwen3VLVisionMLP",
    "GPT2MLP",
    "GPTJMLP",
    "Starcoder2MLP",
    "GPTNeoXMLP",
    "BertIntermediate",
    "SiluAndMul",
    "GeluAndMul",
    "GeluTanhAndMul",
    "activation_name",
    "reset_counters",
    "supports",
]

# ----------------------------------------------------------------------------- counters

FUSED_CALLS: dict[str, int] = {}
ORIGINAL_CALLS: dict[str, int] = {}


def reset_counters() -> None:
    FUSED_CALLS.clear()
    ORIGINAL_CALLS.clear()


def _fused(name: str) -> None:
    if not torch.compiler.is_compiling():  # see the module docstring
        FUSED_CALLS[name] = FUSED_CALLS.get(name, 0) + 1


def _original(name: str) -> None:
    if not torch.compiler.is_compiling():
        ORIGINAL_CALLS[name] = ORIGINAL_CALLS.get(name, 0) + 1


# ----------------------------------------------------------------------------- activations
# Matched by (defining module, class name) so that transformers is never imported and a
# look-alike class of the same name elsewhere is not taken for one of these.

_TF_ACT = "transformers.activations"
_TORCH_ACT = "torch.nn.modules.activation"

_ACTIVATION_CLASSES: dict[tuple[str, str], str] = {
    (_TF_ACT, "SiLUActivation"): "silu",
    # GELUTanh computes F.gelu(approximate="tanh") (or the same formula in Python);
    # NewGELU, FastGELU and AccurateGELU write that formula out (FastGELU with
    # sqrt(2/pi) rounded to 10 digits): the same function up to float rounding.
    (_TF_ACT, "GELUTanh"): "gelu_tanh",
    (_TF_ACT, "NewGELUActivation"): "gelu_tanh",
    (_TF_ACT, "FastGELUActivation"): "gelu_tanh",
    (_TF_ACT, "AccurateGELUActivation"): "gelu_tanh",
    # GELUActivation is F.gelu (erf form), or the same erf formula in Python.
    (_TF_ACT, "GELUActivation"): "gelu",
    (_TF_ACT, "QuickGELUActivation"): "quick_gelu",
    (_TF_ACT, "ReLUSquaredActivation"): "relu2",
    (_TF_ACT, "LinearActivation"): "identity",
    (_TORCH_ACT, "SiLU"): "silu",
    (_TORCH_ACT, "ReLU"): "relu",
    ("torch.nn.modules.linear", "Identity"): "identity",
}


def activation_name(act) -> Optional[str]:
    """The fused-mlp activation that `act` (a module's activation attribute) computes,
    or None when it is not one fused-mlp computes exactly (then: original computation).

    Read from the instance: its class (transformers.activations or torch.nn, matched
    by module and class name), nn.GELU's `approximate`, or a plain torch function.
    The instance is what the original forward calls, so it decides, not a config name.
    A module with hooks or a forward replaced on the instance (by a user, or by another
    kernelize) is not assumed to compute its class's function.
    """
    if isinstance(act, nn.Module):
        if not _no_hooks(act):
            return None
        cls = type(act)
        key = (cls.__module__, cls.__name__)
        name = _ACTIVATION_CLASSES.get(key)
        if name is not None:
            return name
        if key == (_TORCH_ACT, "GELU"):
            approx = getattr(act, "approximate", None)
            if approx == "none":
                return "gelu"
            if approx == "tanh":
                return "gelu_tanh"
        return None
    if act is F.silu:
        return "silu"
    if act is F.gelu:
        return "gelu"
    if act is F.relu or act is torch.relu:
        return "relu"
    return None


# ----------------------------------------------------------------------------- checks

_FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FUSED_DEVICES = ("cuda", "cpu")


def _no_hooks(m: nn.Module) -> bool:
    # The fused path reads the weights instead of calling the submodule, so it must not
    # skip anything the submodule's call would run: hooks, or a forward replaced on the
    # instance (accelerate's offload hooks, adapters, other kernels).
    return not (
        m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or m._backward_pre_hooks
        or not _own_forward(m)
    )


def _own_forward(m: nn.Module) -> bool:
    """The instance runs its class's forward: none set on the instance, or the class's
    own forward bound to it. kernels.kernelize does the latter for every tagged layer it
    has no kernel for (e.g. transformers' SiLUActivation, tagged "SiLU" by the
    transformers releases that accept the installed kernels)."""
    f = m.__dict__.get("forward")
    if f is None:
        return True
    return getattr(f, "__self__", None) is m and getattr(f, "__func__", None) is type(m).forward


# nn.Linear subclasses whose forward is F.linear's function written out (x @ W.T + b).
_LINEAR_EQUIVALENTS = {
    ("transformers.models.falcon.modeling_falcon", "FalconLinear"),
}


def _no_global_hooks() -> bool:
    # Module hooks registered for every module (torch.nn.modules.module.register_module_*).
    g = torch.nn.modules.module
    return not (g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
                or g._global_backward_pre_hooks)


def _is_linear(m) -> bool:
    cls = type(m)
    return (cls is nn.Linear or (cls.__module__, cls.__name__) in _LINEAR_EQUIVALENTS) and _no_hooks(m)


def _is_conv1d(m) -> bool:
    cls = type(m)
    return cls.__name__ == "Conv1D" and cls.__module__ == "transformers.pytorch_utils" and _no_hooks(m)


def _plain(t) -> bool:
    """None, or a plain tensor or parameter, not a quantized or other subclass; while
    torch.export traces without dynamo (its default, non-strict), also the FakeTensor that
    stands in for a plain one there (torch fakes a traceable wrapper subclass under its own
    type, so those still go to the original; not tested here)."""
    cls = type(t)
    return (t is None or cls is torch.Tensor or cls is nn.Parameter
            or (cls is FakeTensor and torch.compiler.is_compiling()))


def _tensors_ok(x, tensors) -> bool:
    """x and the weights/biases can go to the fused op: plain tensors (not quantized or
    other subclasses) on x's device, CPU or CUDA, of one float dtype; under autocast of
    any of those float dtypes, since the op then casts them all to autocast's dtype as the
    original's projections do (fused_mlp.functional, "Autocast"). Not under a torch.func
    transform or in a forward-AD dual level: there the functions would run their reference
    anyway, and the original is the model's own computation."""
    if x is None or not _plain(x) or transform_active():
        return False
    if x.dtype not in _FUSED_DTYPES or x.device.type not in _FUSED_DEVICES:
        return False
    if not _no_global_hooks():
        return False
    for t in tensors:
        if t is None:
            continue
        if not _plain(t) or t.device != x.device:
            return False
        if t.dtype != x.dtype and not (t.dtype in _FUSED_DTYPES and torch.is_autocast_enabled(x.device.type)):
            return False
    return True


def _dropout_inactive(d) -> bool:
    return type(d) is nn.Dropout and (not d.training or d.p == 0)


def _linear_tensors(*mods):
    out = []
    for m in mods:
        out.append(m.weight)
        out.append(m.bias)
    return out


# ----------------------------------------------------------------------------- gated MLPs


def _gated_fused(x, gate, up, down, act: Optional[str]):
    """gated_mlp on the projections' weights, or None when the fused path does not apply."""
    if act is None or not (_is_linear(gate) and _is_linear(up) and _is_linear(down)):
        return None
    if not _tensors_ok(x, _linear_tensors(gate, up, down)):
        return None
    return gated_mlp(x, gate.weight, up.weight, down.weight, act,
                     gate_bias=gate.bias, up_bias=up.bias, down_bias=down.bias)


def _packed_fused(x, gate_up, down, act: Optional[str]):
    """gated_mlp_packed on a [2H, D] projection, or None when the fused path does not apply."""
    if act is None or not (_is_linear(gate_up) and _is_linear(down)) or gate_up.weight.shape[0] % 2:
        return None
    if not _tensors_ok(x, _linear_tensors(gate_up, down)):
        return None
    return gated_mlp_packed(x, gate_up.weight, down.weight, act, gate_up_bias=gate_up.bias, down_bias=down.bias)



class GatedMLP(nn.Module):
    """down_proj(act_fn(gate_proj(x)) * up_proj(x)): Llama, Mistral, Qwen2/3, Gemma 1/2/3,
    OLMo, Granite, SmolLM3, Cohere and every other transformers MLP of that form."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        y = _gated_fused(x, self.gate_proj, self.up_proj, self.down_proj, activation_name(self.act_fn))
        if y is not None:
            _fused("GatedMLP")
            return y
        _original("GatedMLP")
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class PackedGatedMLP(nn.Module):
    """down_proj(up * activation_fn(gate)) with gate, up = gate_up_proj(x).chunk(2, -1):
    Phi-3, GLM, Dia and the other transformers MLPs with one packed [2H, D] projection."""

    gate_up_proj: nn.Linear
    down_proj: nn.Linear
    activation_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        y = _packed_fused(hidden_states, self.gate_up_proj, self.down_proj, activation_name(self.activation_fn))
        if y is not None:
            _fused("PackedGatedMLP")
            return y
        _original("PackedGatedMLP")
        up_states = self.gate_up_proj(hidden_states)
        gate, up_states = up_states.chunk(2, dim=-1)
        up_states = up_states * self.activation_fn(gate)
        return self.down_proj(up_states)


class Lfm2MLP(nn.Module):
    """w2(silu(w1(x)) * w3(x)) with SiLU written into the forward: LFM2, LFM2-MoE (dense layers)."""

    w1: nn.Linear
    w2: nn.Linear
    w3: nn.Linear

    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        y = _gated_fused(x, self.w1, self.w3, self.w2, "silu")
        if y is not None:
            _fused("Lfm2MLP")
            return y
        _original("Lfm2MLP")
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Llama4TextMLP(nn.Module):
    """down_proj(activation_fn(gate_proj(x)) * up_proj(x)): Llama 4's dense and shared-expert MLP."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    activation_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        y = _gated_fused(x, self.gate_proj, self.up_proj, self.down_proj, activation_name(self.activation_fn))
        if y is not None:
            _fused("Llama4TextMLP")
            return y
        _original("Llama4TextMLP")
        down_proj = self.activation_fn(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(down_proj)


class SeedOssMLP(nn.Module):
    """F.dropout(down_proj(act_fn(gate_proj(x)) * up_proj(x)), p=residual_dropout,
    training=self.training): Seed-OSS. Fused only in eval mode or with residual_dropout == 0."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: nn.Module
    residual_dropout: float

    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        if not self.training or self.residual_dropout == 0:
            y = _gated_fused(x, self.gate_proj, self.up_proj, self.down_proj, activation_name(self.act_fn))
            if y is not None:
                _fused("SeedOssMLP")
                return y
        _original("SeedOssMLP")
        down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        down_proj = nn.functional.dropout(down_proj, p=self.residual_dropout, training=self.training)
        return down_proj


class GraniteMoeSharedMLP(nn.Module):
    """output_linear(activation(h[0]) * h[1]) with h = input_linear(x).chunk(2, -1): the shared
    MLP of GraniteMoeShared / GraniteMoeHybrid (Granite 4)."""

    input_linear: nn.Linear
    output_linear: nn.Linear
    activation: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        y = _packed_fused(hidden_states, self.input_linear, self.output_linear, activation_name(self.activation))
        if y is not None:
            _fused("GraniteMoeSharedMLP")
            return y
        _original("GraniteMoeSharedMLP")
        hidden_states = self.input_linear(hidden_states)
        chunked_hidden_states = hidden_states.chunk(2, dim=-1)
        hidden_states = self.activation(chunked_hidden_states[0]) * chunked_hidden_states[1]
        hidden_states = self.output_linear(hidden_states)
        return hidden_states


# ----------------------------------------------------------------------------- plain MLPs


def _plain_mlp(x, fc, proj, act: Optional[str]):
    """(fused output) or None when the fused path does not apply."""
    if act is None:
        return None
    if _is_linear(fc) and _is_linear(proj):
        layout = "linear"
    elif _is_conv1d(fc) and _is_conv1d(proj):
        layout = "conv1d"
    else:
        return None
    if not _tensors_ok(x, _linear_tensors(fc, proj)):
        return None
    return mlp(x, fc.weight, fc.bias, proj.weight, proj.bias, act, layout)


def _plain_layer(name: str, x, fc, proj, act_module, dropout=None):
    """The body of every layer whose original forward is dropout?(proj(act(fc(x)))):
    the fused MLP when it applies (and the dropout, if any, is the identity), else that
    original computation, step by step, with the module's own submodules."""
    if dropout is None or _dropout_inactive(dropout):
        y = _plain_mlp(x, fc, proj, activation_name(act_module))
        if y is not None:
            _fused(name)
            return y
    _original(name)
    y = proj(act_module(fc(x)))
    return y if dropout is None else dropout(y)


class UpDownMLP(nn.Module):
    """down_proj(act_fn(up_proj(x))): Nemotron, Arcee, Apertus, Jais2, ..."""

    up_proj: nn.Linear
    down_proj: nn.Linear
    act_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, x):
        return _plain_layer("UpDownMLP", x, self.up_proj, self.down_proj, self.act_fn)


class Fc1Fc2MLP(nn.Module):
    """fc2(activation_fn(fc1(x))): CLIP, SigLIP, ViT-style encoders, OPT-style blocks, ..."""

    fc1: nn.Linear
    fc2: nn.Linear
    activation_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        return _plain_layer("Fc1Fc2MLP", hidden_states, self.fc1, self.fc2, self.activation_fn)


class Qwen3VLVisionMLP(nn.Module):
    """linear_fc2(act_fn(linear_fc1(x))): the vision MLPs of Qwen3-VL, Qwen3.5, Qwen3-Omni."""

    linear_fc1: nn.Linear
    linear_fc2: nn.Linear
    act_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_state):
        return _plain_layer("Qwen3VLVisionMLP", hidden_state, self.linear_fc1, self.linear_fc2, self.act_fn)


class GPTNeoXMLP(nn.Module):
    """dense_4h_to_h(act(dense_h_to_4h(x))): GPT-NeoX, GPT-NeoX-Japanese, Falcon, Persimmon."""

    dense_h_to_4h: nn.Linear
    dense_4h_to_h: nn.Linear
    act: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        return _plain_layer("GPTNeoXMLP", hidden_states, self.dense_h_to_4h, self.dense_4h_to_h, self.act)


class GPT2MLP(nn.Module):
    """dropout(c_proj(act(c_fc(x)))) with Conv1D (GPT-2, ImageGPT, ...) or nn.Linear
    (GPT-BigCode, GPT-Neo) projections. Fused only while the dropout is inactive
    (eval mode or p == 0): then it is the identity and the fused output is returned."""

    c_fc: nn.Module
    c_proj: nn.Module
    act: nn.Module
    dropout: nn.Dropout

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        return _plain_layer("GPT2MLP", hidden_states, self.c_fc, self.c_proj, self.act, self.dropout)


class GPTJMLP(nn.Module):
    """dropout(fc_out(act(fc_in(x)))): GPT-J, CodeGen. Fused only while the dropout is inactive."""

    fc_in: nn.Linear
    fc_out: nn.Linear
    act: nn.Module
    dropout: nn.Dropout

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        return _plain_layer("GPTJMLP", hidden_states, self.fc_in, self.fc_out, self.act, self.dropout)


class Starcoder2MLP(nn.Module):
    """F.dropout(c_proj(act(c_fc(x))), p=residual_dropout, training=self.training):
    StarCoder2. Fused only in eval mode or with residual_dropout == 0."""

    c_fc: nn.Linear
    c_proj: nn.Linear
    act: nn.Module
    residual_dropout: float

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        if not self.training or self.residual_dropout == 0:
            y = _plain_mlp(hidden_states, self.c_fc, self.c_proj, activation_name(self.act))
            if y is not None:
                _fused("Starcoder2MLP")
                return y
        _original("Starcoder2MLP")
        hidden_states = self.c_fc(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.c_proj(hidden_states)
        hidden_states = nn.functional.dropout(hidden_states, p=self.residual_dropout, training=self.training)
        return hidden_states


# ----------------------------------------------------------------------------- half MLPs


class BertIntermediate(nn.Module):
    """intermediate_act_fn(dense(x)): the first half of BERT's MLP (BertIntermediate, and
    RoBERTa, ELECTRA and the other encoders that copy it), as one GEMM with the bias and
    the activation in its epilogue (`linear_act`). The second half (BertOutput: dense,
    dropout, residual, LayerNorm) is left to PyTorch."""

    dense: nn.Linear
    intermediate_act_fn: nn.Module

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states):
        act = activation_name(self.intermediate_act_fn)
        dense = self.dense
        if act is not None and _is_linear(dense) and _tensors_ok(hidden_states, [dense.weight, dense.bias]):
            _fused("BertIntermediate")
            return linear_act(hidden_states, dense.weight, dense.bias, act)
        _original("BertIntermediate")
        hidden_states = self.dense(hidden_states)
        hidden_states = self.intermediate_act_fn(hidden_states)
        return hidden_states


# ----------------------------------------------------------------------------- act-and-mul
# Same names and forward as kernels-community/activation's layers:
# forward(x) = act(x[..., :d]) * x[..., d:], output allocated inside.
# Under torch.compile they emit that formula, which inductor fuses into one elementwise
# kernel itself.


def _act_and_mul_layer(x, activation: str, name: str):
    fusable = (
        not torch.compiler.is_compiling()
        and type(x) is torch.Tensor
        and x.dim() >= 1
        and x.shape[-1] % 2 == 0
        and x.dtype in _FUSED_DTYPES
        and x.device.type in _FUSED_DEVICES
        # act_and_mul writes into `out` and has no derivative (it refuses such calls).
        and not autodiff_wanted(x)
    )
    if fusable:
        _fused(name)
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2,), dtype=x.dtype, device=x.device)
        return act_and_mul(out, x, activation)
    _original(name)
    return reference.act_and_mul(x, activation)


class SiluAndMul(nn.Module):
    """silu(x[..., :d]) * x[..., d:]"""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act_and_mul_layer(x, "silu", "SiluAndMul")


class GeluAndMul(nn.Module):
    """gelu(x[..., :d]) * x[..., d:] (erf GELU)"""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act_and_mul_layer(x, "gelu", "GeluAndMul")


class GeluTanhAndMul(nn.Module):
    """gelu_tanh(x[..., :d]) * x[..., d:]"""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act_and_mul_layer(x, "gelu_tanh", "GeluTanhAndMul")


# ----------------------------------------------------------------------------- structure


def _linear_attrs(*names):
    return lambda m: all(_is_linear(getattr(m, n, None)) for n in names)


def _act_attr(name):
    return lambda m: activation_name(getattr(m, name, None)) is not None


def _gpt2_projs(m) -> bool:
    fc, proj = getattr(m, "c_fc", None), getattr(m, "c_proj", None)
    return (_is_linear(fc) and _is_linear(proj)) or (_is_conv1d(fc) and _is_conv1d(proj))


# What a module instance needs for a layer's fused path to be possible at all (dtype,
# device and dropout are checked per call). The kernelize condition uses it.
_STRUCTURE = {
    "GatedMLP": (_linear_attrs("gate_proj", "up_proj", "down_proj"), _act_attr("act_fn")),
    "PackedGatedMLP": (_linear_attrs("gate_up_proj", "down_proj"), _act_attr("activation_fn")),
    "Lfm2MLP": (_linear_attrs("w1", "w2", "w3"),),
    "Llama4TextMLP": (_linear_attrs("gate_proj", "up_proj", "down_proj"), _act_attr("activation_fn")),
    "SeedOssMLP": (_linear_attrs("gate_proj", "up_proj", "down_proj"), _act_attr("act_fn"),
                   lambda m: isinstance(getattr(m, "residual_dropout", None), (int, float))),
    "GraniteMoeSharedMLP": (_linear_attrs("input_linear", "output_linear"), _act_attr("activation")),
    "Qwen3VLVisionMLP": (_linear_attrs("linear_fc1", "linear_fc2"), _act_attr("act_fn")),
    "UpDownMLP": (_linear_attrs("up_proj", "down_proj"), _act_attr("act_fn")),
    "Fc1Fc2MLP": (_linear_attrs("fc1", "fc2"), _act_attr("activation_fn")),
    "GPTNeoXMLP": (_linear_attrs("dense_h_to_4h", "dense_4h_to_h"), _act_attr("act")),
    "GPT2MLP": (_gpt2_projs, _act_attr("act"), lambda m: type(getattr(m, "dropout", None)) is nn.Dropout),
    "GPTJMLP": (_linear_attrs("fc_in", "fc_out"), _act_attr("act"),
                lambda m: type(getattr(m, "dropout", None)) is nn.Dropout),
    "Starcoder2MLP": (_linear_attrs("c_fc", "c_proj"), _act_attr("act"),
                      lambda m: isinstance(getattr(m, "residual_dropout", None), (int, float))),
    "BertIntermediate": (_linear_attrs("dense"), _act_attr("intermediate_act_fn")),
    "SiluAndMul": (),
    "GeluAndMul": (),
    "GeluTanhAndMul": (),
}

ACTIVATION_LAYERS: tuple[str, ...] = ("SiluAndMul", "GeluAndMul", "GeluTanhAndMul")
# Every layer has an entry in _STRUCTURE (a layer without one would never be kernelized).
MLP_LAYERS: tuple[str, ...] = tuple(name for name in _STRUCTURE if name not in ACTIVATION_LAYERS)


def supports(module: nn.Module, layer_name: str) -> bool:
    """Whether `module` has the submodules `layer_name`'s fused path needs (plain
    projections, a supported activation). False means: keep the original forward."""
    checks = _STRUCTURE.get(layer_name)
    if checks is None:
        return False
    return all(check(module) for check in checks)
