"""Streaming online learning for :class:`cores.lru.LRUCore`: one time step at a time.

The trainer carries, per layer, the LRU state and the eligibility traces
(``e^lambda [B, N]``, ``e^gamma [B, N]``, ``e^B [B, N, H]``, complex, stored as real views) in one
flat state tuple. At each step it builds a one-step graph, and as soon as that step's loss is
known it calls ``backward`` on it: the LRU's custom step function turns ``dL_t/dh_t`` into
parameter gradients with the traces of step t, and every other parameter (encoder, LayerNorm,
C, D, GLU, readout) gets the instantaneous spatial gradient. Gradients accumulate in ``.grad``
across steps, so after a sequence they equal those of ``LRUCore(grad="online")`` with
``loss.backward()`` over the whole sequence, while the memory in use does not grow with T
(nothing from earlier steps is kept except the traces).

Example::

    trainer = StreamingOnlineTrainer(core, readout)
    state = trainer.initial_state(batch_size)
    opt.zero_grad()
    loss, state = trainer.accumulate(xs, lambda t, out: loss_at(t, out), state)
    opt.step()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from memcores.cores.base import State, reset_where
from memcores.cores.lru import LRUCore

LossFn = Callable[[int, Tensor], "Tensor | None"]
"""``loss_fn(t, out_t [B, out]) -> scalar loss of step t, or None when step t has no target``."""


class StreamingOnlineTrainer:
    """Run ``readout(core(x))`` step by step and accumulate the online rule's gradients.

    :param core: the LRU core (its ``grad`` option is ignored: streaming is always ``online``).
    :param readout: module applied to the core output at each step (e.g. the decoder), or
        ``None`` to use the core output itself.
    """

    def __init__(self, core: LRUCore, readout: nn.Module | None = None) -> None:
        if not isinstance(core, LRUCore):
            raise TypeError(f"StreamingOnlineTrainer needs an LRUCore, got {type(core).__name__}")
        self.core = core
        self.readout = readout if readout is not None else nn.Identity()
        self.layers = len(core.blocks)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """``L`` core states ``[B, N, 2]`` followed by ``3L`` traces (see ``initial_traces``)."""
        return (
            *self.core.initial_state(batch_size, device),
            *self.core.initial_traces(batch_size, device),
        )

    def reset(self, state: State, mask: Tensor) -> State:
        """Reset rows ``mask [B]`` of states and traces to zero (new tensors)."""
        fresh = self.initial_state(mask.shape[0], state[0].device)
        return reset_where(state, mask, fresh)

    def step(self, x_t: Tensor, state: State, start: Tensor | None = None) -> tuple[Tensor, State]:
        """One step: ``x_t [B, input_size]`` -> ``out_t [B, out]`` (one-step graph) and the state.

        The traces in ``state`` are updated in place; backpropagate step t's loss before the next
        call (autograd raises an error otherwise).
        """
        core_state, traces = state[: self.layers], state[self.layers :]
        y_t, core_state = self.core.online_step(x_t, core_state, traces, start)
        return self.readout(y_t), (*core_state, *traces)

    def accumulate(
        self,
        xs: Iterable[Tensor],
        loss_fn: LossFn,
        state: State,
        starts: Iterable[Tensor] | None = None,
    ) -> tuple[Tensor, State]:
        """Stream a sequence and add the online gradients of ``sum_t loss_t`` into ``.grad``.

        :param xs: the inputs ``x_t [B, input_size]`` in time order (a tensor ``[T, B, D]``
            works; so does a generator, which keeps even the input out of memory).
        :param loss_fn: ``loss_fn(t, out_t)`` -> the loss of step t or ``None``.
        :param state: from :meth:`initial_state` or a previous call.
        :param starts: optional ``[B]`` bool per step (episode starts).
        :return: the summed loss (detached scalar) and the state after the last step.
        """
        total = None
        start_iter = iter(starts) if starts is not None else None
        for t, x_t in enumerate(xs.unbind(0) if isinstance(xs, Tensor) else xs):
            start = next(start_iter) if start_iter is not None else None
            out_t, state = self.step(x_t, state, start)
            loss = loss_fn(t, out_t)
            if loss is None:
                continue
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if total is None:
            total = torch.zeros((), device=state[0].device)
        return total, state
