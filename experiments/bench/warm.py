"""Compile the kernels a ``bench gpu`` part is about to time, side by side in worker processes.

A fused core's first call compiles its Triton kernels, about a second each on one CPU core.
The cores part times some fifty cells and the probe 54 variants, most with kernels of their
own: compiled one after another, as each cell's first call would, the compiles take most of
those parts' budgets. Triton keeps what it compiles in its on-disk cache
(``TRITON_CACHE_DIR``, by default ``~/.triton/cache``), keyed by the kernel's source, its
compile options and how the launch specialises it (pointer alignment, integers divisible by
16). A worker process that runs the same forward+backward, at the same shape and under the
same options, compiles exactly the kernels the part will launch, and the part then loads
them from the cache. The workers (:func:`worker_count`) share the GPU; nothing is timed while
they run, and they are ended at the deadline, whatever is left.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Launch:
    """One forward+backward whose kernels are compiled ahead: core ``name`` on a ``shape``
    ``(T, B, D, H)`` input, under the :class:`cores.triton_gates.SplitOptions` changes
    ``options`` (``(field, value)`` pairs), with the unit split off where ``unsplit``."""

    name: str
    shape: tuple[int, int, int, int]
    options: tuple[tuple[str, Any], ...] = ()
    unsplit: bool = False

    def label(self) -> str:
        extra = [f"{k}={v}" for k, v in self.options] + (["unsplit"] if self.unsplit else [])
        return " ".join([self.name, str(self.shape), *extra])


def worker_count(launches: int) -> int:
    """Worker processes for ``launches``: one per CPU core but one (the parent's), at most
    one per launch."""
    return max(1, min(launches, (os.cpu_count() or 2) - 1))


def _start_worker() -> None:
    """A worker compiles on one core: its own threads would only compete with the others'."""
    torch.set_num_threads(1)


def compile_launch(launch: Launch, device: str) -> str | None:
    """Run ``launch`` once on ``device`` (in a worker); ``None``, or the error's first line."""
    from agents.device import sync
    from cores import triton_gates
    from experiments.bench.gpu import core_runner, split_off

    try:
        with split_off(launch.unsplit), triton_gates.split_options(**dict(launch.options)):
            dev = torch.device(device)
            core_runner(launch.name, *launch.shape, dev)()
            sync(dev)
    except Exception as err:  # reported, and the part meets it again in its own cell
        return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}"
    return None


def warm(
    launches: Sequence[Launch],
    device: torch.device,
    seconds: float,
    processes: int | None = None,
) -> dict[str, Any]:
    """Run every launch in ``processes`` worker processes (:func:`worker_count` by default;
    spawned, as CUDA does not survive a fork) for at most ``seconds``; then end them.

    :returns: ``launches`` (how many), ``done`` (returned by the deadline), ``failed`` (label:
        error of each that raised), ``processes`` and ``seconds`` (wall time, the workers'
        start included).
    """
    start = time.perf_counter()
    unique = list(dict.fromkeys(launches))
    processes = processes or worker_count(len(unique))
    failed: dict[str, str] = {}
    done = 0
    pool = None
    try:
        if unique:
            pool = multiprocessing.get_context("spawn").Pool(processes, initializer=_start_worker)
            results = [(x, pool.apply_async(compile_launch, (x, str(device)))) for x in unique]
            for launch, result in results:
                left = seconds - (time.perf_counter() - start)
                try:  # past the deadline, only what has returned already
                    error = result.get(timeout=max(left, 0.0))
                except multiprocessing.TimeoutError:
                    continue  # the part compiles it itself
                done += 1
                if error is not None:
                    failed[launch.label()] = error
    except Exception as err:  # no workers: the parts compile as they go, as without them
        failed["workers"] = f"{type(err).__name__}: {err}"
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return dict(
        launches=len(unique),
        done=done,
        failed=failed,
        processes=processes if unique else 0,
        seconds=time.perf_counter() - start,
    )


WARM_SHARE = 0.5
"""The most of a part's time left that compiling its kernels ahead may take."""


def warm_part(
    launches: Sequence[Launch], device: torch.device, time_left: float
) -> dict[str, Any] | None:
    """A ``bench gpu`` part's kernels compiled ahead (:func:`warm`) in at most
    :data:`WARM_SHARE` of its ``time_left`` seconds, on CUDA; elsewhere nothing (Triton's
    interpreter compiles nothing)."""
    if device.type != "cuda":
        return None
    return warm(launches, device, WARM_SHARE * time_left)


def markdown(warmed: dict[str, Any] | None) -> list[str]:
    """One line on a part's compiles ahead (none without them)."""
    if not warmed or not warmed["launches"]:
        return []
    line = (
        f"Kernels compiled ahead in {warmed['processes']} worker processes: "
        f"{warmed['done']} of {warmed['launches']} forward+backward launches in "
        f"{warmed['seconds']:.1f} s"
    )
    if warmed["failed"]:
        line += "; failed: " + "; ".join(f"{k} ({v})" for k, v in warmed["failed"].items())
    return ["", line + "."]
