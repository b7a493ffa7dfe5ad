"""Training forward and fused backward of the MLP blocks on the Triton path.

The kernels are triton_gemm's (passed in as `tg`: the compiled module, or its copy under
Triton's interpreter); this module orders them with cuBLAS GEMMs. It does not import
Triton itself. dispatch.py calls it; functional.py's custom ops call dispatch.

Gated MLP, x [M, D], g = x Wg^T + bg, u = x Wu^T + bu, h = act(g) * u, y = h Wd^T + bd:

    training forward   one fused kernel writes h and the pre-activations g | u ([M, 2H],
                       rounded to x's dtype); cuBLAS y = h Wd^T. Saved: g | u and h.
    backward           (a) linear_dact: dh = dy Wd (never stored) with the epilogue
                           dg = dh * u * act'(g), du = dh * act(g), written as dg | du over
                           g | u (in place where allowed) or into a new [M, 2H] buffer
                       (b) dx = dg Wg + du Wu: one cuBLAS mm where Wg and Wu are the two
                           halves of one packed tensor, else mm + addmm_ ("cublas"), or the
                           dual-operand Triton kernel ("triton"); FUSED_MLP_BWD_DX picks
                       (c) cuBLAS: dWd = dy^T h; [dWg; dWu] = (dg | du)^T x in ONE GEMM
                           into a [2H, D] tensor (the two weight grads are its row halves);
                           bias grads are column sums
    recompute          nothing but the inputs is saved; the backward recomputes g | u and h
                       with the forward kernel, in column chunks of the hidden dimension
                       (at most FUSED_MLP_RECOMPUTE_CHUNK_MB of g | u | h at a time, 64 by
                       default), each chunk's gradients written in place over its g | u.
                       Weight gradients of a chunk are complete column / row blocks; dx
                       accumulates over chunks (addmm_, in x's dtype). Gated MLP with
                       [dWg; dWu] requested: where it can, a chunk's g | u | h lives in
                       gradient rows not yet written (recompute_plan): the chunk's token
                       rows in two halves, one half's g | u in the dWg rows of later
                       chunks, the other's in their dWu rows; h in the chunk's own dWg
                       rows (M <= d: they are written after h's last reader) or after each
                       half's g | u. Only the last, small chunk takes memory of its own
                       (FUSED_MLP_RECOMPUTE_IN_GRADS=0: every chunk in the budget's buffer).

Plain MLP (pre = x W1^T + b1, h = act(pre)): the same with pre instead of g | u,
dpre = dh * act'(pre), dx = dpre W1; Conv1D weights ([in, out]) are read through strides
and their gradients are returned in that layout.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import torch

Tensor = torch.Tensor

DX_MODES = ("cublas", "triton")


def dx_mode() -> str:
    """How the gated MLP's dx = dg Wg + du Wu is computed: "cublas" (default) or "triton"."""
    mode = os.environ.get("FUSED_MLP_BWD_DX", "cublas").lower()
    if mode not in DX_MODES:
        raise ValueError(f"FUSED_MLP_BWD_DX={mode!r}: expected one of {DX_MODES}")
    return mode


def recompute_chunk_bytes() -> int:
    """FUSED_MLP_RECOMPUTE_CHUNK_MB (default 64) in bytes: the recomputed pre-activations'
    budget per chunk."""
    raw = os.environ.get("FUSED_MLP_RECOMPUTE_CHUNK_MB", "64")
    try:
        mb = float(raw)
    except ValueError:
        mb = float("nan")
    if not (math.isfinite(mb) and mb * 2**20 >= 1):
        raise ValueError(f"FUSED_MLP_RECOMPUTE_CHUNK_MB={raw!r}: expected a positive number of MB")
    return int(mb * 2**20)


