"""The host side of the fused recurrent kernels (:mod:`cores.triton_kernels`).

:func:`triton_lstm`, :func:`triton_gru` and :func:`triton_slstm` run a sequence through
:class:`_Fused`: one matmul for all steps' input side, one forward launch, and in the backward
one launch and a few matmuls. A launch takes the unit-split kernels where :func:`split_plan`
gives a cut whose parts are all resident at once, else the tile kernels (cuDNN's route is
picked before, by the cores: :mod:`cores.cudnn`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import triton
from torch import Tensor
from torch.autograd.function import once_differentiable
from triton.runtime.errors import OutOfResources

from memcores.cores import triton_kernels as tk
from memcores.cores.base import pow2_at_least, reset_where
from memcores.cores.gates import ACTIVATIONS, FAST_CLAMP
from memcores.cores.triton_cells import GRU, LSTM, SLSTM

BLOCK_B = 16  # batch rows per program (tl.dot needs at least 16 rows on a GPU)


def block_meta(hidden: int) -> dict[str, int]:
    """Tile sizes (``BLOCK_N`` output and ``BLOCK_K`` input units per chunk, at least
    ``tl.dot``'s 16) and warps: with 32-wide chunks 4 warps spill 52-596 bytes per thread, 8
    none (``ptxas -v`` on sm_90: ``python tests/triton_compile.py 128 --spills``)."""
    chunk = 16 if hidden <= 16 else 32
    return dict(BLOCK_B=BLOCK_B, BLOCK_N=chunk, BLOCK_K=chunk, num_warps=4 if chunk == 16 else 8)


MAX_OFFSET = 2**31 - 1  # the kernels address their buffers with 32-bit offsets


def time_chunks(steps: int, per_step: int) -> list[slice]:
    """Steps ``0 .. steps-1`` cut into runs whose largest buffer, ``(run + 1) * per_step``
    elements, stays within :data:`MAX_OFFSET` (one launch pair per run, the state carried);
    :class:`ValueError` where one step's buffers are already too large."""
    longest = MAX_OFFSET // per_step - 1
    if longest < 1:
        raise ValueError(
            f"one step's buffers ({per_step} elements) exceed the Triton kernels' 32-bit "
            "offsets; valid instead: impl='loop'"
        )
    return [slice(i, min(i + longest, steps)) for i in range(0, steps, longest)]


def launch(kernel: Any, grid: tuple[int, ...], *args: Any, **meta: Any) -> Any:
    """Launch ``kernel`` on ``grid`` (the one place kernels start: tests count launches here)."""
    return kernel[grid](*args, **meta)


SPLIT_ENV = "MEMCORES_TRITON_SPLIT"  # "0": the tile kernels only
SPLIT_UNITS = 16  # units per split program (the only width a GPU record timed: h100_probe)
SPLIT_MAX_HIDDEN = 256  # above it a program's weight slice no longer fits its registers
SPIN_LIMIT = 1 << 24
"""Rounds a split part waits at a barrier before the launch fails
(:func:`~cores.triton_kernels.sync_parts`): seconds at a GPU's atomic round trip, where a
legitimate wait lasts one step. A bound, not a timer: the interpreter has no clock."""


def recurrent_precision(device: torch.device) -> str:
    """``tl.dot``'s precision for the recurrent products: on CUDA PyTorch's own for cuDNN RNNs
    (``torch.backends.cudnn.rnn.fp32_precision``, ``allow_tf32`` before 2.9), so these kernels
    and cuDNN's presets compute alike; elsewhere (the interpreter) ``"ieee"``."""
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
    """Warps per unit-split program for ``block_h`` input units: the fewest that hold its
    ``NG x block_h x 16`` weights without spills (``ptxas -v`` on sm_90: at 128 units 4 warps
    spill 324-548 bytes per thread, ``slstm`` 3.9-6.4 KB, 8 none; up to 64 units 4 hold them).
    """
    return 4 if block_h <= 64 else 8


@dataclass(frozen=True)
class SplitPlan:
    """A unit-split cut: ``tiles`` batch tiles of ``block_b`` rows, each run by ``parts``
    programs of ``block_n`` units that meet at a barrier after every step."""

    block_b: int
    block_n: int
    block_h: int
    tiles: int
    parts: int
    precision: str = "ieee"

    def meta(self) -> dict[str, Any]:
        return dict(
            BLOCK_B=self.block_b, BLOCK_N=self.block_n, BLOCK_H=self.block_h,
            PARTS=pow2_at_least(self.parts), PREC=self.precision, SPIN_LIMIT=SPIN_LIMIT,
            num_warps=split_warps(self.block_h),
        )  # fmt: skip

    def flags(self, device: torch.device) -> Tensor:
        """Zeroed barrier counters, one per program, then the error word (the step at which a
        part gave up waiting)."""
        return torch.zeros(self.tiles * self.parts + 1, dtype=torch.int32, device=device)


def split_plan(steps: int, batch: int, hidden: int, device: torch.device) -> SplitPlan | None:
    """The cut of a unit-split launch, or ``None`` for the tile kernels. A tile's parts meet
    after every step, so all must be resident at once (:func:`resident_cut`). The interpreter
    runs programs one after another, so there a tile has one part except for a single step
    (``tests/side_by_side.py`` runs the GPU's cut with the programs in threads).
    """
    if os.environ.get(SPLIT_ENV, "1") == "0" or hidden > SPLIT_MAX_HIDDEN:
        return None
    block_h = max(16, pow2_at_least(hidden))  # the units of h_{t-1} every part reads
    if (str(device), block_h) in _UNFIT:
        return None
    precision = recurrent_precision(device)
    if os.environ.get("TRITON_INTERPRET") == "1":
        block_n = SPLIT_UNITS if steps == 1 else block_h
        parts = triton.cdiv(hidden, block_n)
        return SplitPlan(BLOCK_B, block_n, block_h, triton.cdiv(batch, BLOCK_B), parts, precision)
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
    """The unit-split cut for a GPU of ``slots`` multiprocessors (parts of
    :data:`SPLIT_UNITS` units, tiles of 16, 32 or 64 rows), or ``None``.

    Why every part is resident: the grid holds at most one program per multiprocessor, and
    one program always fits one (Triton refuses shared memory beyond the per-block limit with
    ``OutOfResources``; 255 registers per thread at <= 8 warps is 65,280 of 65,536). Where
    other work holds multiprocessors (MPS) a part may never start: every wait is bounded, so
    that ends the launch with an error (:func:`launch_split`), not a hang.
    """
    parts = triton.cdiv(hidden, SPLIT_UNITS)
    block_h = max(16, pow2_at_least(hidden))
    for block_b in (16, 32, 64):
        tiles = triton.cdiv(batch, block_b)
        if tiles * parts <= slots:
            return SplitPlan(block_b, SPLIT_UNITS, block_h, tiles, parts, precision)
    return None


_UNFIT: set[tuple[str, int]] = set()  # (device, BLOCK_H) short of a block's shared memory
_WARNED: set[Any] = set()


def _warn_once(key: Any, message: str) -> None:
    """A one-line ``RuntimeWarning``, once per ``key`` in a process."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def launch_split(
    kernel: Any, plan: SplitPlan, *args: Any, flags: Tensor, where: str, **meta: Any
) -> bool:
    """Launch a unit-split kernel on ``plan``'s grid (``flags`` among ``args``); ``False``,
    having run nothing, where a program's shared memory does not fit (up to 80 KB at 256
    units, more than a T4's 64 KB): the caller then runs the tile kernel (warned once).

    :raises RuntimeError: a part waited past :data:`SPIN_LIMIT` for another of its tile,
        named by ``where`` (checked after the launch, except in a CUDA graph capture).
    """
    try:
        launch(kernel, (plan.tiles, plan.parts), *args, **meta)
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


Family = tuple[str, dict[str, Any]]
"""A core's cell: its name and settings as its errors name them, and its compile-time
parameters (``FAMILY``, gate functions, ``NG`` gate blocks, ``NA`` saved slots, ``NS`` states)."""


def family(
    name: str, kind: int, n_gates: int, n_states: int, device: torch.device, **gates: Any
) -> Family:
    """A :data:`Family` (``kind``: a ``FAMILY`` value; ``gates``: those of ``ACT, TIED,
    REFINE, R, POWER, EPS`` the cell uses)."""
    meta = {**dict(ACT=0, TIED=False, REFINE=False, R=0, POWER=0.0, EPS=0.0), **gates}
    meta.update(
        FAMILY=kind,
        NG=n_gates,
        NA=n_gates + (kind == GRU.value),  # the GRU keeps U_n h + b_hn too
        NS=n_states,
        CLAMP=FAST_CLAMP,
        PREC=recurrent_precision(device),  # PyTorch's switch for its own RNNs
    )
    listed = ", ".join(f"{k}={v}" for k, v in meta.items() if k not in ("NA", "NS", "PREC"))
    return f"{name}({listed})", meta


class _Fused(torch.autograd.Function):
    """``y [T, B, H]`` and the final state ``[NS, B, H]`` of a family's cell over ``x [T, B, D]``
    from the state ``s0 [NS, B, H]``, the kernels forward and backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        bias_hn: Tensor | None,
        s0: Tensor,
        starts: Tensor | None,
        detach: Tensor | None,
        cell: Family,
    ) -> tuple[Tensor, Tensor]:
        T, B, D = x.shape
        H = weight_hh.shape[1]
        label, c = cell
        # every step's input side x W_ih^T + b as one matmul; the kernels add h U^T
        G = torch.addmm(bias, x.reshape(T * B, D), weight_ih.t()).view(T, B, -1)
        A = x.new_empty(T, B, c["NA"] * H)
        S = x.new_empty(c["NS"], T + 1, B, H)  # the state before the first step and after each
        S[:, 0] = s0
        w = weight_hh.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else S
        bhn = bias_hn.contiguous() if bias_hn is not None else w  # read by the GRU only
        tile_meta = dict(c, **block_meta(H), HAS_STARTS=starts is not None)
        ctx.where = f"{label} at T={T}, B={B}, H={H}"  # for the error of a part that never came
        buffers = (G, A, w, bhn, starts8, S)
        ctx.plan, ctx.meta, ctx.tile_meta = None, tile_meta, tile_meta
        plan = split_plan(T, B, H, x.device)
        if plan is not None:
            meta = {k: v for k, v in tile_meta.items() if k != "BLOCK_K"}
            meta.update(plan.meta())
            flags = plan.flags(x.device)
            args = (*buffers, flags, T, B, H)
            if launch_split(
                tk.forward_split_kernel, plan, *args, flags=flags, where=ctx.where, **meta
            ):
                ctx.plan, ctx.meta = plan, meta
        if ctx.plan is None:
            launch(tk.forward_kernel, (triton.cdiv(B, BLOCK_B),), *buffers, T, B, H, **tile_meta)
        ctx.has_starts, ctx.has_detach = starts is not None, detach is not None
        ctx.gru = bias_hn is not None
        ctx.save_for_backward(x, weight_ih, w, starts8, detach, A, S)
        return S[0, 1:], S[:, -1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dS: Tensor | None):
        x, weight_ih, w, starts8, detach, A, S = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        NG = w.shape[0] // H
        dY = x.new_zeros(T, B, H) if dY is None else dY.contiguous()
        detach8 = detach if detach is not None else starts8
        dA = torch.empty_like(A)
        split = ctx.plan is not None
        if split:  # dS0: the initial state's gradient, h's without step 0's products (below)
            dS0 = dY.new_zeros(S.shape[0], B, H) if dS is None else dS.contiguous().clone()
            flags = ctx.plan.flags(dY.device)
            args = (A, w, S, starts8, detach8, dY, dS0, dA, flags, T, B, H)
            split = launch_split(
                tk.backward_split_kernel, ctx.plan, *args, flags=flags, where=ctx.where,
                HAS_DETACH=ctx.has_detach, **ctx.meta,
            )  # fmt: skip
        if not split:  # one program per batch tile (or a GPU the split does not fit)
            dSall = torch.empty_like(S)  # the gradient into each state from the steps after it
            dSall[:, T] = 0.0 if dS is None else dS
            args = (A, w, S, starts8, detach8, dY, dSall, dA, T, B, H)
            grid = (triton.cdiv(B, BLOCK_B),)
            launch(tk.backward_kernel, grid, *args, HAS_DETACH=ctx.has_detach, **ctx.tile_meta)
            dS0 = dSall[:, 0]
        # the recurrent side's gradient: dA with the GRU's n block replaced by U_n h's
        dA_flat = dA.view(T * B, -1)
        dA_rec = dA_flat
        if ctx.gru:
            dA_rec = torch.cat([dA_flat[:, : (NG - 1) * H], dA_flat[:, -H:]], 1)
        if split:  # step 0's products need every part's dA_0: one matmul
            dh0 = dS0[0] + dA_rec[:B].mm(w)
            if ctx.has_starts:
                dh0 = dh0.masked_fill(starts8[0].bool()[:, None], 0.0)
            if ctx.has_detach:
                dh0 = torch.where(detach[0] != 0, dS0[0], dh0)
            dS0[0] = dh0
        h_prev = S[0, :-1]  # h_{t-1} as step t read it (restarting rows reset)
        if ctx.has_starts:
            (h_prev,) = reset_where((h_prev,), starts8.bool())
        d_weight_hh = dA_rec.t().mm(h_prev.reshape(T * B, H))
        dA_in = dA_flat[:, : NG * H] if ctx.gru else dA_flat
        d_bias_hn = dA_flat[:, NG * H :].sum(0) if ctx.gru else None
        needs = ctx.needs_input_grad
        dx = dA_in.mm(weight_ih).view_as(x) if needs[0] else None
        d_weight_ih = dA_in.t().mm(x.reshape(T * B, -1)) if needs[1] else None
        d_bias = dA_in.sum(0) if needs[2] else None
        return dx, d_weight_ih, d_bias, d_weight_hh, d_bias_hn, dS0, None, None, None


