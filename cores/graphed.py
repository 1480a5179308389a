"""CUDA graphs: one way to record a call once and replay it, and the cores that train through it.

At RL shapes a GPU waits on the launches of a step loop, an acting step or a PPO minibatch
step. :class:`RecordedCall` runs a call eagerly for a few warm-up calls, records it once and
replays it after; a recording that raises warns once and leaves every later call eager. The
recorder is a parameter: :class:`CudaRecorder` records CUDA graphs, :class:`EagerRecorder`
replays by running the call again under the recorded settings (the tests' CPU stand-in).

:class:`GraphedCore` wraps a ``graph_safe`` core (no host synchronisation, no data-dependent
shapes in ``forward``): on CUDA with autograd on and T > 1 it keeps one recording per input
shape, dtype, mode and ``graph_key``, elsewhere runs the core as it is. Inside a capture
:func:`cores.base.steps_with_starts` resets at every step, so one graph is right for any later
``starts``. :func:`graph_switch` resolves every CUDA-graph switch.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, autocast_enabled, capturing

Out = TypeVar("Out")
Settings = Callable[[], contextlib.AbstractContextManager[Any]]
"""A context a call is recorded (and, by :class:`EagerRecorder`, replayed) under."""

CUDA_GRAPH_CHOICES = ("auto", "true", "false")  # true insists: refused where it cannot apply

WARMUP_CALLS = 3
"""Eager calls before a recording (as PyTorch's examples): they build an optimiser's moments,
compile and autotune kernels."""

MAX_GRAPHS = 12
"""Recordings kept per wrapped core, each with its own memory (``mem_lstm`` needs one per
memory width: 11 at its default ``max_len``)."""


def cuda_graph_choice(value: bool | str, option: str = "core.cuda_graph") -> str:
    """``value`` (a bool or one of :data:`CUDA_GRAPH_CHOICES`) as one of those strings
    (:class:`ValueError` naming the valid choices for any other value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.lower() in CUDA_GRAPH_CHOICES:
        return value.lower()
    raise ValueError(f"{option} must be one of {', '.join(CUDA_GRAPH_CHOICES)}, got {value!r}")


def graph_switch(value: bool | str, option: str, why_not: str | None) -> bool:
    """On unless ``false`` or ``why_not`` (a reason against, or None); :class:`ValueError`
    for an invalid ``value``, or ``true`` where ``why_not`` is given."""
    choice = cuda_graph_choice(value, option)
    if choice == "true" and why_not is not None:
        raise ValueError(f"{option}=true cannot apply: {why_not}; use auto or false")
    return choice != "false" and why_not is None


def cuda_only(device: torch.device | str) -> str | None:
    """The reason against a CUDA graph on ``device`` (None on CUDA)."""
    kind = torch.device(device).type
    return None if kind == "cuda" else f"the training device is {kind}, not CUDA"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A capture with the cyclic garbage collector paused, after one collection: a dead graph
    in a reference cycle destroyed mid-capture fails that capture ("operation failed due to a
    previous error during capture"; torch >= 2.9 no longer collects first, PR 161037)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class EagerRecorder:
    """Replays by running the call again on the same static buffers and settings, on any
    device (the tests' stand-in for :class:`CudaRecorder`)."""

    device_type: str | None = None  # the device a recording runs on (None: any)

    def warmup(self) -> contextlib.AbstractContextManager[Any]:
        """The context of the eager calls before recording."""
        return contextlib.nullcontext()

    def record(self, fn: Callable[[], Out], settings: Settings) -> Callable[[], Out]:
        """``fn`` recorded under ``settings()``, as a replay returning its outputs."""

        def replay() -> Out:
            with settings():
                return fn()

        return replay

    def record_autograd(
        self, module: nn.Module, samples: tuple[Tensor, ...], settings: Settings
    ) -> Callable[..., tuple[Tensor, ...]]:
        """``module``'s forward and backward recorded for inputs like ``samples``."""

        def replay(*args: Tensor) -> tuple[Tensor, ...]:
            with settings():
                return module(*args)

        return replay


class CudaRecorder(EagerRecorder):
    """CUDA graphs: eager warm-up on a side stream, one graph per recording."""

    device_type: str | None = "cuda"
    _side: torch.cuda.Stream | None = None  # made at first use; not copied with the module

    def __getstate__(self) -> dict[str, Any]:
        return {}

    @contextlib.contextmanager
    def warmup(self) -> Iterator[None]:
        """Eager calls on a side stream (as PyTorch's whole-network capture asks)."""
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(self._side):
                yield
        finally:
            torch.cuda.current_stream().wait_stream(self._side)

    def record(self, fn: Callable[[], Out], settings: Settings) -> Callable[[], Out]:
        """One graph of ``fn``. ``thread_local``: an overlapped rollout's collector thread
        may launch its own kernels meanwhile."""
        graph = torch.cuda.CUDAGraph()
        with settings(), collector_paused():
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                out = fn()

        def replay() -> Out:
            graph.replay()
            return out

        return replay

    def record_autograd(
        self, module: nn.Module, samples: tuple[Tensor, ...], settings: Settings
    ) -> Callable[..., tuple[Tensor, ...]]:
        """``make_graphed_callables``; unused inputs allowed (an option may drop a parameter)."""
        with settings(), collector_paused():
            return torch.cuda.make_graphed_callables(module, samples, allow_unused_input=True)


class RecordedCall(Generic[Out]):
    """``fn(*args)``: eager for ``warmup_calls`` calls, then recorded once and replayed.

    :param fn: the eager call (for ``recorder.record``: no arguments, fixed addresses).
    :param record: makes the replay; a :class:`RuntimeError` from it is a failed recording.
    :param what: how the warning of a failed recording names the call.
    """

    def __init__(
        self,
        fn: Callable[..., Out],
        record: Callable[[], Callable[..., Out]],
        what: str,
        warmup: Settings = contextlib.nullcontext,
        warmup_calls: int = 0,
    ) -> None:
        self.fn, self.record, self.what, self.warmup = fn, record, what, warmup
        self.warmups_left = warmup_calls
        self.replay: Callable[..., Out] | None = None
        self.failure: str | None = None  # why the recording failed; every call is then eager
        self.replays = 0  # calls replayed so far (the recorded one included)

    def __call__(self, *args: Any) -> Out:
        if self.failure is not None:
            return self.fn(*args)
        if self.replay is None and self.warmups_left > 0:
            self.warmups_left -= 1
            with self.warmup():
                return self.fn(*args)
        if self.replay is None:
            try:
                self.replay = self.record()
            except RuntimeError as err:  # training goes on, eagerly, rather than stop
                self.failure = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
                why = f"{self.what}: recording failed ({self.failure}); it runs eagerly from now on"
                warnings.warn(why, RuntimeWarning, stacklevel=2)
                return self.fn(*args)
        self.replays += 1
        return self.replay(*args)


def recorded_call(
    fn: Callable[[], Out], recorder: EagerRecorder, what: str,
    settings: Settings = contextlib.nullcontext, warmup_calls: int = WARMUP_CALLS,
) -> RecordedCall[Out]:  # fmt: skip
    """``fn`` (no arguments, fixed addresses) as a :class:`RecordedCall` of ``recorder``."""
    record = lambda: recorder.record(fn, settings)  # noqa: E731
    return RecordedCall(fn, record, what, recorder.warmup, warmup_calls)


class _Flat(nn.Module):
    """``core`` as a module of tensors only (what ``make_graphed_callables`` takes):
    ``(x, *state) -> (y, *state)``, or ``(x, starts, *state)`` when ``with_starts``."""

    def __init__(self, core: MemoryCore, with_starts: bool) -> None:
        super().__init__()
        self.core = core
        self.with_starts = with_starts

    def forward(self, x: Tensor, *rest: Tensor) -> tuple[Tensor, ...]:
        starts = rest[0] if self.with_starts else None
        state = rest[1:] if self.with_starts else rest
        y, new_state = self.core(x, tuple(state), starts)
        return (y, *new_state)


class GraphedCore(MemoryCore):
    """A ``graph_safe`` core whose training forward+backward is recorded and replayed; its
    ``state_dict`` is the core's, so checkpoints load either way.

    :param recorder: :class:`CudaRecorder` (default) or the tests' :class:`EagerRecorder`.
    """

    def __init__(self, core: MemoryCore, recorder: EagerRecorder | None = None) -> None:
        if not core.graph_safe:
            raise ValueError(
                f"{type(core).__name__} cannot be captured in a CUDA graph (it synchronises "
                "with the host or changes shapes with the data inside forward)"
            )
        super().__init__(core.input_size, core.hidden_size)
        self.core = core
        self.recorder = recorder if recorder is not None else CudaRecorder()
        # the wrapped core's declared capabilities, so callers treat the wrapper like it
        self.has_step = core.has_step
        self.state_arity = core.state_arity
        self.graph_safe = True
        # not submodules: each holds the same parameters as `core` (no duplicate state_dict keys)
        self._graphs: OrderedDict[Hashable, RecordedCall[tuple[Tensor, ...]]] = OrderedDict()
        self.capture_error: str | None = None  # why a recording failed (then eager)
        self.register_load_state_dict_pre_hook(_keys_into_wrapped)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.core.state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Submodules and parameters first, then the wrapped core's attributes."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules")
            if not modules or "core" not in modules:
                raise
            return getattr(modules["core"], name)

    def __getstate__(self) -> dict[str, Any]:
        """Without its recordings (copies and pickles record their own)."""
        return {**self.__dict__, "_graphs": OrderedDict()}

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.core.initial_state(batch_size, device)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        return self.core.step(x_t, state)

    def reset_state(self, state: State, mask: Tensor) -> State:
        return self.core.reset_state(state, mask)

    def draws_on_host(self) -> bool:
        return self.core.draws_on_host()

    def graph_key(self, state: State) -> Hashable:
        return self.core.graph_key(state)

    def recording(self, key: Hashable) -> contextlib.AbstractContextManager[None]:
        return self.core.recording(key)

    def graphable(self, x: Tensor) -> bool:
        """Whether a call with ``x [T, B, D]`` replays a recording; not inside the update
        graph's capture (graphs do not nest: the core is recorded within it)."""
        device_type = self.recorder.device_type
        return (
            device_type in (None, x.device.type)
            and not capturing(x)
            and torch.is_grad_enabled()
            and x.shape[0] > 1
            and not autocast_enabled("cuda")
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the state after step ``T``."""
        if self.capture_error is not None or not self.graphable(x):
            return self.core(x, state, starts)
        with_starts = starts is not None
        args = (x, starts.to(device=x.device, dtype=torch.bool)) if with_starts else (x,)
        args = (*args, *state)
        fixed = self.core.graph_key(state)  # what the shapes leave open (mem_lstm's width)
        shapes = tuple((tuple(a.shape), a.dtype, a.requires_grad) for a in args)
        key = (self.core.training, fixed, shapes, with_starts)
        call = self._graphs.get(key)
        if call is None:  # recorded under core.recording(fixed), for inputs like args
            flat = _Flat(self.core, with_starts)
            samples = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
            settings = lambda: self.core.recording(fixed)  # noqa: E731
            record = lambda: self.recorder.record_autograd(flat, samples, settings)  # noqa: E731
            what = f"{type(self.core).__name__}: the step loop"
            call = self._graphs[key] = RecordedCall(flat, record, what)
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        out = call(*args)
        self.capture_error = call.failure
        # copies out of the static output buffers, which the next replay overwrites
        y, *new_state = (t.clone() for t in out)
        return y, tuple(new_state)


def _keys_into_wrapped(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """Load pre-hook: a saved key in the unwrapped core's layout goes to ``core.`` + key."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[f"{prefix}core.{key[len(prefix) :]}"] = state_dict.pop(key)


def maybe_graphed(
    core: MemoryCore, device: torch.device | str, choice: bool | str = "auto"
) -> MemoryCore:
    """``core`` with its outermost ``graph_safe`` cores wrapped in :class:`GraphedCore` (in
    place, as in the policy's actor/critic pair) where ``choice`` and a CUDA ``device`` say so.

    :raises ValueError: ``choice`` is invalid, or ``true`` where it cannot apply.
    """
    why_not = cuda_only(device)
    if why_not is None and _capturable(core) == 0:
        why_not = (
            f"{type(core).__name__} cannot be captured in a CUDA graph "
            "(a fused kernel, a scan or data-dependent shapes)"
        )
    if not graph_switch(choice, "core.cuda_graph", why_not):
        return core
    return _wrap_capturable(core)


def _capturable(module: nn.Module) -> int:
    """How many outermost ``graph_safe`` cores ``module`` holds (itself included)."""
    if isinstance(module, MemoryCore) and module.graph_safe:
        return 1
    return sum(_capturable(child) for child in module.children())


def _wrap_capturable(module: nn.Module) -> nn.Module:
    """``module`` with its outermost ``graph_safe`` cores wrapped."""
    if isinstance(module, GraphedCore):
        return module
    if isinstance(module, MemoryCore) and module.graph_safe:
        return GraphedCore(module)
    for name, child in list(module.named_children()):
        new = _wrap_capturable(child)
        if new is not child:
            setattr(module, name, new)
    return module
