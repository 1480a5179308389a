"""Triton pieces shared by the fused recurrent kernels (:mod:`cores.triton_lstm`,
:mod:`cores.triton_gru`): the gate functions of :mod:`cores.gates` as ``@triton.jit``
functions selected by a compile-time ``ACT`` (0 sigmoid, 1 fast, 2 fast2, 3 softsign), the
per-gate-block recurrent products, and the one launcher every kernel starts through.

Importing this module imports ``triton``; :mod:`cores` imports it only when a Triton path runs.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

from cores.base import pow2_at_least, reset_where

BLOCK_B = 16
"""Batch rows per program (``tl.dot`` needs at least 16 rows on a GPU)."""


def block_meta(hidden: int) -> dict[str, int]:
    """Tile sizes: ``BLOCK_B`` rows per program, units in chunks of ``BLOCK_N`` (outputs) and
    ``BLOCK_K`` (inputs of the recurrent product), so a step's working set stays a few small
    tiles whatever ``H`` is (``tl.dot`` needs 16 or more in every dimension); and the warps
    per program that hold that working set in registers: with 32-wide chunks 4 warps spill
    52-596 bytes per thread, 8 warps none (``ptxas -v`` on the sm_90 code, any ``H``:
    ``python tests/triton_compile.py 128 --spills``); 16-wide chunks fit in 4."""
    chunk = 16 if hidden <= 16 else 32
    return dict(BLOCK_B=BLOCK_B, BLOCK_N=chunk, BLOCK_K=chunk, num_warps=4 if chunk == 16 else 8)


@triton.jit
def sigmoid(z):
    """sigma(z), from exp(-|z|) so it never overflows."""
    e = tl.exp(-tl.abs(z))
    return tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def tanh(z):
    """tanh z, from exp(-2|z|) so it never overflows (and keeps small |z| exact)."""
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z >= 0, t, -t)


@triton.jit
def sinh(z):
    """sinh z."""
    return 0.5 * (tl.exp(z) - tl.exp(-z))


@triton.jit
def cosh(z):
    """cosh z."""
    return 0.5 * (tl.exp(z) + tl.exp(-z))


@triton.jit
def gate(a, ACT: tl.constexpr, CLAMP: tl.constexpr):
    """phi(a) of cores.gates: 0 sigmoid, 1 fast, 2 fast2, 3 softsign."""
    if ACT == 0:
        f = sigmoid(a)
    elif ACT == 1:
        f = sigmoid(sinh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP)))
    elif ACT == 2:
        s = sinh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP))
        f = sigmoid(sinh(tl.minimum(tl.maximum(s, -CLAMP), CLAMP)))
    else:
        f = 0.5 + 0.5 * a / (2.0 + tl.abs(a))
    return f


@triton.jit
def gate_slope(a, f, ACT: tl.constexpr, CLAMP: tl.constexpr):
    """phi'(a) given f = phi(a), as cores.gates.gate_derivative (zero beyond the clamp)."""
    if ACT == 0:
        d = f * (1.0 - f)
    elif ACT == 1:
        inside = tl.abs(a) <= CLAMP
        d = tl.where(inside, f * (1.0 - f) * cosh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP)), 0.0)
    elif ACT == 2:
        ac = tl.minimum(tl.maximum(a, -CLAMP), CLAMP)
        s = sinh(ac)
        inside = (tl.abs(a) <= CLAMP) & (tl.abs(s) <= CLAMP)
        sc = tl.minimum(tl.maximum(s, -CLAMP), CLAMP)
        d = tl.where(inside, f * (1.0 - f) * cosh(sc) * cosh(ac), 0.0)
    else:
        q = 1.0 / (2.0 + tl.abs(a))
        d = q * q
    return d


