"""Triton pieces shared by the fused recurrent kernels (:mod:`cores.triton_lstm`,
:mod:`cores.triton_gru`): the gate functions of :mod:`cores.gates` as ``@triton.jit``
functions selected by a compile-time ``ACT`` (0 sigmoid, 1 fast, 2 fast2, 3 softsign), the
per-gate-block recurrent products, and the one launcher every kernel starts through.

Importing this module imports ``triton``; :mod:`cores` imports it only when a Triton path runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.runtime.errors import OutOfResources

from cores import triton_tune
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
    under the interpreter).

    Every fused kernel takes ``T, B, H`` as its last three arguments; on a GPU the tile cut
    (``BLOCK_N``, ``BLOCK_K``, warps) is the fastest of :mod:`cores.triton_tune`'s candidates
    for that shape, timed on first use.
    """
    if "BLOCK_K" in meta and triton_tune.enabled(args):
        meta = triton_tune.best_meta(kernel, grid, args, meta, hidden=int(args[-1]))
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
"""Units per program in the unit-split kernels by default (``tl.dot``'s minimum width; the
probe times 32 and 64, :attr:`SplitOptions.units`)."""
SPLIT_MAX_HIDDEN = 256
"""Above this hidden size a program's weight slice no longer fits its registers."""


GATHER_MAX_H = tl.constexpr(128)
"""Up to this many input units (``BLOCK_H``) a prefetching backward reads every part's gate
gradients before its products: their tiles then sit in shared memory at once, 64 KB per
program at 128 units on sm_90, where wider would exceed the 99 KB a block gets on consumer
GPUs (``python tests/triton_compile.py 256``: 128 KB)."""

SPLIT_LOOP_STAGES = tl.constexpr(1)
"""The unit-split kernels' time loops run in one stage (``tl.range(T, num_stages=...)``):
Triton's software pipeliner would otherwise issue a later step's read of the values the
parts exchange (as an asynchronous copy) before this step's wait, as its sm_90 code of the
``data`` barrier's forwards did, where no atomic stands in the loop (``async_copy`` in their
``ttgir``): that read would find those values unwritten."""

