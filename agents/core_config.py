"""The ``core`` config section, shared by the RL and supervised schemas."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cores.graphed import cuda_graph_choice


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
    cuda_graph: Any = "auto"  # a bool or "auto"; validate() names the choices
    """Train the core through CUDA graphs (:func:`cores.graphed.maybe_graphed`): ``auto``
    does so on a CUDA device for the cores that declare ``graph_safe`` (the step-loop cores
    without a fused kernel or a scan); ``true`` insists (an error where it cannot apply);
    ``false`` runs every core eagerly. Acting stays eager in every case."""

    def validate(self) -> None:
        cuda_graph_choice(self.cuda_graph)
        if self.hidden_size < 1:
            raise ValueError(f"core.hidden_size must be >= 1, got {self.hidden_size}")