def chunk_columns(m: int, hidden: int, bytes_per_column_row: int, budget: Optional[int] = None) -> int:
    """Hidden columns per recompute chunk: all of them if m * hidden * bytes fits the budget,
    else equal chunks rounded up to a multiple of 128 (whole tiles)."""
    budget = recompute_chunk_bytes() if budget is None else budget
    total = m * hidden * bytes_per_column_row
    if total <= budget or hidden <= 128:
        return max(hidden, 1)
    n_chunks = -(-total // budget)
    cols = -(-hidden // n_chunks)
    return min(hidden, -(-cols // 128) * 128)


def _chunks(hidden: int, cols: int) -> list[tuple[int, int]]:
    return [(i, min(i + cols, hidden)) for i in range(0, hidden, cols)] or [(0, 0)]


def recompute_in_grads() -> bool:
    """FUSED_MLP_RECOMPUTE_IN_GRADS=0 turns off recompute_plan's chunks in the weight
    gradients' rows (every chunk in one buffer of the budget, the form before session 25)."""
    return os.environ.get("FUSED_MLP_RECOMPUTE_IN_GRADS", "1") != "0"


# recompute_plan: at most this many chunks (each is ~7 launches), and the last chunk's own
# buffer at most this fraction of the chunk budget.
MAX_PLAN_CHUNKS = 16
TAIL_BUDGET_DIVISOR = 16


def in_grads_columns(m: int, rest: int, d: int, h_own: bool) -> int:
    """Hidden columns n of the next recompute chunk that fit the [dWg; dWu] rows the chunks
    after it will write. The chunk's m token rows are cut in two halves: the first half's
    g | u [m1, 2n] goes into the dWg rows of the columns after the chunk, the second's into
    their dWu rows ((rest - n) rows of d elements each). h [m, n] goes into the chunk's own
    dWg rows when h_own (they are written after dWd = dy^T h, its last reader; the caller
    checks m <= d), else each half's h after its g | u. n: a multiple of 8 (16-byte aligned
    slices)."""
    half = (m + 1) // 2
    return (rest * d // ((2 if h_own else 3) * half + d)) // 8 * 8


def recompute_plan(m: int, hidden: int, d: int, elem: int, budget: Optional[int] = None,
                   grads_free: bool = True, h_own: bool = False) -> tuple[list[tuple[int, int, bool]], int]:
    """The gated backward's recompute chunks: ([(h0, h1, in_grads)], columns of the buffer
    the chunks with in_grads False share).

    The plain plan cuts the hidden columns into equal chunks whose g | u | h fit the budget
    (chunk_columns), all in one buffer. With grads_free (the caller writes [dWg; dWu] [2H, d],
    whose rows for hidden columns >= h1 are not written until their own chunk), chunk
    [h0, h1) can hold its g | u and h in those rows instead (in_grads_columns; h_own: h in
    the chunk's own dWg rows), until the columns left fit a buffer of budget /
    TAIL_BUDGET_DIVISOR (g | u only with h_own); the chunks shrink as the free rows do. This
    plan is taken where it needs at most MAX_PLAN_CHUNKS chunks (large d against m: SwiGLU
    M 4096, d 4096 takes 7, halving), else the plain one (h never in the gradients)."""
    budget = recompute_chunk_bytes() if budget is None else budget
    cols = chunk_columns(m, hidden, 3 * elem, budget)
    plain = [(h0, h1, False) for h0, h1 in _chunks(hidden, cols)]
    if not grads_free or cols >= hidden:
        return plain, cols
    tail = budget // TAIL_BUDGET_DIVISOR
    plan: list[tuple[int, int, bool]] = []
    h0 = 0
    while h0 < hidden and len(plan) < MAX_PLAN_CHUNKS:
        rest = hidden - h0
        if m * (2 if h_own else 3) * rest * elem <= tail:
            return plan + [(h0, hidden, False)], rest
        n = in_grads_columns(m, rest, d, h_own)
        if n < 8:
            break
        plan.append((h0, h0 + n, True))
        h0 += n
    return plain, cols


def in_grads_parts(dwgu: Tensor, hidden: int, h1: int, m: int, n: int,
                   h_all: Optional[Tensor]) -> list[tuple[int, int, Tensor, Tensor]]:
    """Where an in_grads chunk [h1 - n, h1) keeps its g | u and h (in_grads_columns): the
    [(r0, r1, g | u [r1 - r0, 2n], h [r1 - r0, n])] of the two halves of the token rows.
    h_all: the chunk's h [m, n] in its own dWg rows, or None (h after each half's g | u)."""
    half = (m + 1) // 2
    parts = []
    for r0, r1, region in ((0, half, dwgu[h1:hidden]), (half, m, dwgu[hidden + h1:])):
        if r1 == r0:  # M = 1: one part
            continue
        flat = region.view(-1)
        rows = r1 - r0
        gu_k = flat[: rows * 2 * n].view(rows, 2 * n)
        h_k = flat[rows * 2 * n: rows * 3 * n].view(rows, n) if h_all is None else h_all[r0:r1]
        parts.append((r0, r1, gu_k, h_k))
    return parts


def as_one_weight(a: Tensor, b: Tensor) -> Optional[Tensor]:
    """[a; b] as one [2n, d] view where b's rows follow a's in memory (the two halves of a
    packed gate_up weight), else None."""
    if (a.dim() != 2 or a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype
            or a.device != b.device or a.shape[0] == 0 or a.stride(1) != 1):
        return None
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return None
    if b.storage_offset() != a.storage_offset() + a.shape[0] * a.stride(0):
        return None
    return a.as_strided((2 * a.shape[0], a.shape[1]), a.stride())


# Ones vectors for the bias gradients' GEMVs (column_sum here, the C++ training nodes through
# dispatch), by (device, dtype): every one ever made is kept (a CUDA graph captured with one
# may replay after a longer one was needed), the last is the longest; the total is below twice
# the longest.
_ONES: dict[tuple, list[Tensor]] = {}


def ones_vector(n: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A read-only vector of n ones on `device`: a view of a cached one when it is long
    enough. One made while a CUDA graph is captured is not cached: its fill kernel is only
    recorded, so outside the graph it would hold garbage."""
    kept = _ONES.get((device, dtype))
    if kept and kept[-1].shape[0] >= n:
        return kept[-1][:n]
    if torch.cuda.is_current_stream_capturing():
        return torch.ones(n, device=device, dtype=dtype)
    longest = max(n, 2 * kept[-1].shape[0] if kept else 1024)
    ones = torch.ones(longest, device=device, dtype=dtype)
    torch.cuda.current_stream(device).synchronize()  # filled before any other stream reads it
    _ONES.setdefault((device, dtype), []).append(ones)
    return ones[:n]


def column_sum(t: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """t.sum(0) for a 2-D t [M, N] (a bias gradient), into `out` if given. 16-bit CUDA
    tensors take a GEMV with a ones vector (cuBLAS, fp32 accumulation): torch's column
    sum of a bf16 [8192, 3072] allocates a 138 MB temporary, 2.75 x its input (measured on
    the H200, results/memory_trace_h200.txt), the GEMV nothing. That temporary was the
    plain MLP's backward's peak memory. The ones vector is cached (ones_vector): making it was
    one more launch, and host time, per bias gradient."""
    if t.is_cuda and t.dtype in (torch.float16, torch.bfloat16) and t.shape[0] > 0:
        ones = ones_vector(t.shape[0], t.device, t.dtype)
        return torch.mv(t.t(), ones) if out is None else torch.mv(t.t(), ones, out=out)
    return t.sum(0) if out is None else torch.sum(t, 0, out=out)


def _dx_gated(tg, dx: Tensor, dgu: Tensor, n: int, wg: Tensor, wu: Tensor, accumulate: bool, mode: str) -> None:
    """dx (+)= dg Wg + du Wu, dg | du = dgu [M, 2n], Wg / Wu [n, D]."""
    dg, du = dgu[:, :n], dgu[:, n:]
    if mode == "triton":
        tg.dual_matmul(dg, du, wg, wu, dx, accumulate=accumulate)
        return
    w = as_one_weight(wg, wu)
    if w is not None:  # packed gate_up: one GEMM with K = 2n
        _mm_into(dx, dgu, w, accumulate)
        return
    _mm_into(dx, dg, wg, accumulate)
    dx.addmm_(du, wu)


def _mm_into(out: Tensor, a: Tensor, b: Tensor, accumulate: bool) -> None:
    """out = a b, or out += a b (cuBLAS, no temporary)."""
    if accumulate:
        out.addmm_(a, b)
    else:
        torch.mm(a, b, out=out)


# Bits of `needs` (which gradients to compute).
NEED_DX, NEED_DW_IN, NEED_DW_OUT, NEED_DB_IN, NEED_DB_OUT = 1, 2, 4, 8, 16


# ----------------------------------------------------------------------------- gated


def gated_train_forward(tg, x: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, activation_id: int,
                        bg: Optional[Tensor], bu: Optional[Tensor], bd: Optional[Tensor]):
    """(y, g | u [M, 2H], h [M, H]) for 2-D x."""
    m, hidden = x.shape[0], wg.shape[0]
    gu = torch.empty((m, 2 * hidden), device=x.device, dtype=x.dtype)
    h = tg.gated_linear(x, wg, wu, bg, bu, activation_id, pre=gu)
    return torch.nn.functional.linear(h, wd, bd), gu, h


def gated_backward(tg, dy: Tensor, x: Tensor, wg: Tensor, wu: Tensor, wd: Tensor, activation_id: int,
                   bg: Optional[Tensor], bu: Optional[Tensor], gu: Optional[Tensor], h: Optional[Tensor],
                   needs: int, inplace: bool, mode: Optional[str] = None, chunk_budget: Optional[int] = None):
    """(dx, [dWg; dWu] [2H, D], dWd, [dbg; dbu] [2H], dbd), None where `needs` leaves it out.

    gu, h: saved by gated_train_forward, or None (recompute). inplace: dg | du may overwrite
    the saved gu (the caller knows nobody reads it again)."""
    mode = mode or dx_mode()
    m, d = x.shape
    hidden, d_out = wg.shape[0], wd.shape[0]
    new = dict(device=x.device, dtype=x.dtype)
    dx = torch.empty((m, d), **new) if needs & NEED_DX else None
    dwgu = torch.empty((2 * hidden, d), **new) if needs & NEED_DW_IN else None
    dwd = torch.empty((d_out, hidden), **new) if needs & NEED_DW_OUT else None
    dbgu = torch.empty((2 * hidden,), **new) if needs & NEED_DB_IN else None
    dbd = column_sum(dy) if needs & NEED_DB_OUT else None
    if dx is not None and hidden == 0:
        dx.zero_()

    saved = gu is not None
    h_own = False
    if saved:
        chunks, cols = [(0, hidden, False)], hidden
    else:
        # (rows of dWgu 16-byte aligned, as the kernels' row pointers must be)
        grads_free = dwgu is not None and (d * x.element_size()) % 16 == 0 and recompute_in_grads()
        h_own = m <= d  # (h fits the chunk's own dWg rows)
        chunks, cols = recompute_plan(m, hidden, d, x.element_size(), chunk_budget, grads_free, h_own=h_own)
        h_own = h_own and any(c[2] for c in chunks)  # (the plain plan keeps h in its buffer)
    # g | u (and h, unless h_own) of the chunks that do not live in the gradients
    buf = None if saved else torch.empty((m, (2 if h_own else 3) * cols), **new)
    for h0, h1, in_grads in chunks:
        n = h1 - h0
        # parts: (r0, r1, g | u, h) over token rows [r0, r1); h_all: the chunk's whole h
        # where it is one tensor; dgus: where each part's dg | du go
        if saved:
            parts, h_all = [(0, m, gu, h)], h
            dgus = [gu if inplace else torch.empty_like(gu)]
        else:
            # h_own: h in the chunk's own dWg rows (its last reader, dWd's GEMM, runs before
            # they are written)
            h_all = dwgu[h0:h1].view(-1)[: m * n].view(m, n) if h_own else None
            if in_grads:
                parts = in_grads_parts(dwgu, hidden, h1, m, n, h_all)
            else:
                parts = [(0, m, buf[:, : 2 * n], h_all if h_own else buf[:, 2 * n: 3 * n])]
                h_all = parts[0][3]
            for r0, r1, gu_k, h_k in parts:
                tg.gated_linear(x[r0:r1], wg[h0:h1], wu[h0:h1], None if bg is None else bg[h0:h1],
                                None if bu is None else bu[h0:h1], activation_id, pre=gu_k, out=h_k)
            dgus = [gu_k for _, _, gu_k, _ in parts]
        for (r0, r1, gu_k, _), dgu_k in zip(parts, dgus):
            tg.linear_dact(dy[r0:r1], wd[:, h0:h1], True, gu_k, dgu_k, activation_id, gated=True)
        if dwd is not None:
            if h_all is not None:
                torch.mm(dy.t(), h_all, out=dwd[:, h0:h1])
            else:  # the halves' h apart: the second adds to the first
                for k, (r0, r1, _, h_k) in enumerate(parts):
                    _mm_into(dwd[:, h0:h1], dy[r0:r1].t(), h_k, k > 0)
        whole = len(chunks) == 1 and len(parts) == 1  # [dWg; dWu] and [dbg; dbu] at once
        for k, ((r0, r1, _, _), dgu_k) in enumerate(zip(parts, dgus)):
            xk = x[r0:r1]
            if dwgu is not None:
                if whole:
                    torch.mm(dgu_k.t(), xk, out=dwgu)
                else:
                    _mm_into(dwgu[h0:h1], dgu_k[:, :n].t(), xk, k > 0)
                    _mm_into(dwgu[hidden + h0: hidden + h1], dgu_k[:, n:].t(), xk, k > 0)
            if dbgu is not None:
                if whole:
                    column_sum(dgu_k, out=dbgu)
                else:
                    for part, lo in ((dgu_k[:, :n], h0), (dgu_k[:, n:], hidden + h0)):
                        if k == 0:
                            column_sum(part, out=dbgu[lo: lo + n])
                        else:
                            dbgu[lo: lo + n] += column_sum(part)
            if dx is not None and n > 0:
                _dx_gated(tg, dx[r0:r1], dgu_k, n, wg[h0:h1], wu[h0:h1], accumulate=h0 > 0, mode=mode)
    return dx, dwgu, dwd, dbgu, dbd


# ----------------------------------------------------------------------------- plain


def mlp_train_forward(tg, x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                      activation_id: int, weight_layout: str):
    """(y, pre [M, H], h [M, H]) for 2-D x."""
    conv = weight_layout == "conv1d"
    hidden = w1.shape[1] if conv else w1.shape[0]
    pre = torch.empty((x.shape[0], hidden), device=x.device, dtype=x.dtype)
    h = tg.linear_act(x, w1, b1, activation_id, weight_layout, pre=pre)
    return torch.nn.functional.linear(h, w2.t() if conv else w2, b2), pre, h


def mlp_backward(tg, dy: Tensor, x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, activation_id: int,
                 weight_layout: str, pre: Optional[Tensor], h: Optional[Tensor], needs: int, inplace: bool,
                 chunk_budget: Optional[int] = None):
    """(dx, dW1, dW2, db1, db2) with dW1 / dW2 in the weights' own layout; None where not needed."""
    conv = weight_layout == "conv1d"
    m, d = x.shape
    hidden = w1.shape[1] if conv else w1.shape[0]
    new = dict(device=x.device, dtype=x.dtype)
    dx = torch.empty((m, d), **new) if needs & NEED_DX else None
    dw1 = torch.empty(w1.shape, **new) if needs & NEED_DW_IN else None
    dw2 = torch.empty(w2.shape, **new) if needs & NEED_DW_OUT else None
    db1 = torch.empty((hidden,), **new) if needs & NEED_DB_IN else None
    db2 = column_sum(dy) if needs & NEED_DB_OUT else None
    if dx is not None and hidden == 0:
        dx.zero_()

    saved = pre is not None
    cols = hidden if saved else chunk_columns(m, hidden, 2 * x.element_size(), chunk_budget)
    buf = None if saved else torch.empty((m, 2 * cols), **new)  # pre | h of one chunk
    for h0, h1 in _chunks(hidden, cols):
        n = h1 - h0
        w1_c = w1[:, h0:h1] if conv else w1[h0:h1]  # conv [D, n], linear [n, D]
        w2_c = w2[h0:h1] if conv else w2[:, h0:h1]  # conv [n, Dout] = [N, K], linear [Dout, n] = [K, N]
        if saved:
            pre_c, h_c = pre, h
            dpre = pre if inplace else torch.empty_like(pre)
        else:
            pre_c, h_c = buf[:, :n], buf[:, n: 2 * n]
            tg.linear_act(x, w1_c, None if b1 is None else b1[h0:h1], activation_id, weight_layout,
                          pre=pre_c, out=h_c)
            dpre = pre_c
        tg.linear_dact(dy, w2_c, not conv, pre_c, dpre, activation_id, gated=False)
        if dw2 is not None:
            if conv:
                torch.mm(h_c.t(), dy, out=dw2[h0:h1])
            else:
                torch.mm(dy.t(), h_c, out=dw2[:, h0:h1])
        if dw1 is not None:
            if conv:
                torch.mm(x.t(), dpre, out=dw1[:, h0:h1])
            else:
                torch.mm(dpre.t(), x, out=dw1[h0:h1])
        if db1 is not None:
            column_sum(dpre, out=db1[h0:h1])
        if dx is not None and n > 0:
            _mm_into(dx, dpre, w1_c.t() if conv else w1_c, h0 > 0)  # w1 chunk as [n, D]
    return dx, dw1, dw2, db1, db2
