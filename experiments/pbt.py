"""Population Based Training members (``memcores sweep --scheduler pbt``).

A member is one RL run (one grid point). Its hyperparameters (the config's ``search:`` keys)
are first sampled, then, every ``--perturbation-interval`` frames, Tune's PBT scheduler lets a
member in the bottom quarter copy the weights of one in the top quarter (exploit) and mutate
the copied hyperparameters (explore). The exchange goes through Tune checkpoints holding the
trainer's ``checkpoints/last.pt``, the ``progress.csv`` up to it and the member's
hyperparameter schedule; a member restored from one resumes the trainer from that
checkpoint with its new values, which take effect from the next update.

The schedule (``pbt_schedule.json`` in the run folder, ``pbt_schedule`` in the record) lists
``{"step": frames, "values": {key: value}}`` each time the values changed, the donor's history
included, so the run that produced the final weights can be replayed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from memcores.agents.files import write_text_atomic
from memcores.experiments.search import override_text, round_params
from memcores.experiments.trials import DONE, Trial, run_trial, trial_done

SCHEDULE_FILE = "pbt_schedule.json"
SECONDS_FILE = "pbt_seconds.txt"
"""The member's own training seconds so far, over all its segments (not the donors')."""
CHECKPOINT = "checkpoints/last.pt"


def checkpoint_step(checkpoint: Path) -> int:
    """The frame count stored in a trainer checkpoint."""
    from memcores.agents.checkpoint import load_rl_checkpoint

    return int(load_rl_checkpoint(checkpoint)["step"])


def save_member(run_dir: Path, schedule: list[dict[str, Any]], dest: Path) -> None:
    """Write what another member needs to continue this one into folder ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / CHECKPOINT, dest / "last.pt")
    if (run_dir / "progress.csv").is_file():
        shutil.copyfile(run_dir / "progress.csv", dest / "progress.csv")
    (dest / SCHEDULE_FILE).write_text(json.dumps(schedule))


def restore_member(source: Path, run_dir: Path) -> tuple[int, list[dict[str, Any]]]:
    """Put the member saved in ``source`` (:func:`save_member`) into ``run_dir``, whose next
    training resumes from it; returns its step and schedule."""
    (run_dir / CHECKPOINT).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "last.pt", run_dir / CHECKPOINT)
    if (source / "progress.csv").is_file():
        shutil.copyfile(source / "progress.csv", run_dir / "progress.csv")
    return checkpoint_step(run_dir / CHECKPOINT), json.loads((source / SCHEDULE_FILE).read_text())


def run_member(
    trial: Trial,
    params: Mapping[str, Any],
    source: Path | None,
    report: Callable[[dict[str, float], Path | None], None],
    command_line: str = "",
    interval: int = 1,
) -> dict[str, float]:
    """Train one PBT member with hyperparameters ``params``, from the saved member
    ``source`` when given (an exploit, or this member paused and continued).

    :param report: ``report(metrics, saved)``: every logged row, with a folder written by
        :func:`save_member` (deleted after the call) on the first row at or past each
        multiple of ``interval`` steps after a new trainer checkpoint: the rows at which
        PBT exploits and explores, so only the checkpoints it can use are kept.
    :returns: the member's last metrics; its record holds ``pbt_schedule``.
    """
    values = round_params(params)
    run_dir = Path(trial.run_dir)
    schedule: list[dict[str, Any]] = []
    step = 0
    if source is not None:
        step, schedule = restore_member(source, run_dir)
    elif (run_dir / CHECKPOINT).is_file() and (run_dir / SCHEDULE_FILE).is_file():
        step = checkpoint_step(run_dir / CHECKPOINT)  # a retry without a Tune checkpoint
        schedule = json.loads((run_dir / SCHEDULE_FILE).read_text())
    if not schedule or schedule[-1]["values"] != values:
        schedule.append({"step": step, "values": values})
    write_text_atomic(run_dir / SCHEDULE_FILE, json.dumps(schedule, indent=1))
    member = dataclasses.replace(
        trial, overrides=[*trial.overrides, *(f"{k}={override_text(v)}" for k, v in values.items())]
    )

    # A member trains in segments (paused, cloned); its record's wall time is their sum.
    seconds_file = run_dir / SECONDS_FILE
    before = float(seconds_file.read_text()) if seconds_file.is_file() else 0.0
    start = time.perf_counter()

    def seconds() -> float:
        # Unrounded: a member that trains one short update takes well under 0.1 s; the record
        # keeps milliseconds (experiments.records), and only printed times are rounded.
        return before + time.perf_counter() - start

    fresh = [False]  # a trainer checkpoint not yet handed to PBT
    last_saved = [step // interval]

    def on_row(metrics: dict[str, float], ckpt_run: str | None) -> None:
        seconds_file.write_text(repr(seconds()))
        fresh[0] = fresh[0] or ckpt_run is not None
        period = int(metrics.get("step", 0)) // interval
        if not fresh[0] or period == last_saved[0]:
            report(metrics, None)
            return
        fresh[0], last_saved[0] = False, period
        with tempfile.TemporaryDirectory() as tmp:
            save_member(run_dir, schedule, Path(tmp))
            report(metrics, Path(tmp))

    def extra() -> dict[str, Any]:
        return {"pbt_schedule": schedule, "wall_seconds": seconds()}

    # A clone continues the donor's checkpoint, trained with the donor's seed; the member
    # keeps its own seed for the environments it resets from now on.
    allowed = [*values, "train.seed"]
    return run_trial(member, on_row, command_line, extra=extra, allow_changes=allowed)


def pbt_trainable(config: dict[str, Any]) -> None:
    """Ray Tune function trainable of one PBT member (see :func:`run_member`)."""
    from ray import tune

    # After an exploit, config is the clone's (mutated): only the Tune trial name says who
    # this member is.
    trial = Trial(**config["members"][tune.get_context().get_trial_name()])
    if trial_done(trial):
        tune.report({DONE: 1, "memcores_skipped": 1, "step": 0})
        return

    def report(metrics: dict[str, float], saved: Path | None) -> None:
        checkpoint = tune.Checkpoint.from_directory(str(saved)) if saved else None
        tune.report(metrics, checkpoint=checkpoint)

    checkpoint = tune.get_checkpoint()
    params = config.get("params", {})
    with tempfile.TemporaryDirectory() as tmp:
        source = None
        if checkpoint is not None:  # copied: Tune may delete it once this member reports
            checkpoint.to_directory(tmp)
            source = Path(tmp)
        command_line = config.get("command_line", "")
        interval = int(config.get("perturbation_interval", 1))
        final = run_member(trial, params, source, report, command_line, interval)
    tune.report({**final, DONE: 1})
