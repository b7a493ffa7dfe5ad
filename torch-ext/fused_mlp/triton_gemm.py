"""Triton kernels of the fused MLP forward: the first GEMM with its epilogue fused.

    gated_linear:  h = act(x @ Wg^T + bg) * (x @ Wu^T + bu)   (one pass over x, two accumulators)
    linear_act:    h = act(x @ W^T + b)                         (W as nn.Linear [N, K] or Conv1D [K, N])

The second GEMM of the block (the down / proj projection) is cuBLAS: F.linear, or, in CUDA
graphs at few tokens where it measures faster (FUSED_MLP_DOWN_SPLIT), a K split by hand (a
batched cuBLAS GEMM and _sum_parts_kernel, for weights larger than the L2) or the sm_90a
one-kernel down GEMM (M <= 128); see down_linear near the bottom.

The same tile loop serves the backward pass (triton_backward.py runs it), through
compile-time flags of the epilogue:
    STORE_PRE   the forward also stores the pre-activations (gated: g | u side by side in
                one [M, 2N] buffer; plain: pre), rounded to the input dtype, for the backward
    BWD         the accumulator is dh = dy @ W_down; the epilogue loads the saved
                pre-activations and writes the gradient through the activation:
                gated (BWD=2): dg = dh * u * act'(g) | du = dh * act(g) into one [M, 2N] buffer;
                plain (BWD=1): dpre = dh * act'(pre); dh itself is never written.
                STORE_H also writes h = act(g) * u (act(pre)). The output may be the
                pre-activation buffer itself (in place: each tile is read before it is written).
    PREFETCH    backward: the epilogue's pre-activation tiles are loaded before the tile
                loop instead of after it (a per-config choice, Config.prefetch)
and one more kernel, _dual_gemm_kernel: out (+)= a1 @ w1 + a2 @ w2 (dx = dg Wg + du Wu in
one K loop over both operand pairs, without a concatenated weight).

This is the only module of the package that imports Triton, and dispatch.py imports
it only when a Triton path runs, so the package works where Triton is absent.

One kernel serves both cases (GATED is a compile-time flag), in two flavours sharing
the tile order and the epilogue (the second also as a persistent kernel):
  _fused_linear_kernel      pointer loads, any strides, sm_80+. Weights are read through
                            their own strides: gate and up may be two row slices of one
                            packed [2H, D] tensor, a Conv1D weight [K, N] is used as it is
                            (no transposed copy). Rows past M and columns past N are
                            wrapped (offs % M) so the tile loop needs no M/N masks; only
                            the store is masked; K is masked unless K % BLOCK_K == 0.
  _fused_linear_kernel_tma  TMA loads through host tensor descriptors (sm_90+, rows
                            16-byte aligned, unit last stride); the hardware zero-fills
                            past the edges. Offered to the tuner next to the pointer kernel;
                            for the plain forward also PERSISTENT: one program per SM walking
                            the tiles in one flattened loop, so that the next tile's loads
                            overlap this tile's epilogue.

Tile configurations: a short list per (gated, M range, dtype), clamped to the problem
and timed on the first call of each shape bucket (M rounded up to a power of two, N,
K, dtype, GPU, TMA-eligible); the winner is cached for the process. Set
FUSED_MLP_AUTOTUNE=0 to skip the timing and take the first candidate (also what
happens during CUDA-graph capture, when nothing may be timed), FUSED_MLP_TMA=0 to
leave the TMA kernel out. The plain forward's first GEMM (linear_act without `pre`) with a
bias and gelu_tanh or relu has one more candidate, not a Triton kernel: cuBLASLt's own
bias + activation epilogue (torch._addmm_activation), timed against ours the same way and
the untimed default (measured faster on the H200); FUSED_MLP_CUBLASLT=0 leaves it out.

Host time: every launch on CUDA goes through a launch plan (_planned), keyed by what the
config, the grid, the non-tensor arguments and Triton's specialization depend on (shapes,
strides, 16-byte alignment of each pointer, dtype, device, activation, the switches above).
A repeated call signature skips the tuner lookup and the argument set-up, and from its
second call launches through the compiled kernel's own launcher (CompiledKernel[grid])
instead of the JIT's argument binding: ~80 us of host time per gated_mlp call instead of
~230 on the GPU machine's CPU (benchmarks/NOTES.md).

Under Triton's interpreter (TRITON_INTERPRET=1 before this module is imported, or
`interpreted_module()`, which loads a second copy of this file with the interpreter
on) the kernels run on CPU tensors, for testing without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import statistics
import sys
import time
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import sm90 as _sm90
from .activations import ACTIVATION_IDS, TANH_FORMS, tanh_forms_allowed

Tensor = torch.Tensor

# Compile options every launch of this module's kernels passes. Floating-point contraction
# (FMA) stays on: the kernels were checked and timed with it, it was Triton's default up to
# 3.9, and Triton 3.9 warns that 3.10 turns the default off (ptxas --fmad=false, so the
# epilogues' activation math changes speed and rounding). Asking for it keeps the kernels as
# measured whatever the Triton; TRITON_FORCE_DISABLE_FP_FUSION (3.9+) still turns it off.
COMPILE_OPTIONS = {"enable_fp_fusion": True}

# Activation ids as compile-time constants (see activations.ACTIVATION_IDS).
_IDENTITY = tl.constexpr(ACTIVATION_IDS["identity"])
_SILU = tl.constexpr(ACTIVATION_IDS["silu"])
_GELU_TANH = tl.constexpr(ACTIVATION_IDS["gelu_tanh"])
_GELU = tl.constexpr(ACTIVATION_IDS["gelu"])
_RELU = tl.constexpr(ACTIVATION_IDS["relu"])
_RELU2 = tl.constexpr(ACTIVATION_IDS["relu2"])
_QUICK_GELU = tl.constexpr(ACTIVATION_IDS["quick_gelu"])
# The sigmoid-based activations in a form with one tanh.approx.f32 (one special-function
# unit operation per element) instead of an exponential and a reciprocal (two): the
# activation id plus _FAST, chosen on the host for 16-bit outputs on a GPU (_kernel_activation).
_FAST = 64
assert max(ACTIVATION_IDS.values()) < _FAST
_SILU_FAST = tl.constexpr(ACTIVATION_IDS["silu"] + _FAST)
_GELU_TANH_FAST = tl.constexpr(ACTIVATION_IDS["gelu_tanh"] + _FAST)
_QUICK_GELU_FAST = tl.constexpr(ACTIVATION_IDS["quick_gelu"] + _FAST)


@triton.jit
def _tanh_approx(x):
    """tanh on fp32 by the hardware's approximation (relative error about 2**-11)."""
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _activation(x, ACTIVATION: tl.constexpr):
    """act(x) on an fp32 tile."""
    if ACTIVATION == _SILU:
        x = x / (1.0 + tl.exp(-x))
    elif ACTIVATION == _GELU_TANH:
        # 0.5 x (1 + tanh(z)) = x * sigmoid(2z), z = sqrt(2/pi) (x + 0.044715 x^3)
        z2 = 1.5957691216057308 * (x + 0.044715 * x * x * x)
        x = x / (1.0 + tl.exp(-z2))
    elif ACTIVATION == _GELU:
        x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == _RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == _RELU2:
        x = tl.maximum(x, 0.0)
        x = x * x
    elif ACTIVATION == _QUICK_GELU:
        x = x / (1.0 + tl.exp(-1.702 * x))
    elif ACTIVATION == _SILU_FAST:  # sigmoid(x) = (1 + tanh(x / 2)) / 2
        hx = 0.5 * x
        x = hx + hx * _tanh_approx(hx)
    elif ACTIVATION == _GELU_TANH_FAST:
        hx = 0.5 * x
        x = hx + hx * _tanh_approx(0.7978845608028654 * (x + 0.044715 * x * x * x))
    elif ACTIVATION == _QUICK_GELU_FAST:
        hx = 0.5 * x
        x = hx + hx * _tanh_approx(0.851 * x)
    return x


