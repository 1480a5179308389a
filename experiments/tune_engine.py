"""Ray Tune engine of ``memcores sweep``: connect to Ray, run or restore the Tune experiment
of a sweep folder, and turn Tune's results into :class:`~experiments.trials.TrialResult`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memcores.agents.files import write_text_atomic
from memcores.experiments.trials import DONE, Trial, TrialResult, trainable

if TYPE_CHECKING:
    from memcores.experiments.search import Dist
    from memcores.experiments.sweep_options import SweepOptions

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
    "search",
    "samples",
    "memory_gb",
    "perturbation_interval",
    "search_seed",
)
GB = 1024**3


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
    # Workers log at WARNING: no line per Tune checkpoint and restore on the driver's console.
    quiet = {"logging_level": "WARNING", "logging_config": ray.LoggingConfig(log_level="WARNING")}
    if address:
        try:
            ray.init(address=address, runtime_env=runtime_env, **quiet)
        except Exception as err:  # ConnectionError, AuthenticationError, ...
            raise RuntimeError(f"{str(err).splitlines()[0]}{_auth_hint()}") from None
    else:
        # Ray turns token authentication on for a new local instance and, with no token
        # anywhere, writes one to ~/.ray/auth_token, which outlives the sweep; a token in the
        # environment keeps the instance authenticated and writes nothing.
        if not ({"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)):
            if not (Path.home() / ".ray" / "auth_token").is_file():
                os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        # "local": a new private instance even when `ray start` runs a cluster on the same host
        # (ray.init() would join that one, whose CPUs it cannot set).
        ray.init(
            address="local",
            num_cpus=cpus,
            include_dashboard=False,
            runtime_env=runtime_env,
            **quiet,
        )
    return True


def _auth_hint() -> str:
    """Why a cluster that ``ray start`` put on token authentication (it does when
    ``~/.ray/auth_token`` exists) refuses this process: Ray's clients send the token only with
    ``RAY_AUTH_MODE=token``."""
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return ""
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if not (token.is_file() or os.environ.get("RAY_AUTH_TOKEN")):
        return ""
    return (
        f"; if the cluster uses token authentication (`ray start` turns it on when {token} "
        "exists), run the sweep with RAY_AUTH_MODE=token"
    )


FLAGS = {"CPU": "--threads-per-trial", "GPU": "--gpus-per-trial", "memory": "--memory-per-trial"}
"""The option that asks for each of Ray's resources."""


def _show(key: str, value: float) -> str:
    return f"{value / GB:.3g} GB memory" if key == "memory" else f"{value:g} {key}"


def trial_resources(o: SweepOptions) -> dict[str, float]:
    """What one trial reserves, in Ray's resource names (``memory`` in bytes)."""
    need: dict[str, float] = {"CPU": float(o.cpus)}
    if o.gpus:
        need["GPU"] = float(o.gpus)
    if o.memory_gb:
        need["memory"] = float(o.memory_gb * GB)
    return need


def check_resources(nodes: Sequence[dict[str, float]], need: dict[str, float]) -> None:
    """Whether one of the cluster's ``nodes`` (each its Ray ``Resources``) can hold a trial
    that needs ``need``; Ray would otherwise keep such a trial pending for ever.

    :raises ValueError: no node can, with the most any node has (one line).
    """
    if any(all(node.get(k, 0.0) >= v for k, v in need.items()) for node in nodes):
        return
    wanted = ", ".join(f"{_show(k, v)} ({FLAGS[k]})" for k, v in need.items())
    most = {k: max((n.get(k, 0.0) for n in nodes), default=0.0) for k in need}
    have = ", ".join(_show(k, v) for k, v in most.items())
    raise ValueError(
        f"no node of the Ray cluster can run a trial: it needs {wanted}; "
        f"the most any of its {len(nodes)} node(s) has: {have}"
    )


