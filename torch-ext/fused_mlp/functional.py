"""Public MLP functions, each a torch.library custom op (with a fake implementation,
so torch.compile and CUDA graphs see through it) registered under this build's op
namespace.

    gated_mlp(x, gate_weight, up_weight, down_weight, activation="silu", *, biases..., recompute=False)
    gated_mlp_packed(x, gate_up_weight, down_weight, activation="silu", *, biases..., recompute=False)
    mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation="gelu_tanh", weight_layout="linear",
        *, recompute=False)
    linear_act(x, weight, bias=None, activation="gelu", weight_layout="linear")

Weights are nn.Linear's [out, in] (or GPT-2 Conv1D's [in, out] with
weight_layout="conv1d"); `x` may have any leading dimensions.

Autocast. Inside torch.autocast (for x's device) the four functions cast their
floating-point operands (float64 excepted) to autocast's dtype, as F.linear's are, and
run the MLP in it: the result has autocast's dtype on every path.

torch.func and forward AD. Under a transform (grad, vmap, jvp, jacrev, functional_call
inside one) or inside a torch.autograd.forward_ad dual level the four functions run their
plain-PyTorch reference (fused_mlp.reference), which both support; the kernels and the
training Functions do not.

Autograd. Without gradients (inference, torch.no_grad) the ops gated_mlp / mlp run.
When a gradient is needed, the training ops gated_mlp_train / mlp_train run instead:
    recompute=False  the forward also returns the pre-activations (g | u, or pre) and h,
                     saved for the backward: the fastest backward, more memory
    recompute=True   only the inputs are saved; the backward recomputes the pre-activations
                     (in chunks of the hidden dimension): the least memory
The backward (dispatch.backward_choice) is the fused one of triton_backward.py on the
Triton paths, the plain-PyTorch one below elsewhere (CPU, float64, ...) and wherever a
double backward is asked for (create_graph=True). Eager, the fused
backward is called directly (no custom-op dispatch: less host time per step) and writes
dg | du over the saved g | u, unless the graph is kept for another backward
(retain_graph=True). Traced (torch.compile), it is the custom op gated_mlp_backward /
mlp_backward (fake implementations; gradients into new buffers).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from . import dispatch, reference
from ._autodiff import transform_active
from ._ops import add_op_namespace_prefix
from .activations import canonical_activation, torch_activation, torch_activation_backward
from .triton_backward import NEED_DB_IN, NEED_DB_OUT, NEED_DW_IN, NEED_DW_OUT, NEED_DX

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


# ----------------------------------------------------------------------------- autocast
# Under torch.autocast the public functions take their operands as F.linear does: every
# floating-point tensor on autocast's device, float64 excepted, is cast to autocast's dtype
# (bf16 / fp16), and the MLP then runs in that dtype with autocast off inside. So every path
# (fused kernels, decode, the reference path's own F.linear calls) returns autocast's dtype,
# and gradients reach float32 weights through the casts, as in an eager autocast step.
# Like eager, a float32 weight is cast again at each call (autocast's cast cache keeps a cast
# only for the rest of its region, and a forward uses each MLP weight once).


def _autocast_operand(t, device_type: str, dtype: torch.dtype):
    if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
            and t.device.type == device_type):
        return t.to(dtype)
    return t


def _autocast_of(x):
    """(device type, dtype) of the autocast that is on for x's device, else None. Called
    at the top of each public function; is_cuda / is_cpu come first because x.device.type
    alone costs more host time than the rest."""
    if not isinstance(x, torch.Tensor):
        return None
    if x.is_cuda:
        device_type = "cuda"
    elif x.is_cpu:
        device_type = "cpu"
    else:
        device_type = x.device.type
        if not torch.amp.is_autocast_available(device_type):  # meta, ...
            return None
    if not torch.is_autocast_enabled(device_type):
        return None
    return device_type, torch.get_autocast_dtype(device_type)


def _run_cast(fn, autocast, *args, **kwargs):
    """fn(*args, **kwargs) with autocast's casts applied to its tensor arguments, and
    autocast off inside."""
    device_type, dtype = autocast
    args = [_autocast_operand(a, device_type, dtype) for a in args]
    kwargs = {k: _autocast_operand(v, device_type, dtype) for k, v in kwargs.items()}
    with torch.autocast(device_type, enabled=False):
        return fn(*args, **kwargs)


# ----------------------------------------------------------------------------- backward
# Plain-PyTorch backward, recomputing the pre-activations from the saved inputs.


def _sum_rows(t: Tensor) -> Tensor:
    return t.sum(0)


def _gated_backward(ctx, grad_out):
    """Backward of the inference op, used only when that op is called directly with inputs
    requiring grad (gated_mlp sends those calls to the training op): plain PyTorch,
    pre-activations recomputed from the saved inputs."""
    x, gate_w, up_w, down_w, gate_b, up_b, down_b = ctx.saved_tensors
    x2 = x.reshape(-1, x.shape[-1])
    dy = grad_out.reshape(-1, grad_out.shape[-1])
    dx, dwg, dwu, dwd, dbg, dbu, dbd = _gated_grads_torch(
        dy, x2, gate_w, up_w, down_w, ctx.activation, gate_b, up_b, down_b is not None, None, None)
    return dx.reshape(x.shape), dwg, dwu, dwd, None, dbg, dbu, dbd


def _save_all(ctx, inputs, output):
    ctx.activation = inputs[4]
    ctx.save_for_backward(*inputs[:4], *inputs[5:8])


# ----------------------------------------------------------------------------- gated MLP


def _gated_mlp_impl(
    x: Tensor,
    gate_weight: Tensor,
    up_weight: Tensor,
    down_weight: Tensor,
    activation: str,
    gate_bias: Optional[Tensor],
    up_bias: Optional[Tensor],
    down_bias: Optional[Tensor],
) -> Tensor:
    return _on_rows(dispatch.gated_mlp_forward, x, gate_weight, up_weight, down_weight, activation, gate_bias,
                    up_bias, down_bias)


_gated_mlp_op = torch.library.custom_op(add_op_namespace_prefix("gated_mlp"), _gated_mlp_impl, mutates_args=())


@_gated_mlp_op.register_fake
def _(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias):
    return x.new_empty(*x.shape[:-1], down_weight.shape[0])


_gated_mlp_op.register_autograd(_gated_backward, setup_context=_save_all)


# ----------------------------------------------------------------------------- training


def _run_direct(x: Tensor) -> bool:
    """Inference calls outside tracing run the op's implementation without the dispatcher
    round trip of a Python custom op (~50 us of host time per call, measured), which
    dominated small and mid-size MLPs. torch.compile / export (and fake tensors) still go
    through the registered op, so graphs see one node with its fake implementation."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling()


