"""Grid sweeps on Ray Tune: each trial calls a trainer in-process and reports while it trains.

``memcores sweep CONFIG --grid core.name=lstm,ur_lstm --grid train.seed=0,1`` makes one trial per
grid point. A trial is a Tune function trainable (:func:`trainable`) that runs
``agents.rl_trainer.train`` / ``agents.supervised.train`` (or a transfer suite: train on each
small env, evaluate on it and on its large twin) and reports every logged row to Tune, with a
Tune checkpoint that points at the trial's own run folder. Tune then provides what a sweep
needs: retries (``FailureConfig``), resume of an interrupted sweep (``Tuner.restore``), early
stopping (ASHA), a cluster (``--address``), resources per trial, per-trial time limits.

Layout::

    SWEEP/sweep.json              what was asked, and each trial's last outcome
    SWEEP/<trial>/                the trial's run folder (config.yaml, progress.csv, events, ...)
    SWEEP/<trial>/trial.json      the trial's outcome (status, seconds, message)
    SWEEP/.tune/                  Tune's experiment (restored when the same sweep is re-run)
    RESULTS/<sweep>/<trial>/      the finished trial's record (see :mod:`experiments.records`)

A trial whose record exists under RESULTS is skipped, so a fresh clone with committed
records re-runs only what is missing. The check runs again before each trial starts, so sweeps
in two processes (disjoint ``--out`` folders, one ``--results``) skip what the other finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcores.agents.files import write_text_atomic
from memcores.experiments.config import config_path as config_file
from memcores.experiments.config import parse_override, read_yaml_mapping
from memcores.experiments.records import write_record
from memcores.experiments.search import trial_name
from memcores.experiments.sweep_options import (
    SweepError,
    SweepOptions,
)
from memcores.experiments.trials import (
    TRANSFER_KEYS,
    Trial,
    TrialResult,
    check_metric,
    run_trial,
    trial_config,
    trial_done,
)
from memcores.experiments.tune_engine import (
    check_machine,
    check_resources,
    cluster_nodes,
    connect_ray,
    ray_available,
    run_tune,
    trial_resources,
)

if TYPE_CHECKING:
    from memcores.experiments.search import Dist

COMMANDS = ("train", "supervised", "transfer")
TRIAL_FILE = "trial.json"
SWEEP_FILE = "sweep.json"


# --------------------------------------------------------------------------- grid and trials
def parse_grid(items: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``["core.name=lstm,ur_lstm", "train.seed=0,1"]`` -> ``[("core.name", ["lstm", ...]), ...]``.

    Values stay strings (parsed like any override); they cannot hold commas.
    """
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, text = (s.strip() for s in item.partition("="))
        if not sep or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key):
            raise SweepError(f"--grid {item!r} must look like section.key=value1,value2")
        values = [v.strip() for v in text.split(",")]
        if not text or not all(values):
            raise SweepError(f"--grid {item!r} has an empty value; give value1,value2,...")
        if key in dict(grid):
            raise SweepError(f"--grid key {key!r} is given twice; put all its values in one --grid")
        if len(set(values)) != len(values):
            raise SweepError(f"--grid {item!r} repeats a value")
        if key == "run.dir":
            raise SweepError("run.dir cannot be swept: each trial's run.dir is set by the sweep")
        grid.append((key, values))
    return grid


def _check_folder(flag: str, path: Path) -> None:
    """A folder the sweep can create or write into.

    :raises SweepError: ``path`` is a file, or its nearest existing ancestor is a file or
        read-only.
    """
    if path.exists() and not path.is_dir():
        raise SweepError(f"{flag} {path} is a file; give a folder")
    ancestor = next(p for p in [path, *path.parents] if p.exists())
    if not ancestor.is_dir():
        raise SweepError(f"{flag} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise SweepError(f"{flag} {path}: cannot create it, {ancestor} is read-only")


def expand_grid(grid: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """The cartesian product of the grid, the last key varying fastest (like nested loops)."""
    keys = [k for k, _ in grid]
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in grid))
    ]


