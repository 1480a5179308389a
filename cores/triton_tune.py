"""Pick the tile sizes of a fused recurrent kernel by timing them on the GPU that runs it.

The fused kernels (:mod:`cores.triton_lstm`, :mod:`cores.triton_gru`, :mod:`cores.triton_slstm`)
run the whole time loop in one program per batch tile, so their speed hangs on how a step's
recurrent product is cut into ``BLOCK_N x BLOCK_K`` chunks and on the warps per program; the
best cut differs between GPUs and hidden sizes. Like ``triton.autotune``, the first launch of a
kernel for a new shape times a few candidate cuts and keeps the fastest for that shape. Unlike
it, every candidate runs on a copy of the arguments' initial values, so kernels that update
buffers in place (``h_0`` in, ``h_t`` out) stay exact whichever candidate ran last.

Tuning is opt-in (``MEMCORES_TRITON_TUNE=1``) until its gain is measured on a GPU; it runs
only on CUDA and never under Triton's interpreter (whose results do not depend on tiles).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor

from cores.base import pow2_at_least

ENV_VAR = "MEMCORES_TRITON_TUNE"
CANDIDATES: tuple[dict[str, int], ...] = (
    dict(BLOCK_N=32, BLOCK_K=32, num_warps=4),
    dict(BLOCK_N=64, BLOCK_K=64, num_warps=4),
    dict(BLOCK_N=64, BLOCK_K=64, num_warps=8),
    dict(BLOCK_N=64, BLOCK_K=128, num_warps=8),
    dict(BLOCK_N=128, BLOCK_K=128, num_warps=8),
)
"""Tile cuts tried per shape; each is clamped to the hidden size (``H``) before it runs."""

_BEST: dict[Hashable, dict[str, int]] = {}


def enabled(args: Sequence[Any]) -> bool:
    """Whether a launch with ``args`` is tuned: switched on, CUDA tensors, no interpreter."""
    if os.environ.get(ENV_VAR, "0") != "1" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return any(isinstance(a, Tensor) and a.is_cuda for a in args)


def candidates(hidden: int, meta: dict[str, Any]) -> list[dict[str, int]]:
    """The distinct candidate cuts for ``hidden`` units, each at least 16 wide (``tl.dot``'s
    minimum) and at most the next power of two of ``hidden``; the kernel's own default first."""
    cap = max(16, pow2_at_least(hidden))
    default = dict(
        BLOCK_N=meta["BLOCK_N"], BLOCK_K=meta["BLOCK_K"], num_warps=meta.get("num_warps", 4)
    )
    seen: list[dict[str, int]] = []
    for cand in (default, *CANDIDATES):
        cut = dict(
            BLOCK_N=min(cand["BLOCK_N"], cap),
            BLOCK_K=min(cand["BLOCK_K"], cap),
            num_warps=cand["num_warps"],
        )
        if cut not in seen:
            seen.append(cut)
    return seen


def cuda_seconds(run: Callable[[], None]) -> float:
    """Seconds one call of ``run`` takes on the current CUDA stream (after one untimed call,
    which compiles the kernel)."""
    run()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000.0


def best_meta(
    kernel: Any,
    grid: tuple[int, ...],
    args: Sequence[Any],
    meta: dict[str, Any],
    hidden: int,
    timer: Callable[[Callable[[], None]], float] = cuda_seconds,
) -> dict[str, Any]:
    """``meta`` with the fastest candidate cut for this kernel and shape, timed once per shape.

    :param kernel: a ``@triton.jit`` function (anything indexable by ``grid`` and callable).
    :param args: the launch's positional arguments; tensors among them are restored to their
        values before every candidate run and after the last.
    :param hidden: the hidden size ``H`` the cuts are clamped to.
    :param timer: seconds of one call (replaced in tests).
    """
    shape = tuple(tuple(a.shape) if isinstance(a, Tensor) else a for a in args)
    cut_keys = ("BLOCK_N", "BLOCK_K", "num_warps")
    frozen = tuple(sorted((k, v) for k, v in meta.items() if k not in cut_keys))
    key = (getattr(kernel, "__name__", repr(kernel)), grid, shape, frozen)
    if key not in _BEST:
        saved = [(a, a.clone()) for a in args if isinstance(a, Tensor)]

        def restore() -> None:
            # through ``.data``, as a kernel writes: a copy_ on the tensor itself would bump its
            # autograd version, and a backward that tunes would then invalidate the views its
            # forward returned (a GRU's ``Y[1:]``: "its base ... has been modified inplace")
            for live, copy in saved:
                live.data.copy_(copy)

        times: list[tuple[float, int]] = []
        cuts = candidates(hidden, meta)
        for i, cut in enumerate(cuts):

            def run(cut: dict[str, int] = cut) -> None:
                restore()
                kernel[grid](*args, **{**meta, **cut})

            try:
                times.append((timer(run), i))
            except Exception:  # a cut this GPU cannot compile (e.g. out of shared memory)
                continue
        restore()
        _BEST[key] = cuts[min(times)[1]] if times else cuts[0]
    return {**meta, **_BEST[key]}


def chosen() -> dict[Hashable, dict[str, int]]:
    """The cut chosen for every kernel and shape tuned so far (for benchmarks' reports)."""
    return dict(_BEST)