@triton.jit
def power_decay(x, POWER: tl.constexpr):
    """Ohno & Kumagai's decay term ``|x|^r x`` (``r = POWER > 0``, as
    :func:`cores.power_rnn.power_decay`) and its slope ``(r + 1) |x|^r``."""
    if POWER == 2.0:  # the presets' r: exactly the reference's x * x * x
        x2 = x * x
        decay = x2 * x
        slope = 3.0 * x2
    else:
        ax = tl.abs(x)
        nonzero = ax > 0.0
        # |x|^r through log2 and exp2, the log kept finite at 0, where both terms are 0
        x_r = tl.where(nonzero, tl.exp2(POWER * tl.log2(tl.where(nonzero, ax, 1.0))), 0.0)
        decay = x * x_r
        slope = (POWER + 1.0) * x_r
    return decay, slope


@triton.jit
def clip_unit(x):
    """``x`` clipped to ``[-1, 1]``, the power-law cells' range."""
    return tl.minimum(tl.maximum(x, -1.0), 1.0)


@triton.jit
def inside_unit(x):
    """Where :func:`clip_unit` passes gradient (``torch.clamp``'s rule: bounds included)."""
    return (x >= -1.0) & (x <= 1.0)


@triton.jit
def starts_at(starts_ptr, t, B, rows, row_ok, BLOCK_B: tl.constexpr, HAS_STARTS: tl.constexpr):
    """Which of the tile's rows start an episode at step ``t`` (``starts_ptr`` at ``[T, B]``
    int8): ``[BLOCK_B]`` bool, all false without ``HAS_STARTS``. Those rows read the zero
    initial state, as :func:`cores.base.reset_where` does in the reference loop."""
    start = tl.zeros([BLOCK_B], dtype=tl.int1)
    if HAS_STARTS:
        start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
    return start


@triton.jit
def rec(h, w_ptr, g, cols_k, k_ok, cols_n, n_ok, H, PREC: tl.constexpr):
    """``h [BB, BK] @ W_g[cols_n, cols_k]^T``: gate block ``g``'s recurrent pre-activation for
    output units ``cols_n`` from input units ``cols_k`` (``W = weight_hh [nH, H]``)."""
    w = tl.load(
        w_ptr + (g * H + cols_n[None, :]) * H + cols_k[:, None],
        mask=k_ok[:, None] & n_ok[None, :],
        other=0.0,
    )
    return tl.dot(h, w, input_precision=PREC)


@triton.jit
def back(da, w_ptr, g, cols_n, n_ok, cols_k, k_ok, H, PREC: tl.constexpr):
    """``da_g [BB, BN] @ W_g[cols_n, cols_k]``: the gradient into ``h_{t-1}[cols_k]`` through
    gate block ``g``'s units ``cols_n``."""
    w = tl.load(
        w_ptr + (g * H + cols_n[:, None]) * H + cols_k[None, :],
        mask=n_ok[:, None] & k_ok[None, :],
        other=0.0,
    )
    return tl.dot(da, w, input_precision=PREC)


@triton.jit
def tile(ptr, rows, row_ok, cols, col_ok, width):
    """The ``[BB, BC]`` tile ``ptr[rows, cols]`` of a row-major matrix ``width`` wide (0
    outside the matrix)."""
    mask = row_ok[:, None] & col_ok[None, :]
    return tl.load(ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)


@triton.jit
def put(ptr, value, rows, row_ok, cols, col_ok, width):
    """Store a ``[BB, BC]`` tile at ``ptr[rows, cols]`` (the inverse of :func:`tile`)."""
    mask = row_ok[:, None] & col_ok[None, :]
    tl.store(ptr + rows[:, None] * width + cols[None, :], value, mask=mask)


MAX_OFFSET = 2**31 - 1
"""The kernels address their buffers with 32-bit offsets (``t * B * G`` and the like), so no
buffer a launch touches may hold more elements than this."""


def time_chunks(steps: int, per_step: int) -> list[slice]:
    """Steps ``0 .. steps-1`` cut into consecutive runs, each short enough that a launch's
    largest buffer, ``(run + 1) * per_step`` elements, stays within :data:`MAX_OFFSET` (one
    run unless the sequence is very long); the wrappers run one launch pair per run, carrying
    the state from one to the next.

    :raises ValueError: a single step's buffers are already too large.
    """
    longest = MAX_OFFSET // per_step - 1
    if longest < 1:
        raise ValueError(
            f"one step's buffers ({per_step} elements) exceed the Triton kernels' 32-bit "
            "offsets; valid instead: impl='loop'"
        )
    return [slice(i, min(i + longest, steps)) for i in range(0, steps, longest)]


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> Any:
    """Launch ``kernel`` on ``grid`` (the one place kernels start: tests count launches here,
    and on a GPU read the compiled kernel it returns, Triton's ``CompiledKernel``; ``None``
    under the interpreter)."""
    return kernel[grid](*args, **meta)