def this_machine() -> dict[str, float]:
    """What the local computer has, in Ray's resource names: the CPU cores this process may use,
    its CUDA GPUs and its physical memory (bytes); what a private local Ray can offer."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    have = {"CPU": float(cores or 1), "GPU": float(torch.cuda.device_count())}
    try:
        have["memory"] = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): not checked
        pass
    return have


def check_machine(need: dict[str, float]) -> None:
    """Whether the local computer can hold one trial that needs ``need``, before a private local
    Ray is sized from the request (Ray would accept any number of CPUs it is told of).

    :raises ValueError: it cannot, naming each option and what the machine has (one line).
    """
    have = this_machine()
    short = [k for k, v in need.items() if k in have and v > have[k]]
    if short:
        wanted = ", ".join(f"{_show(k, need[k])} ({FLAGS[k]})" for k in short)
        has = ", ".join(_show(k, have[k]) for k in short)
        raise ValueError(f"the local computer cannot run a trial: it needs {wanted}; it has {has}")


def cluster_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the connected Ray cluster."""
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def run_tune(
    trials: Sequence[Trial],
    out: Path,
    o: SweepOptions,
    command_line: str,
    trial_fn: Callable | None,
    echo: Callable,
    space: dict[str, Dist] | None = None,
) -> dict[str, TrialResult]:
    """Run (or restore) the sweep's Tune experiment in ``out/.tune``; results by trial name
    (by point name for a random or Optuna search).

    :param trials: the grid's trials; for a search, one template per seed.
    :param space: the config's ``search:`` space (search and PBT).
    """
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # no console tables: we print a summary
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")  # relative paths in configs work
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # skipped trials
    # Each trial checkpoint forces a snapshot of the experiment; the warning about their
    # frequency says nothing a sweep's user can act on.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    from ray import tune

    if trial_fn is None:
        trial_fn = default_trainable(o)
    resources = {"cpu": o.cpus, **({"gpu": o.gpus} if o.gpus else {})}
    if o.memory_gb:
        resources["memory"] = o.memory_gb * GB
    fn = tune.with_resources(trial_fn, resources)
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
        param_space, tune_config = _experiment(trials, o, command_line, space or {})
        total = o.points if o.search != "grid" else len(trials)
        tuner = tune.Tuner(
            fn,
            param_space=param_space,
            tune_config=tune_config,
            run_config=tune.RunConfig(
                storage_path=str(out),
                name=TUNE_DIR,
                verbose=0,
                stop=sweep_stopper(o.timeout),
                failure_config=tune.FailureConfig(max_failures=o.retries),
                # PBT clones a member from a checkpoint that must outlive the donor's next
                # ones (a member reports one per perturbation interval).
                checkpoint_config=tune.CheckpointConfig(
                    num_to_keep=None if o.scheduler == "pbt" else 1
                ),
                # Ctrl-C (or SIGTERM, turned into it) ends fit() without an exception: Tune
                # saves the experiment, and experiment_end notes the trials it cut off
                callbacks=[
                    trial_lines(echo, total),
                    experiment_end(),
                    *lost_member_callback(o),
                ],
            ),
        )
    LOST_MEMBERS.clear()
    UNFINISHED.clear()
    with warnings.catch_warnings():
        # PBT's advice to reuse actors: a member's run is restarted from its checkpoint anyway
        warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
        grid = tuner.fit()
    results = {r.name: r for r in map(tune_result(o), grid)}
    for result in results.values():  # no record: a re-run resumes them
        if result.name in UNFINISHED and result.status in ("stopped", "failed"):
            result.status = "interrupted"
            result.message = f"interrupted at step {result.step}; run the same command to resume it"
        elif LOST_MEMBERS and result.status == "stopped":
            result.status = "cancelled"
            result.message = (
                f"stopped at step {result.step} because member {LOST_MEMBERS[0]} failed"
            )
    return results


LOST_MEMBERS: list[str] = []
"""The PBT members of this driver's running sweep that failed for good (retries spent)."""
UNFINISHED: list[str] = []
"""The trials that Tune's experiment ended before they finished or a scheduler stopped them
(the sweep was interrupted): their runs resume when the sweep is run again."""


def experiment_end() -> Any:
    """A Tune callback noting, after each step of Tune's loop, the trials still running,
    pending or paused (:data:`UNFINISHED`): after the last step, those of an interrupted
    sweep, which must not be recorded. (Tune marks them terminated as it cleans up, before
    ``on_experiment_end``.)"""
    from ray.tune import Callback

    class ExperimentEnd(Callback):
        def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
            from memcores.experiments import tune_engine

            done = ("TERMINATED", "ERROR")
            tune_engine.UNFINISHED[:] = [str(t) for t in trials if t.status not in done]

    return ExperimentEnd()


def lost_member_callback(o: SweepOptions) -> list[Any]:
    """A PBT sweep's callback that notes a member failing for good; :class:`SweepStopper`
    then ends the sweep. Tune's synchronous PBT would otherwise keep the other members paused
    for ever, waiting for the lost one to reach the next perturbation."""
    if o.scheduler != "pbt":
        return []
    from ray.tune import Callback

    class LostMember(Callback):
        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            # the module's list, also in a copy Tune unpickled on a restore
            from memcores.experiments import tune_engine

            tune_engine.LOST_MEMBERS.append(str(trial))

    return [LostMember()]


