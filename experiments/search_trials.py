"""One point of a random or Optuna search: the same sampled config run on every seed.

A point is one Tune trial. It runs the sweep's seed trials (``--grid train.seed=0,1``: the
same seeds for every point) one after the other, each in its own run folder
``SWEEP/<point>,seed=S`` with its own record ``RESULTS/<point>,seed=S``, and reports the mean
over seeds of the last value of ``--metric``: the one number Optuna's search needs per point.
A seed whose record exists is not run again; its value is read from the record, so a re-run
tells the search algorithm the same results.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memcores.experiments.search import override_text, point_name, round_params
from memcores.experiments.trials import DONE, Trial, run_trial, trial_done


def seed_trials(templates: Sequence[Trial], values: Mapping[str, Any]) -> list[Trial]:
    """The trials of one point: each seed template with the point's ``values`` added.

    :param templates: the sweep's trials without the point (one per seed, named ``seed=S``).
    """
    point = point_name(values)
    sampled = [f"{key}={override_text(value)}" for key, value in values.items()]
    trials = []
    for t in templates:
        name = point if t.name == "trial" else f"{point},{t.name}"
        run_dir = str(Path(t.run_dir).parent / name)
        own = [o for o in t.overrides if not o.startswith("run.dir=")]
        trials.append(
            dataclasses.replace(
                t,
                name=name,
                overrides=[*own, *sampled, f"run.dir={run_dir}"],
                run_dir=run_dir,
                record_dir=str(Path(t.record_dir).parent / name),
                assignment={**t.assignment, **{k: str(v) for k, v in values.items()}},
            )
        )
    return trials


def recorded_final(trial: Trial) -> dict[str, float]:
    """The final metrics in a finished trial's record."""
    record = json.loads((Path(trial.record_dir) / "record.json").read_text())
    return dict(record.get("final") or {})


def mean(values: Sequence[float]) -> float:
    """The mean of the finite values (NaN when there is none)."""
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def run_point(
    templates: Sequence[Trial],
    params: Mapping[str, Any],
    metric: str | None,
    report: Callable[[dict[str, float]], None],
    command_line: str = "",
) -> dict[str, Any]:
    """Run every seed of one point (skipping seeds with a record); returns the point's last
    result: ``metric`` = mean over seeds, ``memcores_seed_values``, ``step`` = frames or
    updates summed over seeds.

    ``report`` gets every logged row, with ``metric`` replaced by the running mean over the
    seeds so far (rows where it is not yet a number are not reported).
    """
    values = round_params(params)
    trials = seed_trials(templates, values)
    finals: list[float] = []
    steps, skipped = 0, 0
    for trial in trials:
        if trial_done(trial):
            last = recorded_final(trial)
            skipped += 1
        else:

            def on_row(row: dict[str, float], _ckpt: str | None, before: int = steps) -> None:
                row = {**row, "step": before + row.get("step", 0)}
                if metric:
                    row[metric] = mean([*finals, row.get(metric, math.nan)])
                    if not math.isfinite(row[metric]):
                        return
                report(row)

            last = run_trial(trial, on_row, command_line)
        finals.append(float(last.get(metric, math.nan)) if metric else math.nan)
        steps += int(last.get("step", 0))
    result: dict[str, Any] = {"step": steps, DONE: 1, "memcores_point": point_name(values)}
    if metric:
        result[metric] = mean(finals)
        result["memcores_seed_values"] = json.dumps(finals)
    if skipped == len(trials):
        result["memcores_skipped"] = 1
    return result


def point_trainable(config: dict[str, Any]) -> None:
    """Ray Tune function trainable of one search point (see :func:`run_point`)."""
    from ray import tune

    templates = [Trial(**spec) for spec in config["seeds"]]
    result = run_point(
        templates,
        config.get("params", {}),
        config.get("metric"),
        tune.report,
        config.get("command_line", ""),
    )
    tune.report(result)
