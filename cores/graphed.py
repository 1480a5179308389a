"""CUDA graphs for the cores whose time loop stays a Python loop of small operations.

A step loop launches a dozen small kernels per step; at the shapes of RL and supervised
training a GPU then waits on launches, not arithmetic. Cores without a fused kernel or a
parallel scan (the ordered-neuron family, ``janet``, ``nru``, the power and leaky RNNs,
``rel_lstm``/``rel_rnn``, ``block_gru``/``linear_rnn``) get their whole forward and backward
for one fixed shape recorded once as a CUDA graph (``torch.cuda.make_graphed_callables``)
and replayed afterwards as one launch each way.

:class:`GraphedCore` wraps a core: on CUDA tensors, with autograd on and more than one step,
it captures one graph per input shape/dtype/mode and ``graph_key`` (:data:`MAX_GRAPHS` are
kept, least recently used dropped) and replays it; everywhere else (CPU, acting under
``torch.no_grad``, one step, autocast) it runs the wrapped core as it is. Outputs are copied
out of the graph's static buffers, so results behave like eager ones.

What makes a loop capturable is declared by the core (``graph_safe``): no host
synchronisation and no data-dependent shapes inside ``forward``. Episode resets are read on
the host by :func:`cores.base.steps_with_starts`, which inside a capture returns every step
instead, so the reset mask is applied (as a ``torch.where``) at every step and the graph is
right for any later ``starts``. What the shapes leave open is read from the state once per
call by the core's ``graph_key`` and keys the graphs: the memory LSTM (``mem_lstm``) attends
to as many memory columns as its fullest row stores, rounded up to a power of two, so it
records one graph per width (its ``on_full="error"`` policy reads the memory at every step
and is not capturable).

The wrapper is transparent to checkpoints and diagnostics: its ``state_dict`` holds the
wrapped core's keys (a run trained with graphs on a GPU loads into an unwrapped core on the
CPU and back), and attributes it does not define (``forget_gate_timescales``, options) are
read from the wrapped core. :func:`maybe_graphed` is what the trainers call: it wraps where
the ``core.cuda_graph`` setting (:data:`CUDA_GRAPH_CHOICES`) and the device say so.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from cores.base import MemoryCore, State, autocast_enabled

CUDA_GRAPH_CHOICES = ("auto", "true", "false")
"""``core.cuda_graph``: ``auto`` wraps the capturable cores when training on CUDA; ``true``
insists (an error where the device is not CUDA or no core can be captured); ``false`` never
wraps."""

MAX_GRAPHS = 12
"""Graphs kept per wrapped core (one per shape, mode and ``graph_key`` seen); each holds its
own memory. Most cores need one to three (the RL update's full and smaller last minibatch, the
supervised batch); ``mem_lstm`` one per memory width, up to ``log2(max_len) + 1`` (11 at its
default ``max_len``), which the RL update's chunks, each starting from a stored memory, may
all use in turn."""


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
    """A core whose training forward+backward runs as CUDA graphs (see the module docstring).

    :param core: a core that declares ``graph_safe``; a :class:`ValueError` names the problem
        otherwise.
    """

    def __init__(self, core: MemoryCore) -> None:
        if not core.graph_safe:
            raise ValueError(
                f"{type(core).__name__} cannot be captured in a CUDA graph (it synchronises "
                "with the host or changes shapes with the data inside forward)"
            )
        super().__init__(core.input_size, core.hidden_size)
        self.core = core
        # the wrapped core's declared capabilities, so callers treat the wrapper like it
        self.has_step = core.has_step
        self.state_arity = core.state_arity
        self.graph_safe = True
        # not submodules: each holds the same parameters as `core` (no duplicate state_dict keys)
        self._graphs: OrderedDict[Hashable, Callable[..., tuple[Tensor, ...]]] = OrderedDict()
        self.capture_error: str | None = None
        """Why a capture failed, after which this core runs eagerly (None: none failed)."""
        self.register_load_state_dict_pre_hook(_keys_into_wrapped)

    # ------------------------------------------------------------ transparency
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The wrapped core's ``state_dict``, under the wrapper's own prefix: the keys are
        those of the unwrapped core, so checkpoints load either way."""
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
        """The module without its recorded graphs (copies and pickles record their own)."""
        state = dict(self.__dict__)
        state["_graphs"] = OrderedDict()
        return state

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """The wrapped core's initial state."""
        return self.core.initial_state(batch_size, device)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One eager step of the wrapped core (acting is not graphed here)."""
        return self.core.step(x_t, state)

    def reset_state(self, state: State, mask: Tensor) -> State:
        """The wrapped core's reset."""
        return self.core.reset_state(state, mask)

    def draws_on_host(self) -> bool:
        """The wrapped core's answer."""
        return self.core.draws_on_host()

    def graph_key(self, state: State) -> Hashable:
        """The wrapped core's key."""
        return self.core.graph_key(state)

    def recording(self, key: Hashable) -> contextlib.AbstractContextManager[None]:
        """The wrapped core's recording context."""
        return self.core.recording(key)

    def graphable(self, x: Tensor) -> bool:
        """Whether a call with ``x [T, B, D]`` replays a graph (else it runs eagerly). Not
        while a graph of the whole update step records (graphs do not nest): the wrapped core
        is then recorded within it."""
        return (
            x.device.type == "cuda"
            and not torch.cuda.is_current_stream_capturing()
            and torch.is_grad_enabled()
            and x.shape[0] > 1
            and not autocast_enabled("cuda")
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the state after step ``T``, as the
        wrapped core computes them."""
        if self.capture_error is not None or not self.graphable(x):
            return self.core(x, state, starts)
        args = (x,) if starts is None else (x, starts.to(device=x.device, dtype=torch.bool))
        args = (*args, *state)
        fixed = self.core.graph_key(state)  # what the shapes leave open (mem_lstm's width)
        key = (
            self.core.training,
            starts is None,
            fixed,
            *((tuple(a.shape), a.dtype, a.requires_grad) for a in args),
        )
        graphed = self._graphs.get(key)
        if graphed is None:
            try:
                graphed = self._capture(args, starts is not None, fixed)
            except RuntimeError as err:  # a training run goes on, eagerly, rather than stop
                self.capture_error = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
                warnings.warn(
                    f"{type(self.core).__name__}: CUDA graph capture failed "
                    f"({self.capture_error}); the core runs eagerly from now on",
                    RuntimeWarning,
                    stacklevel=2,
                )
                return self.core(x, state, starts)
            self._graphs[key] = graphed
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        # copies out of the static output buffers, which the next replay overwrites
        y, *new_state = (t.clone() for t in graphed(*args))
        return y, tuple(new_state)

    def _capture(self, args: tuple[Tensor, ...], with_starts: bool, fixed: Hashable) -> Callable:
        """Record one graph each way for inputs shaped like ``args`` (warm-up runs included),
        under the core's :meth:`~cores.base.MemoryCore.recording` of ``fixed``."""
        samples = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        # allow_unused_input: a parameter some option leaves out of forward gets no gradient
        with collector_paused(), self.core.recording(fixed):
            return torch.cuda.make_graphed_callables(
                _Flat(self.core, with_starts), samples, allow_unused_input=True
            )


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run a CUDA graph capture with Python's cyclic garbage collector paused, after one
    collection.

    A dead graph still held in a reference cycle (an evicted graph of this core, another
    core's, a finished benchmark's) is otherwise destroyed whenever the collector happens to
    run, which may be in the middle of another capture; destroying a graph is not allowed
    while a stream captures, so that capture fails with "operation failed due to a previous
    error during capture" (torch >= 2.9 no longer collects before each capture: pytorch/pytorch
    PR 161037). Collecting first destroys those graphs while nothing captures."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _keys_into_wrapped(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any
) -> None:
    """Load pre-hook of :class:`GraphedCore`: a saved ``prefix + key`` (the unwrapped core's
    layout, which :meth:`GraphedCore.state_dict` writes) goes to ``prefix + "core." + key``."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[f"{prefix}core.{key[len(prefix) :]}"] = state_dict.pop(key)


def graphed(core: MemoryCore) -> MemoryCore:
    """``core`` wrapped in :class:`GraphedCore` when it declares ``graph_safe``, else itself
    (cores with a fused kernel or a scan need no graph)."""
    return GraphedCore(core) if core.graph_safe else core


def cuda_graph_choice(value: bool | str, option: str = "core.cuda_graph") -> str:
    """``value`` (a config's ``option``, such as ``core.cuda_graph``: a bool or one of
    :data:`CUDA_GRAPH_CHOICES`) as one of those strings.

    :raises ValueError: any other value, named with the valid choices.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.lower() in CUDA_GRAPH_CHOICES:
        return value.lower()
    raise ValueError(f"{option} must be one of {', '.join(CUDA_GRAPH_CHOICES)}, got {value!r}")