def _may_take_node(x: Tensor, recompute: bool) -> bool:
    """Whether a training call may run as one of the C++ autograd nodes (dispatch.sm90_train /
    sm90_mlp_train decide the rest): eager, CUDA, the pre-activations saved."""
    return _run_direct(x) and not recompute and x.is_cuda


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _on_rows(forward, x: Tensor, *args) -> Tensor:
    """forward(x2d, *args) -> [M, out] applied to x with any leading dimensions (a 2-D x is
    passed as it is: no reshape on the hot path)."""
    return _unrows(forward(_rows(x), *args), x)


def _rows(t: Tensor) -> Tensor:
    """t as 2-D rows [M, last]: itself when it is 2-D already (a reshape that changes nothing
    still costs a few microseconds of host time, five times per training step)."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


def _unrows(t: Tensor, like: Tensor) -> Tensor:
    """The 2-D result t [M, n] with like's leading dimensions: [..., n]."""
    return t if like.dim() == 2 else t.reshape(*like.shape[:-1], t.shape[-1])


def _eager_function(name: str, impl, setup_context, backward) -> type:
    """A torch.autograd.Function running a training op's implementation, setup_context and
    backward directly: what the op's registered autograd does, without the dispatcher round
    trips of a Python custom op (eager training; torch.compile traces the op itself)."""
    def forward(ctx, *inputs):
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


def _may_overwrite_saved() -> bool:
    """Whether the (eager) fused backward may write gradients over the saved
    pre-activations: not when the graph is kept for another backward (retain_graph=True)."""
    try:
        return not torch._C._autograd._get_current_graph_task_keep_graph()
    except AttributeError:  # a torch without this query: keep the saved tensors intact
        return False