def infer_command(config: dict[str, Any]) -> str:
    """``task:`` section -> supervised, ``suite:`` key -> transfer, else train."""
    return "supervised" if "task" in config else "transfer" if "suite" in config else "train"


def _check_overrides(overrides: Sequence[str], grid_keys: set[str]) -> None:
    if any(parse_override(o)[0] == "run.dir" for o in overrides):
        raise SweepError("run.dir cannot be overridden: each trial's run.dir is set by the sweep")
    clash = [o for o in overrides if parse_override(o)[0] in grid_keys]
    if clash:
        raise SweepError(f"override(s) {clash} also appear in --grid; keep one of them")


def _transfer_args(raw: dict, overrides: Sequence[str], grid_keys: set[str], command: str) -> dict:
    """``suite``/``episodes``/``argmax`` of a transfer sweep from its config and overrides."""
    if command != "transfer":
        if "suite" in grid_keys:
            raise SweepError("--grid suite=... is for transfer sweeps (--command transfer)")
        return {}
    bad = [k for k in grid_keys if k in TRANSFER_KEYS and k != "suite"]
    if bad:
        raise SweepError(f"--grid {bad[0]} cannot be swept; valid transfer grid key: suite")
    args = {"episodes": 100, "argmax": False, **{k: raw[k] for k in TRANSFER_KEYS if k in raw}}
    args.update(parse_override(o) for o in overrides if parse_override(o)[0] in TRANSFER_KEYS)
    return args


def make_trials(
    config_path: str | Path,
    grid: Sequence[tuple[str, Sequence[str]]],
    out_dir: str | Path,
    *,
    command: str | None = None,
    overrides: Sequence[str] = (),
    results_dir: str | Path | None = None,
) -> tuple[str, list[Trial]]:
    """Build the sweep's trials in grid order; nothing is written.

    :param results_dir: where records go (``results_dir/<trial>``); default
        ``results/<name of out_dir>``.
    :raises SweepError: bad grid/override/command; ``ConfigError`` for a missing config file.
    """
    config_path = config_file(config_path).resolve()  # a shipped config by name, too
    raw = read_yaml_mapping(config_path)
    command = command or infer_command(raw)
    if command not in COMMANDS:
        raise SweepError(f"unknown trial command {command!r}; valid: {', '.join(COMMANDS)}")
    grid_keys = {k for k, _ in grid}
    _check_overrides(overrides, grid_keys)
    transfer = _transfer_args(raw, overrides, grid_keys, command)
    overrides = [o for o in overrides if parse_override(o)[0] not in TRANSFER_KEYS]
    out = Path(out_dir).resolve()
    results = Path(results_dir or Path("results") / out.name).resolve()
    _check_folder("--out", out)
    _check_folder("--results", results)
    trials, names = [], set()
    for assignment in expand_grid(grid):
        name = trial_name(assignment)
        if name in names:  # two values that sanitise to the same folder name
            raise SweepError(f"two grid points map to the same trial folder {name!r}")
        names.add(name)
        dotted = [f"{k}={v}" for k, v in assignment.items() if k not in TRANSFER_KEYS]
        run_dir = out / name
        args = {**transfer, "suite": str(assignment.get("suite", transfer.get("suite", "")))}
        if command == "transfer" and not args["suite"]:
            raise SweepError("a transfer sweep needs `suite: NAME` in the config or --grid suite=")
        own = [] if command == "transfer" else [f"run.dir={run_dir}"]
        trials.append(
            Trial(
                name,
                command,
                str(config_path),
                [*overrides, *dotted, *own],
                str(run_dir),
                str(results / name),
                dict(assignment),
                args if command == "transfer" else {},
            )
        )
    return command, trials


