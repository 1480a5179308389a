"""One run life cycle, shared by ``memcores train`` (RL) and ``memcores supervised``.

A trainer describes what it writes (:class:`RunLayout`) and adds only its own loop::

    with RunSession(layout, run_dir, config, resume) as run:
        if run.resumed:                       # the checkpoint, loaded onto the CPU and checked
            step = run.restore(model, optimizer)
        ...                                   # the loop: run.logger, run.progress_bar(...)
        run.save_checkpoint(step, model, optimizer, extra)

Entering a session:

1. locks the folder (:class:`agents.run_lock.RunLock`: one writer, never stale);
2. claims it: with ``resume``, loads ``checkpoints/last.pt`` and refuses a config that differs
   from the checkpoint's in any key outside :data:`RESUME_ALLOWED_CHANGES` (plus the caller's
   ``allow_changes``), naming the key; without it, refuses a folder that holds an earlier
   run's files unless ``overwrite`` (then deletes those files, and only those);
3. writes ``config.yaml`` and opens the logger (``progress.csv``, TensorBoard events; a resumed
   run drops the rows after its checkpoint).

Every refusal happens before anything is written or deleted.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from memcores.agents.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    LEGACY_NAMES,
    checkpoint_path,
    load_trainer_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from memcores.agents.divergence import DivergenceGuard
from memcores.agents.files import write_text_atomic
from memcores.agents.logger import RunLogger
from memcores.agents.run_config import migrate_saved_config
from memcores.agents.run_lock import RunLock, refuse_earlier_run, run_files

RESUME_ALLOWED_CHANGES: frozenset[str] = frozenset(
    {
        "train.total_steps",  # RL budget: only longer (see RunLayout.budget_key)
        "train.steps",  # supervised budget: only longer
        "train.device",
        "core.cuda_graph",  # the same maths, eager or replayed
        "train.graph_update",  # the same maths, eager or replayed
        "train.graph_acting",  # where and how the policy acts, not what it learns
        "train.threads",
        "train.update_threads",
        "train.progress",
        "train.log_every",
        "train.checkpoint_every",
        "train.histogram_every",
        "train.eval_every",
        "train.max_skipped_updates",
        "train.init_from",  # ignored by a resume, which restores its own checkpoint
        "run.dir",
        "run.tensorboard",
        "run.overwrite",
    }
)
"""Config keys (dotted) that ``--resume`` lets differ from the checkpoint's config: where and
how the run computes and reports, never what it learns. The budget may only grow. Any other
difference is refused, naming the key; a caller that means to change more (e.g. Population
Based Training mutating ``agent.learning_rate``) passes those keys as ``allow_changes``."""


@dataclass(frozen=True)
class RunLayout:
    """What a trainer writes into its run folder besides the shared files."""

    command: str
    """Shown to a second writer that finds the folder locked (``"memcores train"``)."""
    trainer: str
    """The ``trainer`` tag of its checkpoints (``"rl"`` or ``"supervised"``)."""
    budget_key: str
    """The dotted config key of the run's length, which a resume may only raise."""
    extra_files: tuple[str, ...] = ()
    """Globs of what it writes besides :data:`RUN_FILES` (what ``run.overwrite`` deletes)."""

    @property
    def files(self) -> tuple[str, ...]:
        return RUN_FILES + self.extra_files


RUN_FILES = (
    "config.yaml",
    ".config.yaml.*.tmp",
    "progress.csv",
    "progress.csv.tmp",
    "events.out.tfevents.*",
    "checkpoints",
    *LEGACY_NAMES.values(),
    *(f".{name}.*.tmp" for name in LEGACY_NAMES.values()),
)
"""Globs of what every run writes into its folder (``checkpoints/`` and, from earlier
releases, a supervised run's ``checkpoint.pt``/``init.pt``)."""