def input_projection(x: Tensor, weight_ih: Tensor, bias: Tensor) -> Tensor:
    """Every step's input side ``x W_ih^T + b`` as one matmul: ``x [T, B, D]`` -> ``[T, B, G]``
    (the kernels add the recurrent side)."""
    T, B, _ = x.shape
    return torch.addmm(bias, x.reshape(T * B, -1), weight_ih.t()).view(T, B, -1)


def previous_states(h_before: Tensor, starts8: Tensor, has_starts: bool) -> Tensor:
    """``h_{t-1} [T, B, H]`` as step ``t`` read it: the stored state before each step, with the
    rows that restart at ``t`` reset (for the weight gradient ``dA^T h_{t-1}``)."""
    if not has_starts:
        return h_before
    (h_prev,) = reset_where((h_before,), starts8.bool())
    return h_prev


def input_side_grads(
    needs: tuple[bool, ...], dA: Tensor, x: Tensor, weight_ih: Tensor
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of ``x``, ``weight_ih`` and the bias from the pre-activation gradients
    ``dA [T, B, G]``, one matmul each over all steps (``needs``: autograd's
    ``needs_input_grad`` for those three, in that order)."""
    dA_flat = dA.view(-1, dA.shape[-1])
    dx = dA_flat.mm(weight_ih).view_as(x) if needs[0] else None
    d_weight_ih = dA_flat.t().mm(x.reshape(dA_flat.shape[0], -1)) if needs[1] else None
    d_bias = dA_flat.sum(0) if needs[2] else None
    return dx, d_weight_ih, d_bias


def check_device(x: Tensor) -> None:
    """Refuse CPU tensors unless Triton's interpreter is on (it compiles for GPUs only)."""
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"impl='triton' needs CUDA tensors (got {x.device.type}) or TRITON_INTERPRET=1 set "
            "before triton is imported; valid impls on a CPU: fused, loop"
        )


SPLIT_ENV = "MEMCORES_TRITON_SPLIT"
"""``0`` turns the unit-split kernels off (every step then runs in one program per batch tile)."""
SPLIT_UNITS = 16
"""Units per program in the unit-split kernels (``tl.dot``'s minimum width; the only width a GPU
record has timed, ``results/bench_gpu/h100_probe``)."""
SPLIT_MAX_HIDDEN = 256
"""Above this hidden size a program's weight slice no longer fits its registers."""
SPIN_LIMIT = 1 << 24
"""Rounds a part of a unit-split launch waits at a barrier for the tile's other parts before it
gives up and reports the launch failed (:func:`sync_parts`): at the microsecond or so an atomic
round trip takes on a GPU, seconds, where a legitimate wait lasts one step's work. A bound, not
a timer: Triton has no clock its interpreter runs too."""

SPLIT_LOOP_STAGES = tl.constexpr(1)
"""The unit-split kernels' time loops run in one stage (``tl.range(T, num_stages=...)``):
Triton's software pipeliner would otherwise issue a later step's read of the values the
parts exchange (as an asynchronous copy) before this step's wait, where that read would find
those values unwritten."""