# --------------------------------------------------------------------------- the sweep
def prepare_folder(out: Path, meta: dict[str, Any]) -> Any:
    """Create the sweep folder, take its lock (one driver per sweep folder) and check that it
    holds this sweep and no other; returns the held lock.

    :raises SweepError: the folder is a file, unwritable, busy or holds another sweep.
    """
    from memcores.agents.run_lock import RunFolderBusy, RunLock

    lock = RunLock(out, "memcores sweep")
    try:
        lock.acquire()
    except (OSError, RunFolderBusy) as err:
        raise SweepError(f"sweep folder: {err}") from None
    try:
        old = json.loads((out / SWEEP_FILE).read_text()) if (out / SWEEP_FILE).is_file() else {}
        if old and not same_sweep(old.get("spec"), meta):
            raise SweepError(
                f"{out} holds another sweep (other config, grid or overrides: was "
                f"{old.get('spec')}); use another --out or delete that folder"
            )
        write_text_atomic(out / SWEEP_FILE, json.dumps({**meta, "state": "running"}, indent=2))
    except BaseException:
        lock.release()
        raise
    return lock


def sweep_meta(config: str | Path, command: str, grid: Sequence, overrides: Sequence[str]) -> dict:
    """What identifies a sweep: the config's values, command, grid and overrides.

    The config is identified by a hash of its parsed values, so a comment or layout edit to
    the file does not make its sweep folder refuse to resume.
    """
    values = json.dumps(read_yaml_mapping(config), sort_keys=True, default=str)
    spec = {
        "config_values_sha256": hashlib.sha256(values.encode()).hexdigest(),
        "command": command,
        "grid": [list(kv) for kv in grid],
        "overrides": list(overrides),
    }
    return {
        "config": str(config_file(config).resolve()),
        "command": command,
        "grid": dict(grid),
        "overrides": list(overrides),
        "spec": spec,
        "file_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest(),
    }


def same_sweep(old_spec: dict[str, Any] | None, meta: dict[str, Any]) -> bool:
    """Whether a folder's recorded ``spec`` is the sweep ``meta`` describes. A folder written
    when the spec held the file's byte hash (``config_sha256``) matches an unchanged file."""
    if isinstance(old_spec, dict) and "config_sha256" in old_spec:
        rest = {k: v for k, v in old_spec.items() if k != "config_sha256"}
        new = {k: v for k, v in meta["spec"].items() if k != "config_values_sha256"}
        return old_spec["config_sha256"] == meta.get("file_sha256") and rest == new
    return old_spec == meta["spec"]


def run_sweep(
    trials: Sequence[Trial],
    out_dir: str | Path,
    options: SweepOptions | None = None,
    *,
    meta: dict[str, Any] | None = None,
    command_line: str = "",
    echo: Callable[[str], None] = print,
    trial_fn: Callable[[dict[str, Any]], None] | None = None,
    space: dict[str, Dist] | None = None,
) -> list[TrialResult]:
    """Run every trial without a record; returns one result per trial, in grid order (per
    point, best first, for a random or Optuna search).

    :param trials: the grid's trials (for a search: one per seed, every point runs them all).
    :param trial_fn: the Tune trainable (default: that of the sweep's mode).
    :param space: the config's ``search:`` space (``--search random|optuna``, PBT).
    """
    options = options or SweepOptions()
    options.check()
    backend = _resolve_backend(options)
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise SweepError(f"--out {out} is a file; give a folder")
    meta = meta or {"spec": [dataclasses.asdict(t) for t in trials]}
    searching = options.search != "grid"
    check_space(space or {}, options, trials)
    check_mode(options, trials)
    todo = list(trials) if searching else [t for t in trials if not trial_done(t)]
    if todo and backend == "ray" and not options.address:
        _check_machine(options)  # before a private Ray is sized from the request
    _announce(trials, todo, out, backend, options, echo)
    results = {t.name: TrialResult(t.name, "skipped") for t in trials if t not in todo}
    if not todo:
        return [results[t.name] for t in trials]
    # Reach the cluster and check it can hold a trial before writing anything: a wrong
    # address or an impossible request leaves no half sweep (and no trial pending for ever).
    started = backend == "ray" and connect_ray(
        options.address, options.max_concurrent * options.cpus
    )
    try:
        if backend == "ray":
            _check_cluster(options)
        lock = prepare_folder(out, meta)
        try:
            if backend == "ray":
                ran = run_tune(todo, out, options, command_line, trial_fn, echo, space)
            else:
                ran = _run_local(todo, command_line, echo)
            if searching:
                return _write_point_outcomes(ran, out, meta, options, echo)
            results.update(ran)
            _write_outcomes(trials, results, out, meta, command_line)
        except Exception as err:
            # sweep.json must not say "running" about a sweep that ended (Ctrl-C leaves it
            # so: the re-run resumes)
            _write_json(out / SWEEP_FILE, {**meta, "state": "failed", "error": str(err)[:600]})
            raise
        finally:
            lock.release()
    finally:
        if started:
            import ray

            ray.shutdown()
    return [results[t.name] for t in trials]


