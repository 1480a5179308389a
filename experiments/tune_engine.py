"""Ray Tune engine of ``memcores sweep``: connect to Ray, run or restore the Tune experiment
of a sweep folder, and turn Tune's results into :class:`~experiments.trials.TrialResult`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.files import write_text_atomic
from experiments.trials import DONE, Trial, TrialResult, trainable

if TYPE_CHECKING:
    from experiments.sweep import SweepOptions

TUNE_DIR = ".tune"
"""Tune's experiment inside a sweep folder (hidden: readers of run folders skip it)."""
# The settings Tune stores in its experiment: Tuner.restore keeps the stored ones and ignores
# new values, so a re-run that changes any of them starts a new Tune experiment instead.
TUNE_SETTINGS_FILE = "tune_settings.json"
TUNE_SETTINGS = (
    "max_concurrent",
    "cpus",
    "gpus",
    "max_failures",
    "scheduler",
    "metric",
    "mode",
    "grace_period",
    "timeout",
)


def ray_available() -> bool:
    """Whether Ray Tune can be imported (the ``memcores[ray]`` extra)."""
    try:
        from ray import tune  # noqa: F401
    except ImportError:
        return False
    return True


def connect_ray(address: str | None, cpus: int) -> bool:
    """Connect to the cluster at ``address`` or start a private local Ray with ``cpus`` CPUs;
    returns whether this call did it (then the caller shuts Ray down).

    :raises RuntimeError: nothing answers at ``address`` (checked first: Ray itself retries
        an unreachable address for minutes).
    """
    import socket

    match = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", (address or "").strip())
    if match:
        try:
            socket.create_connection((match.group(1), int(match.group(2))), timeout=10).close()
        except OSError as err:
            raise RuntimeError(
                f"no Ray cluster answers at {address} ({err}); start one with `ray start "
                "--head` or check the address"
            ) from None
    import ray

    if ray.is_initialized():
        return False
    threads = {v: "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if v not in os.environ}
    runtime_env = {"env_vars": threads}
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level="WARNING")
    else:
        ray.init(
            num_cpus=cpus, include_dashboard=False, runtime_env=runtime_env, logging_level="WARNING"
        )
    return True


def run_tune(
    trials: Sequence[Trial],
    out: Path,
    o: SweepOptions,
    command_line: str,
    trial_fn: Callable | None,
    echo: Callable,
) -> dict[str, TrialResult]:
    """Run (or restore) the sweep's Tune experiment in ``out/.tune``; results by trial name."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # no console tables: we print a summary
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # relative paths in configs work
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # skipped trials
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    resources = {"cpu": o.cpus, **({"gpu": o.gpus} if o.gpus else {})}
    fn = tune.with_resources(trial_fn or trainable, resources)
    path = out / TUNE_DIR
    settings_file = out / TUNE_SETTINGS_FILE
    settings = tune_settings(o)
    restore = tune.Tuner.can_restore(path)
    changed = settings_change(_read_json(settings_file), settings) if restore else ""
    if changed:
        # Nothing is lost: Tune's checkpoints only point at the trials' run folders.
        echo(
            f"Tune settings changed ({changed}): a new Tune experiment; finished trials are "
            "skipped by their records, unfinished ones resume from their run folders"
        )
        shutil.rmtree(path)
        restore = False
    write_text_atomic(settings_file, json.dumps(settings, indent=2))
    if restore:
        echo(f"restoring the Tune experiment in {path}")
        tuner = tune.Tuner.restore(str(path), fn, resume_errored=True)
    else:
        specs = [{"trial": dataclasses.asdict(t), "command_line": command_line} for t in trials]
        scheduler = None
        if o.scheduler == "asha":
            scheduler = ASHAScheduler(
                time_attr="step",
                metric=o.metric,
                mode=o.mode,
                grace_period=o.grace_period,
                max_t=10**12,
            )
        tuner = tune.Tuner(
            fn,
            param_space=tune.grid_search(specs),
            tune_config=tune.TuneConfig(
                max_concurrent_trials=o.max_concurrent,
                scheduler=scheduler,
                trial_name_creator=lambda t: t.config["trial"]["name"],
                trial_dirname_creator=lambda t: t.config["trial"]["name"],
            ),
            run_config=tune.RunConfig(
                storage_path=str(out),
                name=TUNE_DIR,
                verbose=0,
                stop={"time_total_s": o.timeout} if o.timeout else None,
                failure_config=tune.FailureConfig(max_failures=o.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            ),
        )
    grid = tuner.fit()
    return {r.name: r for r in map(tune_result(o), grid)}


def tune_settings(o: SweepOptions) -> dict[str, Any]:
    """The options that a Tune experiment stores and a restore cannot change."""
    return {k: getattr(o, k) for k in TUNE_SETTINGS}


def settings_change(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """``"max_concurrent 1 -> 2"`` for what differs; "" when nothing does. A missing record
    (an experiment from before settings were recorded) counts as changed."""
    if old is None:
        return "no record of the previous settings"
    return ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tune_result(o: SweepOptions) -> Callable[[Any], TrialResult]:
    """A function turning one of Tune's results into a :class:`TrialResult`."""

    def convert(result: Any) -> TrialResult:
        name = result.config["trial"]["name"]
        metrics = result.metrics or {}
        seconds = float(metrics.get("time_total_s", 0.0))
        step = int(metrics.get("step", 0))
        if result.error is not None:
            lines = [line for line in str(result.error).splitlines() if line.strip()]
            return TrialResult(name, "failed", seconds, lines[-1] if lines else "error", step)
        if metrics.get("memcores_skipped"):
            return TrialResult(name, "skipped")
        if metrics.get(DONE):
            return TrialResult(name, "ok", seconds, "", step)
        if o.timeout and seconds >= o.timeout:
            return TrialResult(name, "timeout", seconds, f"stopped after {o.timeout:g}s", step)
        return TrialResult(name, "stopped", seconds, f"stopped early at step {step}", step)

    return convert
