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
    (``[B, 1]``) to the total and one to the steps, and outputs the new total."""

    state_arity = 2

    def __init__(self) -> None:
        super().__init__(1, 1)

    def initial_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> tuple[Tensor, Tensor]:
        total = torch.full((batch_size, 1), START, device=device)
        return total, torch.zeros(batch_size, dtype=torch.int64, device=device)

    def step(self, x_t: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, tuple[Tensor, ...]]:
        total, steps = state
        total = total + x_t
        return total, (total, steps + 1)
