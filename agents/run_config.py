"""Config fields both trainers share: the ``run`` section and the common ``train`` keys.

:class:`RunConfig` is the ``run`` section of both schemas; :class:`TrainBase` holds the
``train`` keys with one meaning in both (seed, device, threads, progress bar, ``init_from``,
the divergence limit), which each trainer's ``TrainConfig`` extends. One convention each:
``train.threads: 0`` keeps torch's default thread count, ``train.progress`` switches the bar,
``run.dir: null`` picks the trainer's default folder.

Keys of earlier releases still load for one release (:data:`DEPRECATED_KEYS`,
:func:`migrate_config`), each with a one-line message saying what to write instead.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from memcores.agents.device import DEVICE_CHOICES

MAX_SEED = 2**32 - 1
"""Largest ``train.seed``: NumPy's global generator takes seeds below ``2**32``."""


@dataclass
class TrainBase:
    """``train`` keys shared by the RL and supervised trainers."""

    seed: int = 0
    """Seed of torch, NumPy and Python (and of the envs or data)."""
    device: str = "auto"
    """``auto`` (CUDA when present), ``cpu``, ``cuda`` or ``cuda:N``."""
    threads: int = 1
    """``torch.set_num_threads`` for this run (small recurrent nets are fastest on one thread;
    ``0`` keeps torch's default)."""
    progress: bool = True
    """Show a tqdm progress bar."""
    log_every: int = 1
    """Write the training scalars every this many updates."""
    init_from: str | None = None
    """Start a new run from the weights of another run (its folder or a checkpoint file): only
    the weights come over; the optimiser, step counter and schedule start fresh. Ignored by
    ``--resume``, which restores its own checkpoint."""
    max_skipped_updates: int = 10
    """Stop the run (exit code 3) after this many consecutive updates that were skipped for a
    non-finite (or, supervised, exploding) loss or gradient (0: never stop; skipped updates
    are still counted)."""

    def validate(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"train.seed must be in 0..{MAX_SEED}, got {self.seed}")
        if self.max_skipped_updates < 0:
            raise ValueError(
                f"train.max_skipped_updates must be >= 0, got {self.max_skipped_updates}"
            )
        if self.log_every < 1:
            raise ValueError(f"train.log_every must be >= 1, got {self.log_every}")
        if self.threads < 0:
            raise ValueError(f"train.threads must be >= 0 (0: torch's default), got {self.threads}")
        if not (self.device in DEVICE_CHOICES or self.device.startswith("cuda:")):
            raise ValueError(
                f"invalid value {self.device!r} for 'train.device'; allowed: "
                f"{', '.join(DEVICE_CHOICES)}, cuda:N"
            )


@dataclass
class RunConfig:
    """Where the run's outputs go."""

    dir: str | None = None
    """Run folder (``config.yaml``, TensorBoard events, ``progress.csv``, checkpoints); null:
    the trainer's default (``memcores train``: ``runs/<config file stem>``; ``memcores
    supervised``: ``runs/supervised/<task>_<core>_s<seed>``)."""
    tensorboard: bool = True
    """Write TensorBoard event files (``progress.csv`` is always written)."""
    overwrite: bool = False
    """Start over in a run folder that already holds a run, with or without a checkpoint (its
    files, and only those, are deleted once the new config has been validated); without it,
    such a folder is an error unless ``--resume`` is given."""


class MigratingSchema:
    """Base of a top-level config schema whose files may hold keys of earlier releases:
    ``experiments.config.load_config`` renames them with :meth:`migrate` before checking."""

    @staticmethod
    def migrate(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """:func:`migrate_config`."""
        return migrate_config(raw)


DEPRECATED_KEYS: dict[str, str] = {"run.progress_bar": "train.progress"}
"""Keys of earlier releases -> the key that replaced them (same meaning)."""


def migrate_config(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Rewrite the keys and values of earlier releases in a raw config mapping.

    ``run.progress_bar`` becomes ``train.progress``; ``train.threads: null`` becomes ``0``
    (torch's default); ``run.dir: ""`` becomes ``null`` (the default folder).

    :param raw: nested mappings as read from YAML plus overrides (left unchanged).
    :return: the rewritten copy and one message per deprecated key found.
    """
    data = copy.deepcopy(raw)
    notes: list[str] = []
    for old, new in DEPRECATED_KEYS.items():
        section, key = old.split(".")
        if isinstance(data.get(section), dict) and key in data[section]:
            value = data[section].pop(key)
            new_section, new_key = new.split(".")
            target = data.setdefault(new_section, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
            notes.append(f"{old} is deprecated and will be removed; write {new}")
    train, run = data.get("train"), data.get("run")
    if isinstance(train, dict) and "threads" in train and train["threads"] is None:
        train["threads"] = 0
        notes.append("train.threads: null is deprecated; write 0 for torch's default")
    if isinstance(run, dict) and run.get("dir") == "":
        run["dir"] = None
        notes.append('run.dir: "" is deprecated; write null for the default run folder')
    return data, notes


def migrate_saved_config(saved: dict[str, Any]) -> dict[str, Any]:
    """:func:`migrate_config` without the messages, for configs that runs and records saved."""
    return migrate_config(saved)[0]