def _run(
    cell: Family, x: Tensor, weights: tuple[Tensor, ...], state: tuple[Tensor, ...],
    starts: Tensor | None, detach: list[bool] | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    """``x [T, B, D]`` through :class:`_Fused` with ``weights`` (``weight_ih, bias,
    weight_hh, bias_hn or None``), a launch pair per run of :func:`time_chunks`."""
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"impl='triton' needs CUDA tensors (got {x.device.type}) or TRITON_INTERPRET=1 set "
            "before triton is imported; valid impls on a CPU: fused, loop"
        )
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    use_mask = detach is not None and any(detach)
    mask = torch.tensor(detach, dtype=torch.int8, device=x.device) if use_mask else None
    c = cell[1]
    final, ys = torch.stack(state), []
    # the slots [T, B, NA*H] or the states [NS, T+1, B, H]: the largest buffer a launch addresses
    per_step = x.shape[1] * weights[2].shape[1] * max(c["NA"], c["NS"])
    for steps in time_chunks(x.shape[0], per_step):
        y, final = _Fused.apply(
            x[steps].contiguous(), *weights, final, None if starts is None else starts[steps],
            None if mask is None else mask[steps], cell,
        )  # fmt: skip
        ys.append(y)
    return (ys[0] if len(ys) == 1 else torch.cat(ys)), tuple(final.unbind(0))


