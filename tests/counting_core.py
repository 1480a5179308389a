"""A memory core whose every output can be written out by hand, for the adapters' tests
(torchrl's ``CoreModule``, RLlib's ``CoreRLModule``): which state a sequence starts from,
where it resets and what state it hands on."""

from __future__ import annotations

import torch
from torch import Tensor

from memcores.cores.base import MemoryCore

START = 10.0
"""The counting core's initial total (not zero, so a reset to zeros would show)."""


class CountingCore(MemoryCore):
    """State ``(total [B, 1], steps [B] int64)``, initially ``(10, 0)``; a step adds its input
    (``[B, 1]``) to the total and one to the steps, and outputs the new total. A row resets
    to ``(10, 0)`` before a step where ``starts`` is true."""

    state_arity = 2

    def __init__(self) -> None:
        super().__init__(1, 1)

    def initial_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> tuple[Tensor, Tensor]:
        total = torch.full((batch_size, 1), START, device=device)
        return total, torch.zeros(batch_size, dtype=torch.int64, device=device)

    def forward(
        self, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None = None
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The steps in turn, each row reset where ``starts``; no read of the values on the
        host (so it runs on the ``meta`` device too)."""
        outputs = []
        for t in range(x.shape[0]):
            if starts is not None:
                initial = self.initial_state(x.shape[1], x.device)
                state = tuple(
                    torch.where(starts[t].view(-1, *[1] * (s.ndim - 1)), i, s)
                    for s, i in zip(state, initial, strict=True)
                )
            y, state = self.step(x[t], state)
            outputs.append(y)
        return torch.stack(outputs), state

    def step(self, x_t: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        total, steps = state
        total = total + x_t
        return total, (total, steps + 1)