def maybe_graphed(
    core: MemoryCore, device: torch.device | str, choice: bool | str = "auto"
) -> MemoryCore:
    """``core`` set up to train through CUDA graphs where ``choice`` and ``device`` say so.

    On a CUDA ``device`` (``auto`` or ``true``) a ``graph_safe`` core comes back wrapped in
    :class:`GraphedCore`; a core that is not capturable itself but holds capturable cores
    (e.g. the RL policy's actor/critic pair) has those wrapped in place and comes back itself.
    Cores with a fused kernel or a scan are left as they are. Elsewhere nothing changes.
    Acting (one step, no autograd) runs eagerly through the wrapper in any case.

    :param device: the training device (a string is enough, so the rule is testable
        without a GPU).
    :param choice: ``core.cuda_graph`` (see :data:`CUDA_GRAPH_CHOICES`).
    :raises ValueError: ``choice`` is invalid, or ``true`` where the device is not CUDA or
        no core in ``core`` can be captured.
    """
    choice = cuda_graph_choice(choice)
    on_cuda = torch.device(device).type == "cuda"
    if choice == "false" or (choice == "auto" and not on_cuda):
        return core
    if not on_cuda:
        raise ValueError(
            f"core.cuda_graph=true needs a CUDA device, the training device is {device}; "
            "use auto (graphs on CUDA only) or false"
        )
    wrapped, count = _wrap_capturable(core)
    if count == 0 and choice == "true":
        raise ValueError(
            f"core.cuda_graph=true: {type(core).__name__} cannot be captured in a CUDA graph "
            "(a fused kernel, a scan or data-dependent shapes); use auto or false"
        )
    return wrapped


def _wrap_capturable(module: nn.Module) -> tuple[nn.Module, int]:
    """``module`` with its outermost ``graph_safe`` cores wrapped, and how many there are."""
    if isinstance(module, GraphedCore):
        return module, 1
    if isinstance(module, MemoryCore) and module.graph_safe:
        return GraphedCore(module), 1
    count = 0
    for name, child in list(module.named_children()):
        new, n = _wrap_capturable(child)
        if new is not child:
            setattr(module, name, new)
        count += n
    return module, count