def _resolve_backend(options: SweepOptions) -> str:
    """The backend the sweep runs on: ``ray`` or ``local`` (``auto``: ray when installed).

    :raises SweepError: Ray is asked for, by ``--backend ray`` or a Ray-only option, but is
        not installed.
    """
    backend = options.backend
    if backend != "local" and not ray_available():
        asked = options.ray_only_options()
        if backend == "ray" or asked:
            what = f"{asked[0]} needs" if asked and backend == "auto" else "--backend ray needs"
            raise SweepError(
                f"{what} Ray Tune, which is not installed: `pip install 'memcores[ray]'` "
                "(or run without it: --backend local)"
            )
        backend = "local"
    elif backend == "auto":
        backend = "ray"
    return backend


def _announce(
    trials: Sequence[Trial],
    todo: Sequence[Trial],
    out: Path,
    backend: str,
    options: SweepOptions,
    echo: Callable[[str], None],
) -> None:
    """The sweep's first line: what runs, what is skipped, and how."""
    if options.search != "grid":
        seeds = ", ".join(t.name for t in trials)
        echo(
            f"sweep {out}: {options.points} points of {options.search} search x "
            f"{len(trials)} seed(s) ({seeds}), points with records skipped, with "
            f"{_how(backend, options)}"
        )
    else:
        echo(
            f"sweep {out}: {len(trials)} trials, {len(trials) - len(todo)} with a record "
            f"(skipped), {len(todo)} to run with {_how(backend, options)}"
        )


def _check_machine(options: SweepOptions) -> None:
    """Whether the local computer can hold one trial (for a private local Ray).

    :raises SweepError: it cannot.
    """
    try:
        check_machine(trial_resources(options))
    except ValueError as err:
        raise SweepError(str(err)) from None
    from memcores.envs.cpus import cpu_cores

    cpus, cores = options.max_concurrent * options.cpus, cpu_cores()
    if cpus > cores:  # a private Ray would offer them all and oversubscribe the cores
        raise SweepError(
            f"--max-concurrent {options.max_concurrent} x --threads-per-trial {options.cpus} "
            f"is {cpus} CPUs, more than the {cores} cores of this computer; give "
            f"--max-concurrent 1..{max(1, cores // options.cpus)} (or a cluster: --address)"
        )


def _check_cluster(options: SweepOptions) -> None:
    """Whether the connected Ray cluster has a node that can hold one trial.

    :raises SweepError: no node can.
    """
    try:
        check_resources(cluster_nodes(), trial_resources(options))
    except ValueError as err:
        raise SweepError(str(err)) from None


