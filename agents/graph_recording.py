"""Record a call on static buffers once and replay it: what the update and acting graphs share.

:class:`RecordedCall` runs ``fn`` (which reads and writes only tensors at fixed addresses)
eagerly for a few warm-up calls, then records it once and replays it on every later call. A
recording that raises (an operation CUDA graphs refuse, such as a read of the device from the
host) warns once and leaves every later call eager, so a training run goes on.

The recorder is a parameter: :class:`CudaRecorder` records CUDA graphs (warm-up on a side
stream, as PyTorch's whole-network capture asks); :class:`EagerRecorder` "replays" by running
``fn`` again under the recorded settings, on any device, which is how the tests check the
bookkeeping around a recording on a CPU.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from cores.base import MemoryCore
from cores.graphed import collector_paused

Out = TypeVar("Out")
Settings = Callable[[], contextlib.AbstractContextManager[Any]]
"""A context the call is recorded (and, by :class:`EagerRecorder`, replayed) under."""

WARMUP_CALLS = 3
"""Eager calls before a recording (PyTorch's examples use 3): they build lazily created state
(an optimiser's moments), compile and autotune kernels."""


class Recorder(Protocol):
    """How a call is recorded and replayed."""

    def warmup(self) -> contextlib.AbstractContextManager[Any]:
        """The context of the eager calls before recording."""
        ...

    def record(self, fn: Callable[[], Out], settings: Settings) -> Callable[[], Out]:
        """Record ``fn`` under ``settings()``; return its replay, which returns ``fn``'s
        outputs (for a CUDA graph, the same static tensors at every replay)."""
        ...


class CudaRecorder:
    """CUDA graphs: warm-up on a side stream, one ``torch.cuda.CUDAGraph`` per recording."""

    def __init__(self) -> None:
        self.side = torch.cuda.Stream()

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        """Eager calls on a side stream, ordered after and before the current one."""
        self.side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(self.side):
                yield
        finally:
            torch.cuda.current_stream().wait_stream(self.side)

    def record(self, fn: Callable[[], Out], settings: Settings) -> Callable[[], Out]:
        """One graph of ``fn``, with Python's cyclic collector paused (a dead graph destroyed
        mid-capture breaks it: :func:`cores.graphed.collector_paused`). ``thread_local``: an
        overlapped rollout's collector thread may launch its own kernels meanwhile."""
        graph = torch.cuda.CUDAGraph()
        with settings(), collector_paused():
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn()

        def replay() -> Out:
            graph.replay()
            return out

        return replay


class EagerRecorder:
    """Replays by running ``fn`` again under the recorded settings: the same static buffers
    and settings as a graph, on any device (the tests' stand-in for a GPU)."""

    def warmup(self) -> contextlib.AbstractContextManager[Any]:
        """Nothing to set up."""
        return contextlib.nullcontext()

    def record(self, fn: Callable[[], Out], settings: Settings) -> Callable[[], Out]:
        """``fn``, run under ``settings()`` at every replay."""

        def replay() -> Out:
            with settings():
                return fn()

        return replay


class RecordedCall(Generic[Out]):
    """``fn()``: eager for ``warmup_calls`` calls, then recorded once and replayed.

    :param fn: reads and writes only tensors whose addresses stay fixed between calls.
    :param recorder: :class:`CudaRecorder` or :class:`EagerRecorder`.
    :param what: how the warning of a failed recording names the call.
    :param settings: a context to record under (e.g. an optimiser's capturable settings).
    :param warmup_calls: at least one, so lazily created state exists before a recording
        (state created inside one would be created anew at every replay).
    """

    def __init__(
        self,
        fn: Callable[[], Out],
        recorder: Recorder,
        what: str,
        settings: Settings = contextlib.nullcontext,
        warmup_calls: int = WARMUP_CALLS,
    ) -> None:
        if warmup_calls < 1:
            raise ValueError(f"warmup_calls must be >= 1, got {warmup_calls}")
        self.fn, self.recorder, self.what, self.settings = fn, recorder, what, settings
        self.warmups_left = warmup_calls
        self.replay: Callable[[], Out] | None = None
        self.failure: str | None = None
        """Why the recording failed, after which every call is eager (None: it did not)."""
        self.replays = 0
        """Calls replayed so far (the recorded one included)."""

    @property
    def records_next(self) -> bool:
        """Whether the next call records (its warm-up done, nothing recorded or failed yet)."""
        return self.failure is None and self.replay is None and self.warmups_left == 0

    def __call__(self) -> Out:
        if self.failure is not None:
            return self.fn()
        if self.replay is None and self.warmups_left > 0:
            self.warmups_left -= 1
            with self.recorder.warmup():
                return self.fn()
        if self.replay is None:
            try:
                self.replay = self.recorder.record(self.fn, self.settings)
            except RuntimeError as err:  # training goes on, eagerly, rather than stop
                self.failure = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
                warnings.warn(
                    f"{self.what}: recording failed ({self.failure}); it runs eagerly from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return self.fn()
        self.replays += 1
        return self.replay()


def keyed_by_state(policy: nn.Module) -> str | None:
    """The class name of the first core in ``policy`` whose calls depend on a value of its
    state read on the host (:meth:`cores.base.MemoryCore.graph_key`: ``mem_lstm``'s memory
    width), which one recording would fix; ``None`` where there is none."""
    for module in policy.modules():
        if not isinstance(module, MemoryCore):
            continue
        state = module.initial_state(1, next(module.parameters()).device)
        if module.graph_key(state) is not None:
            return type(module).__name__
    return None