def triton_lstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, detach: list[bool]
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """:class:`~cores.gated.GatedLSTM` over ``x [T, B, D]`` (``starts [T, B]`` bool or None;
    ``detach``: per step, whether h-detach blocks ``h_{t-1}``'s gradient): ``y``, ``(h, c)``."""
    cell = family(
        "GatedLSTM", LSTM.value, len(core.gate_names), 2, x.device,
        ACT=ACTIVATIONS.index(core.activation), TIED=core.tied, REFINE=core.refine,
        R=2 if core.tied else 3, POWER=core.power,
    )  # fmt: skip
    weights = (core.weight_ih, core.bias, core.weight_hh, None)
    return _run(cell, x, weights, state, starts, detach)


def triton_gru(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """:class:`~cores.gru.GatedGRU` over ``x [T, B, D]``: ``y [T, B, H]`` and ``(h,)``."""
    cell = family(
        "GatedGRU", GRU.value, len(core.gate_names), 1, x.device,
        ACT=ACTIVATIONS.index(core.activation), REFINE=core.refine, POWER=core.power,
    )  # fmt: skip
    weights = (core.weight_ih, core.bias, core.weight_hh, core.bias_hn)
    return _run(cell, x, weights, state, starts)


def triton_slstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, eps: float
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """:class:`~cores.xlstm.SLSTM` over ``x [T, B, D]`` (``eps``: the normaliser's floor):
    ``y [T, B, H]`` and ``(h, c, n, m)``."""
    cell = family("SLSTM", SLSTM.value, 4, 4, x.device, EPS=eps)
    # the block-diagonal [4, heads, d, d] as one [4H, H] (autograd keeps it to the blocks)
    dense = torch.cat([torch.block_diag(*r).t() for r in core.recurrent.unbind(0)], 0)
    weights = (core.input.weight, core.input.bias, dense, None)
    return _run(cell, x, weights, state, starts)