def recurrent_precision(device: torch.device) -> str:
    """``tl.dot``'s input precision for the recurrent products on ``device``: on CUDA what
    PyTorch's own cuDNN RNNs use, ``torch.backends.cudnn.rnn.fp32_precision`` (``"tf32"`` by
    default, as for ``nn.LSTM``; set ``"ieee"`` for full float32 products), so a preset on these
    kernels and one routed to cuDNN (``lstm``, ``gru``) compute at the same precision. PyTorch
    before 2.9 has ``torch.backends.cudnn.allow_tf32`` instead. Elsewhere (Triton's
    interpreter) ``"ieee"``: TF32 is a mode of NVIDIA tensor cores."""
    if device.type != "cuda":
        return "ieee"
    rnn = getattr(torch.backends.cudnn, "rnn", None)
    value = getattr(rnn, "fp32_precision", None)
    if value is None:  # PyTorch before 2.9 (reading allow_tf32 later raises on a mix of APIs)
        return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"
    for parent in (torch.backends.cudnn, torch.backends):  # "none" inherits from its parent
        if value != "none":
            break
        value = getattr(parent, "fp32_precision", "none")
    return "tf32" if value == "tf32" else "ieee"


def split_warps(block_h: int) -> int:
    """Warps per unit-split program for ``block_h`` input units: the fewest that hold a
    program's weight slices without register spills.

    The forward multiplies by ``NG x block_h x 16`` weights every step. By ``ptxas -v`` on the
    sm_90 code (``python tests/triton_compile.py 128 --spills``, as launched at T=256, B=64),
    at 128 units 4 warps spill 324-548 bytes per thread in the LSTM and GRU forwards
    (420-540 with Triton 3.6; ``slstm`` 3.9-6.4 KB), 8 warps none; at 256 units 4 warps spill
    4.8-12.7 KB, 8 warps none at TF32 products and 744-812 bytes at full float32 (Triton
    3.9). Up to 64 units 4 warps hold them.
    """
    return 4 if block_h <= 64 else 8


@dataclass(frozen=True)
class SplitPlan:
    """How a unit-split launch cuts the work: ``tiles`` batch tiles of ``block_b`` rows, each
    run by ``parts`` programs of ``block_n`` units that meet at a barrier after every step;
    ``precision``: the recurrent products' (:func:`recurrent_precision`)."""

    block_b: int
    block_n: int
    block_h: int
    tiles: int
    parts: int
    precision: str = "ieee"

    @property
    def grid(self) -> tuple[int, int]:
        return (self.tiles, self.parts)

    def meta(self) -> dict[str, Any]:
        """The kernel's compile-time parameters (tile sizes, precision, wait bound) and warps."""
        return dict(
            BLOCK_B=self.block_b,
            BLOCK_N=self.block_n,
            BLOCK_H=self.block_h,
            PARTS=pow2_at_least(self.parts),
            PREC=self.precision,
            SPIN_LIMIT=SPIN_LIMIT,
            num_warps=split_warps(self.block_h),
        )

    def flags(self, device: torch.device) -> Tensor:
        """Zeroed step counters of the barrier, one per program, then the launch's error word
        (the step at which a part gave up waiting, :func:`sync_parts`)."""
        return torch.zeros(self.tiles * self.parts + 1, dtype=torch.int32, device=device)


def split_width(hidden: int) -> int:
    """``BLOCK_H`` of a unit-split launch: the units of ``h_{t-1}`` every part reads, a power
    of two (``tl.arange``), at least ``tl.dot``'s 16."""
    return max(16, pow2_at_least(hidden))


def split_plan(steps: int, batch: int, hidden: int, device: torch.device) -> SplitPlan | None:
    """The cut of a unit-split launch, or ``None`` where one program per batch tile must do.

    Splitting a step's units over ``parts`` programs runs them side by side (each keeps its
    slice of ``weight_hh`` on chip), but the programs of a tile meet after every step, so all
    of them must be resident at once (:func:`resident_cut`). Triton's interpreter runs
    programs one after the other, so there a tile has one part, except for a single step,
    which needs no barrier (the tests run the GPU's cut under the interpreter with a launch's
    programs in threads, ``tests/side_by_side.py``).
    """
    if os.environ.get(SPLIT_ENV, "1") == "0" or hidden > SPLIT_MAX_HIDDEN:
        return None
    block_h = split_width(hidden)
    if (str(device), block_h) in _UNFIT:
        return None
    precision = recurrent_precision(device)
    if os.environ.get("TRITON_INTERPRET") == "1":
        block_n = SPLIT_UNITS if steps == 1 else block_h
        parts = cdiv(hidden, block_n)
        return SplitPlan(BLOCK_B, block_n, block_h, cdiv(batch, BLOCK_B), parts, precision)
    if device.type != "cuda":
        return None
    slots = torch.cuda.get_device_properties(device).multi_processor_count
    plan = resident_cut(batch, hidden, slots, precision)
    if plan is None:
        _warn_once(
            ("grid", batch, hidden),
            f"memcores: batch {batch} at hidden {hidden} needs more unit-split programs than "
            f"the {slots} multiprocessors of {device} hold at once; the fused Triton kernels "
            "run one program per batch tile there (slower)",
        )
    return plan