def _empty_to_none(t: Tensor, wanted: bool) -> Optional[Tensor]:
    return t if wanted else None


def _gated_grads_torch(dy, x2, wg, wu, wd, act, bg, bu, has_bd, gu, h):
    """Plain-PyTorch gradients of the gated MLP (2-D), from saved g | u and h or recomputed."""
    hidden = wg.shape[0]
    if gu is None:
        g = torch.nn.functional.linear(x2, wg, bg)
        u = torch.nn.functional.linear(x2, wu, bu)
        h = None
    else:
        g, u = gu[:, :hidden], gu[:, hidden:]
    a = torch_activation(act)(g)
    if h is None:
        h = a * u
    dh = dy @ wd
    dg = torch_activation_backward(act, dh * u, g)
    du = dh * a
    return (dg @ wg + du @ wu, dg.t() @ x2, du.t() @ x2, dy.t() @ h,
            _sum_rows(dg) if bg is not None else None, _sum_rows(du) if bu is not None else None,
            _sum_rows(dy) if has_bd else None)


def _gated_mlp_train_impl(
    x: Tensor,
    gate_weight: Tensor,
    up_weight: Optional[Tensor],
    down_weight: Tensor,
    activation: str,
    gate_bias: Optional[Tensor],
    up_bias: Optional[Tensor],
    down_bias: Optional[Tensor],
    recompute: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, g | u [M, 2H], h [M, H]); the last two are empty with recompute. up_weight None:
    gate_weight / gate_bias are the packed gate_up [2H, D] / [2H]."""
    x2 = _rows(x)
    if recompute:
        wg, wu, bg, bu = dispatch.split_gate_up(gate_weight, up_weight, gate_bias, up_bias)
        y = dispatch.gated_mlp_forward(x2, wg, wu, down_weight, activation, bg, bu, down_bias)
        return _unrows(y, x), x.new_empty(0), x.new_empty(0)
    y, gu, h = dispatch.gated_mlp_train_forward(
        x2, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias)
    return _unrows(y, x), gu, h


_gated_mlp_train_op = torch.library.custom_op(add_op_namespace_prefix("gated_mlp_train"), _gated_mlp_train_impl,
                                              mutates_args=())


@_gated_mlp_train_op.register_fake
def _(x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, down_bias, recompute):
    y = x.new_empty(*x.shape[:-1], down_weight.shape[0])
    if recompute:
        return y, x.new_empty(0), x.new_empty(0)
    hidden = gate_weight.shape[0] if up_weight is not None else gate_weight.shape[0] // 2
    m = math.prod(x.shape[:-1])
    return y, x.new_empty(m, 2 * hidden), x.new_empty(m, hidden)


def _gated_bwd_fake(dy, x, gate_weight, up_weight, down_weight, activation, gate_bias, up_bias, gu, h, needs):
    hidden = gate_weight.shape[0] if up_weight is not None else gate_weight.shape[0] // 2
    shapes = ((x.shape, NEED_DX), ((2 * hidden, x.shape[1]), NEED_DW_IN), (down_weight.shape, NEED_DW_OUT),
              ((2 * hidden,), NEED_DB_IN), ((down_weight.shape[0],), NEED_DB_OUT))
    return tuple(x.new_empty(shape if needs & bit else (0,)) for shape, bit in shapes)


@torch.library.custom_op(add_op_namespace_prefix("gated_mlp_backward"), mutates_args=())
def _gated_bwd_op(
    dy: Tensor, x: Tensor, gate_weight: Tensor, up_weight: Optional[Tensor], down_weight: Tensor,
    activation: str, gate_bias: Optional[Tensor], up_bias: Optional[Tensor],
    gu: Optional[Tensor], h: Optional[Tensor], needs: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused backward (2-D dy, x) as traced by torch.compile: (dx, [dWg; dWu], dWd,
    [dbg; dbu], dbd), empty where `needs` leaves one out; the saved gu is left as it is."""
    grads = dispatch.gated_mlp_backward(dy, x, gate_weight, up_weight, down_weight, activation,
                                        gate_bias, up_bias, gu, h, needs, False)
    return tuple(g if g is not None else x.new_empty(0) for g in grads)  # custom ops return tensors


_gated_bwd_op.register_fake(_gated_bwd_fake)