def sweep_stopper(timeout: float | None) -> Any:
    """Tune's stopper of a sweep: a trial at ``timeout`` seconds (``--trial-timeout``); every
    trial once a PBT member failed for good (:data:`LOST_MEMBERS`)."""
    from ray.tune.stopper import Stopper

    class SweepStopper(Stopper):
        def __init__(self, timeout: float | None) -> None:
            self.timeout = timeout

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            seconds = float(result.get("time_total_s", 0.0))
            return self.timeout is not None and seconds >= self.timeout

        def stop_all(self) -> bool:
            from memcores.experiments import tune_engine

            return bool(tune_engine.LOST_MEMBERS)

    return SweepStopper(timeout)


def default_trainable(o: SweepOptions) -> Callable[[dict[str, Any]], None]:
    """The Tune trainable of the sweep's mode: a grid trial, a search point, a PBT member."""
    if o.search != "grid":
        from memcores.experiments.search_trials import point_trainable

        return point_trainable
    if o.scheduler == "pbt":
        from memcores.experiments.pbt import pbt_trainable

        return pbt_trainable
    return trainable


def _experiment(
    trials: Sequence[Trial], o: SweepOptions, command_line: str, space: dict[str, Dist]
) -> tuple[Any, Any]:
    """Tune's ``param_space`` and ``TuneConfig`` of a new experiment.

    Grid: one Tune trial per grid point. Search: ``samples`` Tune trials, each a point of
    ``space`` that runs every seed (``trials``) in turn. PBT: one Tune trial per grid point,
    its hyperparameters first sampled from ``space``, then mutated within it.
    """
    domains = {key: dist.tune() for key, dist in space.items()}
    specs = [dataclasses.asdict(t) for t in trials]
    if o.search != "grid":
        return _search_experiment(specs, domains, o, command_line)
    return _grid_experiment(specs, domains, o, command_line, space)


def _search_alg(o: SweepOptions) -> Any:
    """The searcher of a random or Optuna search."""
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if o.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no line per new study
        sampler = optuna.samplers.TPESampler(seed=o.sampler_seed)
        return OptunaSearch(metric=o.metric, mode=o.mode, sampler=sampler)
    # Tune's max_concurrent_trials takes no BasicVariantGenerator: it has its own.
    return BasicVariantGenerator(random_state=o.sampler_seed, max_concurrent=o.max_concurrent)


def _search_experiment(
    specs: list[dict[str, Any]], domains: dict[str, Any], o: SweepOptions, command_line: str
) -> tuple[Any, Any]:
    """A random or Optuna search: ``samples`` points, each running every seed in turn."""
    from ray import tune

    point_space = {
        "seeds": specs,
        "params": domains,
        "metric": o.metric,
        "command_line": command_line,
    }
    config = tune.TuneConfig(
        max_concurrent_trials=None if o.search == "random" else o.max_concurrent,
        num_samples=o.points,
        search_alg=_search_alg(o),
        trial_name_creator=_point_name,
        trial_dirname_creator=lambda t: f"point_{t.trial_id}",
    )
    return point_space, config


def _pbt_experiment(
    specs: list[dict[str, Any]],
    domains: dict[str, Any],
    o: SweepOptions,
    command_line: str,
    space: dict[str, Dist],
) -> tuple[Any, Any, Any]:
    """PBT's scheduler, ``param_space`` and searcher: one member per grid point."""
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    scheduler = PopulationBasedTraining(
        time_attr="step",
        metric=o.metric,
        mode=o.mode,
        perturbation_interval=o.perturbation_interval,
        hyperparam_mutations={"params": pbt_mutations(space)},
        custom_explore_fn=KeepInRange(space),
        synch=True,  # members wait for each other: fair with fewer slots than members
    )
    # PBT copies the whole config of the member it clones: a member's own trial is
    # looked up by its Tune trial name (fixed when it is created), never read from it.
    param_space = {
        "member": tune.grid_search([t["name"] for t in specs]),
        "members": {t["name"]: t for t in specs},
        "params": domains,
        "perturbation_interval": o.perturbation_interval,
        "command_line": command_line,
    }
    # The whole population exists from the start (a generator limited to N live trials
    # would hold members back until others end): trials at once are limited by the
    # CPUs each reserves (a private local instance has max_concurrent x cpus).
    search_alg = BasicVariantGenerator(random_state=o.sampler_seed)
    return scheduler, param_space, search_alg


def pbt_mutations(space: dict[str, Dist]) -> dict[str, Any]:
    """PBT's ``hyperparam_mutations`` of the ``search:`` space: a ``choice`` as its list of
    values (Tune's explore resamples one from the list, or moves to a neighbour in it; it
    would multiply a value drawn from a ``tune.choice`` domain), any other distribution as its
    Tune domain (resampled, or the value x0.8 or x1.2)."""
    return {
        key: list(dist.args) if dist.kind == "choice" else dist.tune()
        for key, dist in space.items()
    }


