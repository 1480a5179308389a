"""The fused recurrent kernels: the whole time loop in one launch each way, for every family
(``FAMILY``, :mod:`cores.triton_cells`, and its gate functions compile-time parameters).
Two cuts, a forward and a backward kernel each:

- **tile** (:func:`forward_kernel`, :func:`backward_kernel`): one program per ``BLOCK_B``
  batch rows runs every unit of a step, in chunks of ``BLOCK_N`` units and ``BLOCK_K`` inputs
  of the recurrent product (``h_{t-1} U_g^T`` per gate block, by ``tl.dot``).
- **unit split** (:func:`forward_split_kernel`, :func:`backward_split_kernel`): program
  ``(tile, part)`` owns ``BLOCK_B`` rows and ``BLOCK_N`` units, keeps its slice of every
  gate block's weights on chip and its state in registers, reads every unit of ``h_{t-1}``
  and meets its tile's other parts after each step (:func:`sync_parts`, a bounded wait).

The forward stores each step's gate pre-activations (slots) and states; the backward
recomputes the gates from them, writes ``dA_t`` and carries ``dh_{t-1} = dA_t U`` back (the
weight and input gradients are matmuls after it, :mod:`cores.triton_engine`). Episode starts
zero the state inside the loop and stop the gradient into it; h-detach (``HAS_DETACH``) stops
the gradient into ``h_{t-1}`` at the steps set.

Buffers: ``G [T, B, NG*H]`` input side, ``A [T, B, NA*H]`` the saved slots (``NA = NG``, the
GRU one more), ``W [NG*H, H]`` ``weight_hh``, ``S [NS, T+1, B, H]`` the states (``h`` first)
before the first step and after each.
"""

from __future__ import annotations

import triton
import triton.language as tl

from memcores.cores.triton_cells import GRU, backward_cell, forward_cell

SPLIT_LOOP_STAGES = tl.constexpr(1)
"""The unit-split time loops run in one stage: Triton's pipeliner would otherwise issue a later
step's read of the exchanged values before this step's wait, and read them unwritten."""


@triton.jit
def tile(ptr, rows, row_ok, cols, col_ok, width):
    """The ``[BB, BC]`` tile ``ptr[rows, cols]`` of a row-major matrix ``width`` wide (0
    outside the matrix)."""
    mask = row_ok[:, None] & col_ok[None, :]
    return tl.load(ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)


@triton.jit
def shared_tile(ptr, rows, row_ok, cols, col_ok, width):
    """:func:`tile` of a matrix other programs wrote in this launch (read from L2, not L1)."""
    mask = row_ok[:, None] & col_ok[None, :]
    return tl.load(
        ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg"
    )


@triton.jit
def put(ptr, value, rows, row_ok, cols, col_ok, width):
    """Store a ``[BB, BC]`` tile at ``ptr[rows, cols]`` (the inverse of :func:`tile`)."""
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(ptr + rows[:, None] * width + cols[None, :], value, mask=mask)


@triton.jit
def weight_slice(w_ptr, g, cols_k, k_ok, cols_n, n_ok, H):
    """``W_g[cols_n, cols_k]^T`` as a ``[BK, BN]`` tile (``W = weight_hh [NG*H, H]``): gate
    block ``g``'s recurrent weights from input units ``cols_k`` into output units ``cols_n``."""
    return tl.load(
        w_ptr + (g * H + cols_n[None, :]) * H + cols_k[:, None],
        mask=k_ok[:, None] & n_ok[None, :],
        other=0.0,
    )


@triton.jit
def back_slice(w_ptr, g, cols_n, n_ok, cols_k, k_ok, H):
    """``W_g[cols_n, cols_k]`` as a ``[BN, BK]`` tile: what gate block ``g``'s gradients of
    units ``cols_n`` send into the gradient of ``h_{t-1}[cols_k]``."""
    return tl.load(
        w_ptr + (g * H + cols_n[:, None]) * H + cols_k[None, :],
        mask=n_ok[:, None] & k_ok[None, :],
        other=0.0,
    )