def _gated_train_setup(ctx, inputs, output):
    x, gate_w, up_w, down_w, act, gate_b, up_b, down_b, recompute = inputs
    _, gu, h = output
    ctx.mark_non_differentiable(gu, h)
    ctx.set_materialize_grads(False)  # no zero gradients for the unused outputs
    ctx.activation = act
    ctx.save_for_backward(x, gate_w, up_w, down_w, gate_b, up_b, down_b,
                          None if recompute else gu, None if recompute else h)


def _gated_train_backward(ctx, grad_out, _grad_gu, _grad_h):
    nothing = (None,) * 9
    if grad_out is None:
        return nothing
    x, gate_w, up_w, down_w, gate_b, up_b, down_b, gu, h = ctx.saved_tensors
    need = ctx.needs_input_grad
    packed = up_w is None
    x2 = _rows(x)
    dy = _rows(grad_out)
    wg, wu, bg, bu = dispatch.split_gate_up(gate_w, up_w, gate_b, up_b)
    hidden = wg.shape[0]
    path = dispatch.backward_choice(x2, "gated", (wg, wu, down_w), hidden).path
    if path == "reference" or torch.is_grad_enabled():
        # torch.is_grad_enabled(): create_graph=True, a double backward to come: PyTorch ops
        # on pre-activations recomputed from the inputs (the saved ones carry no graph).
        if torch.is_grad_enabled():
            gu = h = None
        dx, dwg, dwu, dwd, dbg, dbu, dbd = _gated_grads_torch(
            dy, x2, wg, wu, down_w, ctx.activation, bg, bu, down_b is not None, gu, h)
        dx = _unrows(dx, x)
        if packed:
            dbgu = None if gate_b is None else torch.cat([dbg, dbu])
            return dx, torch.cat([dwg, dwu]), None, dwd, None, dbgu, None, dbd, None
        return dx, dwg, dwu, dwd, None, dbg, dbu, dbd, None
    needs = ((NEED_DX if need[0] else 0) | (NEED_DW_IN if need[1] or need[2] else 0)
             | (NEED_DW_OUT if need[3] else 0) | (NEED_DB_IN if need[5] or need[6] else 0)
             | (NEED_DB_OUT if need[7] else 0))
    args = (dy, x2, gate_w, up_w, down_w, ctx.activation, gate_b, up_b, gu, h, needs)
    if not (_run_direct(dy) and type(x2) is torch.Tensor):  # traced (AOTAutograd: fake tensors)
        dx, dwgu, dwd, dbgu, dbd = _gated_bwd_op(*args)
    else:
        dx, dwgu, dwd, dbgu, dbd = dispatch.gated_mlp_backward(*args, gu is not None and _may_overwrite_saved(),
                                                               path=path)
    dx = _unrows(dx, x) if need[0] else None
    dwd = _empty_to_none(dwd, need[3])
    dbd = _empty_to_none(dbd, need[7])
    if packed:
        return (dx, _empty_to_none(dwgu, need[1]), None, dwd, None,
                _empty_to_none(dbgu, need[5]), None, dbd, None)
    # The two weight gradients are the row halves of one [2H, D] tensor (one GEMM made both).
    return (dx, dwgu[:hidden] if need[1] else None, dwgu[hidden:] if need[2] else None, dwd, None,
            dbgu[:hidden] if need[5] else None, dbgu[hidden:] if need[6] else None, dbd, None)


_gated_mlp_train_op.register_autograd(_gated_train_backward, setup_context=_gated_train_setup)
_GatedTrain = _eager_function("GatedMlpTrain", _gated_mlp_train_impl, _gated_train_setup, _gated_train_backward)


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
    recompute: bool = False,
) -> Tensor:
    """down(act(gate(x)) * up(x)) with weights in nn.Linear layout [out, in].

    recompute=True: for training, save only the inputs and recompute the pre-activations
    in the backward (less memory, one more gate/up GEMM)."""
    autocast = _autocast_of(x)
    if autocast is not None:
        return _run_cast(gated_mlp, autocast, x, gate_weight, up_weight, down_weight, activation,
                         gate_bias=gate_bias, up_bias=up_bias, down_bias=down_bias, recompute=recompute)
    act = canonical_activation(activation)
    _check_gated(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias)
    if transform_active():
        return reference.gated_mlp(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias)
    if _needs_grad(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias):
        if _may_take_node(x, recompute):
            y = dispatch.sm90_train(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias)
            if y is not None:  # one C++ autograd node
                return y
        train = _GatedTrain.apply if _run_direct(x) else _gated_mlp_train_op
        y, _, _ = train(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias, bool(recompute))
        return y
    if _run_direct(x):
        return _gated_mlp_impl(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias)
    return _gated_mlp_op(x, gate_weight, up_weight, down_weight, act, gate_bias, up_bias, down_bias)