def resident_cut(batch: int, hidden: int, slots: int, precision: str) -> SplitPlan | None:
    """The unit-split cut whose programs are all resident at once on a GPU of ``slots``
    multiprocessors: parts of :data:`SPLIT_UNITS` units, batch tiles as narrow as fit (16, 32
    or 64 rows), or ``None``.

    Why every part is resident: the grid holds at most one program per multiprocessor, and
    one program always fits a multiprocessor, since a launch Triton accepts has one program's
    shared memory within the per-block limit (it raises ``OutOfResources`` before launching
    otherwise, :func:`launch_split`), which is at most the multiprocessor's, and its registers
    within 255 per thread at 8 warps or fewer (65,280 of the 65,536 a multiprocessor has). So
    with the GPU to itself the launch's programs all start at once. Where other work holds
    multiprocessors (another stream, another process under MPS) a part may start late, or,
    if the others of its tile hold the last free ones, never: :func:`sync_parts` bounds every
    wait, so that ends the launch with an error (:func:`launch_split`), not a hang.
    """
    parts = cdiv(hidden, SPLIT_UNITS)
    block_h = split_width(hidden)
    for block_b in (16, 32, 64):
        tiles = cdiv(batch, block_b)
        if tiles * parts <= slots:
            return SplitPlan(block_b, SPLIT_UNITS, block_h, tiles, parts, precision)
    return None


_UNFIT: set[tuple[str, int]] = set()
"""``(device, BLOCK_H)`` where a unit-split kernel needed more shared memory than the GPU gives
a block: :func:`split_plan` keeps to one program per batch tile there."""
_WARNED: set[Any] = set()


