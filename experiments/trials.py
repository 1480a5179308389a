"""One sweep trial, run in-process: the trainer call, its reports, its records.

:func:`run_trial` trains a :class:`Trial` with ``agents.rl_trainer.train`` or
``agents.supervised.train`` (a transfer trial: each env pair of its suite, then evaluation on
both envs of the pair), hands every logged row to a ``report`` callback and writes the records
(:mod:`experiments.records`) when it finishes. :func:`trainable` wraps it as a Ray Tune function
trainable; the sweep's no-Ray path calls :func:`run_trial` directly.
"""

from __future__ import annotations

import dataclasses
import inspect
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from memcores.experiments.commands.transfer import TRANSFER_KEYS, resolve_pair_overrides
from memcores.experiments.config import (
    ConfigError,
    build,
    parse_override,
    read_yaml_mapping,
    set_dotted,
)
from memcores.experiments.records import has_record, write_record
from memcores.experiments.search import SWEEP_KEYS

DONE = "memcores_done"
"""Reported (= 1) with a trial's last result: it ran its whole budget."""


@dataclasses.dataclass
class TrialResult:
    """How a trial ended. ``status``: ok | skipped | stopped (early, by ASHA) | timeout |
    failed | cancelled (a PBT member stopped because another failed) | interrupted (the
    sweep was stopped by Ctrl-C before it finished; no record, a re-run resumes it)."""

    name: str
    status: str
    seconds: float = 0.0
    message: str = ""
    step: int = 0
    value: float | None = None
    """The sweep's ``--metric`` in the trial's last result (a search point: mean over seeds)."""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped", "stopped")


@dataclasses.dataclass
class Trial:
    """One grid point, everything :func:`run_trial` needs (plain data: it travels to Tune).

    :param overrides: every dotted override of the trial's config (``run.dir`` included,
        except for transfer trials: each env pair has its own run folder under ``run_dir``).
    :param transfer: ``suite``, ``episodes``, ``argmax`` of a transfer trial.
    """

    name: str
    command: str
    config: str
    overrides: list[str]
    run_dir: str
    record_dir: str
    assignment: dict[str, str] = dataclasses.field(default_factory=dict)
    transfer: dict[str, Any] = dataclasses.field(default_factory=dict)

    def cli(self) -> str:
        """The equivalent ``memcores`` command line of this trial."""
        if self.command != "transfer":
            return shlex.join(["memcores", self.command, self.config, *self.overrides])
        t = self.transfer
        words = ["memcores", "transfer", t["suite"], *self.overrides, "--config", self.config]
        words += ["--out", self.run_dir, "--episodes", str(t["episodes"])]
        return shlex.join(words + (["--argmax"] if t["argmax"] else []))


def trial_config(
    trial: Trial, run_dir: str | Path | None = None, env_id: str = "", pair: Sequence[str] = ()
) -> Any:
    """The trial's full config object (``RLConfig`` or ``SupervisedConfig``), validated.
    A transfer trial's pair: its ``run_dir``, train ``env_id`` and ``pair`` overrides.

    :raises ConfigError: a wrong key or value; the message names the trial.
    """
    from memcores.agents.rl_config import RLConfig
    from memcores.agents.supervised_config import SupervisedConfig

    skip = (*TRANSFER_KEYS, *SWEEP_KEYS)
    raw = {k: v for k, v in read_yaml_mapping(trial.config).items() if k not in skip}
    extra = [f"run.dir={run_dir}"] if run_dir else []
    extra += [f"env.id={env_id}"] if env_id else []
    extra += list(pair)
    for item in [*trial.overrides, *extra]:
        set_dotted(raw, *parse_override(item))
    schema = SupervisedConfig if trial.command == "supervised" else RLConfig
    try:
        return build(schema, raw, prefix="")
    except ConfigError as err:
        raise ConfigError(f"trial {trial.name}: {err}") from None


def validate_trials(trials: Sequence[Trial]) -> None:
    """Check every trial's full config (keys, values, core name and core options, transfer
    suite) before anything is created, as the trainers would check it.

    :raises ConfigError: the first wrong trial, named in the message.
    """
    from memcores.agents.device import resolve_device
    from memcores.cores import CORES, make_core
    from memcores.envs.suites import SUITES

    for trial in trials:
        config = trial_config(trial)
        try:  # what `train` and `supervised` refuse before they build anything
            config.check_device(resolve_device(config.train.device))
        except ValueError as err:
            raise ConfigError(f"trial {trial.name}: {err}") from None
        core = config.core
        if core.name not in CORES:
            raise ConfigError(
                f"trial {trial.name}: unknown core {core.name!r}; valid: {', '.join(CORES)}"
            )
        try:
            make_core(core.name, 4, core.hidden_size, **core.options)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"trial {trial.name}: core.{core.name}: {err}") from None
        suite = trial.transfer.get("suite")
        if suite is not None and suite not in SUITES:
            raise ConfigError(
                f"trial {trial.name}: unknown suite {suite!r}; valid: {', '.join(SUITES)}"
            )
        if suite is not None:
            for train_id, pair in _pair_overrides(trial).items():
                trial_config(trial, Path(trial.run_dir), train_id, pair)