@triton.jit
def starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B: tl.constexpr, HAS_STARTS: tl.constexpr):
    """Which of the tile's rows start an episode at step ``t`` (``starts_ptr`` at ``[T, B]``
    int8): ``[BLOCK_B, 1]`` bool, all false without ``HAS_STARTS``."""
    start = tl.zeros([BLOCK_B], dtype=tl.int1)
    if HAS_STARTS:
        start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
    return start[:, None]


@triton.jit
def stopped_at(detach_ptr, t, HAS_DETACH: tl.constexpr):
    """Whether h-detach stops the gradient into ``h_{t-1}`` at step ``t`` (``[1, 1]`` bool)."""
    stop = tl.zeros([1, 1], dtype=tl.int1)
    if HAS_DETACH:
        stop = tl.load(detach_ptr + t + tl.zeros([1, 1], dtype=tl.int32)) != 0
    return stop


@triton.jit
def load_slots(ptr, rows, row_ok, cols, col_ok, H, N: tl.constexpr):
    """The first ``N`` of five ``H``-wide blocks of one step (``ptr`` at ``[B, N*H]``), each
    ``[BLOCK_B, BLOCK_N]``; the others are stand-ins (block 0) that nothing reads."""
    p0 = tile(ptr, rows, row_ok, cols, col_ok, N * H)
    p1 = tile(ptr + H, rows, row_ok, cols, col_ok, N * H)
    p2 = tile(ptr + 2 * H, rows, row_ok, cols, col_ok, N * H)
    p3 = p0
    p4 = p0
    if N > 3:
        p3 = tile(ptr + 3 * H, rows, row_ok, cols, col_ok, N * H)
    if N > 4:
        p4 = tile(ptr + 4 * H, rows, row_ok, cols, col_ok, N * H)
    return p0, p1, p2, p3, p4


@triton.jit
def put_slots(ptr, p0, p1, p2, p3, p4, rows, row_ok, cols, col_ok, H, N: tl.constexpr):
    """Store the first ``N`` of five blocks (the inverse of :func:`load_slots`)."""
    put(ptr, p0, rows, row_ok, cols, col_ok, N * H)
    put(ptr + H, p1, rows, row_ok, cols, col_ok, N * H)
    put(ptr + 2 * H, p2, rows, row_ok, cols, col_ok, N * H)
    if N > 3:
        put(ptr + 3 * H, p3, rows, row_ok, cols, col_ok, N * H)
    if N > 4:
        put(ptr + 4 * H, p4, rows, row_ok, cols, col_ok, N * H)


@triton.jit
def input_side(
    g_t, bhn_ptr, rows, row_ok, cols, col_ok, H, FAMILY: tl.constexpr, NG: tl.constexpr
):  # fmt: skip
    """A step's gate blocks before the recurrent products (``g_t`` at ``[B, NG*H]``) and the
    GRU's input side of ``n`` apart (its last block starts at ``b_hn``: it accumulates
    ``U_n h + b_hn``, which the reset gate scales)."""
    p0, p1, p2, p3, p4 = load_slots(g_t, rows, row_ok, cols, col_ok, H, NG)
    g_n = p0  # a stand-in outside the GRU
    if FAMILY == GRU:
        b_hn = tl.load(bhn_ptr + cols, mask=col_ok, other=0.0)[None, :] + tl.zeros_like(p0)
        if NG == 3:
            g_n, p2 = p2, b_hn
        else:
            g_n, p3 = p3, b_hn
    return p0, p1, p2, p3, p4, g_n


