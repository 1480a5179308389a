"""Config schema of ``memcores supervised`` (sections task, core, model, optim, train, run).

Loaded with :func:`experiments.config.load_config`; every field below can be set in the YAML
file or overridden on the command line (``task.length=500 core.name=ur_lstm optim.lr=2e-4``).
Unknown keys of ``task`` and ``core`` are collected into their ``options`` dict and checked
against the task factory / core class (``task.loss=last10``, ``core.p=0.25``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from memcores.agents.core_config import CoreConfig
from memcores.agents.divergence import check_learning_rate
from memcores.agents.run_config import MigratingSchema, RunConfig, TrainBase


@dataclass
class TaskConfig:
    """Which sequence task to train on (``memcores list tasks``)."""

    __extras__ = "options"

    name: str = "copy"
    """Task name, one of ``envs.sequences.TASKS``."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task options (any other key of this section): length, loss, data_dir, ..."""

    def validate(self) -> None:
        from memcores.envs.datasets import DatasetMissingError
        from memcores.envs.sequences import check_task_data, check_task_options

        check_task_options(self.name, self.options)
        try:  # before a run folder exists, not when the task is built
            check_task_data(self.name, self.options)
        except DatasetMissingError as err:
            raise ValueError(f"task.data_dir: {err}") from None


@dataclass
class ModelConfig:
    """The readout applied to the core's output at every scored step."""

    readout: Literal["linear", "mlp"] = "linear"
    """``linear``: one affine layer; ``mlp``: ReLU hidden layer then affine (UR-gates §3.5)."""
    readout_hidden: int = 256
    """Width of the ``mlp`` readout's hidden layer."""


@dataclass
class OptimConfig:
    """Optimiser, gradient clipping and learning-rate schedule."""

    name: Literal["adam", "rmsprop", "adamw"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    eps: float = 1e-8
    alpha: float = 0.99
    """RMSprop smoothing constant (torch's default; the fast-gate paper's "default")."""
    clip_grad_norm: float | None = 1.0
    """Global gradient-norm clipping threshold; null disables clipping."""
    schedule: Literal["constant", "step", "cosine"] = "constant"
    """``step``: multiply lr by ``gamma`` at each of ``milestones``; ``cosine``: anneal to 0."""
    milestones: list[int] = field(default_factory=list)
    """Training steps at which the ``step`` schedule multiplies lr by ``gamma``."""
    gamma: float = 0.5
    warmup_steps: int = 0
    """Linear warm-up from 0 over this many steps (before any schedule)."""

    def validate(self) -> None:
        check_learning_rate("optim.lr", self.lr)
        for name in ("weight_decay", "eps", "alpha", "gamma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"optim.{name} must be a finite number >= 0, got {value}")
        clip = self.clip_grad_norm
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(
                f"optim.clip_grad_norm must be positive or null, got {self.clip_grad_norm}"
            )
        if self.warmup_steps < 0 or any(m <= 0 for m in self.milestones):
            raise ValueError("optim.warmup_steps must be >= 0 and optim.milestones positive")


@dataclass
class TrainConfig(TrainBase):
    """Training length, batching and evaluation (the keys shared with the RL trainer:
    :class:`agents.run_config.TrainBase`)."""

    threads: int = 0
    """torch CPU threads (``0``: torch's default); 1 is polite on a shared machine."""
    steps: int = 2000
    """Number of optimiser updates."""
    batch_size: int = 64
    eval_every: int = 200
    """Evaluate (and write a checkpoint) every this many updates, and at the end."""
    eval_size: int = 1000
    """Examples in the fixed evaluation set of a synthetic task (datasets: the whole split)."""
    eval_batch_size: int = 500
    log_every: int = 20
    """Write training scalars every this many updates."""
    target_accuracy: float | None = None
    """Stop early once the evaluation accuracy reaches this value (0..1); null: never."""
    max_loss_ratio: float = 1e4
    """A training loss above this many times the reference (the task's chance-level loss, or
    the first training loss when that is larger) counts as exploding."""

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.max_loss_ratio) and self.max_loss_ratio > 1):
            raise ValueError(f"train.max_loss_ratio must be > 1, got {self.max_loss_ratio}")
        for name in ("steps", "batch_size", "eval_every", "eval_size", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"train.target_accuracy must be in (0, 1], got {self.target_accuracy}")


@dataclass
class SupervisedConfig(MigratingSchema):
    """Top level of a ``memcores supervised`` config file."""

    task: TaskConfig = field(default_factory=TaskConfig)
    core: CoreConfig = field(default_factory=CoreConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def check_device(self, device: Any) -> None:
        """Refuse what cannot run on ``device`` (Triton options, :meth:`CoreConfig.check_device`).

        :raises ValueError: naming the key and the values that run there.
        """
        self.core.check_device(device)