BARRIERS = ("scalar", "vector", "release", "data")
DATA_BARRIER = tl.constexpr(BARRIERS.index("data"))
"""``BARRIER``'s value for the ``data`` barrier (:func:`meet_parts`)."""
UNWRITTEN = tl.constexpr(-1)
"""The bits (all ones: a NaN) a ``data`` barrier's buffers hold until a part writes a value
there (:meth:`SplitPlan.unwritten`); :func:`marked` keeps a written value from having them."""
PRECISIONS = ("ieee", "tf32")


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
    3.9); 16 warps would leave a thread at most 128 registers. Up to 64 units 4 warps hold
    them.
    """
    return 4 if block_h <= 64 else 8


@dataclass(frozen=True)
class SplitOptions:
    """How the unit-split kernels run, beyond their tile cut: the variants ``memcores bench gpu
    --parts probe`` times against each other (the barrier default is the measured one; the
    precision is PyTorch's for its RNNs, :func:`recurrent_precision`; the warps follow the
    compiler's register report, :func:`split_warps`).

    :param barrier: how :func:`sync_parts` waits for a tile's other parts: ``scalar`` reads
        their step counters one after the other, ``vector`` reads them all with one atomic
        per thread, ``release`` as ``vector`` with the part's own mark a ``release`` atomic
        and the reads ``acquire`` ones instead of ``acq_rel`` (the mark's round trip then
        overlaps the first read's); ``data`` marks nothing: a part waits until the values it
        is about to read no longer hold :data:`UNWRITTEN` (:func:`meet_parts`).
    :param precision: ``tl.dot``'s input precision: ``ieee`` (full float32, what the reference
        loop computes) or ``tf32`` (tensor cores, a 10-bit mantissa); ``None``:
        :func:`recurrent_precision` of the device, PyTorch's switch for its own RNNs.
    :param num_warps: warps per program; ``None``: :func:`split_warps` of the hidden size.
    :param prefetch: read the next step's own inputs (those no other program writes) before
        waiting at the barrier, so that after it only the values the other parts wrote are
        read from memory; off, they are read at the start of their step.
    :param units: units per program (its ``BLOCK_N``): 16 (:data:`SPLIT_UNITS`), 32 or 64; wider
        parts make fewer programs meet after each step, each with more weights to hold.
    :param cooperative: launch as a cooperative grid: CUDA then starts a launch's programs only
        all at once, or refuses it, where off :func:`resident_cut` sizes the grid to the
        multiprocessors and trusts that nothing else (another stream, another process under
        MPS) holds one, or a tile's parts could wait forever for a part that never starts.
        Ignored under Triton's interpreter.
    """

    barrier: str = "vector"  # 0.47-0.61x the scalar wait's time on an H100, same numbers
    precision: str | None = None
    num_warps: int | None = None
    prefetch: bool = True
    units: int = SPLIT_UNITS
    cooperative: bool = False

    def __post_init__(self) -> None:
        if self.barrier not in BARRIERS:
            raise ValueError(f"barrier must be one of {', '.join(BARRIERS)}, got {self.barrier!r}")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.num_warps not in (None, 1, 2, 4, 8, 16):
            raise ValueError(
                f"num_warps must be 1, 2, 4, 8, 16 or None (by hidden size), got {self.num_warps!r}"
            )
        if self.units not in (16, 32, 64):
            raise ValueError(f"units must be 16, 32 or 64, got {self.units!r}")
        if not isinstance(self.cooperative, bool):
            raise ValueError(f"cooperative must be True or False, got {self.cooperative!r}")


_split_options = SplitOptions()


@contextlib.contextmanager
def split_options(**changes: Any) -> Iterator[SplitOptions]:
    """Run the unit-split kernels launched inside the block with ``changes`` to
    :class:`SplitOptions` (a backward runs with its forward's options)."""
    global _split_options
    previous = _split_options
    _split_options = dataclasses.replace(previous, **changes)
    try:
        yield _split_options
    finally:
        _split_options = previous


@dataclass(frozen=True)
class SplitPlan:
    """How a unit-split launch cuts the work: ``tiles`` batch tiles of ``block_b`` rows, each
    run by ``parts`` programs of ``block_n`` units that meet at a barrier after every step."""

    block_b: int
    block_n: int
    block_h: int
    tiles: int
    parts: int
    options: SplitOptions = SplitOptions()

    @property
    def grid(self) -> tuple[int, int]:
        return (self.tiles, self.parts)

    def meta(self) -> dict[str, Any]:
        """The kernel's compile-time parameters (tile sizes, barrier, precision), its warps and
        whether it launches as a cooperative grid."""
        return dict(
            BLOCK_B=self.block_b,
            BLOCK_N=self.block_n,
            BLOCK_H=self.block_h,
            BARRIER=BARRIERS.index(self.options.barrier),
            PARTS=pow2_at_least(self.parts),
            PREFETCH=self.options.prefetch,
            PREC=self.options.precision,
            num_warps=self.options.num_warps or split_warps(self.block_h),
            launch_cooperative_grid=self.options.cooperative,
        )

    def flags(self, device: torch.device) -> Tensor:
        """Zeroed step counters of the barrier, one per program."""
        return torch.zeros(self.tiles * self.parts, dtype=torch.int32, device=device)

    def unwritten(self, *buffers: Tensor) -> None:
        """With the ``data`` barrier, fill ``buffers`` (those the parts exchange) with
        :data:`UNWRITTEN` before the launch; with the others, nothing."""
        if self.options.barrier == "data":
            for buffer in buffers:
                as_int = torch.int64 if buffer.element_size() == 8 else torch.int32
                buffer.view(as_int).fill_(UNWRITTEN.value)


def _options_on(device: torch.device) -> SplitOptions:
    """The split options in force, their precision resolved for ``device``."""
    if _split_options.precision is not None:
        return _split_options
    return dataclasses.replace(_split_options, precision=recurrent_precision(device))


def split_width(hidden: int) -> int:
    """``BLOCK_H`` of a unit-split launch: the units of ``h_{t-1}`` every part reads, a power
    of two (``tl.arange``), at least ``tl.dot``'s 16."""
    return max(16, pow2_at_least(hidden))


def split_plan(steps: int, batch: int, hidden: int, device: torch.device) -> SplitPlan | None:
    """The cut of a unit-split launch, or ``None`` where one program per batch tile must do.

    Splitting a step's units over ``parts`` programs runs them side by side (each keeps its
    slice of ``weight_hh`` on chip), but the programs of a tile must meet after every
    step, so all of them have to be resident at once: the grid may not exceed the GPU's
    multiprocessors (:func:`resident_cut`). Triton's interpreter runs programs one after the
    other, so there a tile has one part, except for a single step, which needs no barrier (the
    tests run the GPU's cut under the interpreter with a launch's programs in threads,
    ``tests/side_by_side.py``).
    """
    if os.environ.get(SPLIT_ENV, "1") == "0" or hidden > SPLIT_MAX_HIDDEN:
        return None
    block_h = split_width(hidden)
    options = _options_on(device)
    if _unfit_key(device, block_h, options.units) in _UNFIT:
        return None
    if os.environ.get("TRITON_INTERPRET") == "1":
        block_n = options.units if steps == 1 else block_h
        parts = cdiv(hidden, block_n)
        return SplitPlan(BLOCK_B, block_n, block_h, cdiv(batch, BLOCK_B), parts, options)
    if device.type != "cuda":
        return None
    slots = torch.cuda.get_device_properties(device).multi_processor_count
    return resident_cut(batch, hidden, slots, options)


def resident_cut(batch: int, hidden: int, slots: int, options: SplitOptions) -> SplitPlan | None:
    """The unit-split cut whose programs all fit ``slots`` multiprocessors at once: parts of
    ``options.units`` units, batch tiles as narrow as fit (16, 32 or 64 rows), or ``None``."""
    parts = cdiv(hidden, options.units)
    block_h = split_width(hidden)
    for block_b in (16, 32, 64):
        tiles = cdiv(batch, block_b)
        if tiles * parts <= slots:
            return SplitPlan(block_b, options.units, block_h, tiles, parts, options)
    return None


_UNFIT: set[tuple[str, int, int]] = set()
"""``(device, BLOCK_H, units)`` where a unit-split kernel with parts of ``units`` units
(:attr:`SplitOptions.units`) needed more shared memory than the GPU gives a block:
:func:`split_plan` keeps to one program per batch tile there."""


def _unfit_key(device: torch.device, block_h: int, units: int) -> tuple[str, int, int]:
    """The :data:`_UNFIT` entry of a split at ``block_h`` input units in parts of ``units``."""
    return (str(device), block_h, units)


def split_refused(hidden: int, device: torch.device) -> bool:
    """Whether ``device`` refused the unit-split kernels at ``hidden`` units with the parts of
    the split options in force (:data:`_UNFIT`), so that they run one program per batch tile."""
    return _unfit_key(device, split_width(hidden), _options_on(device).units) in _UNFIT


def launch_split(
    kernel: Any, plan: SplitPlan, *args: Any, exchanged: tuple[Tensor, ...], **meta: Any
) -> bool:
    """Launch a unit-split kernel on ``plan``'s grid, ``exchanged`` (the buffers its parts read
    from each other) prepared for the barrier (:meth:`SplitPlan.unwritten`); ``False``, having
    run nothing, where the GPU cannot give a program the shared memory it needs (Triton raises
    ``OutOfResources`` before the launch: up to 80 KB at 256 units, more than a T4's 64 KB).
    The caller then runs its one-program-per-tile kernel, which writes every value of those
    buffers, as every later call at that width does (warned once)."""
    plan.unwritten(*exchanged)
    try:
        launch(kernel, plan.grid, *args, **meta)
    except OutOfResources as err:
        device = next(a.device for a in args if isinstance(a, Tensor))
        units = plan.options.units
        _UNFIT.add(_unfit_key(device, plan.block_h, units))
        warnings.warn(
            f"memcores: {err}; the fused Triton kernels at hidden width {plan.block_h} (parts "
            f"of {units} units) run with one program per batch tile on {device} (slower; "
            "MEMCORES_TRITON_SPLIT=0 does so without this warning)",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def launch_forward(
    split_kernel: Any, tile_kernel: Any, buffers: tuple[Tensor, ...], T: int, B: int, H: int,
    tile_meta: dict[str, Any], exchanged: Tensor, **flags: Any,
) -> tuple[SplitPlan | None, dict[str, Any]]:  # fmt: skip
    """Run a family's forward over ``buffers`` (its kernels' arguments before ``T, B, H``; the
    split kernel also takes the barrier's counters after them): the unit-split kernel where
    :func:`split_plan` gives a cut and the GPU fits it (:func:`launch_split`), else one
    program per batch tile with ``tile_meta``. ``exchanged``: the states ``h_1..h_T`` the
    parts read from each other. ``flags``: the compile-time
    switches both take.

    :return: the plan taken (``None``: one program per tile) and the compile-time parameters
        it ran with, which its backward launches with too.
    """
    device = buffers[0].device
    plan = split_plan(T, B, H, device)
    if plan is not None:
        meta = {**tile_meta, **plan.meta()}
        del meta["BLOCK_K"]
        args = (*buffers, plan.flags(device), T, B, H)
        if launch_split(split_kernel, plan, *args, exchanged=(exchanged,), **flags, **meta):
            return plan, meta
    launch(tile_kernel, (cdiv(B, BLOCK_B),), *buffers, T, B, H, **flags, **tile_meta)
    return None, tile_meta


@triton.jit
def sync_parts(flags_ptr, part, n_parts, step, BARRIER: tl.constexpr, PARTS: tl.constexpr):
    """A barrier over the ``n_parts`` programs of one batch tile: mark this part done with
    ``step`` and wait until every part is. The counters only grow and each is written by its
    own part, so the wait is the same whichever threads run it. ``BARRIER`` indexes
    :data:`BARRIERS`: ``0`` reads the counters one by one, ``1`` all ``n_parts <= PARTS`` at
    once, each with ``acq_rel`` atomics (the mark waits for its own round trip); ``2`` reads
    them at once too, but marks with a ``release`` atomic and waits with ``acquire`` ones, the
    least the pattern needs: the parts' stores before the mark are visible to the loads after
    the wait (which bypass L1), and the wait's first read need not follow the mark's round
    trip. It carries no tensor from one round to the next (Triton 3.6 miscompiles a loop that
    does)."""
    tl.debug_barrier()  # every thread of this program has stored its step
    if BARRIER == 2:
        tl.atomic_max(flags_ptr + part, step, sem="release")
    else:
        tl.atomic_max(flags_ptr + part, step, sem="acq_rel")
    if BARRIER == 0:
        for other in range(n_parts):
            while tl.atomic_max(flags_ptr + other, 0, sem="acq_rel") < step:
                pass
    else:
        others = tl.arange(0, PARTS)
        mine = others < n_parts
        while (
            tl.min(tl.where(mine, _counters(flags_ptr + others, mine, BARRIER == 2), step)) < step
        ):
            pass
    tl.debug_barrier()


@triton.jit
def meet_parts(
    flags_ptr, part, n_parts, step, BARRIER: tl.constexpr, PARTS: tl.constexpr,
    ptr, rows, row_ok, cols, col_ok, width, BLOCKS: tl.constexpr, STRIDE,
    ptr2, width2, BLOCKS2: tl.constexpr,
):  # fmt: skip
    """Wait until the tile's other parts have written what this part reads next (the
    backward's gate gradients; the forward waits in its read, :func:`exchanged_tile`): ``BLOCKS``
    tiles ``[rows, cols]`` of a ``width``-wide matrix at ``ptr``, ``STRIDE`` apart, and
    ``BLOCKS2`` more at ``ptr2`` (``width2`` wide; 0: none). Every barrier but ``data`` is
    :func:`sync_parts` on the step counters. The ``data`` barrier reads those tiles
    themselves until none of their values holds :data:`UNWRITTEN` (the buffers start so, and
    every value is written once): no mark, no fence, and no wait at a counter. A read that
    sees a value sees it whole (an aligned word), and the reads after it find it in L2."""
    if BARRIER == DATA_BARRIER:
        while (
            _unwritten(ptr, rows, row_ok, cols, col_ok, width, BLOCKS, STRIDE)
            + _unwritten(ptr2, rows, row_ok, cols, col_ok, width2, BLOCKS2, STRIDE)
            > 0
        ):
            pass
    else:
        sync_parts(flags_ptr, part, n_parts, step, BARRIER, PARTS)


@triton.jit
def _unwritten(ptr, rows, row_ok, cols, col_ok, width, BLOCKS: tl.constexpr, STRIDE):
    """How many values of ``BLOCKS`` tiles (as :func:`meet_parts`) still hold
    :data:`UNWRITTEN`, read past L1 (``volatile``) as their bits."""
    count = 0
    for g in range(BLOCKS):  # one block's bits live at a time
        bits = _bits(ptr + g * STRIDE, rows, row_ok, cols, col_ok, width)
        count += _count_unwritten(bits)
    return count


@triton.jit
def _count_unwritten(bits):
    """How many of ``bits`` are :data:`UNWRITTEN`."""
    return tl.sum(tl.where(bits == UNWRITTEN, 1, 0))


@triton.jit
def _as_bits(x):
    """``x``'s bits, as integers of its width."""
    if x.dtype == tl.float64:
        bits = x.to(tl.int64, bitcast=True)
    else:
        bits = x.to(tl.int32, bitcast=True)
    return bits


@triton.jit
def _bits(ptr, rows, row_ok, cols, col_ok, width):
    """The bits of the tile ``[rows, cols]`` of a ``width``-wide matrix at ``ptr``, read past
    L1 (``volatile``; 0 outside the masks)."""
    value_ptrs = ptr + rows[:, None] * width + cols[None, :]
    if value_ptrs.dtype.element_ty == tl.float64:
        bit_ptrs = value_ptrs.to(tl.pointer_type(tl.int64), bitcast=True)
    else:
        bit_ptrs = value_ptrs.to(tl.pointer_type(tl.int32), bitcast=True)
    return tl.load(bit_ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0, volatile=True)


@triton.jit
def exchanged_tile(ptr, rows, row_ok, cols, col_ok, width, BARRIER: tl.constexpr, wait):
    """:func:`shared_tile` of values the tile's other parts write in this launch; with the
    ``data`` barrier, where ``wait``, only once they are all written. The read is the wait:
    the tile is read once, and only where some value is still :data:`UNWRITTEN` does the
    program wait for all of them (:func:`_unwritten`) and read it again, so a step whose
    values have arrived costs one round trip. The second read is the wait's own volatile read
    (:func:`_bits`), so it sees at least what the wait saw: nothing in this barrier
    invalidates L1, where a read that may be cached (an asynchronous copy, as Triton's
    pipeliner made of these reads where rows are not 16-byte aligned) could find the lines the
    first read left unwritten."""
    value = shared_tile(ptr, rows, row_ok, cols, col_ok, width)
    if BARRIER == DATA_BARRIER:
        missing = wait & (_count_unwritten(_as_bits(value)) > 0)
        if missing:
            while _unwritten(ptr, rows, row_ok, cols, col_ok, width, 1, 0) > 0:
                pass
            value = _bits(ptr, rows, row_ok, cols, col_ok, width).to(value.dtype, bitcast=True)
    return value


@triton.jit
def exchanged(x, BARRIER: tl.constexpr):
    """``x`` as a part stores a value the other parts read: :func:`marked` with the ``data``
    barrier, else as it is."""
    if BARRIER == DATA_BARRIER:
        x = marked(x)
    return x


@triton.jit
def marked(x):
    """``x``, where a value's bits are :data:`UNWRITTEN`'s (a NaN; negating the GPU's NaN
    gives them) with another NaN's, so that a ``data`` barrier never takes a written value
    for an unwritten one."""
    bits = _as_bits(x)
    return tl.where(bits == UNWRITTEN, bits - 1, bits).to(x.dtype, bitcast=True)


@triton.jit
def _counters(ptrs, mask, ACQUIRE: tl.constexpr):
    """The step counters at ``ptrs`` (where ``mask``), read by atomics: ``acquire`` ones, or
    ``acq_rel``."""
    if ACQUIRE:
        seen = tl.atomic_max(ptrs, 0, mask=mask, sem="acquire")
    else:
        seen = tl.atomic_max(ptrs, 0, mask=mask, sem="acq_rel")
    return seen


@triton.jit
def shared_tile(ptr, rows, row_ok, cols, col_ok, width):
    """:func:`tile` of a matrix other programs wrote in this launch (read from L2, not L1)."""
    mask = row_ok[:, None] & col_ok[None, :]
    return tl.load(
        ptr + rows[:, None] * width + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg"
    )


@triton.jit
def any_tile(ptr, rows, row_ok, cols, col_ok, width, SHARED: tl.constexpr):
    """:func:`shared_tile` with ``SHARED``, else :func:`tile`."""
    if SHARED:
        value = shared_tile(ptr, rows, row_ok, cols, col_ok, width)
    else:
        value = tile(ptr, rows, row_ok, cols, col_ok, width)
    return value


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


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)