@triton.jit
def load_state(s_ptr, t, SS, B, H, rows, row_ok, cols, col_ok, reset, NS: tl.constexpr):
    """State ``t`` of units ``cols`` (``s_ptr`` at ``[NS, T+1, B, H]``, ``SS`` apart): ``h``
    and ``NS - 1`` more tiles (stand-ins past them), zero where ``reset``."""
    at = s_ptr + t * B * H
    s0 = tl.where(reset, 0.0, tile(at, rows, row_ok, cols, col_ok, H))
    s1 = s0
    s2 = s0
    s3 = s0
    if NS > 1:
        s1 = tl.where(reset, 0.0, tile(at + SS, rows, row_ok, cols, col_ok, H))
    if NS > 2:
        s2 = tl.where(reset, 0.0, tile(at + 2 * SS, rows, row_ok, cols, col_ok, H))
        s3 = tl.where(reset, 0.0, tile(at + 3 * SS, rows, row_ok, cols, col_ok, H))
    return s0, s1, s2, s3


@triton.jit
def put_state(s_ptr, s0, s1, s2, s3, t, SS, B, H, rows, row_ok, cols, col_ok, NS: tl.constexpr):
    """Store state ``t`` (the inverse of :func:`load_state`)."""
    at = s_ptr + t * B * H
    put(at, s0, rows, row_ok, cols, col_ok, H)
    if NS > 1:
        put(at + SS, s1, rows, row_ok, cols, col_ok, H)
    if NS > 2:
        put(at + 2 * SS, s2, rows, row_ok, cols, col_ok, H)
        put(at + 3 * SS, s3, rows, row_ok, cols, col_ok, H)


@triton.jit
def recurrent(h, p0, p1, p2, p3, p4, w0, w1, w2, w3, w4, NG: tl.constexpr, PREC: tl.constexpr):
    """``p_g + h W_g`` for the ``NG`` gate blocks (``w_g``: :func:`weight_slice` tiles)."""
    p0 += tl.dot(h, w0, input_precision=PREC)
    p1 += tl.dot(h, w1, input_precision=PREC)
    p2 += tl.dot(h, w2, input_precision=PREC)
    if NG > 3:
        p3 += tl.dot(h, w3, input_precision=PREC)
    if NG > 4:
        p4 += tl.dot(h, w4, input_precision=PREC)
    return p0, p1, p2, p3, p4


@triton.jit
def recurrent_chunk(
    h, p0, p1, p2, p3, p4, w_ptr, cols_k, k_ok, cols_n, n_ok, H, NG: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """:func:`recurrent` of the tile kernel's chunks, each block's weights read just before
    its product (so one block's weights are live at a time)."""
    p0 += tl.dot(h, weight_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H), input_precision=PREC)
    p1 += tl.dot(h, weight_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H), input_precision=PREC)
    p2 += tl.dot(h, weight_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H), input_precision=PREC)
    if NG > 3:
        w3 = weight_slice(w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H)
        p3 += tl.dot(h, w3, input_precision=PREC)
    if NG > 4:
        w4 = weight_slice(w_ptr, 4, cols_k, k_ok, cols_n, n_ok, H)
        p4 += tl.dot(h, w4, input_precision=PREC)
    return p0, p1, p2, p3, p4


@triton.jit
def weight_slices(w_ptr, cols_k, k_ok, cols_n, n_ok, H, NG: tl.constexpr, BACK: tl.constexpr):
    """Every gate block's :func:`weight_slice` (or, ``BACK``, :func:`back_slice`): five tiles,
    stand-ins past ``NG``."""
    if BACK:
        w0 = back_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
        w1 = back_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
        w2 = back_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    else:
        w0 = weight_slice(w_ptr, 0, cols_k, k_ok, cols_n, n_ok, H)
        w1 = weight_slice(w_ptr, 1, cols_k, k_ok, cols_n, n_ok, H)
        w2 = weight_slice(w_ptr, 2, cols_k, k_ok, cols_n, n_ok, H)
    w3 = w0
    w4 = w0
    if NG > 3:
        if BACK:
            w3 = back_slice(w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H)
        else:
            w3 = weight_slice(w_ptr, 3, cols_k, k_ok, cols_n, n_ok, H)
    if NG > 4:
        if BACK:
            w4 = back_slice(w_ptr, 4, cols_k, k_ok, cols_n, n_ok, H)
        else:
            w4 = weight_slice(w_ptr, 4, cols_k, k_ok, cols_n, n_ok, H)
    return w0, w1, w2, w3, w4