def gated_mlp_packed(
    x: Tensor,
    gate_up_weight: Tensor,
    down_weight: Tensor,
    activation: str = "silu",
    *,
    gate_up_bias: Optional[Tensor] = None,
    down_bias: Optional[Tensor] = None,
    recompute: bool = False,
) -> Tensor:
    """Gated MLP with one [2H, D] gate_up projection, gate first (Phi-3, GLM).

    The gate and up halves are row slices of the packed weight (views, no copy). In
    training the packed weight's gradient is made whole by one GEMM (no slice backward)."""
    autocast = _autocast_of(x)
    if autocast is not None:
        return _run_cast(gated_mlp_packed, autocast, x, gate_up_weight, down_weight, activation,
                         gate_up_bias=gate_up_bias, down_bias=down_bias, recompute=recompute)
    if not isinstance(gate_up_weight, torch.Tensor) or gate_up_weight.dim() != 2 or gate_up_weight.shape[0] % 2:
        raise ValueError(
            f"gate_up_weight must be a 2-D tensor [2 * hidden, dim] with an even first dimension, "
            f"got shape {tuple(getattr(gate_up_weight, 'shape', ()))}"
        )
    h = gate_up_weight.shape[0] // 2
    if gate_up_bias is not None and (not isinstance(gate_up_bias, torch.Tensor)
                                     or tuple(gate_up_bias.shape) != (2 * h,)):
        raise ValueError(f"gate_up_bias must have shape ({2 * h},), got {tuple(getattr(gate_up_bias, 'shape', ()))}")
    wg, wu, gate_b, up_b = dispatch.split_gate_up(gate_up_weight, None, gate_up_bias, None)
    transform = transform_active()
    if transform or _needs_grad(x, gate_up_weight, down_weight, gate_up_bias, down_bias):
        act = canonical_activation(activation)
        _check_gated(x, wg, wu, down_weight, gate_b, up_b, down_bias)
        if transform:
            return reference.gated_mlp_packed(x, gate_up_weight, down_weight, act, gate_up_bias, down_bias)
        if _may_take_node(x, recompute):
            y = dispatch.sm90_train(x, gate_up_weight, None, down_weight, act, gate_up_bias, None, down_bias)
            if y is not None:  # one C++ autograd node; the packed weight's gradient comes back whole
                return y
        train = _GatedTrain.apply if _run_direct(x) else _gated_mlp_train_op
        y, _, _ = train(x, gate_up_weight, None, down_weight, act, gate_up_bias, None, down_bias, bool(recompute))
        return y
    return gated_mlp(x, wg, wu, down_weight, activation, gate_bias=gate_b, up_bias=up_b, down_bias=down_bias)


# ----------------------------------------------------------------------------- plain MLP


def _mlp_backward(ctx, grad_out):
    """Backward of the inference op: plain PyTorch, pre-activations recomputed."""
    x, fc_w, fc_b, proj_w, proj_b = ctx.saved_tensors
    x2 = x.reshape(-1, x.shape[-1])
    dy = grad_out.reshape(-1, grad_out.shape[-1])
    dx, d_w1, d_b1, d_w2, d_b2 = _mlp_grads_torch(
        dy, x2, fc_w, fc_b, proj_w, proj_b is not None, ctx.activation, ctx.weight_layout, None, None)
    return dx.reshape(x.shape), d_w1, d_b1, d_w2, d_b2, None, None


def _mlp_save(ctx, inputs, output):
    ctx.activation, ctx.weight_layout = inputs[5], inputs[6]
    ctx.save_for_backward(*inputs[:5])