def _warn_once(key: Any, message: str) -> None:
    """A one-line ``RuntimeWarning``, once per ``key`` in a process."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def launch_split(
    kernel: Any, plan: SplitPlan, *args: Any, flags: Tensor, where: str, **meta: Any
) -> bool:
    """Launch a unit-split kernel on ``plan``'s grid (``flags``: its barrier's counters and
    error word, among ``args``); ``False``, having run nothing, where the GPU cannot give a
    program the shared memory it needs (Triton raises ``OutOfResources`` before the launch: up
    to 80 KB at 256 units, more than a T4's 64 KB). The caller then runs its
    one-program-per-tile kernel, as every later call at that width does (warned once).

    :param where: the core and shape, for the error a part that never arrived raises.
    :raises RuntimeError: a part waited past :data:`SPIN_LIMIT` for another part of its tile
        (one that never started: the GPU's multiprocessors held by other work). Checked after
        the launch, except while a CUDA graph is being captured (reading the word would wait
        for the GPU, which a capture forbids).
    """
    try:
        launch(kernel, plan.grid, *args, **meta)
    except OutOfResources as err:
        device = flags.device
        _UNFIT.add((str(device), plan.block_h))
        _warn_once(
            ("shared", str(device), plan.block_h),
            f"memcores: {err}; the fused Triton kernels at hidden width {plan.block_h} run "
            f"with one program per batch tile on {device} (slower; MEMCORES_TRITON_SPLIT=0 "
            "does so without this warning)",
        )
        return False
    if not (flags.is_cuda and torch.cuda.is_current_stream_capturing()):
        step = int(flags[-1])
        if step:
            raise RuntimeError(
                f"memcores: {kernel.__name__} of {where}: a part of a batch tile never reached "
                f"step {step} within {meta['SPIN_LIMIT']} rounds of waiting (the GPU's "
                "multiprocessors held by other work?); MEMCORES_TRITON_SPLIT=0 runs one "
                "program per batch tile, which never waits"
            )
    return True


def launch_forward(
    split_kernel: Any, tile_kernel: Any, buffers: tuple[Tensor, ...], T: int, B: int, H: int,
    tile_meta: dict[str, Any], where: str, **flags: Any,
) -> tuple[SplitPlan | None, dict[str, Any]]:  # fmt: skip
    """Run a family's forward over ``buffers`` (its kernels' arguments before ``T, B, H``; the
    split kernel also takes the barrier's counters after them): the unit-split kernel where
    :func:`split_plan` gives a cut and the GPU fits it (:func:`launch_split`), else one
    program per batch tile with ``tile_meta``. ``where``: the core and shape, for errors.
    ``flags``: the compile-time switches both take.

    :return: the plan taken (``None``: one program per tile) and the compile-time parameters
        it ran with, which its backward launches with too.
    """
    device = buffers[0].device
    plan = split_plan(T, B, H, device)
    if plan is not None:
        meta = {**tile_meta, **plan.meta()}
        del meta["BLOCK_K"]
        counters = plan.flags(device)
        args = (*buffers, counters, T, B, H)
        if launch_split(split_kernel, plan, *args, flags=counters, where=where, **flags, **meta):
            return plan, meta
    launch(tile_kernel, (cdiv(B, BLOCK_B),), *buffers, T, B, H, **flags, **tile_meta)
    return None, tile_meta


@triton.jit
def sync_parts(
    flags_ptr, error_ptr, part, n_parts, step, ok, PARTS: tl.constexpr, SPIN_LIMIT: tl.constexpr
):  # fmt: skip
    """A barrier over the ``n_parts <= PARTS`` programs of one batch tile: mark this part done
    with ``step`` and wait until every part is, reading all their counters at once with
    ``acq_rel`` atomics, so the parts' stores before the mark are visible to the loads after
    the wait (which bypass L1). The counters only grow and each is written by its own part.

    Bounded: after ``SPIN_LIMIT`` rounds the part stops waiting, writes ``step`` to the
    launch's error word at ``error_ptr`` (the launcher raises on it) and returns ``False``;
    given ``ok`` false (an earlier wait gave up) it does not wait at all, so a launch with a
    part that never started ends after one bound. The wait carries scalars only (Triton 3.6
    fails to compile a while loop carrying a tensor here)."""
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
def shared_tile(ptr, rows, row_ok, cols, col_ok, width):
    """:func:`tile` of a matrix other programs wrote in this launch (read from L2, not L1)."""
    mask = row_ok[:, None] & col_ok[None, :]
    return tl.load(
        ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg"
    )


@triton.jit
def weight_slice(w_ptr, g, cols_k, k_ok, cols_n, n_ok, H):
    """``W_g[cols_n, cols_k]^T`` as a ``[BK, BN]`` tile (``W = weight_hh [nH, H]``): gate block
    ``g``'s recurrent weights from input units ``cols_k`` into output units ``cols_n``."""
    return tl.load(
        w_ptr + (g * H + cols_n[None, :]) * H + cols_k[:, None],
        mask=k_ok[:, None] & n_ok[None, :],
        other=0.0,
    )


@triton.jit
def back_slice(w_ptr, g, cols_all, all_ok, cols_own, own_ok, H):
    """``W_g[cols_all, cols_own]`` as a ``[BH, BN]`` tile: what gate block ``g``'s gradients of
    every unit send into the gradient of ``h_{t-1}[cols_own]``."""
    return tl.load(
        w_ptr + (g * H + cols_all[:, None]) * H + cols_own[None, :],
        mask=all_ok[:, None] & own_ok[None, :],
        other=0.0,
    )


def describe(family: str, options: dict[str, Any], T: int, B: int, H: int) -> str:
    """The core and shape of a launch, as its errors name them."""
    listed = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"{family}({listed}) at T={T}, B={B}, H={H}"


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)