def check_space(space: dict[str, Dist], o: SweepOptions, trials: Sequence[Trial]) -> None:
    """A search or PBT needs a ``search:`` space, a search only seeds in its grid, PBT RL
    trials; a ``search:`` space needs one of them.

    :raises SweepError: named in the message.
    """
    pbt = o.scheduler == "pbt"
    if (o.search != "grid" or pbt) and not space:
        what = f"--search {o.search}" if o.search != "grid" else "--scheduler pbt"
        raise SweepError(
            f"{what} samples the config's `search:` section, which it lacks; e.g. "
            "`search: {agent.learning_rate: {loguniform: [0.0001, 0.003]}}`"
        )
    if space and o.search == "grid" and not pbt:
        raise SweepError(
            "the config has a `search:` section: pass --search random|optuna --samples N, or "
            "--scheduler pbt"
        )
    if o.search != "grid":
        other = sorted({k for t in trials for k in t.assignment} - {"train.seed"})
        if other:
            raise SweepError(
                f"--search {o.search}: --grid takes only train.seed (every point runs on the "
                f"same seeds); put {other[0]} in `search:` as {{choice: [...]}}"
            )
        clash = sorted(set(space) & {k for t in trials for k in t.assignment})
        if clash:
            raise SweepError(f"{clash[0]} is both in --grid and in `search:`; keep one")
    if pbt and any(t.command != "train" for t in trials):
        raise SweepError("--scheduler pbt trains RL runs (`memcores train` configs) only")
    if pbt:
        from memcores.agents.rl_config import MUTABLE_HYPERPARAMETERS
        from memcores.agents.run import RESUME_ALLOWED_CHANGES

        # A clone resumes the donor's checkpoint with its own grid values: only keys a resume
        # may change can differ between members (the seed: see experiments.pbt.run_member).
        shared = {"train.seed", *RESUME_ALLOWED_CHANGES} - {"run.dir"}
        differ = [key for key in dict.fromkeys(k for t in trials for k in t.assignment)]
        apart = [key for key in differ if key not in shared]
        if apart:
            raise SweepError(
                f"--scheduler pbt: --grid {apart[0]} gives members different values, but a "
                "member that copies another's checkpoint must run on the same config but for "
                "train.seed; --grid takes train.seed (put a hyperparameter PBT may mutate in "
                f"`search:`, or run one sweep per {apart[0]} value)"
            )

        fixed = [key for key in space if key not in MUTABLE_HYPERPARAMETERS]
        if fixed:
            raise SweepError(
                f"--scheduler pbt cannot mutate {fixed[0]}: a member that copies another's "
                "checkpoint keeps its network, env and rollout; PBT may mutate "
                f"{', '.join(MUTABLE_HYPERPARAMETERS)} (sweep {fixed[0]} with --grid)"
            )


def check_mode(o: SweepOptions, trials: Sequence[Trial]) -> None:
    """The metric is one the trials log; PBT has a population and time to perturb it.

    :raises SweepError: named in the message.
    """
    if o.metric:
        try:
            check_metric(o.metric, trials[0].command)
        except ValueError as err:
            raise SweepError(str(err)) from None
    if o.scheduler != "pbt":
        return
    if len(trials) < 2:
        raise SweepError(
            "--scheduler pbt needs a population of 2 or more members (one per grid point), "
            f"got {len(trials)}; e.g. --grid train.seed=0,1,2,3"
        )
    budget = min(trial_config(t).train.total_steps for t in trials)
    if o.perturbation_interval >= budget:
        raise SweepError(
            f"--perturbation-interval {o.perturbation_interval} is not shorter than the "
            f"members' budget (train.total_steps={budget}): PBT would never perturb them"
        )


def _write_point_outcomes(
    ran: dict[str, TrialResult], out: Path, meta: dict, o: SweepOptions, echo: Callable
) -> list[TrialResult]:
    """sweep.json with every point's outcome, best first; the best point is printed."""
    sign = -1.0 if o.mode == "max" else 1.0

    def scored(r: TrialResult) -> bool:
        return r.value is not None and math.isfinite(r.value)

    # A NaN inside the key would break the sort's order for every point: points without a
    # finite value get a constant key, after the others, in the order they ran.
    points = sorted(ran.values(), key=lambda r: (0, sign * r.value) if scored(r) else (1, 0.0))
    state = {r.name: dataclasses.asdict(r) for r in points}
    best = next((r for r in points if scored(r)), None)
    summary = {"metric": o.metric, "mode": o.mode, "best": best.name if best else None}
    # "results" keeps its best-first order (sorted keys would put the names in their order)
    _write_json(
        out / SWEEP_FILE, {**meta, "state": "done", "results": state, **summary}, sort_keys=False
    )
    if best is not None:
        echo(f"best point: {best.name} ({o.metric} = {best.value:.4g}, mean over its seeds)")
    return points