def _mlp_impl(
    x: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str,
    weight_layout: str,
) -> Tensor:
    return _on_rows(dispatch.mlp_forward, x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout)


_mlp_op = torch.library.custom_op(add_op_namespace_prefix("mlp"), _mlp_impl, mutates_args=())


@_mlp_op.register_fake
def _(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout):
    out = proj_weight.shape[1] if weight_layout == "conv1d" else proj_weight.shape[0]
    return x.new_empty(*x.shape[:-1], out)


_mlp_op.register_autograd(_mlp_backward, setup_context=_mlp_save)


def _mlp_grads_torch(dy, x2, fc_w, fc_b, proj_w, has_pb, act, layout, pre, h):
    """Plain-PyTorch gradients of the plain MLP (2-D), from saved pre and h or recomputed;
    weight gradients in the weights' own layout."""
    conv = layout == "conv1d"
    w1 = fc_w.t() if conv else fc_w  # [hidden, dim]
    w2 = proj_w.t() if conv else proj_w  # [out, hidden]
    if pre is None:
        pre = torch.nn.functional.linear(x2, w1, fc_b)
        h = torch_activation(act)(pre)
    dpre = torch_activation_backward(act, dy @ w2, pre)
    d_w1, d_w2 = dpre.t() @ x2, dy.t() @ h
    if conv:
        d_w1, d_w2 = d_w1.t(), d_w2.t()
    return (dpre @ w1, d_w1, _sum_rows(dpre) if fc_b is not None else None, d_w2,
            _sum_rows(dy) if has_pb else None)


