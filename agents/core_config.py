"""The ``core`` config section, shared by the RL and supervised schemas."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from memcores.cores.base import triton_available
from memcores.cores.graphed import cuda_graph_choice

TRITON_OPTIONS: dict[str, str] = {
    "impl": "fused, loop",
    "scan": "auto, parallel, sequential",
}
"""Core options whose value ``triton`` asks for Triton kernels, with the values that run on
any device (for the message that refuses ``triton`` where it cannot run)."""


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

    def check_device(self, device: torch.device) -> None:
        """Refuse options that ask for Triton kernels (``core.impl=triton``,
        ``core.scan=triton``) where they cannot run: Triton compiles for CUDA GPUs, and runs
        on CPU tensors only under its interpreter (``TRITON_INTERPRET=1``). Called before the
        run folder is touched, so the refusal leaves nothing behind.

        :raises ValueError: naming the key, the device and the values that run there.
        """
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        runs = triton_available() and (device.type == "cuda" or interpreted)
        for key, others in TRITON_OPTIONS.items():
            if self.options.get(key) == "triton" and not runs:
                why = (
                    "Triton is not installed"
                    if not triton_available()
                    else (
                        f"the device is {device.type}; Triton runs on CUDA GPUs, or on a CPU "
                        "under TRITON_INTERPRET=1 set before the command starts"
                    )
                )
                raise ValueError(f"core.{key}=triton cannot run here ({why}); valid: {others}")