@triton.jit
def sync_parts(
    flags_ptr, error_ptr, part, n_parts, step, ok, PARTS: tl.constexpr, SPIN_LIMIT: tl.constexpr
):  # fmt: skip
    """A barrier over the ``n_parts <= PARTS`` programs of one batch tile: mark this part done
    with ``step`` and wait until every part is, reading all their counters at once with
    ``acq_rel`` atomics, so the parts' stores before the mark are visible to the loads after
    the wait (which bypass L1). The counters only grow and each is written by its own part.

    Bounded: after ``SPIN_LIMIT`` rounds the part stops waiting, writes ``step`` to the
    launch's error word at ``error_ptr`` (the launcher raises on it) and returns false; given
    ``ok`` false (an earlier wait gave up) it does not wait at all, so a launch with a part
    that never started ends after one bound. The wait carries scalars only (Triton 3.6 fails
    to compile a while loop carrying a tensor here)."""
    tl.debug_barrier()  # every thread of this program has stored its step
    tl.atomic_max(flags_ptr + part, step, sem="acq_rel")
    others = tl.arange(0, PARTS)
    mine = others < n_parts
    spins = 0
    while (
        ok
        & (spins < SPIN_LIMIT)
        & (
            tl.min(
                tl.where(mine, tl.atomic_max(flags_ptr + others, 0, mask=mine, sem="acq_rel"), step)
            )
            < step
        )
    ):
        spins += 1
    if spins >= SPIN_LIMIT:
        tl.atomic_max(error_ptr, step)
    tl.debug_barrier()
    return ok & (spins < SPIN_LIMIT)