class RunSession:
    """One run folder, locked and claimed for the duration of a ``with`` block.

    :param layout: what the trainer writes.
    :param run_dir: the run folder (created if missing).
    :param config: the run's config (a dataclass tree with a ``run`` section,
        :class:`agents.run_config.RunConfig`: ``overwrite``, ``tensorboard``); written to
        ``config.yaml``.
    :param resume: continue from ``checkpoints/last.pt``.
    :param allow_changes: dotted config keys that a resume may change besides
        :data:`RESUME_ALLOWED_CHANGES` (such a key's budget direction is not checked either).
    :param before_clear: called once the folder is claimed for a new run, before an earlier
        run's files are deleted (a trainer loads ``train.init_from`` there, so a bad source is
        refused with the folder untouched).
    :param on_log: called with every logged row.
    """

    def __init__(
        self,
        layout: RunLayout,
        run_dir: str | Path,
        config: Any,
        resume: bool = False,
        allow_changes: Iterable[str] = (),
        on_log: Callable[[dict[str, float]], None] | None = None,
        *,
        before_clear: Callable[[], None] | None = None,
    ) -> None:
        self.layout, self.run_dir, self.config = layout, Path(run_dir), config
        self.resume = resume
        self.overwrite, self.tensorboard = config.run.overwrite, config.run.tensorboard
        self.allow_changes = frozenset(allow_changes)
        self.before_clear, self.on_log = before_clear, on_log
        self.checkpoint_path = self.run_dir / CHECKPOINT_NAME
        self.payload: dict[str, Any] | None = None
        self._legacy_checkpoint: Path | None = None  # resumed from an earlier release's layout
        self.logger: RunLogger | None = None
        self._lock = RunLock(self.run_dir, layout.command)
        self._bars: list[Any] = []

    @property
    def resumed(self) -> bool:
        """Whether this session continues a checkpoint."""
        return self.payload is not None

    # ------------------------------------------------------------------ enter/exit
    def __enter__(self) -> RunSession:
        self._lock.acquire()
        try:
            self.payload = self._claim()
            write_text_atomic(
                self.run_dir / "config.yaml",
                yaml.safe_dump(dataclasses.asdict(self.config), sort_keys=False),
            )
            self.logger = RunLogger(self.run_dir, self.tensorboard, on_dump=self.on_log)
            if self.payload is not None:
                self.logger.truncate_after(int(self.payload["step"]))
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            for bar in self._bars:
                bar.close()
            if self.logger is not None:
                self.logger.close()
        finally:
            self._lock.release()

    def _claim(self) -> dict[str, Any] | None:
        """The checkpoint to resume from (checked against the config), or a clean folder."""
        found = checkpoint_path(self.run_dir)
        if self.resume:
            payload = load_trainer_checkpoint(found, self.layout.trainer)
            check_resume_config(
                payload["config"], self.config, self.layout.budget_key, self.allow_changes
            )
            for tmp in found.parent.glob(f".{found.name}.*.tmp"):  # a kill mid-write
                tmp.unlink()
            if found != self.checkpoint_path:
                self._legacy_checkpoint = found
            return payload
        refuse_earlier_run(self.run_dir, self.layout.files, found, self.overwrite)
        if self.before_clear is not None:
            self.before_clear()
        clear_run(self.run_dir, self.layout.files)
        return None

    # ------------------------------------------------------------------ the trainer's tools
    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the resumed checkpoint's model, optimiser and RNG states; returns its step.

        The checkpoint was loaded onto the CPU: ``load_state_dict`` copies the weights into
        ``model`` wherever it lives, the optimiser state follows its parameters' device, and
        the RNG states stay on the CPU.
        """
        from memcores.agents.ppo import load_optimizer_state

        assert self.payload is not None, "restore() needs a resumed session"
        model.load_state_dict(self.payload["model"])
        load_optimizer_state(optimizer, self.payload["optimizer"])
        set_rng_state(self.payload["rng"])
        return int(self.payload["step"])

    def guard(self, patience: int, start_step: int, unit: str = "step") -> DivergenceGuard:
        """The divergence guard, counting on from the resumed checkpoint's skipped updates."""
        skipped = int((self.payload or {}).get("skipped_updates", 0))
        return DivergenceGuard(patience, start_step, unit, skipped)

    def progress_bar(
        self, enabled: bool, total: int, initial: int, desc: str, unit: str = "it"
    ) -> Any:
        """A tqdm bar (a disabled one when not ``enabled``), closed with the session."""
        from tqdm.auto import tqdm

        bar = tqdm(
            total=total,
            initial=min(initial, total),
            disable=not enabled,
            unit=unit,
            unit_scale=unit != "it",
            desc=desc,
            dynamic_ncols=True,
            mininterval=1.0,
        )
        self._bars.append(bar)
        return bar

    def save_checkpoint(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extra: dict[str, Any] | None = None,
        path: str | None = None,
    ) -> Path:
        """Write a checkpoint atomically (:mod:`agents.checkpoint`'s format): tags, config,
        model, optimiser, RNG states, ``step`` and ``extra`` (``weights_only``-safe values).

        :param path: relative to the run folder; default ``checkpoints/last.pt``.
        """
        payload = {
            "format": CHECKPOINT_FORMAT,
            "trainer": self.layout.trainer,
            "config": dataclasses.asdict(self.config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": int(step),
            "rng": rng_state(),
            **(extra or {}),
        }
        target = self.run_dir / path if path else self.checkpoint_path
        written = save_checkpoint(target, payload)
        if self._legacy_checkpoint is not None and not path:  # superseded by the new layout
            self._legacy_checkpoint.unlink(missing_ok=True)
            self._legacy_checkpoint = None
        return written


# ---------------------------------------------------------------------------- helpers
def clear_run(run_dir: Path, patterns: tuple[str, ...]) -> None:
    """Delete what an earlier run wrote into ``run_dir`` (only what ``patterns`` match; a
    matched folder is emptied of matched files first and removed once empty)."""
    found = run_files(run_dir, patterns)
    for folder in [p for p in found if p.is_dir()]:
        found += [p for p in run_files(folder, ("*",)) if p.is_file() and p not in found]
    for path in sorted(set(found), reverse=True):  # a folder's files come after it: reversed
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink()


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": {}}`` -> ``{"a.b": 1}`` (an empty mapping has no leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_resume_config(
    saved: dict[str, Any], config: Any, budget_key: str, allow_changes: frozenset[str] = frozenset()
) -> None:
    """Refuse a resume whose config differs from the checkpoint's outside the allowed keys.

    :param saved: the checkpoint's config (plain dicts, possibly of an older schema).
    :param config: the config the resume runs with (a dataclass tree).
    :param budget_key: the run length's key; it may only grow unless in ``allow_changes``.
    :raises ValueError: one line naming the first key that differs, both values, and the
        keys a resume may change.
    """
    now = flatten(dataclasses.asdict(config))
    before = flatten(_normalised(type(config), saved))
    allowed = RESUME_ALLOWED_CHANGES | allow_changes
    named = sorted(key for key in allowed if key in now)  # this trainer's keys, for messages
    for key in sorted(set(now) | set(before)):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if key == budget_key and key not in allow_changes and new < old:
            raise ValueError(
                f"cannot resume: {key}={new} is shorter than the checkpoint's run ({old}); a "
                "resume may only lengthen it"
            )
        if key not in allowed:
            raise ValueError(
                f"cannot resume: {key} is {_short(new)}, the checkpoint's run has "
                f"{_short(old)}; a resume may change only {', '.join(named)} "
                "(start a new run.dir, or set train.init_from to start from its weights)"
            )


def _normalised(schema: type, saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config as the current schema writes it: deprecated keys renamed and keys a
    newer schema added at their defaults, so only real differences remain."""
    data = migrate_saved_config(saved)
    hints = typing.get_type_hints(schema)
    try:
        sections = {
            f.name: hints[f.name](**dict(data.get(f.name) or {}))
            for f in dataclasses.fields(schema)
        }
        return dataclasses.asdict(schema(**sections))
    except (TypeError, ValueError):  # a key this schema does not know: compare as saved
        return data