@triton.jit
def _activation_and_grad(x, ACTIVATION: tl.constexpr):
    """(act(x), act'(x)) on an fp32 tile; the exact derivatives of
    activations.torch_activation_derivative (relu' = 0 at 0, as there)."""
    if ACTIVATION == _SILU:
        s = 1.0 / (1.0 + tl.exp(-x))
        a = x * s
        d = s * (1.0 + x * (1.0 - s))
    elif ACTIVATION == _GELU_TANH:
        # a = x * s, s = sigmoid(2z) = (1 + tanh z) / 2; a' = s + 2 x s (1 - s) z',
        # z' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
        s = 1.0 / (1.0 + tl.exp(-1.5957691216057308 * (x + 0.044715 * x * x * x)))
        a = x * s
        d = s + x * s * (1.0 - s) * (1.5957691216057308 * (1.0 + 0.134145 * x * x))
    elif ACTIVATION == _GELU:
        cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
        a = x * cdf
        d = cdf + x * tl.exp(-0.5 * x * x) * 0.3989422804014327  # + x * pdf(x)
    elif ACTIVATION == _RELU:
        a = tl.maximum(x, 0.0)
        d = tl.where(x > 0.0, 1.0, 0.0)
    elif ACTIVATION == _RELU2:
        a = tl.maximum(x, 0.0)
        d = 2.0 * a
        a = a * a
    elif ACTIVATION == _QUICK_GELU:
        s = 1.0 / (1.0 + tl.exp(-1.702 * x))
        a = x * s
        d = s + 1.702 * x * s * (1.0 - s)
    elif ACTIVATION == _SILU_FAST:
        s = 0.5 + 0.5 * _tanh_approx(0.5 * x)
        a = x * s
        d = s * (1.0 + x * (1.0 - s))
    elif ACTIVATION == _GELU_TANH_FAST:
        s = 0.5 + 0.5 * _tanh_approx(0.7978845608028654 * (x + 0.044715 * x * x * x))
        a = x * s
        d = s + x * s * (1.0 - s) * (1.5957691216057308 * (1.0 + 0.134145 * x * x))
    elif ACTIVATION == _QUICK_GELU_FAST:
        s = 0.5 + 0.5 * _tanh_approx(0.851 * x)
        a = x * s
        d = s + 1.702 * x * s * (1.0 - s)
    else:  # identity
        a = x
        d = tl.where(x == x, 1.0, 1.0)  # ones of x's shape (no tl.full_like: see interpreted_module)
    return a, d


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile `pid`'s (row block, column block): GROUP_M row blocks walk the column blocks
    together, so the weight columns they share are read from L2."""
    num_pid_m = (M + BLOCK_M - 1) // BLOCK_M  # (no tl.cdiv / tl.zeros: see interpreted_module)
    num_pid_n = (N + BLOCK_N - 1) // BLOCK_N
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_per_group) % group_m
    pid_n = (pid % pids_per_group) // group_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc1, acc2, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N,
              stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn, pid_m, pid_n,
              z0, u0, z1, u1,
              GATED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
              STORE_PRE: tl.constexpr, BWD: tl.constexpr, STORE_H: tl.constexpr, SUBTILE: tl.constexpr,
              PREFETCH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """In fp32 on the accumulators. Forward (BWD=0): bias, activation, gate * up, the store
    (and the pre-activations with STORE_PRE). Backward (BWD=1 plain, 2 gated): acc1 is dh;
    multiply by the activation's derivative at the saved pre-activations, which are
    z0, u0 (and the second column half's z1, u1 with SUBTILE) when PREFETCH loaded them
    before the tile loop (_bwd_prefetch), and are loaded here otherwise."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if BWD == 0:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
        pre_ptrs = pre_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
        rn = offs_n % N  # wrapped: bias loads need no mask
        if HAS_B1:
            acc1 += tl.load(b1_ptr + rn).to(tl.float32)[None, :]
        if STORE_PRE:
            tl.store(pre_ptrs, acc1.to(pre_ptr.dtype.element_ty), mask=mask)
        out = _activation(acc1, ACTIVATION)
        if GATED:
            if HAS_B2:
                acc2 += tl.load(b2_ptr + rn).to(tl.float32)[None, :]
            if STORE_PRE:
                tl.store(pre_ptrs + N * stride_pn, acc2.to(pre_ptr.dtype.element_ty), mask=mask)
            out = out * acc2
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    elif SUBTILE:
        # Two [BLOCK_M, BLOCK_N / 2] halves one after the other: half the live registers
        # (dh, u, act(g), act'(g) of a whole 128 x 128 tile spill on 8 warps).
        dh0, dh1 = tl.split(tl.permute(tl.reshape(acc1, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        offs_n0 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
        if not PREFETCH:
            z0, u0 = _bwd_load(pre_ptr, offs_m, offs_n0, M, N, stride_pm, stride_pn, BWD)
        _bwd_epilogue(dh0, z0, u0, out_ptr, h_ptr, offs_m, offs_n0, M, N, stride_om, stride_on,
                      stride_hm, stride_hn, ACTIVATION, BWD, STORE_H)
        if not PREFETCH:
            z1, u1 = _bwd_load(pre_ptr, offs_m, offs_n0 + BLOCK_N // 2, M, N, stride_pm, stride_pn, BWD)
        _bwd_epilogue(dh1, z1, u1, out_ptr, h_ptr, offs_m, offs_n0 + BLOCK_N // 2, M, N, stride_om, stride_on,
                      stride_hm, stride_hn, ACTIVATION, BWD, STORE_H)
    else:
        if not PREFETCH:
            z0, u0 = _bwd_load(pre_ptr, offs_m, offs_n, M, N, stride_pm, stride_pn, BWD)
        _bwd_epilogue(acc1, z0, u0, out_ptr, h_ptr, offs_m, offs_n, M, N, stride_om, stride_on,
                      stride_hm, stride_hn, ACTIVATION, BWD, STORE_H)


@triton.jit
def _bwd_load(pre_ptr, offs_m, offs_n, M, N, stride_pm, stride_pn, BWD: tl.constexpr):
    """The saved pre-activations of one backward tile, in their storage dtype: z (g, or
    the plain MLP's pre) and, gated, u (= z otherwise). Masked loads, not wrapped rows: in
    place, a wrapped row may already hold gradients."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    pre_ptrs = pre_ptr + offs_m[:, None] * stride_pm + offs_n[None, :] * stride_pn
    z = tl.load(pre_ptrs, mask=mask, other=0.0)
    u = z
    if BWD == 2:
        u = tl.load(pre_ptrs + N * stride_pn, mask=mask, other=0.0)
    return z, u


@triton.jit
def _bwd_prefetch(pre_ptr, pid_m, pid_n, M, N, stride_pm, stride_pn, placeholder,
                  BWD: tl.constexpr, SUBTILE: tl.constexpr, PREFETCH: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Backward with PREFETCH: the epilogue's pre-activation tiles, loaded before the tile
    loop so that their DRAM latency hides behind it (z0, u0, z1, u1 as _epilogue takes
    them; `placeholder` for what is not loaded)."""
    z0 = placeholder
    u0 = placeholder
    z1 = placeholder
    u1 = placeholder
    if BWD != 0:
        if PREFETCH:
            offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            if SUBTILE:
                offs_n0 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N // 2)
                z0, u0 = _bwd_load(pre_ptr, offs_m, offs_n0, M, N, stride_pm, stride_pn, BWD)
                z1, u1 = _bwd_load(pre_ptr, offs_m, offs_n0 + BLOCK_N // 2, M, N, stride_pm, stride_pn, BWD)
            else:
                offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
                z0, u0 = _bwd_load(pre_ptr, offs_m, offs_n, M, N, stride_pm, stride_pn, BWD)
    return z0, u0, z1, u1


@triton.jit
def _bwd_epilogue(dh, z, u, out_ptr, h_ptr, offs_m, offs_n, M, N, stride_om, stride_on,
                  stride_hm, stride_hn,
                  ACTIVATION: tl.constexpr, BWD: tl.constexpr, STORE_H: tl.constexpr):
    """dh times the activation's derivative at the saved pre-activations z (and u), for one
    tile. In place (out is pre) the tile's pre-activations were loaded before this."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    a, da = _activation_and_grad(z.to(tl.float32), ACTIVATION)
    if BWD == 2:
        u = u.to(tl.float32)
        if STORE_H:
            h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :] * stride_hn
            tl.store(h_ptrs, (a * u).to(h_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptrs, (dh * u * da).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptrs + N * stride_on, (dh * a).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if STORE_H:
            h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :] * stride_hn
            tl.store(h_ptrs, a.to(h_ptr.dtype.element_ty), mask=mask)
        tl.store(out_ptrs, (dh * da).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])  # one compilation for every number of tokens
def _fused_linear_kernel(
    x_ptr, w1_ptr, w2_ptr, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_w1n, stride_w1k,
    stride_w2n, stride_w2k,
    stride_om, stride_on,
    stride_pm, stride_pn,
    stride_hm, stride_hn,
    GATED: tl.constexpr,  # out = act(x W1^T + b1) * (x W2^T + b2), else act(x W1^T + b1)
    ACTIVATION: tl.constexpr,
    HAS_B1: tl.constexpr,
    HAS_B2: tl.constexpr,
    STORE_PRE: tl.constexpr,  # forward: also store the pre-activations (see the module docstring)
    BWD: tl.constexpr,  # 0 forward; 1 / 2: backward epilogue, plain / gated (GATED is then False)
    STORE_H: tl.constexpr,  # backward: also store h
    SUBTILE: tl.constexpr,  # backward: the epilogue in two column halves (fewer live registers)
    PREFETCH: tl.constexpr,  # backward: load the epilogue's pre-activations before the tile loop
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K mask
    DOT_PRECISION: tl.constexpr,  # "tf32" or "ieee" (fp32 inputs only)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """Pointer loads (any strides, any GPU from sm_80)."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # Rows / columns past the edge are wrapped to valid ones (dropped at the store), so
    # only K needs a mask.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)

    # ---- tile loop: x tile [BLOCK_M, BLOCK_K] against W tiles [BLOCK_K, BLOCK_N]
    x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w1_ptrs = w1_ptr + offs_k[:, None] * stride_w1k + rn[None, :] * stride_w1n
    acc1 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc2 = acc1
    if GATED:
        w2_ptrs = w2_ptr + offs_k[:, None] * stride_w2k + rn[None, :] * stride_w2n
        acc2 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    z0, u0, z1, u1 = _bwd_prefetch(pre_ptr, pid_m, pid_n, M, N, stride_pm, stride_pn, acc1,
                                   BWD, SUBTILE, PREFETCH, BLOCK_M, BLOCK_N)
    for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b1 = tl.load(w1_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b1 = tl.load(w1_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc1 = tl.dot(a, b1, acc1, input_precision=DOT_PRECISION)
        if GATED:
            if EVEN_K:
                b2 = tl.load(w2_ptrs)
            else:
                b2 = tl.load(w2_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc2 = tl.dot(a, b2, acc2, input_precision=DOT_PRECISION)
            w2_ptrs += BLOCK_K * stride_w2k
        x_ptrs += BLOCK_K * stride_xk
        w1_ptrs += BLOCK_K * stride_w1k

    _epilogue(acc1, acc2, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N,
              stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn, pid_m, pid_n,
              z0, u0, z1, u1,
              GATED, ACTIVATION, HAS_B1, HAS_B2, STORE_PRE, BWD, STORE_H, SUBTILE, PREFETCH, BLOCK_M, BLOCK_N)


@triton.jit
def _tma_tile(tile, x_desc, w1_desc, w2_desc, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N, K,
              stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn,
              GATED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_B1: tl.constexpr, HAS_B2: tl.constexpr,
              STORE_PRE: tl.constexpr, BWD: tl.constexpr, STORE_H: tl.constexpr, SUBTILE: tl.constexpr,
              PREFETCH: tl.constexpr, W_KN: tl.constexpr, DOT_PRECISION: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One output tile with TMA loads: the tile loop and the epilogue."""
    pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc1 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc2 = acc1
    if GATED:
        acc2 = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    z0, u0, z1, u1 = _bwd_prefetch(pre_ptr, pid_m, pid_n, M, N, stride_pm, stride_pn, acc1,
                                   BWD, SUBTILE, PREFETCH, BLOCK_M, BLOCK_N)
    for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        off_k = k * BLOCK_K
        a = x_desc.load([off_m, off_k])
        if W_KN:
            b1 = w1_desc.load([off_k, off_n])
        else:
            b1 = w1_desc.load([off_n, off_k]).T
        acc1 = tl.dot(a, b1, acc1, input_precision=DOT_PRECISION)
        if GATED:
            b2 = w2_desc.load([off_n, off_k]).T
            acc2 = tl.dot(a, b2, acc2, input_precision=DOT_PRECISION)

    _epilogue(acc1, acc2, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N,
              stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn, pid_m, pid_n,
              z0, u0, z1, u1,
              GATED, ACTIVATION, HAS_B1, HAS_B2, STORE_PRE, BWD, STORE_H, SUBTILE, PREFETCH, BLOCK_M, BLOCK_N)


@triton.jit(do_not_specialize=["M"])
def _fused_linear_kernel_tma(
    x_desc, w1_desc, w2_desc, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr,
    M, N, K,
    stride_om, stride_on,
    stride_pm, stride_pn,
    stride_hm, stride_hn,
    GATED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_B1: tl.constexpr,
    HAS_B2: tl.constexpr,
    STORE_PRE: tl.constexpr,
    BWD: tl.constexpr,
    STORE_H: tl.constexpr,
    SUBTILE: tl.constexpr,
    PREFETCH: tl.constexpr,
    W_KN: tl.constexpr,  # weights stored [K, N] (Conv1D) rather than [N, K] (nn.Linear)
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,  # a grid of about one program per SM, each walking tiles
):
    """The same with tensor-memory-accelerator loads (sm_90+): tiles come through host
    tensor descriptors, which fill everything past the tensor's edges with zeros.

    PERSISTENT: each program takes tiles pid, pid + programs, ... in one flattened loop,
    so the software pipeline issues the next tile's first loads during this tile's
    epilogue (with one program per tile, an SM idles its tensor cores through each
    epilogue unless another program's tile loop happens to overlap it)."""
    if PERSISTENT:
        num_tiles = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
            _tma_tile(tile, x_desc, w1_desc, w2_desc, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N, K,
                      stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn,
                      GATED, ACTIVATION, HAS_B1, HAS_B2, STORE_PRE, BWD, STORE_H, SUBTILE, PREFETCH, W_KN,
                      DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _tma_tile(tl.program_id(0), x_desc, w1_desc, w2_desc, b1_ptr, b2_ptr, out_ptr, pre_ptr, h_ptr, M, N, K,
                  stride_om, stride_on, stride_pm, stride_pn, stride_hm, stride_hn,
                  GATED, ACTIVATION, HAS_B1, HAS_B2, STORE_PRE, BWD, STORE_H, SUBTILE, PREFETCH, W_KN,
                  DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit
def _k_loop(acc, a_ptr, w_ptr, rm, rn, K, stride_am, stride_ak, stride_wk, stride_wn,
            EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += a[rm, :K] @ w[:K, rn], w read through (k, n) strides."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + rn[None, :] * stride_wn
    for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit(do_not_specialize=["M"])
def _dual_gemm_kernel(
    a1_ptr, a2_ptr, w1_ptr, w2_ptr, out_ptr,
    M, N, K,
    stride_am, stride_ak,  # a1 and a2 share their strides (two column blocks of one buffer)
    stride_w1k, stride_w1n,
    stride_w2k, stride_w2n,
    stride_om, stride_on,
    ACCUMULATE: tl.constexpr,  # out += ..., else out = ...
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """out (+)= a1 @ w1 + a2 @ w2 with a [M, K], w [K, N]: the input gradient of a gated
    MLP (dg Wg + du Wu) in one accumulator, two K loops."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    acc = _k_loop(acc, a1_ptr, w1_ptr, rm, rn, K, stride_am, stride_ak, stride_w1k, stride_w1n,
                  EVEN_K, DOT_PRECISION, BLOCK_K)
    acc = _k_loop(acc, a2_ptr, w2_ptr, rm, rn, K, stride_am, stride_ak, stride_w2k, stride_w2n,
                  EVEN_K, DOT_PRECISION, BLOCK_K)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    if ACCUMULATE:
        acc += tl.load(out_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


INTERPRETED: bool = type(_fused_linear_kernel).__name__ == "InterpretedFunction"

# ----------------------------------------------------------------------------- configs


class Config(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    tma: bool = False  # _fused_linear_kernel_tma (sm_90+, 16-byte aligned rows) instead of pointer loads
    persistent: bool = False  # TMA only: about one program per SM walking the tiles (PERSISTENT)
    prefetch: bool = False  # backward, not persistent: the epilogue's loads before the tile loop (PREFETCH)


# Candidates by M range, fastest-expected first (the first one is the untimed default,
# so it must fit the 163 KiB of shared memory of an A100). Shared memory per stage is
# (BLOCK_M + BLOCK_N * (2 if gated else 1)) * BLOCK_K * 2 bytes for 16-bit inputs.
_GATED_CONFIGS = {
    "small": [  # M <= 64: weight-bandwidth bound; many column blocks, deep pipelines
        Config(16, 64, 128, 8, 4, 4),
        Config(32, 64, 128, 8, 4, 4),
        Config(16, 128, 64, 8, 4, 4),
        Config(64, 64, 64, 8, 4, 4),
        Config(32, 32, 128, 8, 4, 5),
    ],
    "medium": [  # M <= 512
        Config(64, 128, 64, 8, 4, 4),
        Config(128, 64, 64, 8, 4, 4),
        Config(64, 64, 64, 8, 4, 4),
        Config(128, 128, 64, 8, 8, 3),
        Config(32, 128, 64, 8, 4, 4),
    ],
    "large": [
        Config(128, 128, 64, 8, 8, 3),
        Config(128, 128, 64, 8, 8, 4),
        # two programs per SM (64 accumulator registers per thread, 96 KB of shared memory):
        # the training forward (g | u stored) at M 8192, 768 -> 3072 took 153 us as TMA
        # against 158-161 for 128 x 128 (results/gemm_two_per_sm_h200_session7.json)
        Config(128, 64, 64, 8, 8, 3),
        Config(64, 128, 64, 8, 4, 4),
        Config(256, 64, 64, 8, 8, 3),
        Config(128, 128, 32, 8, 8, 5),
    ],
}
_PLAIN_CONFIGS = {
    "small": [
        Config(16, 128, 128, 8, 4, 4),
        Config(32, 64, 128, 8, 4, 4),
        Config(16, 64, 256, 8, 4, 3),
        Config(64, 64, 64, 8, 4, 4),
        Config(32, 128, 64, 8, 4, 4),
    ],
    "medium": [
        Config(64, 128, 64, 8, 4, 4),
        Config(128, 128, 64, 8, 4, 4),
        Config(64, 64, 64, 8, 4, 4),
        Config(128, 64, 64, 8, 4, 4),
        Config(128, 256, 64, 8, 8, 3),
    ],
    "large": [
        Config(128, 256, 64, 8, 8, 3),
        Config(128, 128, 64, 8, 4, 4),
        Config(128, 128, 64, 8, 8, 4),
        Config(256, 128, 64, 8, 8, 3),
        Config(64, 128, 64, 8, 4, 4),
        Config(128, 64, 64, 8, 4, 4),
    ],
}
# The backward's dh GEMM (one accumulator; its epilogue loads one or two saved tiles and
# stores one or two): at most 128 x 128 accumulator elements per 8 warps (64 per thread), so
# that dh, u, act(g) and act'(g) of an epilogue half fit in registers (sm_80 / sm_90 AOT
# compiles: 143-210 registers, no spill; 128 x 256 and 4-warp 128 x 128 tiles spill).
_BWD_CONFIGS = {
    "small": [
        Config(16, 64, 128, 8, 4, 4),
        Config(32, 64, 128, 8, 4, 4),
        Config(64, 64, 64, 8, 4, 4),
        Config(16, 128, 64, 8, 4, 4),
    ],
    "medium": [
        Config(64, 128, 64, 8, 4, 4),
        Config(128, 64, 64, 8, 4, 4),
        Config(64, 64, 64, 8, 4, 4),
        Config(128, 128, 64, 8, 8, 3),
    ],
    # Measured on the H200 at M = 8192, 768 -> 3072 (results/gemm_variants_h200.json): the
    # plain dh kernel is fastest at 128 x 128 without prefetch (103 us), the gated one at
    # 128 x 64 / 4 warps with TMA and prefetch (145 us; 64 x 128 with prefetch 148). Session
    # 5 (gemm_variants_h200_persistent_narrow.json) ranked those two the other way round
    # (64 x 128: 128 us, 128 x 64: 145): both are timed as TMA variants, the tuner picks.
    "large": [
        Config(128, 128, 64, 8, 8, 3),
        Config(128, 64, 64, 8, 4, 4, prefetch=True),
        Config(64, 128, 64, 8, 4, 4, prefetch=True),
        Config(128, 128, 64, 8, 8, 4, prefetch=True),
        Config(128, 256, 64, 8, 8, 3),
    ],
}
# Small and fast for the interpreter, yet every mask and the grouping are exercised.
INTERPRETER_CONFIG = Config(32, 32, 16, 2, 4, 1)


def _pow2_at_least_16(n: int) -> int:
    return max(16, triton.next_power_of_2(max(n, 1)))


def m_bucket(m: int) -> int:
    """Shapes in one bucket share a tuned config: M rounded up to a power of two."""
    return _pow2_at_least_16(m)


# With TMA on sm_90+ (16-bit inputs, M > 64), the first ones of the list are also tried that way.
_TMA_VARIANTS = 3
# ... and, for the plain forward, the first ones as persistent TMA kernels: measured on the
# H200 (results/gemm_variants_h200.json, M = 8192, 768 -> 3072) the persistent 128 x 256
# GEMM + bias + gelu_tanh took 80 us against 98 non-persistent; for the gated forward and
# the dh kernels persistence was 10-30 us slower (two accumulators / the epilogue's
# registers leave no room for the next tile's pipeline).
_PERSISTENT_VARIANTS = 2


def candidates(gated: bool, m: int, n: int, k: int, dtype: torch.dtype, tma: bool = False,
               table: Optional[dict] = None) -> list[Config]:
    """The configs worth timing for this problem, clamped to it and deduplicated (`table`:
    another list than the forward's, e.g. _BWD_CONFIGS)."""
    forward = table is None
    if forward:
        table = _GATED_CONFIGS if gated else _PLAIN_CONFIGS
    size = "small" if m <= 64 else "medium" if m <= 512 else "large"
    out: list[Config] = []
    for c in table[size]:
        bk = c.block_k // 2 if dtype == torch.float32 else c.block_k  # 4-byte inputs: half the K tile
        c = c._replace(
            block_m=min(c.block_m, _pow2_at_least_16(m)),
            block_n=min(c.block_n, _pow2_at_least_16(n)),
            block_k=max(16, min(bk, _pow2_at_least_16(k))),
        )
        if c not in out:
            out.append(c)
    if tma and size != "small" and dtype != torch.float32:
        out += [c._replace(tma=True) for c in out[:_TMA_VARIANTS]]
        if forward and not gated:
            out += [c._replace(tma=True, persistent=True) for c in out[:_PERSISTENT_VARIANTS]]
    return out


def _tma_compatible(*tensors: Tensor) -> bool:
    """What a TMA descriptor needs: 16-byte aligned base and rows, unit stride last."""
    for t in tensors:
        if t.dim() != 2 or 0 in t.shape or t.stride(1) != 1 or t.data_ptr() % 16:
            return False
        if (t.stride(0) * t.element_size()) % 16 or (t.stride(0) == 0 and t.shape[0] > 1):
            return False  # (a broadcast row, e.g. the expanded gradient of y.sum(): pointer loads)
    return True


# ----------------------------------------------------------------------------- launch


def _dot_precision(dtype: torch.dtype) -> str:
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"  # the default; ignored for 16-bit inputs


# Epilogue modes of _launch (the kernels' BWD flag).
FWD, BWD_PLAIN, BWD_GATED = 0, 1, 2


class _Plan:
    """Everything of one launch of the fused kernel but its tensors: what a call of a shape
    seen before reuses (see _forward). `runner`, once set, launches the compiled kernel
    directly (Triton's CompiledKernel[grid]), without the JIT's argument binding and cache
    lookup: valid because the plan's key fixes every property Triton specializes on."""
    __slots__ = ("tma", "kernel", "grid", "ints", "consts", "blocks", "tail", "runner")

    def __init__(self, tma: bool, kernel, grid: tuple, ints: tuple, consts: dict, blocks: tuple):
        self.tma = tma
        self.kernel = kernel  # the @triton.jit function
        self.grid = grid
        self.ints = ints  # M, N, K and the strides, after the eight tensor arguments
        self.consts = consts  # compile-time arguments and launch options
        self.blocks = blocks  # TMA: the block shapes of the x, w1 and w2 descriptors
        # the compile-time arguments in signature order (the runner takes every argument)
        self.tail = tuple(consts[name] for name in kernel.arg_names[8 + len(ints):])
        self.runner = None


def _kernel_activation(activation_id: int, out: Tensor) -> int:
    """The ACTIVATION constant of a launch: the tanh.approx form (activation id + _FAST) for
    16-bit outputs on a GPU, unless FUSED_MLP_FAST_TANH=0. Its error is within a 16-bit
    output's rounding but not fp32's, so fp32 keeps the exact forms; the interpreter has no
    inline assembly. On the H200 it took the GeGLU d768 gate/up kernel from 138.1 to 130.5 us
    (benchmarks/NOTES.md, session 8)."""
    if (activation_id in TANH_FORMS and not INTERPRETED and out.dtype in (torch.float16, torch.bfloat16)
            and tanh_forms_allowed()):
        return activation_id + _FAST
    return activation_id


def _make_plan(cfg: Config, x: Tensor, w1: Tensor, w2: Optional[Tensor], w_kn: bool,
               has_b1: bool, has_b2: bool, out: Tensor, activation_id: int,
               pre: Optional[Tensor] = None, h: Optional[Tensor] = None, bwd: int = FWD) -> _Plan:
    M, K = x.shape
    N = out.shape[1] // 2 if bwd == BWD_GATED else out.shape[1]
    gated = w2 is not None
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    consts = dict(
        GATED=gated, ACTIVATION=_kernel_activation(activation_id, out), HAS_B1=has_b1, HAS_B2=has_b2,
        STORE_PRE=bwd == FWD and pre is not None, BWD=bwd, STORE_H=bwd != FWD and h is not None,
        SUBTILE=bwd != FWD and cfg.block_n >= 32 and _env_flag("FUSED_MLP_BWD_SUBTILE"),
        # (not with PERSISTENT: tiles held across the flattened loop spill, 1.4-2.1 KB of
        # stack at 128 x 128 / 8 warps and 128 x 64 / 4 warps, AOT-compiled for sm_90 with
        # Triton 3.9; benchmarks/NOTES.md, session 4)
        PREFETCH=bwd != FWD and cfg.prefetch and not cfg.persistent,
        DOT_PRECISION=_dot_precision(x.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **COMPILE_OPTIONS,
    )
    pre = pre if pre is not None else out  # placeholders, never read
    h = h if h is not None else out
    extra = (pre.stride(0), pre.stride(1), h.stride(0), h.stride(1))
    if cfg.tma:
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        consts["W_KN"] = w_kn
        consts["PERSISTENT"] = cfg.persistent
        if cfg.persistent:  # (interpreter: two programs, so that each walks several tiles)
            programs = _sm_count(x.device.index if x.device.index is not None else 0) if x.is_cuda else 2
            grid = (min(grid[0], programs),)
        return _Plan(True, _fused_linear_kernel_tma, grid,
                     (M, N, K, out.stride(0), out.stride(1), *extra), consts,
                     ([bm, bk], [bk, bn] if w_kn else [bn, bk], [bn, bk]))
    s1 = (w1.stride(1), w1.stride(0)) if w_kn else (w1.stride(0), w1.stride(1))  # (n, k) strides
    s2 = (w2.stride(0), w2.stride(1)) if gated else s1
    consts["EVEN_K"] = K % cfg.block_k == 0
    return _Plan(False, _fused_linear_kernel, grid,
                 (M, N, K, x.stride(0), x.stride(1), *s1, *s2, out.stride(0), out.stride(1), *extra),
                 consts, ())


def _run_plan(plan: _Plan, x: Tensor, w1: Tensor, w2: Optional[Tensor], b1: Optional[Tensor],
              b2: Optional[Tensor], out: Tensor, pre: Optional[Tensor], h: Optional[Tensor],
              keep_runner: bool = False) -> None:
    """Launch `plan` on these tensors; keep_runner: remember the compiled kernel's launcher
    for the next calls (only for plans whose key covers Triton's specialization)."""
    b1 = b1 if b1 is not None else out  # placeholders, never read
    b2 = b2 if b2 is not None else out
    pre = pre if pre is not None else out
    h = h if h is not None else out
    if plan.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bx, bw1, bw2 = plan.blocks
        a = TensorDescriptor.from_tensor(x, bx)
        w1 = TensorDescriptor.from_tensor(w1, bw1)
        w2 = TensorDescriptor.from_tensor(w2, bw2) if w2 is not None else w1
    else:
        a = x
        w2 = w2 if w2 is not None else w1
    if plan.runner is not None:
        plan.runner(a, w1, w2, b1, b2, out, pre, h, *plan.ints, *plan.tail)
        return
    compiled = plan.kernel[plan.grid](a, w1, w2, b1, b2, out, pre, h, *plan.ints, **plan.consts)
    if keep_runner:
        plan.runner = _kept_launcher(compiled, plan.grid)


def _kept_launcher(compiled, grid: tuple):
    """The launcher of a kernel Triton has just compiled and launched (what `kernel[grid](...)`
    returned), to launch it again on the same grid without the JIT's argument binding; None
    where this Triton's compiled kernel does not offer one."""
    if not (hasattr(compiled, "run") and hasattr(compiled, "packed_metadata")):
        return None
    return compiled[(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)]  # wants 3-D


def _launch(cfg: Config, x: Tensor, w1: Tensor, w2: Optional[Tensor], w_kn: bool,
            b1: Optional[Tensor], b2: Optional[Tensor], out: Tensor, activation_id: int,
            pre: Optional[Tensor] = None, h: Optional[Tensor] = None, bwd: int = FWD) -> None:
    """One launch of the fused kernel. w1 (and w2, gated forward only) are [N, K], or [K, N]
    with w_kn. Forward: `pre` receives the pre-activations if given. Backward (bwd=BWD_PLAIN /
    BWD_GATED): x is dy, w1 the down / proj weight, `pre` the saved pre-activations, `out`
    their gradient ([M, 2N] when gated; may be `pre` itself), `h` receives h if given."""
    plan = _make_plan(cfg, x, w1, w2, w_kn, b1 is not None, b2 is not None, out, activation_id, pre, h, bwd)
    _run_plan(plan, x, w1, w2, b1, b2, out, pre, h)


def _launch_dual(cfg: Config, a1: Tensor, a2: Tensor, w1: Tensor, w2: Tensor, out: Tensor,
                 accumulate: bool) -> None:
    M, K = a1.shape
    N = out.shape[1]
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n),)
    _dual_gemm_kernel[grid](
        a1, a2, w1, w2, out, M, N, K,
        a1.stride(0), a1.stride(1), w1.stride(0), w1.stride(1), w2.stride(0), w2.stride(1),
        out.stride(0), out.stride(1),
        ACCUMULATE=accumulate, EVEN_K=K % cfg.block_k == 0, DOT_PRECISION=_dot_precision(a1.dtype),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **COMPILE_OPTIONS,
    )


# (gated, M bucket, N, K, dtype, (device name, capability), TMA, mode) -> the fastest config measured.
_TUNED: dict[tuple, Config] = {}


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _device_key(index: int) -> tuple:
    return (torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))


# The values that turn an on / off switch off.
_OFF_VALUES = ("0", "false", "no", "off")


def _env_flag(name: str, default: str = "1") -> bool:
    return os.environ.get(name, default).lower() not in _OFF_VALUES


def _autotune_enabled() -> bool:
    return _env_flag("FUSED_MLP_AUTOTUNE")


def _tma_enabled() -> bool:
    return _env_flag("FUSED_MLP_TMA")


def _loop_ms(fn, reps: int) -> float:
    """ms per call of fn over reps calls enqueued back to back, by events around the loop."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def _time_ms(fn) -> float:
    """Median-free quick timing: enough to rank a handful of configs."""
    fn()  # compile + load; raises if the config does not fit the GPU
    torch.cuda.synchronize()
    est = _loop_ms(fn, 3)
    return _loop_ms(fn, max(3, min(50, int(10.0 / max(est, 1e-3)))))


# Tuning modes: the candidate list of each, and whether it has TMA variants.
_MODE_TABLES = {"fwd": None, "fwd_save": None, "bwd": _BWD_CONFIGS, "bwd_gated": _BWD_CONFIGS,
                "dual": _PLAIN_CONFIGS}


def _pick_config(x: Tensor, n: int, gated: bool, tma_ok: bool, launch, mode: str = "fwd",
                 timing_launch=None) -> Config:
    """The config for this problem: the interpreter's, the cached winner, or time the candidates.

    `timing_launch`, for launches that must not run twice (in place, or accumulating):
    called on a cache miss only, it returns the launch function to time (into scratch)."""
    return _pick_config_final(x, n, gated, tma_ok, launch, mode, timing_launch)[0]


def _pick_config_final(x: Tensor, n: int, gated: bool, tma_ok: bool, launch, mode: str = "fwd",
                       timing_launch=None) -> tuple[Config, bool]:
    """_pick_config, and whether the choice is final for this problem (False while a CUDA
    graph is being captured: a later call outside capture still tunes)."""
    if INTERPRETED or x.device.type != "cuda":
        return INTERPRETER_CONFIG, True
    m, k = x.shape
    dev = _device_key(x.device.index if x.device.index is not None else torch.cuda.current_device())
    tma = tma_ok and dev[1] >= (9, 0) and _tma_enabled()
    key = (gated, m_bucket(m), n, k, x.dtype, dev, tma) + ((mode,) if mode != "fwd" else ())
    cfg = _TUNED.get(key)
    if cfg is not None:
        return cfg, True
    cands = candidates(gated, m, n, k, x.dtype, tma, table=_MODE_TABLES[mode])
    if len(cands) == 1 or not _autotune_enabled():
        return cands[0], True
    if torch.cuda.is_current_stream_capturing():
        return cands[0], False  # not cached: a later, uncaptured call still tunes
    if timing_launch is not None:
        launch = timing_launch()
    best, best_ms, failure = None, float("inf"), None
    for c in cands:
        try:
            ms = _time_ms(lambda: launch(c))
        except Exception as e:  # out of shared memory / registers on this GPU, or a compile failure
            failure = e
            continue
        if ms < best_ms:
            best, best_ms = c, ms
    if best is None:
        raise RuntimeError(f"fused_mlp: no Triton config could run for {key}") from failure
    _TUNED[key] = best
    return best, True


# Launch plans of the call signatures seen so far (forward, training forward, the backward's
# dh GEMM): the key is every property of the call that the config, the grid, the non-tensor
# arguments and Triton's specialization depend on, so a repeated signature skips the tuner
# lookup and the argument set-up. Bounded: cleared when full.
_PLANS: dict[tuple, _Plan] = {}
_MAX_PLANS = 4096


def _planned(x: Tensor, w1: Tensor, w2: Optional[Tensor], w_kn: bool, b1: Optional[Tensor],
             b2: Optional[Tensor], out: Tensor, activation_id: int, pre: Optional[Tensor],
             h: Optional[Tensor] = None, bwd: int = FWD, mode: str = "fwd", timing_launch=None) -> None:
    """One launch of the fused kernel (see _launch for the arguments) with the tuned config,
    through _PLANS: the tuner runs on the first call of a shape bucket, the plan is made on
    the first call of a signature, and later calls only launch."""
    key = None
    if not INTERPRETED:
        dev = x.get_device()
        if dev >= 0:
            dt = x.dtype
            key = (x.shape, x.stride(), dt, dev, w1.shape, w1.stride(), w_kn, activation_id, bwd,
                   out.shape, out.stride(), out.data_ptr() % 16, x.data_ptr() % 16, w1.data_ptr() % 16,
                   None if w2 is None else (w2.stride(), w2.data_ptr() % 16),
                   None if b1 is None else (b1.stride(), b1.data_ptr() % 16),
                   None if b2 is None else (b2.stride(), b2.data_ptr() % 16),
                   None if pre is None else (pre.stride(), pre.data_ptr() % 16),
                   None if h is None else (h.stride(), h.data_ptr() % 16),
                   os.environ.get("FUSED_MLP_TMA"), os.environ.get("FUSED_MLP_AUTOTUNE"),
                   os.environ.get("FUSED_MLP_FAST_TANH"),
                   os.environ.get("FUSED_MLP_BWD_SUBTILE") if bwd != FWD else None,
                   torch.backends.cuda.matmul.allow_tf32 if dt == torch.float32 else None)
            plan = _PLANS.get(key)
            if plan is not None:
                if dev != torch.cuda.current_device():
                    with torch.cuda.device(dev):
                        _run_plan(plan, x, w1, w2, b1, b2, out, pre, h)
                else:
                    _run_plan(plan, x, w1, w2, b1, b2, out, pre, h)
                return

    def launch(cfg: Config) -> None:
        _launch(cfg, x, w1, w2, w_kn, b1, b2, out, activation_id, pre=pre, h=h, bwd=bwd)

    gated = w2 is not None
    tma_ok = _tma_compatible(x, w1, w2) if gated else _tma_compatible(x, w1)
    n = out.shape[1] // 2 if bwd == BWD_GATED else out.shape[1]
    with _on_device(x):
        cfg, final = _pick_config_final(x, n, gated, tma_ok, launch, mode, timing_launch)
        plan = _make_plan(cfg, x, w1, w2, w_kn, b1 is not None, b2 is not None, out, activation_id, pre, h, bwd)
        _run_plan(plan, x, w1, w2, b1, b2, out, pre, h, keep_runner=key is not None and final)
    if key is not None and final:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan


# ----------------------------------------------------------------------------- public


def _on_device(x: Tensor):
    """Triton launches on the current CUDA device: make it x's."""
    if x.device.type == "cuda" and x.device.index is not None and x.device.index != torch.cuda.current_device():
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()



def _unit_stride(b: Optional[Tensor]) -> Optional[Tensor]:
    """A bias as the kernels read it: element n at b_ptr + n (a strided view is copied)."""
    return b if b is None or b.stride(0) == 1 or b.shape[0] <= 1 else b.contiguous()


def gated_linear(
    x: Tensor, gate_weight: Tensor, up_weight: Tensor, gate_bias: Optional[Tensor],
    up_bias: Optional[Tensor], activation_id: int, config: Optional[Config] = None,
    *, pre: Optional[Tensor] = None, out: Optional[Tensor] = None,
) -> Tensor:
    """act(x Wg^T + bg) * (x Wu^T + bu) for 2-D x [M, K], weights [N, K] (any strides;
    biases too).

    pre: an [M, 2N] buffer (any strides) that also receives g | u, in x's dtype;
    out: the [M, N] buffer for the result (allocated if None)."""
    M, K = x.shape
    N = gate_weight.shape[0]
    gate_bias, up_bias = _unit_stride(gate_bias), _unit_stride(up_bias)
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return out

    if (config is None and not INTERPRETED
            and _sm90.usable(x, gate_weight, up_weight, gate_bias, up_bias, out, pre, activation_id)):
        # Hopper: the warp-specialized CUDA kernel (its epilogue overlaps the next tile's MMAs)
        return _sm90.gate_up(out, x, gate_weight, up_weight, gate_bias, up_bias, pre, activation_id)
    if config is None:
        _planned(x, gate_weight, up_weight, False, gate_bias, up_bias, out, activation_id, pre,
                 mode="fwd" if pre is None else "fwd_save")
    else:
        with _on_device(x):
            _launch(config, x, gate_weight, up_weight, False, gate_bias, up_bias, out, activation_id, pre=pre)
    return out


def linear_act(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], activation_id: int,
    weight_layout: str = "linear", config: Optional[Config] = None,
    *, pre: Optional[Tensor] = None, out: Optional[Tensor] = None,
) -> Tensor:
    """act(x W^T + b); weight [N, K] ("linear") or [K, N] ("conv1d"), any strides (bias too).
    pre: an [M, N] buffer that also receives x W^T + b; out: the result's buffer."""
    M, K = x.shape
    w_kn = weight_layout == "conv1d"
    N = weight.shape[1] if w_kn else weight.shape[0]
    bias = _unit_stride(bias)
    if (config is None and M > 0 and N > 0 and not INTERPRETED
            and _sm90.linear_usable(x, weight, w_kn, bias, out, pre, activation_id)):
        # Hopper: the warp-specialized CUDA kernel (ahead of cuBLASLt's epilogue: see NOTES)
        return _sm90.linear_act(out, x, weight, bias, pre, activation_id, w_kn)
    if (config is None and pre is None and out is None and M > 0 and N > 0
            and _prefer_cublaslt(x, weight, bias, activation_id, w_kn)):
        return _cublaslt_linear_act(x, weight, bias, activation_id, w_kn)
    if out is None:
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0 or N == 0:
        return out

    if config is None:
        _planned(x, weight, None, w_kn, bias, None, out, activation_id, pre, mode="fwd" if pre is None else "fwd_save")
    else:
        with _on_device(x):
            _launch(config, x, weight, None, w_kn, bias, None, out, activation_id, pre=pre)
    return out


# ---- cuBLASLt's epilogue as one more candidate for the plain forward's first GEMM ----
# cuBLASLt applies bias + GELU (the tanh form) or bias + ReLU in a GEMM's epilogue; PyTorch
# exposes it as torch._addmm_activation. On the H200 it beat our kernel in every case
# measured (M = 777 to 16384, d768 / d1024, bf16 / fp16, both weight layouts; e.g. 69.6 us
# against 80.1 at M = 8192, 768 -> 3072, bias + gelu_tanh: results/lt_epilogue_h200.json),
# so it is the untimed default; with autotuning on, the two are timed once per shape bucket.
# Activation id -> use_gelu. (Its GELU is the tanh form: against float64 its fp16 error is
# our gelu_tanh kernel's, 2.1e-4, and 2.9e-4 against the erf GELU; so gelu stays ours.)
_CUBLASLT_ACTIVATIONS = {ACTIVATION_IDS["gelu_tanh"]: True, ACTIVATION_IDS["relu"]: False}
# (M bucket, N, K, dtype, device, Conv1D layout, activation, TF32) -> cuBLASLt measured faster
_CUBLASLT_CHOICE: dict[tuple, bool] = {}


def _cublaslt_enabled() -> bool:
    return _env_flag("FUSED_MLP_CUBLASLT")


def _cublaslt_linear_act(x: Tensor, weight: Tensor, bias: Tensor, activation_id: int, w_kn: bool) -> Tensor:
    """act(x W^T + b) as one cuBLASLt GEMM (PyTorch falls back to addmm + the activation
    where cuBLASLt cannot take the operands: slower, same result)."""
    return torch._addmm_activation(bias, x, weight if w_kn else weight.t(),
                                   use_gelu=_CUBLASLT_ACTIVATIONS[activation_id])


def _prefer_cublaslt(x: Tensor, weight: Tensor, bias: Optional[Tensor], activation_id: int, w_kn: bool) -> bool:
    """Whether linear_act runs through cuBLASLt's epilogue: only with a bias and an
    activation cuBLASLt has, on CUDA, unless FUSED_MLP_CUBLASLT=0. Timed against our tuned
    kernel on the first call of a shape bucket; untimed (FUSED_MLP_AUTOTUNE=0, or while a
    CUDA graph is captured) it is chosen without caching the choice."""
    if (bias is None or activation_id not in _CUBLASLT_ACTIVATIONS or INTERPRETED
            or x.device.type != "cuda" or not _cublaslt_enabled()):
        return False
    m, k = x.shape
    n = weight.shape[1] if w_kn else weight.shape[0]
    dev = _device_key(x.get_device())
    key = (m_bucket(m), n, k, x.dtype, dev, w_kn, activation_id,
           torch.backends.cuda.matmul.allow_tf32 if x.dtype == torch.float32 else None)
    chosen = _CUBLASLT_CHOICE.get(key)
    if chosen is not None:
        return chosen
    if not _autotune_enabled() or torch.cuda.is_current_stream_capturing():
        return True
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    with _on_device(x):
        ours_ms = _time_ms(lambda: _planned(x, weight, None, w_kn, bias, None, out, activation_id, None))
        lt_ms = _time_ms(lambda: _cublaslt_linear_act(x, weight, bias, activation_id, w_kn))
    _CUBLASLT_CHOICE[key] = lt_ms < ours_ms
    return lt_ms < ours_ms


def linear_dact(
    dy: Tensor, weight: Tensor, w_kn: bool, pre: Tensor, out: Tensor, activation_id: int,
    gated: bool, h: Optional[Tensor] = None, config: Optional[Config] = None,
) -> Tensor:
    """The backward's first GEMM with the activation's derivative as its epilogue.

    dh = dy @ W for dy [M, K] and the down / proj weight W read as [K, N] (w_kn, e.g.
    nn.Linear's [out, hidden]) or [N, K] (Conv1D's [hidden, out]); dh is never stored:
        gated: pre = g | u [M, 2N]  ->  out = dh * u * act'(g) | dh * act(g)  [M, 2N]
        plain: pre [M, N]           ->  out = dh * act'(pre)              [M, N]
    `out` may be `pre` itself (in place). h: an [M, N] buffer receiving act(g) * u / act(pre)."""
    M, K = dy.shape
    N = pre.shape[1] // 2 if gated else pre.shape[1]
    if M == 0 or N == 0:
        return out
    if (config is None and h is None and not INTERPRETED
            and _sm90.dact_usable(dy, weight, w_kn, pre, out, activation_id, gated)):
        # Hopper: the warp-specialized CUDA kernel (its epilogue overlaps the next tile's MMAs)
        return _sm90.dact(dy, weight, w_kn, pre, out, activation_id, gated)
    bwd = BWD_GATED if gated else BWD_PLAIN
    inplace = out.data_ptr() == pre.data_ptr()

    def launch(cfg: Config, target: Tensor = out) -> None:
        _launch(cfg, dy, weight, None, w_kn, None, None, target, activation_id, pre=pre, h=h, bwd=bwd)

    def timing_launch():  # in place, a second run would read gradients as pre-activations
        scratch = torch.empty_like(out)
        return lambda cfg: launch(cfg, scratch)

    if config is None:
        _planned(dy, weight, None, w_kn, None, None, out, activation_id, pre, h, bwd,
                 "bwd_gated" if gated else "bwd", timing_launch if inplace else None)
    else:
        with _on_device(dy):
            launch(config)
    return out


def dual_matmul(a1: Tensor, a2: Tensor, w1: Tensor, w2: Tensor, out: Tensor, accumulate: bool = False,
                config: Optional[Config] = None) -> Tensor:
    """out (+)= a1 @ w1 + a2 @ w2 in one kernel: a1, a2 [M, K] with the same strides (e.g. the
    two halves of dg | du), w1, w2 [K, N] (any strides, e.g. nn.Linear's [hidden, dim])."""
    M, K = a1.shape
    N = out.shape[1]
    if M == 0 or N == 0:
        return out
    if a2.stride() != a1.stride():
        raise ValueError("dual_matmul: a1 and a2 must have the same strides")

    def launch(cfg: Config, target: Tensor = out) -> None:
        _launch_dual(cfg, a1, a2, w1, w2, target, accumulate)

    def timing_launch():
        scratch = torch.empty_like(out)
        return lambda cfg: launch(cfg, scratch)

    with _on_device(a1):
        cfg = config or _pick_config(a1, N, False, False, launch, "dual", timing_launch if accumulate else None)
        launch(cfg)
    return out


# ---- the block's second GEMM (down / proj projection) -------------------------------
# F.linear (cuBLAS), or, for few tokens and a weight larger than the L2 (the GEMM streams it
# from DRAM), K split by hand into S parts (S = 2 or 4): one strided-batched cuBLAS GEMM over
# views of h and W (no copies) writing S fp32 partial sums, then _sum_parts_kernel adds them
# (and the bias), rounds once and stores, launched with a programmatic edge on sm_90 (its CTAs
# wait in griddepcontrol.wait, not behind the launch).
# As CUDA graphs on the H200 (results/down_split_sweep_h200_session35.*,
# down_bmm_split_h200_session35.*): where cuBLAS's heuristic splits K itself, its reduce kernel
# costs ~3.4 us at SwiGLU M 128 and ours ~2 (the MLP 1.3 us faster); at some token counts
# F.linear is much slower than a split (its kernels not listed; Llama-3-8B's down GEMM at
# M 192: 46.9 us, 39.4 split in two); at M 512 it is the fastest. But the split form costs
# 21-48 us more host time per call than F.linear (two launches, two allocations and the views
# against one call; results/down_split_host_pieces{,2,3}_h200_session36.json), and eager
# calls at these token counts are close to host-bound: it pays off where the host time is not
# paid per call, i.e. in CUDA graphs.
# FUSED_MLP_DOWN_SPLIT:
#   "graphs" (the default): the split form or F.linear, whichever measured faster, in calls
#       being captured into a CUDA graph; F.linear in eager calls. The forms are timed on the
#       first eager call of a shape bucket (M rounded up to a multiple of 32, N, K, dtype,
#       device, bias, layout), as a CUDA-graph user's warm-up call is; a capture that comes
#       first, or FUSED_MLP_AUTOTUNE=0, leaves F.linear.
#   "auto": the same choice in every call, eager ones too (for callers whose GPU is the
#       bottleneck, not the host).
#   "2" / "4": that split wherever the rule (split_parts_allowed) allows it; "kernel": the
#       one-kernel form below wherever sm90.down_usable allows it; "0": F.linear.
# The one-kernel form (sm_90a builds, M <= 128): down_gemm_sm90 streams W once with the two K
# halves of each 64-row block reduced inside a cluster of 2 (_ONE_KERNEL), so there is no second
# kernel at all; launched with a programmatic edge (its first W loads overlap the end of the
# first GEMM, which writes h and never the weight). A timed candidate beside the splits (NOTES,
# sessions 48-52; a cluster-of-4 variant sharing h's loads never won and was dropped).
# The timing (_device_time_ms) queues the calls behind a sleeping kernel so that it sees GPU
# time, not the host's: timed as eager calls back to back, the split form is host-bound on the
# H200 machine's CPU (session 35: M 128 65 us against F.linear's 38, as graphs 37 against 39).
_SPLIT_PARTS = (2, 4)
_SPLIT_MAX_M = 512
# The form code of down_gemm_sm90 in down_parts' results and _DOWN_CHOICE (1 is F.linear, 2 / 4
# the splits).
_ONE_KERNEL = 0
# A split (or the one-kernel) form is kept only if it is at least this much faster than
# F.linear when timed.
_SPLIT_MIN_GAIN = 0.01
# Interleaved rounds of that timing; each form is judged by its median round.
_DOWN_ROUNDS = 3
# (M bucket, N, K, dtype, device, bias, weight K-contiguous) -> form (1: F.linear, 2 / 4: split,
# _ONE_KERNEL: down_gemm_sm90)
_DOWN_CHOICE: dict[tuple, int] = {}
# the same key -> {form: ms} as timed (1: F.linear), for inspection
_DOWN_TIMES: dict[tuple, dict] = {}
# what eager calls in the default mode have seen (shapes, dtype, device, weight strides, bias):
# those that have been through the rule (and timing) once
_DOWN_EAGER_SEEN: set = set()
_SUM_BLOCK = 1024  # elements per program of _sum_parts_kernel
_SUM_WARPS = 4
# sum_parts's launchers by call signature (see sum_parts)
_SUM_RUNNERS: dict[tuple, object] = {}


@triton.jit
def _sum_parts_kernel(p_ptr, b_ptr, y_ptr, numel, N, PARTS: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr, WAIT: tl.constexpr):
    """y = sum_i p[i] (+ bias[col]) rounded to y's dtype; p [PARTS, M, N] fp32, y [M, N]."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    if WAIT:
        tl.extra.cuda.gdc_wait()  # p is the previous kernel's output (programmatic edge)
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for i in tl.static_range(1, PARTS):
        acc += tl.load(p_ptr + i * numel + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def sum_parts(parts: Tensor, bias: Optional[Tensor], out: Tensor, pdl: bool = False) -> Tensor:
    """out = parts.sum(0) (+ bias) in fp32, rounded once; parts [S, M, N] fp32 contiguous, out
    [M, N] contiguous, bias [N] or None. pdl: launched with a programmatic edge (sm_90+)."""
    s, m, n = parts.shape
    numel = m * n
    if numel == 0:
        return out
    bias = _unit_stride(bias)
    b = parts if bias is None else bias  # a placeholder when there is no bias, never read
    args = (parts, b, out, numel, n, s, bias is not None, _SUM_BLOCK, pdl)
    key = None
    if not INTERPRETED and out.is_cuda:
        # Everything Triton specializes on (sizes exact, so the grid too): a repeated call
        # launches the compiled kernel directly, without the JIT's argument binding (host time
        # matters here: the split form is for few tokens, where calls are short).
        key = (out.get_device(), out.dtype, b.dtype, s, bias is not None, pdl, numel, n,
               parts.data_ptr() % 16, b.data_ptr() % 16, out.data_ptr() % 16)
        runner = _SUM_RUNNERS.get(key)
        if runner is not None:
            with _on_device(out):
                runner(*args)
            return out
    grid = (triton.cdiv(numel, _SUM_BLOCK), 1, 1)
    extra = {"launch_pdl": True} if pdl else {}
    with _on_device(out):
        compiled = _sum_parts_kernel[grid](*args[:5], PARTS=s, HAS_BIAS=bias is not None, BLOCK=_SUM_BLOCK,
                                           WAIT=pdl, num_warps=_SUM_WARPS, **COMPILE_OPTIONS, **extra)
    runner = _kept_launcher(compiled, grid) if key is not None else None
    if runner is not None:
        if len(_SUM_RUNNERS) >= _MAX_PLANS:
            _SUM_RUNNERS.clear()
        _SUM_RUNNERS[key] = runner
    return out


def split_linear(h: Tensor, weight: Tensor, bias: Optional[Tensor], parts: int) -> Tensor:
    """h W^T + b with K split into `parts`: one batched GEMM over views of h [M, K] and W [N, K]
    (any two strides, one of them 1) with fp32 partial sums, then sum_parts. CUDA, 16-bit."""
    m, k = h.shape
    n = weight.shape[0]
    hb = h.view(m, parts, k // parts).transpose(0, 1)
    wb = weight.view(n, parts, k // parts).permute(1, 2, 0)
    p = torch.empty((parts, m, n), device=h.device, dtype=torch.float32)
    torch.bmm(hb, wb, torch.float32, out=p)
    out = torch.empty((m, n), device=h.device, dtype=h.dtype)
    return sum_parts(p, bias, out, pdl=True)


@functools.lru_cache(maxsize=None)
def _split_l2_bytes(index: int) -> int:
    """Device index's L2 size in bytes where the split form is offered (sm_90+), else -1."""
    if torch.cuda.get_device_capability(index) < (9, 0):
        return -1
    return torch.cuda.get_device_properties(index).L2_cache_size


def split_parts_allowed(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple:
    """The split counts split_linear may take for these tensors (empty: F.linear only): CUDA
    sm_90+, 16-bit, 0 < M <= 512, h contiguous, W [N, K] with one unit stride and 16-byte
    aligned rows / columns, W larger than the L2, K / S a multiple of 8."""
    if (INTERPRETED or h.device.type != "cuda" or h.dtype not in (torch.float16, torch.bfloat16)
            or weight.dtype != h.dtype or h.dim() != 2 or weight.dim() != 2 or not h.is_contiguous()
            or (bias is not None and (bias.dtype != h.dtype or bias.dim() != 1))):
        return ()
    m, k = h.shape
    n = weight.shape[0]
    if not 0 < m <= _SPLIT_MAX_M or weight.shape[1] != k or h.data_ptr() % 16 or weight.data_ptr() % 16:
        return ()
    ws = weight.stride()
    if not ((ws[1] == 1 and ws[0] % 8 == 0) or (ws[0] == 1 and ws[1] % 8 == 0)):
        return ()
    l2 = _split_l2_bytes(h.get_device())  # cached: this rule runs on every call of the op
    if l2 < 0 or n * k * weight.element_size() <= l2:
        return ()
    return tuple(s for s in _SPLIT_PARTS if k % (8 * s) == 0)


def _device_time_ms(fn, reps: int = 20) -> float:
    """GPU time per call of fn (ms), the host's launch time hidden: the timed calls are enqueued
    behind a sleeping kernel that lasts longer than their enqueueing took (measured on a first
    pass), so the GPU runs them back to back as it would a graph's or a GPU-bound server's."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host_s = time.perf_counter() - t0
    torch.cuda.synchronize()
    # torch.cuda._sleep is private (torch's own tests use it). Should a torch release drop it, the
    # calls are timed as they come (the host's launch time included): that can only favour
    # F.linear, whose host path is the shortest, never make a capture fail.
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        # cycles at 2 GHz (above the H100 / H200 boost clock: a slower clock only sleeps longer)
        sleep(int(min(1.5 * host_s * 2e9 + 2e5, 2**40)))
    return _loop_ms(fn, reps)


_DOWN_MODES = ("graphs", "auto", "kernel") + tuple(str(s) for s in _SPLIT_PARTS)


def down_forms_allowed(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple:
    """The forms besides F.linear that down_linear may take for these tensors: the split counts
    split_parts_allowed gives, and _ONE_KERNEL where sm90.down_usable says so."""
    splits = split_parts_allowed(h, weight, bias)
    return (splits + (_ONE_KERNEL,)) if _sm90.down_usable(h, weight, bias) else splits


def down_parts(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> int:
    """How down_linear computes h W^T + b: 1 (F.linear), the split count, or _ONE_KERNEL (see
    above)."""
    mode = os.environ.get("FUSED_MLP_DOWN_SPLIT", "graphs").strip().lower()
    if mode in _OFF_VALUES or mode == "1":  # "1": one part, i.e. F.linear
        return 1
    if mode not in _DOWN_MODES:
        raise ValueError("FUSED_MLP_DOWN_SPLIT must be graphs (the default), auto, 2, 4, kernel or 0 "
                         f"(off), got {mode!r}")
    if not h.is_cuda:
        return 1
    capturing = torch.cuda.is_current_stream_capturing()
    eager_only = mode == "graphs" and not capturing  # F.linear whatever the choice
    if eager_only:
        # Only the first eager call of its kind goes through the rule and times the forms (for
        # a later capture): the others skip the rule's ~5 us of host time (session 36). With
        # autotuning off there is nothing to time, so no eager call goes through the rule (the
        # switch is read after the lookup, so the seen calls, the common case, skip the env read).
        if h.shape[0] > _SPLIT_MAX_M:
            return 1
        seen = (h.shape, h.dtype, h.device, weight.shape, weight.stride(), bias is None)
        if seen in _DOWN_EAGER_SEEN or not _autotune_enabled():
            return 1
    allowed = down_forms_allowed(h, weight, bias)
    if allowed and mode not in ("graphs", "auto"):
        forced = _ONE_KERNEL if mode == "kernel" else int(mode)
        return forced if forced in allowed else 1
    chosen = 1
    if allowed:
        m, k = h.shape
        key = ((m + 31) // 32, weight.shape[0], k, h.dtype, _device_key(h.get_device()), bias is not None,
               weight.stride(1) == 1)
        chosen = _DOWN_CHOICE.get(key)
        if chosen is None:
            if not _autotune_enabled() or capturing:
                return 1  # not cached (nor marked seen): a later, uncaptured call still times the forms
            chosen = _time_down_forms(h, weight, bias, allowed, key)
    if eager_only:
        if len(_DOWN_EAGER_SEEN) >= _MAX_PLANS:
            _DOWN_EAGER_SEEN.clear()
        _DOWN_EAGER_SEEN.add(seen)
        return 1
    return chosen if chosen in allowed else 1


def _time_down_forms(h: Tensor, weight: Tensor, bias: Optional[Tensor], allowed: tuple, key: tuple) -> int:
    """Times F.linear and each allowed form by GPU time in _DOWN_ROUNDS interleaved rounds, caches
    and returns the choice: the form of lowest median if it beats F.linear's by _SPLIT_MIN_GAIN."""
    forms = {1: lambda: F.linear(h, weight, bias)}
    forms.update({s: (lambda s=s: _down_form(h, weight, bias, s)) for s in allowed})
    rounds: dict = {p: [] for p in forms}
    with _on_device(h):
        for _ in range(_DOWN_ROUNDS):
            for p, fn in forms.items():
                rounds[p].append(_device_time_ms(fn))
    times = {p: statistics.median(v) for p, v in rounds.items()}
    base = times.pop(1)
    best = min(times, key=times.get)
    chosen = best if times[best] < (1.0 - _SPLIT_MIN_GAIN) * base else 1
    _DOWN_CHOICE[key] = chosen
    _DOWN_TIMES[key] = {1: base, **times}
    return chosen


def _down_form(h: Tensor, weight: Tensor, bias: Optional[Tensor], form: int) -> Tensor:
    """h W^T + b by one of down_parts' forms."""
    if form == 1:
        return F.linear(h, weight, bias)
    if form == _ONE_KERNEL:
        return _sm90.down(h, weight, bias, True)  # pdl: see down_linear
    return split_linear(h, weight, bias, form)


def down_linear(h: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The block's second GEMM, h W^T + b (weight [N, K], any strides): F.linear, split_linear
    or down_gemm_sm90, whichever down_parts picks. Only for h just written by the block's first
    GEMM (the one-kernel form's programmatic edge relies on the kernel before it not writing
    the weight)."""
    return _down_form(h, weight, bias, down_parts(h, weight, bias))


def gated_mlp(x, gate_weight, up_weight, down_weight, activation_id, gate_bias, up_bias, down_bias):
    """The whole gated MLP: fused gate/up kernel, then the down projection (down_linear)."""
    h = gated_linear(x, gate_weight, up_weight, gate_bias, up_bias, activation_id)
    return down_linear(h, down_weight, down_bias)


def mlp(x, fc_weight, fc_bias, proj_weight, proj_bias, activation_id, weight_layout):
    """The whole plain MLP: GEMM + bias + activation (our kernel or cuBLASLt's epilogue,
    see linear_act), then the projection (down_linear, +bias)."""
    h = linear_act(x, fc_weight, fc_bias, activation_id, weight_layout)
    if weight_layout == "conv1d":
        proj_weight = proj_weight.t()  # a view: cuBLAS reads the [K, N] weight transposed
    return down_linear(h, proj_weight, proj_bias)


def _release(version: str) -> tuple:
    """(major, minor) of a version string such as "3.6.0" or "2.4.0rc1+local"."""
    parts = version.split("+")[0].split(".")[:2]
    return tuple(int(re.match(r"\d*", p).group() or 0) for p in parts)


def interpreter_blocker(triton_version: Optional[str] = None, numpy_version: Optional[str] = None) -> Optional[str]:
    """Why Triton's interpreter cannot run these kernels here, or None. Triton up to 3.6 turns
    a runtime scalar (M, N, K in a loop bound) into an int through int() of a one-element
    array, which NumPy 2.4 refuses (TypeError: only 0-dimensional arrays can be converted to
    Python scalars; triton-lang/triton#9171, fixed in Triton 3.7)."""
    import numpy

    triton_version = triton_version or triton.__version__
    numpy_version = numpy_version or numpy.__version__
    if _release(triton_version) < (3, 7) and _release(numpy_version) >= (2, 4):
        return (f"Triton {triton_version}'s interpreter cannot run with NumPy {numpy_version} "
                "(triton-lang/triton#9171, fixed in Triton 3.7): install numpy<2.4 or Triton >= 3.7")
    return None


@functools.lru_cache(maxsize=None)
def interpreted_module():
    """This module with its kernels under Triton's interpreter (runs on CPU tensors).

    The interpreter is chosen when @triton.jit runs, so this loads a second copy of the
    file with TRITON_INTERPRET=1 set for the duration of the import; the compiled
    kernels of this module stay as they are. The kernels therefore call no @triton.jit
    function of triton.language.standard (tl.cdiv, tl.zeros, tl.sigmoid, ...): those were
    compiled-mode objects since Triton was imported, and cannot run interpreted.
    RuntimeError (interpreter_blocker's reason) where this Triton and NumPy cannot run it."""
    blocker = interpreter_blocker()
    if blocker is not None:
        raise RuntimeError(blocker)
    if INTERPRETED:
        return sys.modules[__name__]
    name = __name__ + "_interpreted"
    spec = importlib.util.spec_from_file_location(name, __file__)
    mod = importlib.util.module_from_spec(spec)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        spec.loader.exec_module(mod)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    if not mod.INTERPRETED:
        raise RuntimeError("could not load the Triton kernels under the interpreter")
    sys.modules[name] = mod
    return mod
