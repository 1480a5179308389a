"""The gated LSTM family as two Triton kernels: the whole time loop in one launch each way.

Forward: the input projection of every step, ``G = x W^T + b`` (``[T, B, nH]``), is one matmul
outside the kernel. One kernel launch then runs all ``T`` steps: each program owns a tile of
``BLOCK_B`` batch rows and all ``H`` units, keeps ``h`` and ``c`` in registers, adds the
recurrent product ``h_{t-1} U_g^T`` per gate block with ``tl.dot``, applies the gates and
writes ``h_t``, ``c_t`` and the pre-activations ``a_t`` (what the backward needs).

Backward: one reverse-time launch recomputes every gate from ``a_t`` and ``c_{t-1}`` (the
pointwise work is recomputed, not stored), writes the pre-activation gradients ``dA_t`` and
carries ``dh``/``dc`` to the previous step (``dh_{t-1} = dA_t U`` by ``tl.dot``). The weight
and input gradients are matmuls over all steps outside the kernel: ``dU = dA^T h_prev``,
``dW = dA^T x``, ``db = sum dA``, ``dx = dA W``.

The gate functions are compile-time parameters of one kernel (``ACT``: sigmoid, fast,
fast2, softsign; ``TIED``; ``REFINE``), so every preset of :class:`cores.gated.GatedLSTM`
compiles its own specialisation of the same source. Episode starts reset ``h`` and ``c`` to
the zero initial state inside the loop, exactly as :func:`cores.base.reset_where` does in the
reference loop, and stop the gradient into the state a restarting row dropped. h-detach's
per-step draws enter the backward as a ``[T]`` mask: where set, no gradient flows from
``a_t`` into ``h_{t-1}`` (the reference's ``h_{t-1}.detach()``).

On a CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` in the
environment before ``triton`` is imported): the tests compare them with the reference loop
there. The maths is :meth:`cores.gated.GatedLSTM.cell`.
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
def load_gates(
    ptr, rows, row_ok, cols_n, n_ok, H, NG: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, R: tl.constexpr,
):  # fmt: skip
    """The gate blocks ``o, f, u`` and, where the preset has them, ``i`` and ``r`` of one step
    (``ptr`` at ``[B, NG*H]``), each ``[BLOCK_B, BLOCK_N]``. A block the preset lacks comes back
    as ``f``: a stand-in that nothing reads."""
    GH = NG * H
    a_o = tile(ptr, rows, row_ok, cols_n, n_ok, GH)
    a_f = tile(ptr + H, rows, row_ok, cols_n, n_ok, GH)
    a_u = tile(ptr + (NG - 1) * H, rows, row_ok, cols_n, n_ok, GH)
    a_i = a_f
    a_r = a_f
    if not TIED:
        a_i = tile(ptr + 2 * H, rows, row_ok, cols_n, n_ok, GH)
    if REFINE:
        a_r = tile(ptr + R * H, rows, row_ok, cols_n, n_ok, GH)
    return a_o, a_f, a_u, a_i, a_r


@triton.jit
def put_gates(
    ptr, a_o, a_f, a_u, a_i, a_r, rows, row_ok, cols_n, n_ok, H, NG: tl.constexpr,
    TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
):  # fmt: skip
    """Store the gate blocks :func:`load_gates` reads (pre-activations or their gradients)."""
    GH = NG * H
    put(ptr, a_o, rows, row_ok, cols_n, n_ok, GH)
    put(ptr + H, a_f, rows, row_ok, cols_n, n_ok, GH)
    put(ptr + (NG - 1) * H, a_u, rows, row_ok, cols_n, n_ok, GH)
    if not TIED:
        put(ptr + 2 * H, a_i, rows, row_ok, cols_n, n_ok, GH)
    if REFINE:
        put(ptr + R * H, a_r, rows, row_ok, cols_n, n_ok, GH)


@triton.jit
def cell(
    a_o, a_f, a_u, a_i, a_r, c_prev, ACT: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """One step of :meth:`cores.gated.GatedLSTM.cell` from its pre-activations: ``c_t, h_t``.
    Every tensor is ``[BLOCK_B, BLOCK_N]``. ``POWER > 0`` is the power-law cell
    ``c_{t-1} - (1 - g) |c_{t-1}|^r c_{t-1} + i u`` clipped to ``[-1, 1]``."""
    f = gate(a_f, ACT, CLAMP)
    g = f  # the forget gate, refined by r where the preset has it
    if REFINE:
        r = sigmoid(a_r)
        g = f * (2.0 * r + (1.0 - 2.0 * r) * f)
    if TIED:
        i = 1.0 - g
    else:
        i = sigmoid(a_i)
    if POWER == 0.0:
        c = g * c_prev + i * tanh(a_u)
    else:
        decay, _ = power_decay(c_prev, POWER)
        c = clip_unit(c_prev - (1.0 - g) * decay + i * tanh(a_u))
    return c, sigmoid(a_o) * tanh(c)


@triton.jit
def cell_grads(
    a_o, a_f, a_u, a_i, a_r, c, c_prev, dh, dc, ACT: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """The backward of :func:`cell`, its gates recomputed from the pre-activations: given the
    gradients ``dh, dc`` into ``h_t, c_t``, returns those of ``a_o, a_f, a_u, a_i, a_r`` and
    of ``c_{t-1}`` (a block the preset lacks gets a stand-in that nothing stores)."""
    o = sigmoid(a_o)
    f = gate(a_f, ACT, CLAMP)
    u = tanh(a_u)
    g = f
    if REFINE:
        r = sigmoid(a_r)
        g = f * (2.0 * r + (1.0 - 2.0 * r) * f)
    tc = tanh(c)
    da_o = dh * tc * o * (1.0 - o)
    dcs = dc + dh * o * (1.0 - tc * tc)  # gradient into c_t
    if TIED:
        i = 1.0 - g
    else:
        i = sigmoid(a_i)
    if POWER == 0.0:
        dg = dcs * c_prev
        dc_prev = dcs * g
    else:  # c_t = clip(c_{t-1} - (1 - g) decay(c_{t-1}) + i u): the unclipped value recomputed
        decay, slope = power_decay(c_prev, POWER)
        dcs = tl.where(inside_unit(c_prev - (1.0 - g) * decay + i * u), dcs, 0.0)
        dg = dcs * decay
        dc_prev = dcs * (1.0 - (1.0 - g) * slope)
    da_i = da_o
    if TIED:
        dg -= dcs * u
    else:
        da_i = dcs * u * i * (1.0 - i)
    da_r = da_o
    if REFINE:
        da_r = dg * 2.0 * f * (1.0 - f) * r * (1.0 - r)
        dg = dg * (2.0 * r + 2.0 * (1.0 - 2.0 * r) * f)
    da_f = dg * gate_slope(a_f, f, ACT, CLAMP)
    return da_o, da_f, dcs * i * (1.0 - u * u), da_i, da_r, dc_prev


@triton.jit
def cell_saved(
    a_t, c_ptr, t, B, H, start, rows, row_ok, cols_n, n_ok, NG: tl.constexpr,
    TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
):  # fmt: skip
    """What the forward stored for step ``t``'s backward, for a tile: the pre-activations
    ``a_o, a_f, a_u, a_i, a_r`` at ``a_t``, ``c_t`` and ``c_{t-1}`` (zero where ``start``)."""
    a_o, a_f, a_u, a_i, a_r = load_gates(a_t, rows, row_ok, cols_n, n_ok, H, NG, TIED, REFINE, R)
    c = tile(c_ptr + (t + 1) * B * H, rows, row_ok, cols_n, n_ok, H)
    c_prev = tile(c_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    return a_o, a_f, a_u, a_i, a_r, c, tl.where(start[:, None], 0.0, c_prev)


@triton.jit
def step_grads(
    a_o, a_f, a_u, a_i, a_r, c, c_prev, da_t, start, dh, dc, rows, row_ok, cols_n, n_ok, H,
    NG: tl.constexpr, ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr,
    R: tl.constexpr, CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law cell's r (0: the ordinary cell)
):  # fmt: skip
    """One step's backward for a tile from its :func:`cell_saved` values: store the gate
    gradients at ``da_t`` and return the gradient into ``c_{t-1}`` (zero where ``start``)."""
    da_o, da_f, da_u, da_i, da_r, dc_prev = cell_grads(
        a_o, a_f, a_u, a_i, a_r, c, c_prev, dh, dc, ACT, TIED, REFINE, CLAMP, POWER
    )
    put_gates(
        da_t, da_o, da_f, da_u, da_i, da_r, rows, row_ok, cols_n, n_ok, H, NG, TIED, REFINE, R
    )
    return tl.where(start[:, None], 0.0, dc_prev)


@triton.jit
def step_saved(
    a_ptr, c_ptr, dy_ptr, starts_ptr, detach_ptr, t, B, H, rows, row_ok, cols_n, n_ok,
    NG: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    BLOCK_B: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_DETACH: tl.constexpr,
):  # fmt: skip
    """Everything step ``t``'s backward reads that no other program writes, read in one go so
    the reads' latencies overlap: :func:`cell_saved`'s values, the output's gradient ``dy_t``
    (``[BLOCK_B, BLOCK_N]`` each), ``start`` (``[BLOCK_B]``) and h-detach's ``stop``
    (``[1]``)."""
    start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
    a_o, a_f, a_u, a_i, a_r, c, c_prev = cell_saved(
        a_ptr + t * B * NG * H, c_ptr, t, B, H, start, rows, row_ok, cols_n, n_ok, NG, TIED,
        REFINE, R,
    )  # fmt: skip
    dy = tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
    stop = tl.zeros([1], dtype=tl.int1)
    if HAS_DETACH:  # the reference's h_{t-1}.detach() at this step
        stop = tl.load(detach_ptr + t + tl.zeros([1], dtype=tl.int32)) != 0
    return a_o, a_f, a_u, a_i, a_r, c, c_prev, dy, start, stop


@triton.jit
def forward_kernel(
    g_ptr,  # [T, B, NG*H] x W^T + b
    a_ptr,  # [T, B, NG*H] out: the pre-activations a_t
    w_ptr,  # [NG*H, H] weight_hh
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T+1, B, H] in: h_0 at index 0; out: h_t at index t+1
    c_ptr,  # [T+1, B, H] in: c_0 at index 0; out: c_t at index t+1
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,  # the refine gate's block: 2 (tied) or 3
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law cell's r (0: the ordinary cell)
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    GH = NG * H
    for t in range(T):
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        h_prev_ptr = y_ptr + t * B * H
        for j0 in range(0, H, BLOCK_N):  # a chunk of units: all its gates, then its cell
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            a_o, a_f, a_u, a_i, a_r = load_gates(
                g_ptr + t * B * GH, rows, row_ok, cols_n, n_ok, H, NG, TIED, REFINE, R
            )
            for k0 in range(0, H, BLOCK_K):  # the recurrent product, chunk by chunk of h_{t-1}
                cols_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = cols_k < H
                h = tl.where(start[:, None], 0.0, tile(h_prev_ptr, rows, row_ok, cols_k, k_ok, H))
                a_o += rec(h, w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_f += rec(h, w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H, PREC)
                a_u += rec(h, w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H, PREC)
                if not TIED:
                    a_i += rec(h, w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H, PREC)
                if REFINE:
                    a_r += rec(h, w_ptr, R, cols_k, k_ok, cols_n, n_ok, H, PREC)
            put_gates(
                a_ptr + t * B * GH, a_o, a_f, a_u, a_i, a_r, rows, row_ok, cols_n, n_ok, H,
                NG, TIED, REFINE, R,
            )  # fmt: skip
            c = tile(c_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            c, h_new = cell(
                a_o, a_f, a_u, a_i, a_r, tl.where(start[:, None], 0.0, c), ACT, TIED, REFINE,
                CLAMP, POWER,
            )  # fmt: skip
            put(c_ptr + (t + 1) * B * H, c, rows, row_ok, cols_n, n_ok, H)
            put(y_ptr + (t + 1) * B * H, h_new, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # h_t is read by every thread of the program at the next step


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    w_ptr,  # [NG*H, H] weight_hh
    c_ptr,  # [T+1, B, H] c_0 and the forward's c_t
    starts_ptr,  # [T, B] int8
    detach_ptr,  # [T] int8: h-detach stops the gradient into h_{t-1} at step t
    dy_ptr,  # [T, B, H] gradient of the outputs
    dh_ptr,  # [T+1, B, H] in: the final h's gradient at index T; out: into h_t's at index t
    dc_ptr,  # [T+1, B, H] in: the final c's gradient at index T; out: into c_t's at index t
    da_ptr,  # [T, B, NG*H] out: pre-activation gradients
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    HAS_DETACH: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law cell's r (0: the ordinary cell)
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    GH = NG * H
    for k in range(T):
        t = T - 1 - k
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        da_t = da_ptr + t * B * GH
        for j0 in range(0, H, BLOCK_N):  # the gate gradients of a chunk of units
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            dh = tile(dh_ptr + (t + 1) * B * H, rows, row_ok, cols_n, n_ok, H)
            dh += tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            dc = tile(dc_ptr + (t + 1) * B * H, rows, row_ok, cols_n, n_ok, H)
            a_o, a_f, a_u, a_i, a_r, c, c_prev = cell_saved(
                a_ptr + t * B * GH, c_ptr, t, B, H, start, rows, row_ok, cols_n, n_ok, NG, TIED,
                REFINE, R,
            )  # fmt: skip
            dc_prev = step_grads(
                a_o, a_f, a_u, a_i, a_r, c, c_prev, da_t, start, dh, dc, rows, row_ok, cols_n,
                n_ok, H, NG, ACT, TIED, REFINE, R, CLAMP, POWER,
            )  # fmt: skip
            put(dc_ptr + t * B * H, dc_prev, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # dA_t is read across the program below
        stop = False
        if HAS_DETACH:  # the reference's h_{t-1}.detach() at this step
            stop = tl.load(detach_ptr + t) != 0
        for k0 in range(0, H, BLOCK_K):  # gradient into h_{t-1}: sum over gates of dA_g W_g
            cols_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = cols_k < H
            acc = tl.zeros([BLOCK_B, BLOCK_K], dtype=dy_ptr.dtype.element_ty)
            for j0 in range(0, H, BLOCK_N):
                cols_n = j0 + tl.arange(0, BLOCK_N)
                n_ok = cols_n < H
                for gi in tl.static_range(NG):
                    da = tile(da_t + gi * H, rows, row_ok, cols_n, n_ok, GH)
                    acc += back(da, w_ptr, gi, cols_n, n_ok, cols_k, k_ok, H, PREC)
            acc = tl.where(start[:, None] | stop, 0.0, acc)
            put(dh_ptr + t * B * H, acc, rows, row_ok, cols_k, k_ok, H)
        tl.debug_barrier()  # the next (earlier) step reads this gradient across the program


@triton.jit
def forward_split_kernel(
    g_ptr,  # [T, B, NG*H] x W^T + b
    a_ptr,  # [T, B, NG*H] out: the pre-activations a_t
    w_ptr,  # [NG*H, H] weight_hh
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T+1, B, H] in: h_0 at index 0; out: h_t at index t+1
    c_ptr,  # [T+1, B, H] in: c_0 at index 0; out: c_t at index t+1
    flags_ptr,  # [tiles * parts + 1] int32 zeros: the barrier's step counters, the error word
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law cell's r (0: the ordinary cell)
    SPIN_LIMIT: tl.constexpr,  # rounds a barrier waits before the launch fails
):
    """The forward with a step's units split over programs: program ``(tile, part)`` owns
    ``BLOCK_B`` rows and ``BLOCK_N`` units, keeps its rows of every gate's weights on chip
    (shared memory, where the sm_90 code puts ``tl.dot``'s operands) and its cells in
    registers, reads all of ``h_{t-1}`` and meets the tile's other parts after each step
    (:func:`~cores.triton_gates.sync_parts`)."""
    part = tl.program_id(1)
    n_parts = tl.num_programs(1)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    cols_n = part * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's units
    n_ok = cols_n < H
    cols_k = tl.arange(0, BLOCK_H)  # every unit of h_{t-1}
    k_ok = cols_k < H
    flags = flags_ptr + tl.program_id(0) * n_parts
    error = flags_ptr + tl.num_programs(0) * n_parts
    GH = NG * H
    w_o = weight_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    w_f = weight_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_u = weight_slice(w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H)
    if not TIED:
        w_i = weight_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    if REFINE:
        w_r = weight_slice(w_ptr, R, cols_k, k_ok, cols_n, n_ok, H)
    c = tile(c_ptr, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for t in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        g_o, g_f, g_u, g_i, g_r = load_gates(
            g_ptr + t * B * GH, rows, row_ok, cols_n, n_ok, H, NG, TIED, REFINE, R
        )
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        h = shared_tile(y_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H)
        h = tl.where(start[:, None], 0.0, h)
        a_t = a_ptr + t * B * GH
        a_o = g_o + tl.dot(h, w_o, input_precision=PREC)
        a_f = g_f + tl.dot(h, w_f, input_precision=PREC)
        a_u = g_u + tl.dot(h, w_u, input_precision=PREC)
        put(a_t, a_o, rows, row_ok, cols_n, n_ok, GH)
        put(a_t + H, a_f, rows, row_ok, cols_n, n_ok, GH)
        put(a_t + (NG - 1) * H, a_u, rows, row_ok, cols_n, n_ok, GH)
        a_r = a_f  # stand-ins that cell() does not read where the preset lacks the block
        a_i = a_f
        if REFINE:
            a_r = g_r + tl.dot(h, w_r, input_precision=PREC)
            put(a_t + R * H, a_r, rows, row_ok, cols_n, n_ok, GH)
        if not TIED:
            a_i = g_i + tl.dot(h, w_i, input_precision=PREC)
            put(a_t + 2 * H, a_i, rows, row_ok, cols_n, n_ok, GH)
        c_prev = tl.where(start[:, None], 0.0, c)
        c, h_new = cell(a_o, a_f, a_u, a_i, a_r, c_prev, ACT, TIED, REFINE, CLAMP, POWER)
        put(c_ptr + (t + 1) * B * H, c, rows, row_ok, cols_n, n_ok, H)
        put(y_ptr + (t + 1) * B * H, h_new, rows, row_ok, cols_n, n_ok, H)
        if t + 1 < T:  # every part's h_t is stored before any part reads it
            ok = sync_parts(flags, error, part, n_parts, t + 1, ok, PARTS, SPIN_LIMIT)


@triton.jit
def backward_split_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    w_ptr,  # [NG*H, H] weight_hh
    c_ptr,  # [T+1, B, H] c_0 and the forward's c_t
    starts_ptr,  # [T, B] int8
    detach_ptr,  # [T] int8: h-detach stops the gradient into h_{t-1} at step t
    dy_ptr,  # [T, B, H] gradient of the outputs
    dh_ptr,  # [B, H] the final h's gradient
    dc_ptr,  # [B, H] in: the final c's gradient; out: the gradient into c_0
    da_ptr,  # [T, B, NG*H] out: pre-activation gradients
    flags_ptr,  # [tiles * parts + 1] int32 zeros
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    HAS_DETACH: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
    POWER: tl.constexpr,  # the power-law cell's r (0: the ordinary cell)
    SPIN_LIMIT: tl.constexpr,
):
    """The reverse-time pass with a step's units split over programs, as
    :func:`forward_split_kernel`: a part writes its units' ``dA_t``, meets the other parts,
    then reads every unit's ``dA_t``, a gate block before its product, for its units of
    ``dh_{t-1}``. The gradient into ``h_0`` is one matmul after the launch (step 0 needs no
    barrier)."""
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
    w_o = back_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
    w_f = back_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
    w_u = back_slice(w_ptr, NG - 1, cols_k, k_ok, cols_n, n_ok, H)
    if not TIED:
        w_i = back_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    if REFINE:
        w_r = back_slice(w_ptr, R, cols_k, k_ok, cols_n, n_ok, H)
    dh = tile(dh_ptr, rows, row_ok, cols_n, n_ok, H)
    dc = tile(dc_ptr, rows, row_ok, cols_n, n_ok, H)
    ok = part >= 0  # no wait has given up
    for k in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        t = T - 1 - k
        s_o, s_f, s_u, s_i, s_r, s_c, s_cp, s_dy, start, stop = step_saved(
            a_ptr, c_ptr, dy_ptr, starts_ptr, detach_ptr, t, B, H, rows, row_ok, cols_n, n_ok,
            NG, TIED, REFINE, R, BLOCK_B, HAS_STARTS, HAS_DETACH,
        )  # fmt: skip
        da_t = da_ptr + t * B * GH
        dh += s_dy
        dc = step_grads(
            s_o, s_f, s_u, s_i, s_r, s_c, s_cp, da_t, start, dh, dc, rows, row_ok, cols_n, n_ok,
            H, NG, ACT, TIED, REFINE, R, CLAMP, POWER,
        )  # fmt: skip
        if t > 0:  # gradient into h_{t-1}: every part's dA_t times its weights
            ok = sync_parts(flags, error, part, n_parts, k + 1, ok, PARTS, SPIN_LIMIT)
            acc = tl.dot(
                shared_tile(da_t, rows, row_ok, cols_k, k_ok, GH), w_o, input_precision=PREC
            )
            acc += tl.dot(
                shared_tile(da_t + H, rows, row_ok, cols_k, k_ok, GH), w_f, input_precision=PREC
            )
            acc += tl.dot(
                shared_tile(da_t + (NG - 1) * H, rows, row_ok, cols_k, k_ok, GH), w_u,
                input_precision=PREC,
            )  # fmt: skip
            if not TIED:
                da_i_all = shared_tile(da_t + 2 * H, rows, row_ok, cols_k, k_ok, GH)
                acc += tl.dot(da_i_all, w_i, input_precision=PREC)
            if REFINE:
                da_r_all = shared_tile(da_t + R * H, rows, row_ok, cols_k, k_ok, GH)
                acc += tl.dot(da_r_all, w_r, input_precision=PREC)
            dh = tl.where(start[:, None] | stop[:, None], 0.0, acc)
    put(dc_ptr, dc, rows, row_ok, cols_n, n_ok, H)


def _meta(spec: dict[str, Any], hidden: int, device: torch.device) -> dict[str, Any]:
    """Compile-time parameters of one preset on ``device``."""
    return dict(
        NG=spec["n_gates"],
        ACT=ACTIVATIONS.index(spec["activation"]),
        TIED=spec["tied"],
        REFINE=spec["refine"],
        R=2 if spec["tied"] else 3,
        PREC=tg.recurrent_precision(device),  # PyTorch's switch for its own RNNs
        CLAMP=FAST_CLAMP,
        POWER=spec["power"],
        **tg.block_meta(hidden),
    )


class _TritonLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        h0: Tensor,
        c0: Tensor,
        starts: Tensor | None,
        detach: Tensor | None,
        spec: dict[str, Any],
    ) -> tuple[Tensor, Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel adds h U^T
        G = tg.input_projection(x, weight_ih, bias)
        A = torch.empty_like(G)
        Y = x.new_empty(T + 1, B, H)  # h_0 and every h_t (the step reads h_{t-1} from here)
        C = x.new_empty(T + 1, B, H)
        Y[0], C[0] = h0, c0
        w = weight_hh.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else Y
        ctx.tile_meta = _meta(spec, H, x.device)
        ctx.where = tg.describe("GatedLSTM", spec, T, B, H)
        ctx.plan, ctx.meta = tg.launch_forward(
            forward_split_kernel, forward_kernel, (G, A, w, starts8, Y, C), T, B, H,
            ctx.tile_meta, ctx.where,
            HAS_STARTS=starts is not None,
        )  # fmt: skip
        ctx.has_starts = starts is not None
        ctx.has_detach = detach is not None
        ctx.save_for_backward(x, weight_ih, w, starts8, detach, A, Y, C)
        return Y[1:], Y[-1].clone(), C[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dhT: Tensor | None, dcT: Tensor | None):
        x, weight_ih, w, starts8, detach, A, Y, C = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = torch.zeros_like(Y[1:]) if dY is None else dY.contiguous()
        split = None
        if ctx.plan is not None:
            split = _split_backward(ctx, A, w, C, starts8, detach, dY, dhT, dcT)
        if split is not None:
            dA, dh0, dc0 = split
            h_prev = tg.previous_states(Y[:-1], starts8, ctx.has_starts)
            d_weight_hh = dA.view(T * B, -1).t().mm(h_prev.reshape(T * B, H))
            dx, d_weight_ih, d_bias = tg.input_side_grads(ctx.needs_input_grad, dA, x, weight_ih)
            return dx, d_weight_ih, d_bias, d_weight_hh, dh0, dc0, None, None, None
        dH = x.new_empty(T + 1, B, H)  # gradient into h_t from the steps after t
        dC = x.new_empty(T + 1, B, H)
        dH[T] = 0.0 if dhT is None else dhT
        dC[T] = 0.0 if dcT is None else dcT
        dA = torch.empty_like(A)  # the kernel writes every gate block
        detach8 = detach if detach is not None else starts8
        tg.launch(
            backward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
            A, w, C, starts8, detach8, dY, dH, dC, dA, T, B, H,
            HAS_STARTS=ctx.has_starts,
            HAS_DETACH=ctx.has_detach,
            **ctx.tile_meta,
        )  # fmt: skip
        # weight and input gradients: one matmul each over all steps
        h_prev = tg.previous_states(Y[:-1], starts8, ctx.has_starts)
        d_weight_hh = dA.view(T * B, -1).t().mm(h_prev.reshape(T * B, H))
        dx, d_weight_ih, d_bias = tg.input_side_grads(ctx.needs_input_grad, dA, x, weight_ih)
        return dx, d_weight_ih, d_bias, d_weight_hh, dH[0], dC[0], None, None, None


def _split_backward(
    ctx: Any,
    A: Tensor,
    w: Tensor,
    C: Tensor,
    starts8: Tensor,
    detach: Tensor | None,
    dY: Tensor,
    dhT: Tensor | None,
    dcT: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """The unit-split reverse pass: ``dA [T, B, NG*H]`` and the gradients into ``h_0`` and
    ``c_0`` (``[B, H]``); ``None`` where the GPU cannot fit its programs
    (:func:`~cores.triton_gates.launch_split`)."""
    T, B, H = dY.shape
    plan = ctx.plan
    dh = dY.new_zeros(B, H) if dhT is None else dhT.contiguous()
    dc = dY.new_zeros(B, H) if dcT is None else dcT.clone()  # the kernel writes dc_0 here
    dA = torch.empty_like(A)
    detach8 = detach if detach is not None else starts8
    flags = plan.flags(dY.device)
    if not tg.launch_split(
        backward_split_kernel, plan,
        A, w, C, starts8, detach8, dY, dh, dc, dA, flags, T, B, H,
        flags=flags, where=ctx.where,
        HAS_STARTS=ctx.has_starts,
        HAS_DETACH=ctx.has_detach,
        **ctx.meta,
    ):  # fmt: skip
        return None
    # step 0's gradient into h_0 needs every part's dA_0: one matmul after the launch
    dh0 = dA[0].mm(w)
    if ctx.has_starts:
        dh0 = dh0.masked_fill(starts8[0].bool()[:, None], 0.0)
    if ctx.has_detach:
        dh0 = torch.where(detach[0] != 0, 0.0, dh0)
    return dA, dh0, dc


def triton_lstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, detach: list[bool]
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Run :class:`~cores.gated.GatedLSTM` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :param detach: per step, whether h-detach blocks the gradient into ``h_{t-1}``.
    :return: ``y [T, B, H]`` and the final ``(h, c)``.
    """
    tg.check_device(x)
    spec = dict(
        n_gates=len(core.gate_names),
        activation=core.activation,
        tied=core.tied,
        refine=core.refine,
        power=core.power,
    )
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    mask = None
    if any(detach):
        mask = torch.tensor(detach, dtype=torch.int8, device=x.device)
    h, c = state
    ys = []
    for steps in tg.time_chunks(x.shape[0], x.shape[1] * core.weight_ih.shape[0]):
        y, h, c = _TritonLSTM.apply(
            x[steps].contiguous(),
            core.weight_ih,
            core.bias,
            core.weight_hh,
            h,
            c,
            None if starts is None else starts[steps],
            None if mask is None else mask[steps],
            spec,
        )
        ys.append(y)
    return (ys[0] if len(ys) == 1 else torch.cat(ys)), (h, c)
