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

from agents.core_config import CoreConfig
from agents.device import DEVICE_CHOICES
from agents.divergence import check_learning_rate


@dataclass
class TaskConfig:
    """Which sequence task to train on (``memcores list tasks``)."""

    __extras__ = "options"

    name: str = "copy"
    """Task name, one of ``envs.sequences.TASKS``."""
    options: dict[str, Any] = field(default_factory=dict)
    """Task options (any other key of this section): length, loss, data_dir, ..."""

    def validate(self) -> None:
        from envs.datasets import DatasetMissingError
        from envs.sequences import check_task_data, check_task_options

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


MAX_SEED = 2**32 - 1
"""Largest ``train.seed`` (the same range as ``memcores train``'s: NumPy seeds below ``2**32``)."""


@dataclass
class TrainConfig:
    """Training length, batching, evaluation and reproducibility."""

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
    seed: int = 0
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int | None = None
    """torch CPU threads (null: torch's default); 1 is polite on a shared machine."""
    init_from: str | None = None
    """Start a new run from the weights of another run (its directory or a ``.pt`` file),
    e.g. a curriculum: train at T=100, then ``task.length=1000 train.init_from=RUN``. The
    optimizer, step count and RNG start afresh; the model section and hidden size must match,
    and the core may change only to one with the same parameters (``lstm`` -> ``hdetach_lstm``)."""
    max_skipped_updates: int = 10
    """Stop the run (exit code 3) after this many consecutive bad updates: a non-finite loss or
    gradient, or a loss above ``max_loss_ratio`` times the reference (such updates are never
    applied). 0: never stop; bad updates are still skipped and counted."""
    max_loss_ratio: float = 1e4
    """A training loss above this many times the reference (the task's chance-level loss, or
    the first training loss when that is larger) counts as exploding."""

    def validate(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"train.seed must be in 0..{MAX_SEED}, got {self.seed}")
        if self.max_skipped_updates < 0:
            raise ValueError(
                f"train.max_skipped_updates must be >= 0, got {self.max_skipped_updates}"
            )
        if not (math.isfinite(self.max_loss_ratio) and self.max_loss_ratio > 1):
            raise ValueError(f"train.max_loss_ratio must be > 1, got {self.max_loss_ratio}")
        for name in ("steps", "batch_size", "eval_every", "eval_size", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.log_every <= 0:
            raise ValueError(f"train.log_every must be positive, got {self.log_every}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ValueError(f"train.target_accuracy must be in (0, 1], got {self.target_accuracy}")
        if not (self.device in DEVICE_CHOICES or self.device.startswith("cuda:")):
            raise ValueError(
                f"invalid value {self.device!r} for 'train.device'; allowed: "
                f"{', '.join(DEVICE_CHOICES)}, cuda:N"
            )
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"train.threads must be positive or null, got {self.threads}")


@dataclass
class RunConfig:
    """Where the run writes (config.yaml, TensorBoard events, progress.csv, checkpoints)."""

    dir: str | None = None
    """Run directory; null: ``runs/supervised/<task>_<core>_s<seed>``."""
    tensorboard: bool = True
    progress_bar: bool = True
    overwrite: bool = False
    """Start afresh in a directory that holds a run's files, with or without a checkpoint
    (deletes those files, and only those); without it, such a directory is an error unless
    ``--resume`` is given."""


@dataclass
class SupervisedConfig:
    """Top level of a ``memcores supervised`` config file."""

    task: TaskConfig = field(default_factory=TaskConfig)
    core: CoreConfig = field(default_factory=CoreConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)
