"""The warp-specialized GEMMs for Hopper (kernel_src/cuda/gated_gemm_sm90_kernel.cuh, ops in
gated_gemm_sm90.cu).

    gate_up(out, x, gate_weight, up_weight, gate_bias, up_bias, pre, activation_id)
        out = act(x Wg^T + bg) * (x Wu^T + bu); pre (optional, [M, 2N]) = g | u
    linear_act(out, x, weight, bias, pre, activation_id, w_kn=False)
        out = act(x W^T + b) for nn.Linear's weight [N, K] (or with w_kn act(x W + b) for
        Conv1D's [K, N], read as it is); pre (optional) = the same without the activation
    dact(dy, weight, w_kn, pre, out, activation_id, gated)
        the backward's dh = dy @ W with the activation's derivative as its epilogue
        (triton_gemm.linear_dact's contract, without its h output)
    train(x, gate_weight, up_weight, down_weight, activation_id, biases, ones)
        the gated MLP (packed weight where up_weight is None, biases optional) as one C++
        autograd node (gate_up, cuBLAS; backward: dact, cuBLAS), where train_usable says so
    mlp_train(x, fc_weight, fc_bias, proj_weight, proj_bias, activation_id, ones, conv1d)
        the plain MLP in nn.Linear's or Conv1D's layout likewise (linear_act, cuBLAS;
        backward: dact, cuBLAS), where mlp_train_usable says so
    down(h, weight, bias, pdl)
        h W^T + b in one kernel for at most 128 rows of h (down_gemm_sm90_kernel.cuh: the two
        K halves of each 64-row block of W reduced in a cluster of 2), where down_usable says
        so: one of the down projection's timed forms (triton_gemm.down_parts)

Builds include them only for sm_90a (build.toml's `fused_mlp_sm90` kernel). triton_gemm
calls them instead of its own kernels (gated_linear, linear_act, linear_dact) wherever
`usable`, `linear_usable` or `dact_usable` says yes; FUSED_MLP_SM90=0 turns them off (and
FUSED_MLP_FAST_TANH=0, for the activations they compute through tanh.approx;
FUSED_MLP_SM90_CACHE_HINTS=0 drops the L2 hints gate_up uses in training at small sizes;
FUSED_MLP_SM90_NARROW_DH=0 keeps dact's gated kind on its wide tiles where K <= 768 would take
the narrow ones, whose epilogue gets g | u by TMA; FUSED_MLP_SM90_TRAIN=0 keeps eager training
on the Python autograd Functions; FUSED_MLP_SM90_TRAIN_FWD=fused / unfused overrides
train_forward_unfused, the training forward's choice between gate_up storing g | u and
cuBLAS + act_and_mul). They take
bf16 / fp16 tensors with unit column stride, 16-byte aligned rows and N a multiple of 8;
everything else (fp32, odd strides or offsets, other GPUs, builds without them) stays on
the Triton kernels (or cuBLASLt's epilogue).
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch

from ._ops import add_op_namespace_prefix, ops
from .act_and_mul import has_compiled_kernel
from .activations import TANH_FORMS, tanh_forms_allowed

Tensor = torch.Tensor

_OP = "gated_gemm_sm90"
_DACT_OP = "dact_gemm_sm90"
_LINEAR_OP = "linear_act_sm90"
# The training nodes (train_sm90.cu), registered above autograd (CompositeImplicitAutograd)
_TRAIN_OP = "gated_mlp_train_sm90"
_MLP_TRAIN_OP = "mlp_train_sm90"
_HAS_TRAIN_OP = torch._C._dispatch_has_kernel(add_op_namespace_prefix(_TRAIN_OP))
_HAS_MLP_TRAIN_OP = torch._C._dispatch_has_kernel(add_op_namespace_prefix(_MLP_TRAIN_OP))
_DOWN_OP = "down_gemm_sm90"
_HAS_DOWN_OP = torch._C._dispatch_has_kernel(add_op_namespace_prefix(_DOWN_OP))
# down_gemm_sm90's limit on h's rows (kDownMaxM: one 128-token tile)
DOWN_MAX_M = 128
_DTYPES = (torch.bfloat16, torch.float16)

# The ops only write their out (and pre) arguments: nothing to compute for fake tensors.
if torch._C._dispatch_has_kernel(add_op_namespace_prefix(_OP)):
    torch.library.register_fake(add_op_namespace_prefix(_OP))(
        lambda out, x, gate_weight, up_weight, gate_bias, up_bias, pre, activation, block_n=0: None
    )
if torch._C._dispatch_has_kernel(add_op_namespace_prefix(_LINEAR_OP)):
    torch.library.register_fake(add_op_namespace_prefix(_LINEAR_OP))(
        lambda out, x, weight, bias, pre, activation: None
    )
if torch._C._dispatch_has_kernel(add_op_namespace_prefix(_DACT_OP)):
    torch.library.register_fake(add_op_namespace_prefix(_DACT_OP))(
        lambda out, dy, weight, pre, activation, gated, weight_kn: None
    )
if _HAS_DOWN_OP:
    torch.library.register_fake(add_op_namespace_prefix(_DOWN_OP))(
        lambda out, h, weight, bias, pdl=False: None
    )


@functools.lru_cache(maxsize=None)
def _device_ok(index: int) -> bool:
    """This build has the kernels and GPU `index` is sm_90 (H100 / H200)."""
    return (all(has_compiled_kernel(op, torch.device("cuda")) for op in (_OP, _DACT_OP, _LINEAR_OP))
            and torch.cuda.get_device_capability(index) == (9, 0))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _index(t: Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _fills_gpu(a: Tensor, n: int) -> bool:
    """At least one 128 x 256 output tile per SM for the wide kinds (dact, linear_act)."""
    return -(-a.shape[0] // 128) * -(-n // 256) >= _sm_count(_index(a))


def _rows_ok(t: Tensor) -> bool:
    return t.stride(1) == 1 and t.stride(0) % 8 == 0 and t.data_ptr() % 16 == 0


def _bias_ok(b: Optional[Tensor]) -> bool:
    return b is None or (b.stride(0) == 1 and b.data_ptr() % 16 == 0)


def switched_off(activation_id: int) -> bool:
    """FUSED_MLP_SM90=0, or FUSED_MLP_FAST_TANH=0 for an activation this kernel computes
    through tanh.approx (the exact forms are the Triton kernels')."""
    return (os.environ.get("FUSED_MLP_SM90", "1") == "0"
            or (activation_id in TANH_FORMS and not tanh_forms_allowed()))


def _wanted(x: Tensor, activation_id: int) -> bool:
    """The conditions all three kinds share: 16-bit CUDA tensors on an sm_90 GPU with this
    build's kernels, not switched off (switched_off)."""
    if x.dtype not in _DTYPES or not x.is_cuda or switched_off(activation_id):
        return False
    return _device_ok(_index(x))


def usable(x: Tensor, gate_weight: Tensor, up_weight: Tensor, gate_bias: Optional[Tensor],
           up_bias: Optional[Tensor], out: Tensor, pre: Optional[Tensor], activation_id: int) -> bool:
    """Whether gate_up takes these 2-D tensors (else the caller keeps its Triton kernel)."""
    if not _wanted(x, activation_id) or gate_weight.shape[0] % 8:
        return False
    return (all(_rows_ok(t) for t in (x, gate_weight, up_weight, out))
            and (pre is None or _rows_ok(pre)) and _bias_ok(gate_bias) and _bias_ok(up_bias))


def train_forward_unfused(m: int, k: int, n: int, biased: bool = False) -> bool:
    """Whether a training forward's gate/up stage (g | u kept for the backward) of x [m, k]
    and weights [n, k] runs as cuBLAS's two GEMMs into g | u's halves + act_and_mul instead of
    the fused kernel storing g | u: where that measured faster (NOTES, session 27), and never
    with gate / up biases (not measured; the fused kernel adds them before g | u's one rounding).
    FUSED_MLP_SM90_TRAIN_FWD=fused / =unfused overrides the rule (read at each call)."""
    if biased:
        return False
    forced = os.environ.get("FUSED_MLP_SM90_TRAIN_FWD")
    if forced in ("fused", "unfused"):
        return forced == "unfused"
    return k >= _UNFUSED_MIN_K and m * n >= _UNFUSED_MIN_MN


# The rule's bounds (train_forward_unfused), from session 27's A/B (alternating calls, whole
# eager steps; NOTES): unfused / fused 0.992 at M 1024, 0.997 at M 4096, 0.998 at M 16384 for
# 4096 -> 14336; 1.004 at 2048 -> 8192, 1.024 at 1024 -> 4096, 1.061 at GeGLU's 768 -> 3072.
_UNFUSED_MIN_K = 4096
_UNFUSED_MIN_MN = 1024 * 14336


def _gate_up_unfused(out: Tensor, x: Tensor, gate_weight: Tensor, up_weight: Tensor, pre: Tensor,
                     activation_id: int) -> None:
    """gate_up's result (no biases) as cuBLAS's g = x Wg^T, u = x Wu^T into pre's halves and
    act_and_mul; train_sm90.cu's node makes the same calls."""
    n = gate_weight.shape[0]
    torch.mm(x, gate_weight.t(), out=pre[:, :n])
    torch.mm(x, up_weight.t(), out=pre[:, n:])
    ops.act_and_mul(out, pre, activation_id)


def gate_up(out: Tensor, x: Tensor, gate_weight: Tensor, up_weight: Tensor, gate_bias: Optional[Tensor],
            up_bias: Optional[Tensor], pre: Optional[Tensor], activation_id: int) -> Tensor:
    if (pre is not None and pre.is_contiguous() and out.is_contiguous()
            and train_forward_unfused(x.shape[0], x.shape[1], gate_weight.shape[0],
                                      gate_bias is not None or up_bias is not None)):
        _gate_up_unfused(out, x, gate_weight, up_weight, pre, activation_id)
    else:
        ops.gated_gemm_sm90(out, x, gate_weight, up_weight, gate_bias, up_bias, pre, activation_id)
    return out


def dact_usable(dy: Tensor, weight: Tensor, w_kn: bool, pre: Tensor, out: Tensor, activation_id: int,
                gated: bool) -> bool:
    """Whether dact takes these tensors: weight [K, N] (w_kn: nn.Linear's down weight
    [out, hidden]) or [N, K] (Conv1D's [hidden, out]; the plain MLP only), each read as it
    is, rows aligned, and at least one 128 x 256 tile per SM: with fewer (SwiGLU's
    M = 128: 56 tiles) the Triton kernel's smaller tiles are faster (47.9 against 67.8 us,
    NOTES, session 9). That was measured with the wide kind; the narrow gated kind the op
    takes for K <= 768 (128 x 128 tiles) has not been compared with Triton at few tiles."""
    if not _wanted(dy, activation_id) or (gated and not w_kn):
        return False
    n = pre.shape[1] // 2 if gated else pre.shape[1]
    if not _fills_gpu(dy, n):
        return False
    return n % 8 == 0 and all(_rows_ok(t) for t in (dy, pre, out, weight))


def dact(dy: Tensor, weight: Tensor, w_kn: bool, pre: Tensor, out: Tensor, activation_id: int,
         gated: bool) -> Tensor:
    ops.dact_gemm_sm90(out, dy, weight, pre, activation_id, gated, w_kn)
    return out


def linear_usable(x: Tensor, weight: Tensor, w_kn: bool, bias: Optional[Tensor], out: Optional[Tensor],
                  pre: Optional[Tensor], activation_id: int) -> bool:
    """Whether linear_act takes these tensors: weight [N, K] (nn.Linear's layout, read K-major)
    or with w_kn [K, N] (Conv1D's, read N-major), rows aligned; one tile per SM at least (as
    for dact; measured for dact only); out None means a new contiguous [M, N] buffer."""
    n = weight.shape[1] if w_kn else weight.shape[0]
    if not _wanted(x, activation_id) or n % 8 or not _fills_gpu(x, n):
        return False
    return (_rows_ok(x) and _rows_ok(weight) and (out is None or _rows_ok(out))
            and (pre is None or _rows_ok(pre)) and _bias_ok(bias))


def linear_act(out: Optional[Tensor], x: Tensor, weight: Tensor, bias: Optional[Tensor], pre: Optional[Tensor],
               activation_id: int, w_kn: bool = False) -> Tensor:
    if out is None:
        n = weight.shape[1] if w_kn else weight.shape[0]
        out = torch.empty((x.shape[0], n), device=x.device, dtype=x.dtype)
    ops.linear_act_sm90(out, x, weight, bias, pre, activation_id, w_kn)
    return out


def down_usable(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> bool:
    """Whether down takes these tensors: h [M, K] with 0 < M <= 128 and weight [N, K] (K
    contiguous), 16-bit on an sm_90 GPU with this build's kernel, rows aligned, N a multiple of
    8, not switched off (FUSED_MLP_SM90=0)."""
    if (not _HAS_DOWN_OP or h.dtype not in _DTYPES or weight.dtype != h.dtype or not h.is_cuda
            or h.dim() != 2 or weight.dim() != 2 or os.environ.get("FUSED_MLP_SM90", "1") == "0"):
        return False
    m, k = h.shape
    n = weight.shape[0]
    if not 0 < m <= DOWN_MAX_M or k == 0 or weight.shape[1] != k or n % 8:
        return False
    if bias is not None and (bias.dtype != h.dtype or bias.dim() != 1):
        return False
    return _device_ok(_index(h)) and _rows_ok(h) and _rows_ok(weight) and _bias_ok(bias)


def down(h: Tensor, weight: Tensor, bias: Optional[Tensor], pdl: bool = False) -> Tensor:
    """h W^T + b as a new [M, N] tensor (down_usable's tensors), the two K halves of each 64-row
    block of W in a cluster of 2. pdl: launched with a programmatic edge from the previous kernel
    in the stream; the W loads may then overlap that kernel, so only where it does not write
    weight (the MLP's first GEMM, say)."""
    out = torch.empty((h.shape[0], weight.shape[0]), device=h.device, dtype=h.dtype)
    ops.down_gemm_sm90(out, h, weight, bias, pdl)
    return out


def _train_wanted(has_op: bool, x: Tensor, hidden: int, activation_id: int) -> bool:
    """What both training nodes need: this build has the node, FUSED_MLP_SM90_TRAIN is not 0, and
    the hidden size suits both of its kernels as the Python path would run them: gate_up or
    linear_act forward, the dact backward with at least one 128 x 256 tile per SM."""
    if not has_op or os.environ.get("FUSED_MLP_SM90_TRAIN", "1") == "0":
        return False
    return _wanted(x, activation_id) and hidden % 8 == 0 and _fills_gpu(x, hidden)


def train_usable(x: Tensor, gate_weight: Tensor, up_weight: Optional[Tensor], down_weight: Tensor,
                 activation_id: int, gate_bias: Optional[Tensor] = None, up_bias: Optional[Tensor] = None) -> bool:
    """Whether `train` takes these tensors (x 2-D; up_weight None: gate_weight is the packed
    [2H, D], gate_bias its [2H] bias): both of its kernels take them as the Python path would run
    them, gate_up (`usable`; the halves of a packed weight or bias start 16-byte aligned where the
    whole does, hidden being a multiple of 8) and the gated dact on the [K, N] down weight
    (`dact_usable`). down_bias: cuBLAS takes any."""
    hidden = gate_weight.shape[0] // 2 if up_weight is None else gate_weight.shape[0]
    if not _train_wanted(_HAS_TRAIN_OP, x, hidden, activation_id):
        return False
    return (all(_rows_ok(t) for t in (x, gate_weight, down_weight))
            and (up_weight is None or _rows_ok(up_weight)) and _bias_ok(gate_bias) and _bias_ok(up_bias))


def train(x: Tensor, gate_weight: Tensor, up_weight: Optional[Tensor], down_weight: Tensor, activation_id: int,
          gate_bias: Optional[Tensor], up_bias: Optional[Tensor], down_bias: Optional[Tensor],
          ones: Optional[Tensor]) -> Tensor:
    hidden = gate_weight.shape[0] // 2 if up_weight is None else gate_weight.shape[0]
    unfused = train_forward_unfused(math.prod(x.shape[:-1]), x.shape[-1], hidden,
                                    gate_bias is not None or up_bias is not None)
    return ops.gated_mlp_train_sm90(x, gate_weight, up_weight, down_weight, gate_bias, up_bias, down_bias, ones,
                                    activation_id, unfused)


def mlp_train_usable(x: Tensor, fc_weight: Tensor, fc_bias: Optional[Tensor], proj_weight: Tensor,
                     activation_id: int, conv1d: bool = False) -> bool:
    """Whether `mlp_train` takes these tensors (x 2-D; weights in nn.Linear's layout, or with
    conv1d in Conv1D's): linear_act (`linear_usable`) and the plain dact on the proj weight
    (`dact_usable`) both take them, each weight read as it is. proj_bias: cuBLAS takes any."""
    hidden = fc_weight.shape[1] if conv1d else fc_weight.shape[0]
    if not _train_wanted(_HAS_MLP_TRAIN_OP, x, hidden, activation_id):
        return False
    return all(_rows_ok(t) for t in (x, fc_weight, proj_weight)) and _bias_ok(fc_bias)


def mlp_train(x: Tensor, fc_weight: Tensor, fc_bias: Optional[Tensor], proj_weight: Tensor,
              proj_bias: Optional[Tensor], activation_id: int, ones: Optional[Tensor], conv1d: bool = False) -> Tensor:
    return ops.mlp_train_sm90(x, fc_weight, fc_bias, proj_weight, proj_bias, ones, activation_id, conv1d)