def _mlp_train_impl(
    x: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str,
    weight_layout: str,
    recompute: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(y, pre [M, H], h [M, H]); the last two are empty with recompute."""
    x2 = _rows(x)
    if recompute:
        y = dispatch.mlp_forward(x2, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout)
        pre, h = x.new_empty(0), x.new_empty(0)
    else:
        y, pre, h = dispatch.mlp_train_forward(x2, fc_weight, fc_bias, proj_weight, proj_bias, activation,
                                               weight_layout)
    return _unrows(y, x), pre, h


_mlp_train_op = torch.library.custom_op(add_op_namespace_prefix("mlp_train"), _mlp_train_impl, mutates_args=())


@_mlp_train_op.register_fake
def _(x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout, recompute):
    conv = weight_layout == "conv1d"
    y = x.new_empty(*x.shape[:-1], proj_weight.shape[1] if conv else proj_weight.shape[0])
    if recompute:
        return y, x.new_empty(0), x.new_empty(0)
    hidden = fc_weight.shape[1] if conv else fc_weight.shape[0]
    m = math.prod(x.shape[:-1])
    return y, x.new_empty(m, hidden), x.new_empty(m, hidden)


def _mlp_bwd_fake(dy, x, fc_weight, fc_bias, proj_weight, activation, weight_layout, pre, h, needs):
    conv = weight_layout == "conv1d"
    hidden = fc_weight.shape[1] if conv else fc_weight.shape[0]
    shapes = ((x.shape, NEED_DX), (fc_weight.shape, NEED_DW_IN), (proj_weight.shape, NEED_DW_OUT),
              ((hidden,), NEED_DB_IN), ((dy.shape[1],), NEED_DB_OUT))
    return tuple(x.new_empty(shape if needs & bit else (0,)) for shape, bit in shapes)


@torch.library.custom_op(add_op_namespace_prefix("mlp_backward"), mutates_args=())
def _mlp_bwd_op(
    dy: Tensor, x: Tensor, fc_weight: Tensor, fc_bias: Optional[Tensor], proj_weight: Tensor,
    activation: str, weight_layout: str, pre: Optional[Tensor], h: Optional[Tensor], needs: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The fused backward of the plain MLP (2-D dy, x) as traced: (dx, dW1, dW2, db1, db2)."""
    grads = dispatch.mlp_backward(dy, x, fc_weight, fc_bias, proj_weight, activation, weight_layout,
                                  pre, h, needs, False)
    return tuple(g if g is not None else x.new_empty(0) for g in grads)


_mlp_bwd_op.register_fake(_mlp_bwd_fake)


def _mlp_train_setup(ctx, inputs, output):
    x, fc_w, fc_b, proj_w, proj_b, act, layout, recompute = inputs
    _, pre, h = output
    ctx.mark_non_differentiable(pre, h)
    ctx.set_materialize_grads(False)
    ctx.activation, ctx.weight_layout = act, layout
    ctx.save_for_backward(x, fc_w, fc_b, proj_w, proj_b, None if recompute else pre, None if recompute else h)


def _mlp_train_backward(ctx, grad_out, _grad_pre, _grad_h):
    if grad_out is None:
        return (None,) * 8
    x, fc_w, fc_b, proj_w, proj_b, pre, h = ctx.saved_tensors
    need = ctx.needs_input_grad
    act, layout = ctx.activation, ctx.weight_layout
    x2 = _rows(x)
    dy = _rows(grad_out)
    hidden = fc_w.shape[1] if layout == "conv1d" else fc_w.shape[0]
    path = dispatch.backward_choice(x2, "mlp", (fc_w, proj_w), hidden, layout).path
    if path == "reference" or torch.is_grad_enabled():  # (see _gated_train_backward)
        if torch.is_grad_enabled():
            pre = h = None
        dx, dw1, db1, dw2, db2 = _mlp_grads_torch(dy, x2, fc_w, fc_b, proj_w, proj_b is not None, act, layout,
                                                  pre, h)
        return _unrows(dx, x), dw1, db1, dw2, db2, None, None, None
    needs = ((NEED_DX if need[0] else 0) | (NEED_DW_IN if need[1] else 0) | (NEED_DB_IN if need[2] else 0)
             | (NEED_DW_OUT if need[3] else 0) | (NEED_DB_OUT if need[4] else 0))
    args = (dy, x2, fc_w, fc_b, proj_w, act, layout, pre, h, needs)
    if not (_run_direct(dy) and type(x2) is torch.Tensor):  # traced (AOTAutograd: fake tensors)
        dx, dw1, dw2, db1, db2 = _mlp_bwd_op(*args)
    else:
        dx, dw1, dw2, db1, db2 = dispatch.mlp_backward(*args, pre is not None and _may_overwrite_saved(),
                                                       path=path)
    return (_unrows(dx, x) if need[0] else None, _empty_to_none(dw1, need[1]), _empty_to_none(db1, need[2]),
            _empty_to_none(dw2, need[3]), _empty_to_none(db2, need[4]), None, None, None)


_mlp_train_op.register_autograd(_mlp_train_backward, setup_context=_mlp_train_setup)
_MlpTrain = _eager_function("MlpTrain", _mlp_train_impl, _mlp_train_setup, _mlp_train_backward)


def _check_first_projection(name: str, w: Tensor, x: Tensor, weight_layout: str) -> int:
    """Checks a projection applied to x ([in, out] for "conv1d", [out, in] for "linear");
    returns its number of outputs."""
    if weight_layout not in ("linear", "conv1d"):
        raise ValueError(f"weight_layout={weight_layout!r} must be 'linear' or 'conv1d'")
    _check_x(x)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor, got shape {tuple(getattr(w, 'shape', ()))}")
    dim, out = w.shape if weight_layout == "conv1d" else (w.shape[1], w.shape[0])
    if x.shape[-1] != dim:
        raise ValueError(
            f"x.shape[-1] is {x.shape[-1]} but {name} {tuple(w.shape)} expects dim {dim} "
            f"(weight_layout={weight_layout!r})"
        )
    _check_tensor(name, w, x, tuple(w.shape))
    return out


def mlp(
    x: Tensor,
    fc_weight: Tensor,
    fc_bias: Optional[Tensor],
    proj_weight: Tensor,
    proj_bias: Optional[Tensor],
    activation: str = "gelu_tanh",
    weight_layout: str = "linear",
    *,
    recompute: bool = False,
) -> Tensor:
    """proj(act(fc(x))) with biases. weight_layout="linear": nn.Linear weights [out, in];
    "conv1d": GPT-2 Conv1D weights [in, out], used as they are (no transposed copy).
    recompute=True: for training, save only the inputs (see gated_mlp)."""
    autocast = _autocast_of(x)
    if autocast is not None:
        return _run_cast(mlp, autocast, x, fc_weight, fc_bias, proj_weight, proj_bias, activation, weight_layout,
                         recompute=recompute)
    act = canonical_activation(activation)
    hidden = _check_first_projection("fc_weight", fc_weight, x, weight_layout)
    if not isinstance(proj_weight, torch.Tensor) or proj_weight.dim() != 2:
        raise ValueError("proj_weight must be a 2-D tensor")
    conv = weight_layout == "conv1d"
    p_in = proj_weight.shape[0] if conv else proj_weight.shape[1]
    if p_in != hidden:
        raise ValueError(f"proj_weight {tuple(proj_weight.shape)} does not take the hidden size {hidden}")
    _check_tensor("proj_weight", proj_weight, x, tuple(proj_weight.shape))
    out = proj_weight.shape[1] if conv else proj_weight.shape[0]
    if fc_bias is not None:
        _check_tensor("fc_bias", fc_bias, x, (hidden,))
    if proj_bias is not None:
        _check_tensor("proj_bias", proj_bias, x, (out,))
    if transform_active():
        return reference.mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout)
    if _needs_grad(x, fc_weight, fc_bias, proj_weight, proj_bias):
        if _may_take_node(x, recompute):
            y = dispatch.sm90_mlp_train(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout)
            if y is not None:  # one C++ autograd node
                return y
        train = _MlpTrain.apply if _run_direct(x) else _mlp_train_op
        y, _, _ = train(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout, bool(recompute))
        return y
    if _run_direct(x):
        return _mlp_impl(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout)
    return _mlp_op(x, fc_weight, fc_bias, proj_weight, proj_bias, act, weight_layout)


