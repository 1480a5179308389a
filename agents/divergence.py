"""Divergence policy shared by the trainers: skip bad updates, stop a run that keeps failing.

A trainer never applies an update whose loss or gradient is not finite (the weights would be
lost to NaN); it counts it as *skipped*. One bad batch is noise; ``patience`` consecutive
updates that were all skipped mean the run has diverged: :class:`DivergenceGuard` raises
:class:`TrainingDiverged`, whose message names the last step whose update was finite, so the
run ends with a non-zero exit instead of reporting a normal result. The running total of
skipped updates is logged (``train/skipped_updates``) and printed in every summary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class TrainingDiverged(RuntimeError):
    """Too many consecutive updates were skipped; the message says since when and why."""


@dataclass
class DivergenceGuard:
    """Counts skipped updates and stops the run after ``patience`` consecutive bad ones.

    :param patience: consecutive bad updates that stop the run (``0`` never stops; skipped
        updates are still counted).
    :param start_step: the step training starts (or resumes) from: the last finite step until
        an update succeeds.
    :param unit: what the step counter counts, for the message (``"frame"``, ``"step"``).
    """

    patience: int
    start_step: int = 0
    unit: str = "step"
    skipped: int = 0
    """Running total of skipped updates (minibatches, for PPO); a resumed run starts from the
    checkpoint's total."""
    consecutive: int = 0
    """Bad updates in a row, up to now."""
    last_finite_step: int = field(init=False)
    """The step reached by the last update that was applied."""
    any_finite: bool = field(init=False, default=False)
    """Some update since :attr:`start_step` was applied."""

    def __post_init__(self) -> None:
        self.last_finite_step = self.start_step

    def observe(self, step: int, bad: bool, skipped: int | None = None, why: str = "") -> None:
        """Account the update that brought the run to ``step``.

        :param bad: the whole update was discarded (every minibatch skipped, or the loss
            exploded).
        :param skipped: how many gradient steps of this update were skipped (default: 1 when
            ``bad``, else 0), added to :attr:`skipped`.
        :param why: what went wrong, for the message (``"non-finite loss"``).
        :raises TrainingDiverged: ``patience`` consecutive bad updates.
        """
        self.skipped += int(bad) if skipped is None else skipped
        if not bad:
            self.consecutive = 0
            self.last_finite_step = step
            self.any_finite = True
            return
        self.consecutive += 1
        if self.patience and self.consecutive >= self.patience:
            reason = f" ({why})" if why else ""
            since = (
                f"last finite update at {self.unit} {self.last_finite_step}"
                if self.any_finite
                else f"no finite update since {self.unit} {self.start_step}"
            )
            raise TrainingDiverged(
                f"training diverged: the last {self.consecutive} updates were all skipped"
                f"{reason}; {since}; {self.skipped} skipped in all; lower the learning rate "
                "or enable gradient clipping"
            )


MAX_LEARNING_RATE = 10.0
"""Learning rates above this are refused before a run starts: no optimiser here makes progress
with them, and a typo such as ``1e30`` would otherwise run until its first non-finite update."""


def check_learning_rate(key: str, value: float) -> None:
    """``0 < value <= MAX_LEARNING_RATE`` and finite, else a ValueError naming ``key``."""
    if not (math.isfinite(value) and 0 < value <= MAX_LEARNING_RATE):
        raise ValueError(f"{key} must be a number in (0, {MAX_LEARNING_RATE:g}], got {value}")
