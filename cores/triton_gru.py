"""The gated GRU family (:class:`cores.gru.GatedGRU`) as two Triton kernels, one launch each way.

The same design as :mod:`cores.triton_lstm`: the input projection ``x W^T + b`` of every step
is one matmul outside the kernel; one forward launch runs the whole time loop (a tile of
``BLOCK_B`` batch rows per program, ``h`` in registers, ``h U_g^T`` per gate block by
``tl.dot``) and stores the gate pre-activations; one reverse-time launch recomputes the gates
from them and writes the pre-activation gradients, the weight and input gradients being
matmuls over all steps outside it. The update gate's activation (``ACT``) and its refine gate
(``REFINE``) are compile-time parameters. Gate blocks: ``z, [q], r, n``; the candidate reads
``n = tanh(a_n + r (U_n h + b_hn))``, so the forward also keeps ``U_n h + b_hn``.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cores import triton_gates as tg
from cores.gates import ACTIVATIONS, FAST_CLAMP
from cores.triton_gates import (
    SPLIT_LOOP_STAGES,
    back,
    back_slice,
    clip_unit,
    gate,
    gate_slope,
    inside_unit,
    power_decay,
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
def cell(
    a_z, a_q, a_n, h_prev, ACT: tl.constexpr, REFINE: tl.constexpr, CLAMP: tl.constexpr,
    POWER: tl.constexpr,
):  # fmt: skip
    """One step of :meth:`cores.gru.GatedGRU.cell` from its pre-activations (``a_n`` with the
    reset gate applied): ``h_t = n + z (h_{t-1} - n)``, or with ``POWER > 0`` the power-law
    rule ``h_{t-1} - (1 - z)(|h_{t-1}|^r h_{t-1} - n)`` clipped to ``[-1, 1]``. Every tensor
    is ``[BLOCK_B, BLOCK_N]``; ``a_q`` is not read without ``REFINE``."""
    z = gate(a_z, ACT, CLAMP)
    if REFINE:
        q = sigmoid(a_q)
        z = z * (2.0 * q + (1.0 - 2.0 * q) * z)
    n = tanh(a_n)
    if POWER == 0.0:
        h = n + z * (h_prev - n)
    else:
        decay, _ = power_decay(h_prev, POWER)
        h = clip_unit(h_prev - (1.0 - z) * (decay - n))
    return h


@triton.jit
def cell_grads(
    a_z, a_q, a_r, a_n, hn, h_prev, dh, ACT: tl.constexpr, REFINE: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """The backward of :func:`cell`, its gates recomputed from the pre-activations: given the
    gradient ``dh`` into ``h_t``, returns those of ``a_z, a_q, a_r, a_n``, of ``U_n h + b_hn``
    (``hn``) and the direct part of ``h_{t-1}``'s (``z dh`` for the GRU; ``a_q``'s is a
    stand-in that nothing stores without ``REFINE``)."""
    zf = gate(a_z, ACT, CLAMP)
    z = zf
    if REFINE:
        q = sigmoid(a_q)
        z = zf * (2.0 * q + (1.0 - 2.0 * q) * zf)
    r = sigmoid(a_r)
    n = tanh(a_n)
    if POWER == 0.0:
        dz = dh * (h_prev - n)
        direct = dh * z
    else:  # h_t = clip(h_{t-1} - (1 - z)(decay(h_{t-1}) - n)): the unclipped value recomputed
        decay, slope = power_decay(h_prev, POWER)
        dh = tl.where(inside_unit(h_prev - (1.0 - z) * (decay - n)), dh, 0.0)
        dz = dh * (decay - n)
        direct = dh * (1.0 - (1.0 - z) * slope)
    da_n = dh * (1.0 - z) * (1.0 - n * n)
    da_q = da_n
    if REFINE:
        da_q = dz * 2.0 * zf * (1.0 - zf) * q * (1.0 - q)
        dz = dz * (2.0 * q + 2.0 * (1.0 - 2.0 * q) * zf)
    da_z = dz * gate_slope(a_z, zf, ACT, CLAMP)
    return da_z, da_q, da_n * hn * r * (1.0 - r), da_n, da_n * r, direct


@triton.jit
def input_side(g_t, rows, row_ok, cols_n, n_ok, H, NG: tl.constexpr, REFINE: tl.constexpr):
    """A step's input-side pre-activations of units ``cols_n`` (``g_t`` at ``[B, NG*H]``):
    ``z, q, r, n``, read in one go so the reads' latencies overlap (``q`` is ``z``'s
    stand-in without ``REFINE``)."""
    GH = NG * H
    g_z = tile(g_t, rows, row_ok, cols_n, n_ok, GH)
    g_q = g_z
    if REFINE:
        g_q = tile(g_t + H, rows, row_ok, cols_n, n_ok, GH)
    g_r = tile(g_t + (NG - 2) * H, rows, row_ok, cols_n, n_ok, GH)
    g_n = tile(g_t + (NG - 1) * H, rows, row_ok, cols_n, n_ok, GH)
    return g_z, g_q, g_r, g_n


@triton.jit
def _step_grads(
    a_t, hn_t, h_prev, dh, rows, row_ok, cols_n, n_ok, H, NG: tl.constexpr,
    ACT: tl.constexpr, REFINE: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """:func:`cell_grads` of a step's tile, reading its pre-activations at ``a_t``
    (``[B, NG*H]``) and ``U_n h + b_hn`` at ``hn_t`` (``[B, H]``)."""
    a_z, a_q, a_r, a_n = input_side(a_t, rows, row_ok, cols_n, n_ok, H, NG, REFINE)
    hn = tile(hn_t, rows, row_ok, cols_n, n_ok, H)
    return cell_grads(a_z, a_q, a_r, a_n, hn, h_prev, dh, ACT, REFINE, CLAMP, POWER)


@triton.jit
def _put_grads(
    da_t, dhn_t, da_z, da_q, da_r, da_n, dhn, rows, row_ok, cols_n, n_ok, H,
    NG: tl.constexpr, REFINE: tl.constexpr,
):  # fmt: skip
    """Store a step's gate gradients at ``da_t`` (``[B, NG*H]``) and ``hn``'s at ``dhn_t``."""
    GH = NG * H
    if REFINE:
        put(da_t + H, da_q, rows, row_ok, cols_n, n_ok, GH)
    put(da_t, da_z, rows, row_ok, cols_n, n_ok, GH)
    put(da_t + (NG - 2) * H, da_r, rows, row_ok, cols_n, n_ok, GH)
    put(da_t + (NG - 1) * H, da_n, rows, row_ok, cols_n, n_ok, GH)
    put(dhn_t, dhn, rows, row_ok, cols_n, n_ok, H)


@triton.jit
def step_saved(
    a_ptr, hn_ptr, y_ptr, dy_ptr, starts_ptr, t, B, H, rows, row_ok, cols_n, n_ok,
    NG: tl.constexpr, REFINE: tl.constexpr, BLOCK_B: tl.constexpr, HAS_STARTS: tl.constexpr,
):  # fmt: skip
    """Everything step ``t``'s backward reads that no other program writes, read in one go:
    its pre-activations ``a_z, a_q, a_r, a_n``, ``U_n h + b_hn``, ``h_{t-1}`` (zero where
    ``start``), the output's gradient ``dy_t`` (``[BLOCK_B, BLOCK_N]`` each) and ``start``
    (``[BLOCK_B]``)."""
    a_z, a_q, a_r, a_n = input_side(
        a_ptr + t * B * NG * H, rows, row_ok, cols_n, n_ok, H, NG, REFINE
    )
    hn = tile(hn_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    h_prev = tile(y_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    dy = tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
    return a_z, a_q, a_r, a_n, hn, tl.where(start[:, None], 0.0, h_prev), dy, start


@triton.jit
def forward_kernel(
    g_ptr,  # [T, B, NG*H] x W^T + b
    a_ptr,  # [T, B, NG*H] out: pre-activations of z, [q], r and n (pre-tanh)
    hn_ptr,  # [T, B, H] out: U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    bhn_ptr,  # [H] bias_hn
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T+1, B, H] in: h_0 at index 0; out: h_t at index t+1
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law rule's r (0: the GRU)
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    GH = NG * H
    for t in range(T):
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        h_prev_ptr = y_ptr + t * B * H
        g_t = g_ptr + t * B * GH
        a_t = a_ptr + t * B * GH
        for j0 in range(0, H, BLOCK_N):  # a chunk of units: all its gates, then its state
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            a_z = tile(g_t, rows, row_ok, cols_n, n_ok, GH)
            a_q = a_z  # a stand-in that cell() does not read without REFINE
            if REFINE:
                a_q = tile(g_t + H, rows, row_ok, cols_n, n_ok, GH)
            a_r = tile(g_t + (NG - 2) * H, rows, row_ok, cols_n, n_ok, GH)
            b_hn = tl.load(bhn_ptr + cols_n, mask=n_ok, other=0.0)
            hn = tl.zeros([BLOCK_B, BLOCK_N], dtype=y_ptr.dtype.element_ty) + b_hn[None, :]
            for k0 in range(0, H, BLOCK_K):  # the recurrent product, chunk by chunk of h_{t-1}
                cols_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = cols_k < H
                h = tl.where(start[:, None], 0.0, tile(h_prev_ptr, rows, row_ok, cols_k, k_ok, H))
                a_z += rec(h, w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H, PREC)
                if REFINE:
                    a_q += rec(h, w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_r += rec(h, w_ptr, NG - 2, cols_k, k_ok, cols_n, n_ok, H, PREC)
                hn += rec(h, w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H, PREC)
            a_n = tile(g_t + (NG - 1) * H, rows, row_ok, cols_n, n_ok, GH) + sigmoid(a_r) * hn
            put(a_t, a_z, rows, row_ok, cols_n, n_ok, GH)
            put(a_t + (NG - 2) * H, a_r, rows, row_ok, cols_n, n_ok, GH)
            put(a_t + (NG - 1) * H, a_n, rows, row_ok, cols_n, n_ok, GH)
            put(hn_ptr + t * B * H, hn, rows, row_ok, cols_n, n_ok, H)
            if REFINE:
                put(a_t + H, a_q, rows, row_ok, cols_n, n_ok, GH)
            h_prev = tile(h_prev_ptr, rows, row_ok, cols_n, n_ok, H)
            h_prev = tl.where(start[:, None], 0.0, h_prev)
            h_new = cell(a_z, a_q, a_n, h_prev, ACT, REFINE, CLAMP, POWER)
            put(y_ptr + (t + 1) * B * H, h_new, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # h_t is read by every thread of the program at the next step


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    hn_ptr,  # [T, B, H] the forward's U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    y_ptr,  # [T+1, B, H] h_0 and the forward's h_t
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    dh_ptr,  # [T+1, B, H] in: the final h's gradient at index T; out: into h_t's at index t
    direct_ptr,  # [B, H] scratch: the gradient into h_{t-1} through h_t = ... + z h_{t-1}
    da_ptr,  # [T, B, NG*H] out: gradients of the input-side pre-activations
    dhn_ptr,  # [T, B, H] out: gradient of U_n h_{t-1} + b_hn
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law rule's r (0: the GRU)
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    GH = NG * H
    for k in range(T):
        t = T - 1 - k
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        a_t = a_ptr + t * B * GH
        da_t = da_ptr + t * B * GH
        for j0 in range(0, H, BLOCK_N):  # the gate gradients of a chunk of units
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            dh = tile(dh_ptr + (t + 1) * B * H, rows, row_ok, cols_n, n_ok, H)
            dh += tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            h_prev = tile(y_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            h_prev = tl.where(start[:, None], 0.0, h_prev)
            da_z, da_q, da_r, da_n, dhn, direct = _step_grads(
                a_t, hn_ptr + t * B * H, h_prev, dh, rows, row_ok, cols_n, n_ok, H, NG, ACT,
                REFINE, CLAMP, POWER,
            )  # fmt: skip
            _put_grads(
                da_t, dhn_ptr + t * B * H, da_z, da_q, da_r, da_n, dhn, rows, row_ok, cols_n,
                n_ok, H, NG, REFINE,
            )  # fmt: skip
            put(direct_ptr, direct, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # dA_t is read across the program below
        for k0 in range(0, H, BLOCK_K):  # gradient into h_{t-1}: z dh + sum_g dA_g W_g
            cols_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = cols_k < H
            acc = tile(direct_ptr, rows, row_ok, cols_k, k_ok, H)
            for j0 in range(0, H, BLOCK_N):
                cols_n = j0 + tl.arange(0, BLOCK_N)
                n_ok = cols_n < H
                for gi in tl.static_range(NG - 1):  # z, [q], r: the input-side gradients
                    da = tile(da_t + gi * H, rows, row_ok, cols_n, n_ok, GH)
                    acc += back(da, w_ptr, gi, cols_n, n_ok, cols_k, k_ok, H, PREC)
                dhn = tile(dhn_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)  # n: r dA_n
                acc += back(dhn, w_ptr, NG - 1, cols_n, n_ok, cols_k, k_ok, H, PREC)
            acc = tl.where(start[:, None], 0.0, acc)
            put(dh_ptr + t * B * H, acc, rows, row_ok, cols_k, k_ok, H)
        tl.debug_barrier()  # the next (earlier) step reads this gradient across the program


@triton.jit
def forward_split_kernel(
    g_ptr,  # [T, B, NG*H] x W^T + b
    a_ptr,  # [T, B, NG*H] out: pre-activations of z, [q], r and n (pre-tanh)
    hn_ptr,  # [T, B, H] out: U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    bhn_ptr,  # [H] bias_hn
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T+1, B, H] in: h_0 at index 0; out: h_t at index t+1
    flags_ptr,  # [tiles * parts + 1] int32 zeros: the barrier's step counters, the error word
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law rule's r (0: the GRU)
    SPIN_LIMIT: tl.constexpr,  # rounds a barrier waits before the launch fails
):
    """The forward with a step's units split over programs (the design of
    :func:`cores.triton_lstm.forward_split_kernel`): a part keeps its units' weights on
    chip and its state in registers, reads every unit of ``h_{t-1}`` and meets the other
    parts after each step."""
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
    GH = NG * H
    w_z = weight_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    if REFINE:
        w_q = weight_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_r = weight_slice(w_ptr, NG - 2, cols_k, k_ok, cols_n, n_ok, H)
    w_n = weight_slice(w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H)
    b_hn = tl.load(bhn_ptr + cols_n, mask=n_ok, other=0.0)
    h_own = tile(y_ptr, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for t in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        g_z, g_q, g_r, g_n = input_side(
            g_ptr + t * B * GH, rows, row_ok, cols_n, n_ok, H, NG, REFINE
        )
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        h = shared_tile(y_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H)
        h = tl.where(start[:, None], 0.0, h)
        a_t = a_ptr + t * B * GH
        a_z = g_z + tl.dot(h, w_z, input_precision=PREC)
        a_r = g_r + tl.dot(h, w_r, input_precision=PREC)
        hn = tl.dot(h, w_n, input_precision=PREC) + b_hn[None, :]
        a_n = g_n + sigmoid(a_r) * hn
        put(a_t, a_z, rows, row_ok, cols_n, n_ok, GH)
        put(a_t + (NG - 2) * H, a_r, rows, row_ok, cols_n, n_ok, GH)
        put(a_t + (NG - 1) * H, a_n, rows, row_ok, cols_n, n_ok, GH)
        put(hn_ptr + t * B * H, hn, rows, row_ok, cols_n, n_ok, H)
        a_q = a_z  # a stand-in that cell() does not read without REFINE
        if REFINE:
            a_q = g_q + tl.dot(h, w_q, input_precision=PREC)
            put(a_t + H, a_q, rows, row_ok, cols_n, n_ok, GH)
        h_own = cell(a_z, a_q, a_n, tl.where(start[:, None], 0.0, h_own), ACT, REFINE, CLAMP, POWER)
        put(y_ptr + (t + 1) * B * H, h_own, rows, row_ok, cols_n, n_ok, H)
        if t + 1 < T:  # every part's h_t is stored before any part reads it
            ok = sync_parts(flags, error, part, n_parts, t + 1, ok, PARTS, SPIN_LIMIT)


@triton.jit
def backward_split_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    hn_ptr,  # [T, B, H] the forward's U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    y_ptr,  # [T+1, B, H] h_0 and the forward's h_t
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    dh_ptr,  # [B, H] in: the final h's gradient; out: step 0's direct part, z_0 dh_0
    da_ptr,  # [T, B, NG*H] out: gradients of the input-side pre-activations
    dhn_ptr,  # [T, B, H] out: gradient of U_n h_{t-1} + b_hn
    flags_ptr,  # [tiles * parts + 1] int32 zeros
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law rule's r (0: the GRU)
    SPIN_LIMIT: tl.constexpr,
):
    """The reverse-time pass with a step's units split over programs (the design of
    :func:`cores.triton_lstm.backward_split_kernel`); the gradient into ``h_0`` is finished
    by one matmul after the launch."""
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
    GH = NG * H
    w_z = back_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    if REFINE:
        w_q = back_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_r = back_slice(w_ptr, NG - 2, cols_k, k_ok, cols_n, n_ok, H)
    w_n = back_slice(w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H)
    dh = tile(dh_ptr, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for k in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        t = T - 1 - k
        s_z, s_q, s_r, s_n, s_hn, s_h, s_dy, start = step_saved(
            a_ptr, hn_ptr, y_ptr, dy_ptr, starts_ptr, t, B, H, rows, row_ok, cols_n, n_ok,
            NG, REFINE, BLOCK_B, HAS_STARTS,
        )  # fmt: skip
        da_t = da_ptr + t * B * GH
        dh += s_dy
        da_z, da_q, da_r, da_n, dhn, direct = cell_grads(
            s_z, s_q, s_r, s_n, s_hn, s_h, dh, ACT, REFINE, CLAMP, POWER
        )
        _put_grads(
            da_t, dhn_ptr + t * B * H, da_z, da_q, da_r, da_n, dhn, rows, row_ok, cols_n, n_ok,
            H, NG, REFINE,
        )  # fmt: skip
        if t > 0:  # gradient into h_{t-1}: z dh + sum_g dA_g W_g, every part's dA_t
            ok = sync_parts(flags, error, part, n_parts, k + 1, ok, PARTS, SPIN_LIMIT)
            acc = direct + tl.dot(
                shared_tile(da_t, rows, row_ok, cols_k, k_ok, GH), w_z, input_precision=PREC
            )
            if REFINE:
                da_q_all = shared_tile(da_t + H, rows, row_ok, cols_k, k_ok, GH)
                acc += tl.dot(da_q_all, w_q, input_precision=PREC)
            da_r_all = shared_tile(da_t + (NG - 2) * H, rows, row_ok, cols_k, k_ok, GH)
            acc += tl.dot(da_r_all, w_r, input_precision=PREC)
            dhn_all = shared_tile(dhn_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H)
            acc += tl.dot(dhn_all, w_n, input_precision=PREC)
            dh = tl.where(start[:, None], 0.0, acc)
        else:
            put(dh_ptr, direct, rows, row_ok, cols_n, n_ok, H)


def _meta(core: Any, device: torch.device) -> dict[str, Any]:
    """Compile-time parameters of one preset on ``device``."""
    return dict(
        NG=len(core.gate_names),
        ACT=ACTIVATIONS.index(core.activation),
        REFINE=core.refine,
        PREC=tg.recurrent_precision(device),  # PyTorch's switch for its own RNNs
        CLAMP=FAST_CLAMP,
        POWER=core.power,
        **tg.block_meta(core.hidden_size),
    )


class _TritonGRU(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        bias_hn: Tensor,
        h0: Tensor,
        starts: Tensor | None,
        meta: dict[str, Any],
    ) -> tuple[Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel adds the recurrent part
        G = tg.input_projection(x, weight_ih, bias)
        A = torch.empty_like(G)
        HN = x.new_empty(T, B, H)
        Y = x.new_empty(T + 1, B, H)  # h_0 and every h_t (the step reads h_{t-1} from here)
        Y[0] = h0
        w = weight_hh.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else Y
        buffers = (G, A, HN, w, bias_hn.contiguous(), starts8, Y)
        ctx.where = tg.describe(
            "GatedGRU", {k: meta[k] for k in ("ACT", "REFINE", "POWER")}, T, B, H
        )
        ctx.plan, ctx.meta = tg.launch_forward(
            forward_split_kernel, forward_kernel, buffers, T, B, H, meta, ctx.where,
            HAS_STARTS=starts is not None,
        )  # fmt: skip
        ctx.tile_meta = meta
        ctx.has_starts = starts is not None
        ctx.save_for_backward(x, weight_ih, w, starts8, A, HN, Y)
        return Y[1:], Y[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dhT: Tensor | None):
        x, weight_ih, w, starts8, A, HN, Y = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = torch.zeros_like(HN) if dY is None else dY.contiguous()
        dA = torch.empty_like(A)  # the kernel writes every gate block
        dHN = torch.empty_like(HN)
        split = ctx.plan is not None
        if split:
            dh = x.new_zeros(B, H) if dhT is None else dhT.clone()  # out: z_0 dh_0
            flags = ctx.plan.flags(x.device)
            split = tg.launch_split(
                backward_split_kernel, ctx.plan,
                A, HN, w, Y, starts8, dY, dh, dA, dHN, flags, T, B, H,
                flags=flags, where=ctx.where,
                HAS_STARTS=ctx.has_starts,
                **ctx.meta,
            )  # fmt: skip
        if not split:  # one program per batch tile (or a GPU the split does not fit)
            dH = x.new_empty(T + 1, B, H)  # gradient into h_t from the steps after t
            dH[T] = 0.0 if dhT is None else dhT
            tg.launch(
                backward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
                A, HN, w, Y, starts8, dY, dH, x.new_empty(B, H), dA, dHN, T, B, H,
                HAS_STARTS=ctx.has_starts,
                **ctx.tile_meta,
            )  # fmt: skip
            dh0 = dH[0]
        # the recurrent side's gradient is dA with its n block replaced by dHN
        h_prev = tg.previous_states(Y[:-1], starts8, ctx.has_starts)
        dA_flat = dA.view(T * B, -1)
        dA_rec = torch.cat([dA_flat[:, : w.shape[0] - H], dHN.view(T * B, H)], 1)
        if split:  # step 0 needs every part's dA_0: one matmul after the launch
            dh0 = dh + dA_rec[:B].mm(w)
            if ctx.has_starts:
                dh0 = dh0.masked_fill(starts8[0].bool()[:, None], 0.0)
        d_weight_hh = dA_rec.t().mm(h_prev.reshape(T * B, H))
        d_bias_hn = dHN.sum((0, 1))
        dx, d_weight_ih, d_bias = tg.input_side_grads(ctx.needs_input_grad, dA, x, weight_ih)
        return dx, d_weight_ih, d_bias, d_weight_hh, d_bias_hn, dh0, None, None


def triton_gru(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None
) -> tuple[Tensor, tuple[Tensor]]:
    """Run :class:`~cores.gru.GatedGRU` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :return: ``y [T, B, H]`` and the final ``(h,)``.
    """
    tg.check_device(x)
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    (h,) = state
    meta, ys = _meta(core, x.device), []
    for steps in tg.time_chunks(x.shape[0], x.shape[1] * core.weight_ih.shape[0]):
        y, h = _TritonGRU.apply(
            x[steps].contiguous(),
            core.weight_ih,
            core.bias,
            core.weight_hh,
            core.bias_hn,
            h,
            None if starts is None else starts[steps],
            meta,
        )
        ys.append(y)
    return (ys[0] if len(ys) == 1 else torch.cat(ys)), (h,)