class KeepInRange:
    """PBT's ``custom_explore_fn``: a value mutated past its ``search:`` range (x1.2 of the
    high end) is put back at the end it passed, so a member never trains on a value the sweep
    did not validate (a ``gae_lambda`` of 1.1). Choices come from their list already."""

    def __init__(self, space: dict[str, Dist]) -> None:
        self.bounds = {k: d.args for k, d in space.items() if d.kind != "choice"}

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        params = config.get("params", {})
        for key, (low, high) in self.bounds.items():
            if key in params:
                params[key] = type(params[key])(min(max(params[key], low), high))
        return config


def _grid_experiment(
    specs: list[dict[str, Any]],
    domains: dict[str, Any],
    o: SweepOptions,
    command_line: str,
    space: dict[str, Dist],
) -> tuple[Any, Any]:
    """The grid: one Tune trial per grid point, under FIFO, ASHA or PBT."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler: Any = None
    search_alg: Any = None
    param_space: Any = tune.grid_search([{"trial": t, "command_line": command_line} for t in specs])
    if o.scheduler == "asha":
        scheduler = ASHAScheduler(
            time_attr="step",
            metric=o.metric,
            mode=o.mode,
            grace_period=o.rung,
            max_t=10**12,
        )
    elif o.scheduler == "pbt":
        scheduler, param_space, search_alg = _pbt_experiment(specs, domains, o, command_line, space)
    config = tune.TuneConfig(
        max_concurrent_trials=None if search_alg else o.max_concurrent,
        scheduler=scheduler,
        search_alg=search_alg,
        trial_name_creator=_grid_name,
        trial_dirname_creator=_grid_name,
    )
    return param_space, config


def _grid_name(trial: Any) -> str:
    return trial.config["member"] if "member" in trial.config else trial.config["trial"]["name"]


def _point_name(trial: Any) -> str:
    from memcores.experiments.search import point_name, round_params

    return point_name(round_params(trial.config.get("params", {})))


def trial_lines(echo: Callable[[str], None], total: int) -> Any:
    """A Tune callback printing ``[i/N] name: ok (12.3s)`` as each trial ends."""
    from ray.tune import Callback

    class TrialLines(Callback):
        def __init__(self, echo: Callable[[str], None], total: int) -> None:
            self.done, self.total = 0, total
            self.echo: Callable[[str], None] | None = echo

        def __getstate__(self) -> dict[str, Any]:
            # Tune pickles its callbacks with the experiment; the console is not kept.
            return {**self.__dict__, "echo": None}

        def _line(self, trial: Any, status: str) -> None:
            self.done += 1
            result = trial.last_result or {}
            seconds = float(result.get("time_total_s", 0.0))
            if status == "ok" and result.get("memcores_skipped"):
                status = "skipped (its record exists)"
            elif status == "ok" and not result.get(DONE):
                status = "stopped"
            line = f"[{self.done}/{self.total}] {trial}: {status} ({seconds:.1f}s)"
            (self.echo or print)(line)

        def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._line(trial, "ok")

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            self._line(trial, "failed")

    return TrialLines(echo, total)


def tune_settings(o: SweepOptions) -> dict[str, Any]:
    """The options that a Tune experiment stores and a restore cannot change (an option not
    given as its default value)."""
    defaults = {"grace_period": o.rung, "samples": o.points, "search_seed": o.sampler_seed}
    settings = {k: defaults.get(k, getattr(o, k)) for k in TUNE_SETTINGS}
    # Tune pickles the trainable by its module path: an experiment stored under another path
    # (the top-level `experiments` package of releases before memcores.experiments) cannot
    # be unpickled, so it counts as changed and a new one starts, losing nothing
    settings["trainable_module"] = trainable.__module__
    return settings


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
        if "members" in result.config:  # a PBT member, under its own name
            name = Path(result.path).name
        elif "trial" in result.config:
            name = result.config["trial"]["name"]
        else:  # a search point
            from memcores.experiments.search import point_name, round_params

            name = point_name(round_params(result.config.get("params", {})))
        metrics = result.metrics or {}
        seconds = float(metrics.get("time_total_s", 0.0))
        step = int(metrics.get("step", 0))
        if result.error is not None:
            lines = [line for line in str(result.error).splitlines() if line.strip()]
            return TrialResult(name, "failed", seconds, lines[-1] if lines else "error", step)
        if metrics.get("memcores_skipped"):
            return TrialResult(name, "skipped")
        value = metrics.get(o.metric) if o.metric else None
        value = float(value) if isinstance(value, (int, float)) else None
        if metrics.get(DONE):
            return TrialResult(name, "ok", seconds, "", step, value)
        if o.timeout and seconds >= o.timeout:
            return TrialResult(name, "timeout", seconds, f"stopped after {o.timeout:g}s", step)
        return TrialResult(name, "stopped", seconds, f"stopped early at step {step}", step)

    return convert