# ----------------------------------------------------------------------------- one projection


def _linear_act_backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    act, layout = ctx.activation, ctx.weight_layout
    conv = layout == "conv1d"
    w = weight.t() if conv else weight  # [out, in]
    x2 = x.reshape(-1, x.shape[-1])
    dy = grad_out.reshape(-1, grad_out.shape[-1])
    pre = torch.nn.functional.linear(x2, w, bias)
    dpre = torch_activation_backward(act, dy, pre)
    dx = (dpre @ w).reshape(x.shape)
    dw = dpre.t() @ x2
    if conv:
        dw = dw.t()
    return dx, dw, _sum_rows(dpre) if bias is not None else None, None, None


def _linear_act_save(ctx, inputs, output):
    ctx.activation, ctx.weight_layout = inputs[3], inputs[4]
    ctx.save_for_backward(*inputs[:3])


def _linear_act_impl(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    activation: str,
    weight_layout: str,
) -> Tensor:
    return _on_rows(dispatch.linear_act_forward, x, weight, bias, activation, weight_layout)


_linear_act_op = torch.library.custom_op(add_op_namespace_prefix("linear_act"), _linear_act_impl, mutates_args=())


@_linear_act_op.register_fake
def _(x, weight, bias, activation, weight_layout):
    out = weight.shape[1] if weight_layout == "conv1d" else weight.shape[0]
    return x.new_empty(*x.shape[:-1], out)


_linear_act_op.register_autograd(_linear_act_backward, setup_context=_linear_act_save)
_LinearActTrain = _eager_function("LinearActTrain", _linear_act_impl, _linear_act_save, _linear_act_backward)


def linear_act(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    activation: str = "gelu",
    weight_layout: str = "linear",
) -> Tensor:
    """act(x W^T + b): one projection with the bias and the activation in the GEMM's
    epilogue (BERT's BertIntermediate). weight_layout="linear": nn.Linear weight [out, in];
    "conv1d": GPT-2 Conv1D weight [in, out], used as it is. The backward is plain PyTorch
    (pre-activations recomputed from the inputs)."""
    autocast = _autocast_of(x)
    if autocast is not None:
        return _run_cast(linear_act, autocast, x, weight, bias, activation, weight_layout)
    act = canonical_activation(activation)
    out = _check_first_projection("weight", weight, x, weight_layout)
    if bias is not None:
        _check_tensor("bias", bias, x, (out,))
    if transform_active():
        return reference.linear_act(x, weight, bias, act, weight_layout)
    if not _run_direct(x):
        return _linear_act_op(x, weight, bias, act, weight_layout)
    if _needs_grad(x, weight, bias):
        return _LinearActTrain.apply(x, weight, bias, act, weight_layout)
    return _linear_act_impl(x, weight, bias, act, weight_layout)