# --------------------------------------------------------------------------- metrics
TRANSFER_TAGS = ("transfer/pairs_done", "transfer/test_return")
"""What a transfer trial reports after each env pair, besides its trainer's rows."""


def check_metric(metric: str, command: str, flag: str = "--metric") -> None:
    """Whether trials of ``command`` log ``metric`` (the tags their trainer logs).

    :raises ValueError: they do not; one line naming ``flag`` and the valid tags.
    """
    if command == "supervised":
        from memcores.agents.supervised import LOGGED_TAGS, TRANSFER_PREFIX

        tags = list(LOGGED_TAGS)
        if metric.startswith(TRANSFER_PREFIX) and metric.count("/") == 2:
            return  # transfer/<variant>/<metric>: the variants are the task's
        tags.append(f"{TRANSFER_PREFIX}<variant>/<metric>")
    else:
        from memcores.agents.rl_trainer import RECON_TAG, ROW_TAGS, VALUE_TAGS

        tags = [
            *ROW_TAGS,
            RECON_TAG,
            *VALUE_TAGS,
            *(TRANSFER_TAGS if command == "transfer" else ()),
        ]
    if metric not in tags:
        raise ValueError(
            f"{flag} {metric!r} is not logged by `memcores {command}` trials; valid: "
            f"{', '.join(tags)}"
        )


# --------------------------------------------------------------------------- one trial
def record_dirs(trial: Trial) -> list[Path]:
    """Where the trial's records go: one folder, or one per env pair of a transfer trial."""
    if trial.command != "transfer":
        return [Path(trial.record_dir)]
    from memcores.envs.suites import SUITES
    from memcores.experiments.commands.transfer import pair_record_names

    pairs = SUITES[trial.transfer["suite"]].pairs
    return [Path(trial.record_dir) / name for name in pair_record_names(pairs)]


def trial_done(trial: Trial) -> bool:
    """Whether every record of the trial exists (then a sweep skips it)."""
    return all(has_record(d) for d in record_dirs(trial))


Report = Callable[[dict[str, float], str | None], None]
"""``report(metrics, checkpoint_run_dir)``: how a running trial tells its driver."""


def node_name() -> str:
    """The machine a trial runs on: host name, and the Ray node's IP inside a Ray worker."""
    host = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return f"{host} ({ray.util.get_node_ip_address()})"
    return host


def resume_options(train_fn: Callable[..., Any], allow_changes: Sequence[str]) -> dict[str, Any]:
    """Keyword arguments that let ``train_fn`` resume with ``allow_changes`` changed.

    A trainer that refuses changed keys on resume takes the allowed ones as
    ``allow_changes``; one without that parameter resumes with the config it is given.
    """
    if allow_changes and "allow_changes" in inspect.signature(train_fn).parameters:
        return {"allow_changes": tuple(allow_changes)}
    return {}


def run_trial(
    trial: Trial,
    report: Report,
    command_line: str = "",
    *,
    extra: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    allow_changes: Sequence[str] = (),
) -> dict[str, float]:
    """Train the trial in this process and write its record; returns its last metrics.

    Every logged row goes to ``report`` (with the run folder when a new trainer checkpoint was
    written since the last report). An interrupted trial resumes from its run folder's
    checkpoint. Each row carries the latest value of every tag, so a scheduler always finds
    its metric. The record says which node ran the trial.

    :param extra: more fields of the record (or a function returning them at the end).
    :param allow_changes: config keys that may differ from the checkpoint's on resume (the
        hyperparameters a PBT exploit changes).
    """
    from memcores.agents.checkpoint import checkpoint_path

    latest: dict[str, float] = {}
    start = time.perf_counter()
    if trial.command == "transfer":
        return _run_transfer(trial, report, latest, command_line)
    run_dir = Path(trial.run_dir)
    ckpt = checkpoint_path(run_dir)  # both trainers' layout (or a supervised run's earlier one)
    resumed = ckpt.is_file()
    on_log = _reporter(report, latest, ckpt, run_dir)
    config = trial_config(trial)
    config.run.overwrite = True  # the sweep owns its trial folders: no checkpoint, no run
    if trial.command == "supervised":
        from memcores.agents.supervised import train as train_supervised

        options = resume_options(train_supervised, allow_changes) if resumed else {}
        train_supervised(config, resume=resumed, on_log=on_log, **options)
    else:
        from memcores.agents.rl_trainer import train

        options = resume_options(train, allow_changes) if resumed else {}
        train(config, run_dir, resume=resumed, on_log=on_log, **options)
    wall = None if resumed else time.perf_counter() - start
    more = extra() if callable(extra) else dict(extra or {})
    write_record(
        run_dir,
        trial.record_dir,
        command=command_line or trial.cli(),
        wall_seconds=wall,
        extra={"trial_command": trial.cli(), "node": node_name(), **more},
    )
    return latest


