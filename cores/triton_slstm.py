"""xLSTM's sLSTM (:class:`cores.xlstm.SLSTM`) as two Triton kernels, one launch each way.

The design of :mod:`cores.triton_lstm`: the input projection of every step is one matmul
outside the kernel, one forward launch runs the whole time loop (a tile of ``BLOCK_B`` batch
rows per program; ``h, c, n, m`` in registers) and one reverse-time launch recomputes the
gates from the stored pre-activations and states. The head-wise (block-diagonal) recurrent
matrices enter as one dense ``[4H, H]`` matrix built outside the kernel with autograd, so the
gradient of the dense matrix flows back into the diagonal blocks alone.

Per step (gate blocks ``z, i, f, o``)::

    log f = logsigmoid(f~);  m = max(log f + m_{t-1}, i~)
    i' = exp(i~ - m);  f' = exp(log f + m_{t-1} - m)
    c = f' c_{t-1} + i' tanh(z~);  n = f' n_{t-1} + i';  h = sigma(o~) c / max(n, eps)

The backward differentiates every path the reference's autograd does, the stabiliser ``m``
included (``torch.maximum`` splits a tie's gradient in halves; so does the kernel).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cores import triton_gates as tg
from cores.triton_gates import (
    SPLIT_LOOP_STAGES,
    back,
    back_slice,
    put,
    rec,
    shared_tile,
    sigmoid,
    starts_at,
    sync_parts,
    tanh,
    tile,
    weight_slice,
)


@triton.jit
def _log_sigmoid(z):
    """log sigma(z) = min(z, 0) - log(1 + exp(-|z|)), finite for every finite z."""
    return tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def cell(a_z, a_i, a_f, a_o, c, n, m, EPS: tl.constexpr):
    """One sLSTM step from its pre-activations and the previous ``c, n, m`` (every tensor
    ``[BLOCK_B, BLOCK_N]``): returns the new ``c, n, m`` and ``h``."""
    log_f = _log_sigmoid(a_f)
    m_new = tl.maximum(log_f + m, a_i)
    i_gate = tl.exp(a_i - m_new)
    f_gate = tl.exp(log_f + m - m_new)
    c = f_gate * c + i_gate * tanh(a_z)
    n = f_gate * n + i_gate
    return c, n, m_new, sigmoid(a_o) * c / tl.maximum(n, EPS)


@triton.jit
def cell_grads(
    a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n, dh, dc, dn, dm, EPS: tl.constexpr
):  # fmt: skip
    """The backward of :func:`cell`, its gates recomputed: given the gradients into the new
    ``h, c, n, m``, returns those of ``a_z, a_i, a_f, a_o`` and of the previous ``c, n, m``."""
    a_keep = _log_sigmoid(a_f) + m_prev  # the first argument of the stabiliser's max
    m = tl.maximum(a_keep, a_i)
    i_gate = tl.exp(a_i - m)
    f_gate = tl.exp(a_keep - m)
    zt = tanh(a_z)
    so = sigmoid(a_o)
    nn = tl.maximum(n, EPS)
    # h = so c / nn (clamp_min passes the gradient where n >= eps)
    da_o = dh * c / nn * so * (1.0 - so)
    dcs = dc + dh * so / nn
    dns = dn + tl.where(n >= EPS, -dh * so * c / (nn * nn), 0.0)
    # c = f' c_prev + i' tanh(z~), n = f' n_prev + i'
    df_gate = dcs * c_prev + dns * n_prev
    di_gate = dcs * zt + dns
    # i' = exp(i~ - m), f' = exp(a_keep - m), m = max(a_keep, i~): a tie splits in halves
    dms = dm - di_gate * i_gate - df_gate * f_gate
    w_keep = tl.where(a_keep > a_i, 1.0, tl.where(a_keep == a_i, 0.5, 0.0))
    d_keep = df_gate * f_gate + dms * w_keep  # gradient of log f + m_prev
    da_z = dcs * i_gate * (1.0 - zt * zt)
    da_i = di_gate * i_gate + dms * (1.0 - w_keep)
    da_f = d_keep * sigmoid(-a_f)
    return da_z, da_i, da_f, da_o, dcs * f_gate, dns * f_gate, d_keep


@triton.jit
def load_gates(ptr, rows, row_ok, cols, col_ok, H):
    """The gate blocks ``z, i, f, o`` of one step (``ptr`` at ``[B, 4H]``)."""
    a_z = tile(ptr, rows, row_ok, cols, col_ok, 4 * H)
    a_i = tile(ptr + H, rows, row_ok, cols, col_ok, 4 * H)
    a_f = tile(ptr + 2 * H, rows, row_ok, cols, col_ok, 4 * H)
    a_o = tile(ptr + 3 * H, rows, row_ok, cols, col_ok, 4 * H)
    return a_z, a_i, a_f, a_o


@triton.jit
def put_gates(ptr, a_z, a_i, a_f, a_o, rows, row_ok, cols_n, n_ok, H):
    """Store the gate blocks :func:`load_gates` reads (pre-activations or their gradients)."""
    put(ptr, a_z, rows, row_ok, cols_n, n_ok, 4 * H)
    put(ptr + H, a_i, rows, row_ok, cols_n, n_ok, 4 * H)
    put(ptr + 2 * H, a_f, rows, row_ok, cols_n, n_ok, 4 * H)
    put(ptr + 3 * H, a_o, rows, row_ok, cols_n, n_ok, 4 * H)


@triton.jit
def cell_saved(a_t, s_ptr, t, T, B, H, start, rows, row_ok, cols_n, n_ok):
    """What the forward stored for step ``t``'s backward, for a tile: the pre-activations
    ``a_z, a_i, a_f, a_o`` at ``a_t``, the states ``c_{t-1}, n_{t-1}, m_{t-1}`` (zero where
    ``start``) and ``c_t, n_t`` (``s_ptr`` at ``[4, T+1, B, H]``)."""
    S = (T + 1) * B * H
    prev = s_ptr + t * B * H
    now = prev + B * H
    a_z, a_i, a_f, a_o = load_gates(a_t, rows, row_ok, cols_n, n_ok, H)
    c_prev = tile(prev + S, rows, row_ok, cols_n, n_ok, H)
    n_prev = tile(prev + 2 * S, rows, row_ok, cols_n, n_ok, H)
    m_prev = tile(prev + 3 * S, rows, row_ok, cols_n, n_ok, H)
    c = tile(now + S, rows, row_ok, cols_n, n_ok, H)
    n = tile(now + 2 * S, rows, row_ok, cols_n, n_ok, H)
    reset = start[:, None]
    c_prev = tl.where(reset, 0.0, c_prev)
    n_prev = tl.where(reset, 0.0, n_prev)
    m_prev = tl.where(reset, 0.0, m_prev)
    return a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n


@triton.jit
def step_saved(
    a_ptr, s_ptr, dy_ptr, starts_ptr, t, T, B, H, rows, row_ok, cols_n, n_ok,
    BLOCK_B: tl.constexpr, HAS_STARTS: tl.constexpr,
):  # fmt: skip
    """Everything step ``t``'s backward reads that no other program writes, read in one go so
    the reads' latencies overlap: :func:`cell_saved`'s values, the output's gradient ``dy_t``
    (``[BLOCK_B, BLOCK_N]`` each) and ``start`` (``[BLOCK_B]``)."""
    start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
    a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n = cell_saved(
        a_ptr + t * B * 4 * H, s_ptr, t, T, B, H, start, rows, row_ok, cols_n, n_ok
    )
    dy = tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    return a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n, dy, start


@triton.jit
def forward_kernel(
    g_ptr,  # [T, B, 4H] x W^T + b
    a_ptr,  # [T, B, 4H] out: the pre-activations z~, i~, f~, o~
    w_ptr,  # [4H, H] the dense recurrent matrix (gate block g maps h to its pre-activation)
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    s_ptr,  # [4, T+1, B, H] h, c, n, m: the initial state at index 0, step t's at t+1
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    S = (T + 1) * B * H  # one state tensor's size in s_ptr
    for t in range(T):
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        prev = s_ptr + t * B * H
        now = s_ptr + (t + 1) * B * H
        g_t = g_ptr + t * B * 4 * H
        a_t = a_ptr + t * B * 4 * H
        for j0 in range(0, H, BLOCK_N):  # a chunk of units: all its gates, then its state
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            a_z, a_i, a_f, a_o = load_gates(g_t, rows, row_ok, cols_n, n_ok, H)
            for k0 in range(0, H, BLOCK_K):  # the recurrent product, chunk by chunk of h_{t-1}
                cols_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = cols_k < H
                h = tl.where(start[:, None], 0.0, tile(prev, rows, row_ok, cols_k, k_ok, H))
                a_z += rec(h, w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_i += rec(h, w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_f += rec(h, w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_o += rec(h, w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H, PREC)
            put_gates(a_t, a_z, a_i, a_f, a_o, rows, row_ok, cols_n, n_ok, H)
            c = tl.where(start[:, None], 0.0, tile(prev + S, rows, row_ok, cols_n, n_ok, H))
            n = tl.where(start[:, None], 0.0, tile(prev + 2 * S, rows, row_ok, cols_n, n_ok, H))
            m = tl.where(start[:, None], 0.0, tile(prev + 3 * S, rows, row_ok, cols_n, n_ok, H))
            c, n, m_new, h_new = cell(a_z, a_i, a_f, a_o, c, n, m, EPS)
            put(now, h_new, rows, row_ok, cols_n, n_ok, H)
            put(now + S, c, rows, row_ok, cols_n, n_ok, H)
            put(now + 2 * S, n, rows, row_ok, cols_n, n_ok, H)
            put(now + 3 * S, m_new, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # h_t is read by every thread of the program at the next step


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, 4H] the forward's pre-activations
    w_ptr,  # [4H, H]
    s_ptr,  # [4, T+1, B, H] the forward's states (h, c, n, m; initial at index 0)
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    ds_ptr,  # [4, T+1, B, H] in: the final state's gradient at index T; out: state t's at t
    da_ptr,  # [T, B, 4H] out: pre-activation gradients
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    S = (T + 1) * B * H
    for k in range(T):
        t = T - 1 - k
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        d_now = ds_ptr + (t + 1) * B * H
        d_prev = ds_ptr + t * B * H
        a_t = a_ptr + t * B * 4 * H
        da_t = da_ptr + t * B * 4 * H
        for j0 in range(0, H, BLOCK_N):  # the gate gradients of a chunk of units
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            dh = tile(d_now, rows, row_ok, cols_n, n_ok, H)
            dh += tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            dc = tile(d_now + S, rows, row_ok, cols_n, n_ok, H)
            dn = tile(d_now + 2 * S, rows, row_ok, cols_n, n_ok, H)
            dm = tile(d_now + 3 * S, rows, row_ok, cols_n, n_ok, H)
            reset = start[:, None]
            a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n = cell_saved(
                a_t, s_ptr, t, T, B, H, start, rows, row_ok, cols_n, n_ok
            )
            da_z, da_i, da_f, da_o, dc_prev, dn_prev, dm_prev = cell_grads(
                a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n, dh, dc, dn, dm, EPS
            )
            put_gates(da_t, da_z, da_i, da_f, da_o, rows, row_ok, cols_n, n_ok, H)
            put(d_prev + S, tl.where(reset, 0.0, dc_prev), rows, row_ok, cols_n, n_ok, H)
            put(d_prev + 2 * S, tl.where(reset, 0.0, dn_prev), rows, row_ok, cols_n, n_ok, H)
            put(d_prev + 3 * S, tl.where(reset, 0.0, dm_prev), rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # dA_t is read across the program below
        for k0 in range(0, H, BLOCK_K):  # gradient into h_{t-1}: sum over gates of dA_g W_g
            cols_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = cols_k < H
            acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=dy_ptr.dtype.element_ty)
            for j0 in range(0, H, BLOCK_N):
                cols_n = j0 + tl.arange(0, BLOCK_N)
                n_ok = cols_n < H
                for gi in tl.static_range(4):
                    da = tile(da_t + gi * H, rows, row_ok, cols_n, n_ok, 4 * H)
                    acc += back(da, w_ptr, gi, cols_n, n_ok, cols_k, k_ok, H, PREC)
            put(d_prev, tl.where(start[:, None], 0.0, acc), rows, row_ok, cols_k, k_ok, H)
        tl.debug_barrier()  # the next (earlier) step reads this gradient across the program


@triton.jit
def forward_split_kernel(
    g_ptr,  # [T, B, 4H] x W^T + b
    a_ptr,  # [T, B, 4H] out: the pre-activations z~, i~, f~, o~
    w_ptr,  # [4H, H] the dense recurrent matrix
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    s_ptr,  # [4, T+1, B, H] h, c, n, m: the initial state at index 0, step t's at t+1
    flags_ptr,  # [tiles * parts + 1] int32 zeros: the barrier's step counters, the error word
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,  # rounds a barrier waits before the launch fails
):
    """The forward with a step's units split over programs (the design of
    :func:`cores.triton_lstm.forward_split_kernel`); ``c, n, m`` of a part's units stay in its
    registers."""
    part = tl.program_id(1)
    n_parts = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    cols_n = part * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols_n < H
    cols_k = tl.arange(0, BLOCK_H)
    k_ok = cols_k < H
    flags = flags_ptr + tl.program_id(0) * n_parts
    error = flags_ptr + tl.num_programs(0) * n_parts
    S = (T + 1) * B * H
    w_z = weight_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    w_i = weight_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_f = weight_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    w_o = weight_slice(w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H)
    c = tile(s_ptr + S, rows, row_ok, cols_n, n_ok, H)
    n = tile(s_ptr + 2 * S, rows, row_ok, cols_n, n_ok, H)
    m = tile(s_ptr + 3 * S, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for t in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        a_z, a_i, a_f, a_o = load_gates(g_ptr + t * B * 4 * H, rows, row_ok, cols_n, n_ok, H)
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        reset = start[:, None]
        h = shared_tile(s_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H)
        h = tl.where(reset, 0.0, h)
        now = s_ptr + (t + 1) * B * H
        a_t = a_ptr + t * B * 4 * H
        a_z += tl.dot(h, w_z, input_precision=PREC)
        a_i += tl.dot(h, w_i, input_precision=PREC)
        a_f += tl.dot(h, w_f, input_precision=PREC)
        a_o += tl.dot(h, w_o, input_precision=PREC)
        put_gates(a_t, a_z, a_i, a_f, a_o, rows, row_ok, cols_n, n_ok, H)
        c = tl.where(reset, 0.0, c)
        n = tl.where(reset, 0.0, n)
        m = tl.where(reset, 0.0, m)
        c, n, m, h_new = cell(a_z, a_i, a_f, a_o, c, n, m, EPS)
        put(now, h_new, rows, row_ok, cols_n, n_ok, H)
        put(now + S, c, rows, row_ok, cols_n, n_ok, H)
        put(now + 2 * S, n, rows, row_ok, cols_n, n_ok, H)
        put(now + 3 * S, m, rows, row_ok, cols_n, n_ok, H)
        if t + 1 < T:  # every part's h_t is stored before any part reads it
            ok = sync_parts(flags, error, part, n_parts, t + 1, ok, PARTS, SPIN_LIMIT)


@triton.jit
def backward_split_kernel(
    a_ptr,  # [T, B, 4H] the forward's pre-activations
    w_ptr,  # [4H, H]
    s_ptr,  # [4, T+1, B, H] the forward's states (h, c, n, m; initial at index 0)
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    ds_ptr,  # [4, B, H] in: the final state's gradient; out: c_0's, n_0's, m_0's (h_0's after)
    da_ptr,  # [T, B, 4H] out: pre-activation gradients
    flags_ptr,  # [tiles * parts + 1] int32 zeros
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,
):
    """The reverse-time pass with a step's units split over programs (the design of
    :func:`cores.triton_lstm.backward_split_kernel`); the gradient into ``h_0`` is one
    matmul after the launch."""
    part = tl.program_id(1)
    n_parts = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    cols_n = part * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = cols_n < H
    cols_k = tl.arange(0, BLOCK_H)
    k_ok = cols_k < H
    flags = flags_ptr + tl.program_id(0) * n_parts
    error = flags_ptr + tl.num_programs(0) * n_parts
    D = B * H  # one state's gradient in ds_ptr
    w_z = back_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    w_i = back_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_f = back_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    w_o = back_slice(w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H)
    dh = tile(ds_ptr, rows, row_ok, cols_n, n_ok, H)
    dc = tile(ds_ptr + D, rows, row_ok, cols_n, n_ok, H)
    dn = tile(ds_ptr + 2 * D, rows, row_ok, cols_n, n_ok, H)
    dm = tile(ds_ptr + 3 * D, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for k in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        t = T - 1 - k
        s_z, s_i, s_f, s_o, s_cp, s_np, s_mp, s_c, s_n, s_dy, s_start = step_saved(
            a_ptr, s_ptr, dy_ptr, starts_ptr, t, T, B, H, rows, row_ok, cols_n, n_ok,
            BLOCK_B, HAS_STARTS,
        )  # fmt: skip
        reset = s_start[:, None]
        da_t = da_ptr + t * B * 4 * H
        dh += s_dy
        da_z, da_i, da_f, da_o, dc, dn, dm = cell_grads(
            s_z, s_i, s_f, s_o, s_cp, s_np, s_mp, s_c, s_n, dh, dc, dn, dm, EPS
        )
        put_gates(da_t, da_z, da_i, da_f, da_o, rows, row_ok, cols_n, n_ok, H)
        dc = tl.where(reset, 0.0, dc)
        dn = tl.where(reset, 0.0, dn)
        dm = tl.where(reset, 0.0, dm)
        if t > 0:  # gradient into h_{t-1}: every part's dA_t times its weights
            ok = sync_parts(flags, error, part, n_parts, k + 1, ok, PARTS, SPIN_LIMIT)
            acc = tl.dot(
                shared_tile(da_t, rows, row_ok, cols_k, k_ok, 4 * H), w_z, input_precision=PREC
            )
            acc += tl.dot(
                shared_tile(da_t + H, rows, row_ok, cols_k, k_ok, 4 * H), w_i,
                input_precision=PREC,
            )  # fmt: skip
            acc += tl.dot(
                shared_tile(da_t + 2 * H, rows, row_ok, cols_k, k_ok, 4 * H), w_f,
                input_precision=PREC,
            )  # fmt: skip
            acc += tl.dot(
                shared_tile(da_t + 3 * H, rows, row_ok, cols_k, k_ok, 4 * H), w_o,
                input_precision=PREC,
            )  # fmt: skip
            dh = tl.where(reset, 0.0, acc)
    put(ds_ptr + D, dc, rows, row_ok, cols_n, n_ok, H)
    put(ds_ptr + 2 * D, dn, rows, row_ok, cols_n, n_ok, H)
    put(ds_ptr + 3 * D, dm, rows, row_ok, cols_n, n_ok, H)


class _TritonSLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        s0: Tensor,
        starts: Tensor | None,
        meta: dict[str, Any],
    ) -> tuple[Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel adds the recurrent part
        G = tg.input_projection(x, weight_ih, bias)
        A = torch.empty_like(G)
        S = x.new_empty(4, T + 1, B, H)  # h, c, n, m before the first step and after each
        S[:, 0] = s0
        w = weight_hh.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else S
        ctx.where = tg.describe("SLSTM", {}, T, B, H)
        ctx.plan, ctx.meta = tg.launch_forward(
            forward_split_kernel, forward_kernel, (G, A, w, starts8, S), T, B, H, meta, ctx.where,
            HAS_STARTS=starts is not None,
        )  # fmt: skip
        ctx.tile_meta = meta
        ctx.has_starts = starts is not None
        ctx.save_for_backward(x, weight_ih, w, starts8, A, S)
        return S[0, 1:], S[:, -1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dS: Tensor | None):
        x, weight_ih, w, starts8, A, S = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = x.new_zeros(T, B, H) if dY is None else dY.contiguous()
        dA = torch.empty_like(A)  # the kernel writes every gate block
        split = ctx.plan is not None
        if split:
            dS0 = x.new_zeros(4, B, H) if dS is None else dS.clone()  # out: the initial state's
            flags = ctx.plan.flags(x.device)
            split = tg.launch_split(
                backward_split_kernel, ctx.plan,
                A, w, S, starts8, dY, dS0, dA, flags, T, B, H,
                flags=flags, where=ctx.where,
                HAS_STARTS=ctx.has_starts,
                **ctx.meta,
            )  # fmt: skip
        if split:
            # step 0's gradient into h_0 needs every part's dA_0: one matmul after the launch
            dS0[0] = dA[0].mm(w)
            if ctx.has_starts:
                dS0[0].masked_fill_(starts8[0].bool()[:, None], 0.0)
        else:  # one program per batch tile (or a GPU the split does not fit)
            dSall = torch.empty_like(S)  # gradient into each state from the steps after it
            dSall[:, T] = 0.0 if dS is None else dS
            tg.launch(
                backward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
                A, w, S, starts8, dY, dSall, dA, T, B, H,
                HAS_STARTS=ctx.has_starts,
                **ctx.tile_meta,
            )  # fmt: skip
            dS0 = dSall[:, 0]
        h_prev = tg.previous_states(S[0, :-1], starts8, ctx.has_starts)
        d_weight_hh = dA.view(T * B, -1).t().mm(h_prev.reshape(T * B, H))
        dx, d_weight_ih, d_bias = tg.input_side_grads(ctx.needs_input_grad, dA, x, weight_ih)
        return dx, d_weight_ih, d_bias, d_weight_hh, dS0, None, None


def dense_recurrent(recurrent: Tensor) -> Tensor:
    """The block-diagonal recurrence ``[4, heads, d, d]`` as one ``[4H, H]`` matrix whose gate
    block ``g`` maps ``h`` to that gate's pre-activation (``a_g = W_g h``), built with autograd
    so its gradient reaches only the diagonal blocks."""
    return torch.cat([torch.block_diag(*r).t() for r in recurrent.unbind(0)], 0)


def triton_slstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, eps: float
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run :class:`~cores.xlstm.SLSTM` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :param eps: the normaliser's floor.
    :return: ``y [T, B, H]`` and the final ``(h, c, n, m)``.
    """
    tg.check_device(x)
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    meta = dict(
        EPS=eps,
        PREC=tg.recurrent_precision(x.device),  # PyTorch's switch for its own RNNs
        **tg.block_meta(core.hidden_size),
    )
    recurrent, final, ys = dense_recurrent(core.recurrent), torch.stack(state), []
    # the states' buffer [4, T+1, B, H] is the largest a launch addresses
    for steps in tg.time_chunks(x.shape[0], 4 * x.shape[1] * core.hidden_size):
        y, final = _TritonSLSTM.apply(
            x[steps].contiguous(),
            core.input.weight,
            core.input.bias,
            recurrent,
            final,
            None if starts is None else starts[steps],
            meta,
        )
        ys.append(y)
    return (ys[0] if len(ys) == 1 else torch.cat(ys)), tuple(final.unbind(0))