@triton.jit
def forward_kernel(
    g_ptr, a_ptr, w_ptr, bhn_ptr, starts_ptr, s_ptr, T, B, H,
    FAMILY: tl.constexpr, NG: tl.constexpr, NA: tl.constexpr, NS: tl.constexpr,
    ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr, EPS: tl.constexpr, HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The forward, one program per batch tile: ``S[:, t+1]`` and ``A[t]`` from ``G[t]`` and
    ``S[:, t]``, step after step (``s_ptr`` holds the initial state at index 0)."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    SS = (T + 1) * B * H
    for t in range(T):
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        g_t = g_ptr + t * B * NG * H
        for j0 in range(0, H, BLOCK_N):  # a chunk of units: all its gates, then its state
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            p0, p1, p2, p3, p4, g_n = input_side(
                g_t, bhn_ptr, rows, row_ok, cols_n, n_ok, H, FAMILY, NG
            )
            for k0 in range(0, H, BLOCK_K):  # the recurrent product, chunk by chunk of h_{t-1}
                cols_k = k0 + tl.arange(0, BLOCK_K)
                k_ok = cols_k < H
                h = tl.where(start, 0.0, tile(s_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H))
                p0, p1, p2, p3, p4 = recurrent_chunk(
                    h, p0, p1, p2, p3, p4, w_ptr, cols_k, k_ok, cols_n, n_ok, H, NG, PREC
                )
            s0, s1, s2, s3 = load_state(s_ptr, t, SS, B, H, rows, row_ok, cols_n, n_ok, start, NS)
            p0, p1, p2, p3, p4, s0, s1, s2, s3 = forward_cell(
                p0, p1, p2, p3, p4, g_n, s0, s1, s2, s3, FAMILY, NG, ACT, TIED, REFINE, R,
                CLAMP, POWER, EPS,
            )  # fmt: skip
            put_slots(a_ptr + t * B * NA * H, p0, p1, p2, p3, p4, rows, row_ok, cols_n, n_ok, H, NA)
            put_state(s_ptr, s0, s1, s2, s3, t + 1, SS, B, H, rows, row_ok, cols_n, n_ok, NS)
        tl.debug_barrier()  # h_t is read by every thread of the program at the next step


@triton.jit
def backward_kernel(
    a_ptr, w_ptr, s_ptr, starts_ptr, detach_ptr, dy_ptr, ds_ptr, da_ptr, T, B, H,
    FAMILY: tl.constexpr, NG: tl.constexpr, NA: tl.constexpr, NS: tl.constexpr,
    ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr, EPS: tl.constexpr, HAS_STARTS: tl.constexpr,
    HAS_DETACH: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The reverse-time pass, one program per batch tile: ``dA[t]`` and the gradient into
    state ``t`` (``ds_ptr`` at ``[NS, T+1, B, H]``: in, the final state's at index ``T``; out,
    state ``t``'s at ``t``) from ``dy[t]`` and the gradient into state ``t+1``."""
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    SS = (T + 1) * B * H
    never = tl.zeros([BLOCK_B, 1], dtype=tl.int1)
    for k in range(T):
        t = T - 1 - k
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        da_t = da_ptr + t * B * NA * H
        d_now = ds_ptr + (t + 1) * B * H
        for j0 in range(0, H, BLOCK_N):  # the slots' gradients of a chunk of units
            cols_n = j0 + tl.arange(0, BLOCK_N)
            n_ok = cols_n < H
            dh = tile(d_now, rows, row_ok, cols_n, n_ok, H)
            dh += tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
            _, d1, d2, d3 = load_state(
                ds_ptr, t + 1, SS, B, H, rows, row_ok, cols_n, n_ok, never, NS
            )
            s0, s1, s2, s3 = load_state(s_ptr, t, SS, B, H, rows, row_ok, cols_n, n_ok, start, NS)
            _, c, n, _ = load_state(s_ptr, t + 1, SS, B, H, rows, row_ok, cols_n, n_ok, never, NS)
            a0, a1, a2, a3, a4 = load_slots(
                a_ptr + t * B * NA * H, rows, row_ok, cols_n, n_ok, H, NA
            )
            a0, a1, a2, a3, a4, direct, d1, d2, d3 = backward_cell(
                a0, a1, a2, a3, a4, s0, s1, s2, s3, c, n, dh, d1, d2, d3, FAMILY, NG, ACT,
                TIED, REFINE, R, CLAMP, POWER, EPS,
            )  # fmt: skip
            put_slots(da_t, a0, a1, a2, a3, a4, rows, row_ok, cols_n, n_ok, H, NA)
            d1, d2, d3 = (
                tl.where(start, 0.0, d1),
                tl.where(start, 0.0, d2),
                tl.where(start, 0.0, d3),
            )
            # h_t's gradient is spent: its place keeps h_{t-1}'s direct part for the products
            put_state(ds_ptr, direct, d1, d2, d3, t, SS, B, H, rows, row_ok, cols_n, n_ok, NS)
            put(d_now, direct, rows, row_ok, cols_n, n_ok, H)
        tl.debug_barrier()  # dA_t is read across the program below
        stop = start | stopped_at(detach_ptr, t, HAS_DETACH)
        for k0 in range(0, H, BLOCK_K):  # gradient into h_{t-1}: direct + sum_g dA_g W_g
            cols_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = cols_k < H
            acc = tile(d_now, rows, row_ok, cols_k, k_ok, H)
            for j0 in range(0, H, BLOCK_N):
                cols_n = j0 + tl.arange(0, BLOCK_N)
                n_ok = cols_n < H
                for g in tl.static_range(NG):  # the GRU's n block: the gradient of U_n h
                    da_g = da_t + (g if g < NG - 1 else NA - 1) * H
                    da = tile(da_g, rows, row_ok, cols_n, n_ok, NA * H)
                    w = back_slice(w_ptr, g, cols_n, n_ok, cols_k, k_ok, H)
                    acc += tl.dot(da, w, input_precision=PREC)
            put(ds_ptr + t * B * H, tl.where(stop, 0.0, acc), rows, row_ok, cols_k, k_ok, H)
        tl.debug_barrier()  # the next (earlier) step reads this gradient across the program


@triton.jit
def forward_split_kernel(
    g_ptr, a_ptr, w_ptr, bhn_ptr, starts_ptr, s_ptr,
    flags_ptr,  # [tiles * parts + 1] int32 zeros: the barrier's step counters, the error word
    T, B, H,
    FAMILY: tl.constexpr, NG: tl.constexpr, NA: tl.constexpr, NS: tl.constexpr,
    ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr, EPS: tl.constexpr, HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr, PREC: tl.constexpr,
    PARTS: tl.constexpr,  # a power of two >= the parts of a tile
    SPIN_LIMIT: tl.constexpr,  # rounds a barrier waits before the launch fails
):  # fmt: skip
    """The forward with a step's units split over programs: a part keeps its units' weights
    (shared memory, where the sm_90 code puts ``tl.dot``'s operands) and state (registers),
    reads every unit of ``h_{t-1}`` and meets the tile's other parts after each step."""
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
    SS = (T + 1) * B * H
    never = tl.zeros([BLOCK_B, 1], dtype=tl.int1)
    w0, w1, w2, w3, w4 = weight_slices(w_ptr, cols_k, k_ok, cols_n, n_ok, H, NG, False)
    s0, s1, s2, s3 = load_state(s_ptr, 0, SS, B, H, rows, row_ok, cols_n, n_ok, never, NS)
    ok = part >= 0  # no wait has given up
    for t in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        p0, p1, p2, p3, p4, g_n = input_side(
            g_ptr + t * B * NG * H, bhn_ptr, rows, row_ok, cols_n, n_ok, H, FAMILY, NG
        )
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        h = tl.where(start, 0.0, shared_tile(s_ptr + t * B * H, rows, row_ok, cols_k, k_ok, H))
        p0, p1, p2, p3, p4 = recurrent(h, p0, p1, p2, p3, p4, w0, w1, w2, w3, w4, NG, PREC)
        s0, s1 = tl.where(start, 0.0, s0), tl.where(start, 0.0, s1)
        s2, s3 = tl.where(start, 0.0, s2), tl.where(start, 0.0, s3)
        p0, p1, p2, p3, p4, s0, s1, s2, s3 = forward_cell(
            p0, p1, p2, p3, p4, g_n, s0, s1, s2, s3, FAMILY, NG, ACT, TIED, REFINE, R, CLAMP,
            POWER, EPS,
        )  # fmt: skip
        put_slots(a_ptr + t * B * NA * H, p0, p1, p2, p3, p4, rows, row_ok, cols_n, n_ok, H, NA)
        put_state(s_ptr, s0, s1, s2, s3, t + 1, SS, B, H, rows, row_ok, cols_n, n_ok, NS)
        if t + 1 < T:  # every part's h_t is stored before any part reads it
            ok = sync_parts(flags, error, part, n_parts, t + 1, ok, PARTS, SPIN_LIMIT)


@triton.jit
def backward_split_kernel(
    a_ptr, w_ptr, s_ptr, starts_ptr, detach_ptr, dy_ptr,
    ds_ptr,  # [NS, B, H] in: the final state's gradient; out: state 0's (h_0's direct part)
    da_ptr, flags_ptr, T, B, H,
    FAMILY: tl.constexpr, NG: tl.constexpr, NA: tl.constexpr, NS: tl.constexpr,
    ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr, EPS: tl.constexpr, HAS_STARTS: tl.constexpr,
    HAS_DETACH: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, PREC: tl.constexpr, PARTS: tl.constexpr, SPIN_LIMIT: tl.constexpr,
):  # fmt: skip
    """The reverse-time pass with a step's units split over programs, as
    :func:`forward_split_kernel`: a part writes its units' ``dA_t``, meets the other parts,
    then reads every unit's ``dA_t``, a block before its product, for its units of
    ``dh_{t-1}``. Step 0's products, which need every part's ``dA_0``, are one matmul after
    the launch."""
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
    SS = (T + 1) * B * H
    never = tl.zeros([BLOCK_B, 1], dtype=tl.int1)
    w0, w1, w2, w3, w4 = weight_slices(w_ptr, cols_k, k_ok, cols_n, n_ok, H, NG, True)
    dh, d1, d2, d3 = load_state(ds_ptr, 0, B * H, B, H, rows, row_ok, cols_n, n_ok, never, NS)
    ok = part >= 0  # no wait has given up
    for k in tl.range(T, num_stages=SPLIT_LOOP_STAGES):
        t = T - 1 - k
        start = starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B, HAS_STARTS)
        s0, s1, s2, s3 = load_state(s_ptr, t, SS, B, H, rows, row_ok, cols_n, n_ok, start, NS)
        _, c, n, _ = load_state(s_ptr, t + 1, SS, B, H, rows, row_ok, cols_n, n_ok, never, NS)
        da_t = da_ptr + t * B * NA * H
        a0, a1, a2, a3, a4 = load_slots(a_ptr + t * B * NA * H, rows, row_ok, cols_n, n_ok, H, NA)
        dh += tile(dy_ptr + t * B * H, rows, row_ok, cols_n, n_ok, H)
        a0, a1, a2, a3, a4, direct, d1, d2, d3 = backward_cell(
            a0, a1, a2, a3, a4, s0, s1, s2, s3, c, n, dh, d1, d2, d3, FAMILY, NG, ACT, TIED,
            REFINE, R, CLAMP, POWER, EPS,
        )  # fmt: skip
        put_slots(da_t, a0, a1, a2, a3, a4, rows, row_ok, cols_n, n_ok, H, NA)
        d1, d2, d3 = tl.where(start, 0.0, d1), tl.where(start, 0.0, d2), tl.where(start, 0.0, d3)
        if t > 0:  # gradient into h_{t-1}: direct + every part's dA_t times its weights
            ok = sync_parts(flags, error, part, n_parts, k + 1, ok, PARTS, SPIN_LIMIT)
            acc = direct + tl.dot(
                shared_tile(da_t, rows, row_ok, cols_k, k_ok, NA * H), w0, input_precision=PREC
            )
            acc += tl.dot(
                shared_tile(da_t + H, rows, row_ok, cols_k, k_ok, NA * H), w1, input_precision=PREC
            )
            da_2 = shared_tile(
                da_t + (2 if NG > 3 else NA - 1) * H, rows, row_ok, cols_k, k_ok, NA * H
            )
            acc += tl.dot(da_2, w2, input_precision=PREC)
            if NG > 3:
                da_3 = shared_tile(
                    da_t + (3 if NG > 4 else NA - 1) * H, rows, row_ok, cols_k, k_ok, NA * H
                )
                acc += tl.dot(da_3, w3, input_precision=PREC)
            if NG > 4:
                da_4 = shared_tile(da_t + (NA - 1) * H, rows, row_ok, cols_k, k_ok, NA * H)
                acc += tl.dot(da_4, w4, input_precision=PREC)
            dh = tl.where(start | stopped_at(detach_ptr, t, HAS_DETACH), 0.0, acc)
        else:
            put(ds_ptr, direct, rows, row_ok, cols_n, n_ok, H)
    if NS > 1:
        put(ds_ptr + B * H, d1, rows, row_ok, cols_n, n_ok, H)
    if NS > 2:
        put(ds_ptr + 2 * B * H, d2, rows, row_ok, cols_n, n_ok, H)
        put(ds_ptr + 3 * B * H, d3, rows, row_ok, cols_n, n_ok, H)