def _write_outcomes(
    trials: Sequence[Trial], results: dict, out: Path, meta: dict, command_line: str
) -> None:
    """trial.json of every trial that ran, records of trials a scheduler stopped early (so a
    re-run skips them too), and the outcome in sweep.json."""
    # an interrupted sweep (Ctrl-C) is not done: its re-run resumes the interrupted trials,
    # and those Tune had not started yet
    cut = any(r.status == "interrupted" for r in results.values())
    status, why = ("interrupted", "not started") if cut else ("failed", "lost")
    for trial in trials:
        result = results.setdefault(trial.name, TrialResult(trial.name, status, message=why))
        if result.status == "skipped":
            continue
        run_dir = Path(trial.run_dir)
        _write_json(
            run_dir / TRIAL_FILE, {**dataclasses.asdict(result), "overrides": trial.overrides}
        )
        if result.status == "stopped" and trial.command != "transfer":
            extra = {"stopped_early": True, "trial_command": trial.cli()}
            write_record(
                run_dir, trial.record_dir, command=command_line or trial.cli(), extra=extra
            )
    state = {t.name: dataclasses.asdict(results[t.name]) for t in trials}
    _write_json(
        out / SWEEP_FILE, {**meta, "state": "interrupted" if cut else "done", "results": state}
    )


def _how(backend: str, o: SweepOptions) -> str:
    if backend == "local":
        return "a loop in this process (no Ray)"
    where = f"the Ray cluster at {o.address}" if o.address else f"{o.max_concurrent} at a time"
    early = f", ASHA on {o.metric} ({o.mode})" if o.scheduler == "asha" else ""
    if o.scheduler == "pbt":
        early = f", PBT on {o.metric} ({o.mode}) every {o.perturbation_interval} steps"
    if o.search != "grid" and o.metric:
        early = f", {o.mode} mean {o.metric} over seeds"
    return f"Ray Tune ({where}, {o.retries} retries{early})"


def _write_json(path: Path, data: dict[str, Any], sort_keys: bool = True) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=sort_keys) + "\n")


def _run_local(todo: Sequence[Trial], command_line: str, echo: Callable) -> dict:
    """The no-Ray path: the same trial function, one trial after the other."""
    results = {}
    for i, trial in enumerate(todo, 1):
        if trial_done(trial):  # another process writing to the same results finished it
            results[trial.name] = TrialResult(trial.name, "skipped")
            echo(f"[{i}/{len(todo)}] {trial.name}: skipped (its record appeared meanwhile)")
            continue
        start = time.perf_counter()
        try:
            final = run_trial(trial, lambda metrics, ckpt: None, command_line)
            result = TrialResult(trial.name, "ok", step=int(final.get("step", 0)))
        except (ValueError, RuntimeError, OSError) as err:
            result = TrialResult(trial.name, "failed", message=f"{type(err).__name__}: {err}")
        result.seconds = time.perf_counter() - start
        echo(f"[{i}/{len(todo)}] {trial.name}: {result.status} ({result.seconds:.1f}s)")
        results[trial.name] = result
    return results


def summarize(results: Sequence[TrialResult]) -> str:
    """Counts per status, then each trial that did not finish, with its reason."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines = ["summary: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
    lines += [
        f"  {r.status.upper()} {r.name}: {r.message}"
        for r in results
        if r.status != "ok" and r.status != "skipped"
    ]
    return "\n".join(lines)
