"""CUDA graphs for the cores whose time loop stays a Python loop of small operations.

A step loop launches a dozen small kernels per step; at the shapes of RL and supervised
training a GPU then waits on launches, not arithmetic. Cores without a fused kernel or a
parallel scan (the ordered-neuron family, ``janet``, ``nru``, the power and leaky RNNs,
``rel_lstm``/``rel_rnn``, ``block_gru``/``linear_rnn``) get their whole forward and backward
for one fixed shape recorded once as a CUDA graph (``torch.cuda.make_graphed_callables``)
and replayed afterwards as one launch each way.

:class:`GraphedCore` wraps a core: on CUDA tensors, with autograd on and more than one step,
it captures one graph per input shape/dtype/mode (a few are kept, least recently used
dropped) and replays it; everywhere else (CPU, acting under ``torch.no_grad``, one step,
autocast) it runs the wrapped core as it is. Outputs are copied out of the graph's static
buffers, so results behave like eager ones.

What makes a loop capturable is declared by the core (``graph_safe``): no host
synchronisation and no data-dependent shapes inside ``forward``. Episode resets are read on
the host by :func:`cores.base.steps_with_starts`, which inside a capture returns every step
instead, so the reset mask is applied (as a ``torch.where``) at every step and the graph is
right for any later ``starts``. The memory LSTM (``mem_lstm``) grows its memory by the
number of stored states, a data-dependent shape, and is not capturable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch
from torch import Tensor, nn

from cores.base import MemoryCore, State, autocast_enabled

MAX_GRAPHS = 4
"""Graphs kept per wrapped core (one per shape and mode seen); each holds its own memory."""


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

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """The wrapped core's initial state."""
        return self.core.initial_state(batch_size, device)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One eager step of the wrapped core (acting is not graphed here)."""
        return self.core.step(x_t, state)

    def reset_state(self, state: State, mask: Tensor) -> State:
        """The wrapped core's reset."""
        return self.core.reset_state(state, mask)

    def graphable(self, x: Tensor) -> bool:
        """Whether a call with ``x [T, B, D]`` replays a graph (else it runs eagerly)."""
        return (
            x.device.type == "cuda"
            and torch.is_grad_enabled()
            and x.shape[0] > 1
            and not autocast_enabled("cuda")
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the state after step ``T``, as the
        wrapped core computes them."""
        if not self.graphable(x):
            return self.core(x, state, starts)
        args = (x,) if starts is None else (x, starts.to(device=x.device, dtype=torch.bool))
        args = (*args, *state)
        key = (
            self.core.training,
            starts is None,
            *((tuple(a.shape), a.dtype, a.requires_grad) for a in args),
        )
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._capture(args, starts is not None)
            self._graphs[key] = graphed
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        # copies out of the static output buffers, which the next replay overwrites
        y, *new_state = (t.clone() for t in graphed(*args))
        return y, tuple(new_state)

    def _capture(self, args: tuple[Tensor, ...], with_starts: bool) -> Callable:
        """Record one graph each way for inputs shaped like ``args`` (warm-up runs included)."""
        samples = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        # allow_unused_input: a parameter some option leaves out of forward gets no gradient
        return torch.cuda.make_graphed_callables(
            _Flat(self.core, with_starts), samples, allow_unused_input=True
        )


def graphed(core: MemoryCore) -> MemoryCore:
    """``core`` wrapped in :class:`GraphedCore` when it declares ``graph_safe``, else itself
    (cores with a fused kernel or a scan need no graph)."""
    return GraphedCore(core) if core.graph_safe else core
