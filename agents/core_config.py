"""The ``core`` config section, shared by the RL and supervised schemas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class CoreConfig:
    """The memory core; any key not listed here is a core option (``core.p=0.25``)."""

    __extras__ = "options"

    name: str = "lstm"
    """Registered core name (see ``memcores list cores``)."""
    hidden_size: int = 128
    """Size of the core's output vector (and of its hidden state)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Core-specific options passed to :func:`cores.make_core` (validated there), e.g. ``p``
    for ``hdetach_lstm``, ``t_max`` for ``c_lstm``."""

    def validate(self) -> None:
        if self.hidden_size < 1:
            raise ValueError(f"core.hidden_size must be >= 1, got {self.hidden_size}")