def _reporter(report: Report, latest: dict, ckpt: Path, run_dir: Path) -> Callable:
    seen = [ckpt.stat().st_mtime_ns if ckpt.is_file() else 0]

    def on_log(row: dict[str, float]) -> None:
        latest.update(row)
        stamp = ckpt.stat().st_mtime_ns if ckpt.is_file() else 0
        report(dict(latest), str(run_dir) if stamp != seen[0] else None)
        seen[0] = stamp

    return on_log


def _pair_overrides(trial: Trial) -> dict[str, list[str]]:
    """The transfer trial's ``pair_overrides``, per train env (ConfigError if malformed)."""
    from memcores.envs.suites import SUITES

    suite = trial.transfer["suite"]
    spec = trial.transfer.get("pair_overrides")
    try:
        return resolve_pair_overrides(spec, suite, SUITES[suite].pairs, Path(trial.run_dir))
    except ValueError as err:
        raise ConfigError(f"trial {trial.name}: {err}") from None


def _run_transfer(trial: Trial, report: Report, latest: dict, command_line: str) -> dict:
    """Each env pair of the suite: train (resuming), evaluate on both envs, record."""
    from memcores.agents.evaluation import evaluate_run
    from memcores.agents.rl_trainer import CHECKPOINT_NAME, train
    from memcores.envs.suites import SUITES
    from memcores.experiments.commands.transfer import short_name, table_row, write_table_csv

    t, rows = trial.transfer, []
    per_pair, records = _pair_overrides(trial), record_dirs(trial)
    for i, (train_id, test_id) in enumerate(SUITES[t["suite"]].pairs):
        run_dir = Path(trial.run_dir) / short_name(train_id)
        config = trial_config(trial, run_dir, train_id, per_pair[train_id])
        config.run.overwrite = True
        ckpt = run_dir / CHECKPOINT_NAME
        on_log = _reporter(report, latest, ckpt, Path(trial.run_dir))
        result = train(config, run_dir, resume=ckpt.is_file(), on_log=on_log)
        results = {
            env_id: evaluate_run(run_dir, env_id, int(t["episodes"]), bool(t["argmax"]))
            for env_id in (train_id, test_id)
        }
        evals = {
            env_id: {"return": r.mean_return, "success": r.success_rate, "episodes": r.episodes}
            for env_id, r in results.items()
        }
        rows.append(
            table_row(
                train_id,
                test_id,
                config,
                result.global_step,
                results[train_id],
                results[test_id],
                t["episodes"],
                run_dir,
            )
        )
        write_record(
            run_dir,
            records[i],
            eval_results=evals,
            command=command_line or trial.cli(),
            policy=True,
            extra={"trial_command": trial.cli(), "test_env": test_id, "node": node_name()},
        )
        latest.update(dict(zip(TRANSFER_TAGS, (i + 1, rows[-1]["test_return"]), strict=True)))
        report(dict(latest), None)
        write_table_csv(Path(trial.run_dir) / "table.csv", rows)
    return latest


def trainable(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: one trial, reporting while it trains.

    Tune's checkpoint holds a pointer to the trial's run folder (whose trainer checkpoint is
    what a retried or restored trial resumes from), so nothing large is copied per report.
    """
    import tempfile

    from ray import tune

    trial = Trial(**config["trial"])
    if trial_done(trial):  # committed by an earlier run of this sweep
        tune.report({DONE: 1, "memcores_skipped": 1, "step": 0})
        return

    def report(metrics: dict[str, float], run_dir: str | None) -> None:
        if run_dir is None:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "run_dir.txt").write_text(run_dir)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))

    final = run_trial(trial, report, config.get("command_line", ""))
    tune.report({**final, DONE: 1})
