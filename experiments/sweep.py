"""Grid sweeps: expand ``--grid key=v1,v2`` options into trials and run each as a normal command.

A trial is exactly the command a person would type, e.g. ``memcores train CONFIG core.name=lstm
train.seed=0 run.dir=SWEEP/name=lstm,seed=0``, run in a child process. So a trial's folder has
the same layout as a hand-made run, and a sweep needs nothing from the trainers beyond their CLI.

Layout of a sweep folder::

    SWEEP/sweep.json              what was asked (config, command, grid) and the last outcome
    SWEEP/<trial>/                the trial's run.dir (config.yaml, events, progress.csv, ...)
    SWEEP/<trial>/trial.json      written atomically when the trial ends: status ok|failed|...
    SWEEP/logs/<trial>.log        the trial's stdout and stderr
    SWEEP/.ray/                   Ray Tune's own bookkeeping (only with the Ray backend)

A trial counts as finished only when its ``trial.json`` says ``"status": "ok"`` for the same
command, config and overrides; a re-run skips those and re-runs everything else from scratch.

Backends: Ray Tune (``pip install memcores[ray]``; local by default, a cluster given an address)
or local child processes when Ray is not installed. Both run every trial to its end whatever
happens to the others, and report failures with their exit code and the tail of their log.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agents.files import write_text_atomic
from experiments.config import parse_override, read_yaml_mapping

COMMANDS = ("train", "supervised", "transfer")
BACKENDS = ("auto", "ray", "local")
# The default way a trial runs: the module behind the ``memcores`` script, with this Python.
DEFAULT_TEMPLATE = "{python} -m experiments.cli {command} {config} {overrides}"
# `memcores transfer SUITE --config RL_CONFIG --out DIR`: it trains one run per env pair of the
# suite under DIR (setting their run.dir itself) and writes DIR/table.csv. The overrides come
# right after the suite: its parser takes positionals only before the options.
TRANSFER_TEMPLATE = (
    "{python} -m experiments.cli transfer {suite} {overrides} --config {config} "
    "--out {run_dir} {extra}"
)
DEFAULT_TEMPLATES = (DEFAULT_TEMPLATE, TRANSFER_TEMPLATE)
# The checkpoint each command's --resume continues from (globs inside the trial's run folder).
RESUME_FROM = {
    "train": "checkpoints/last.pt",
    "supervised": "checkpoint.pt",
    "transfer": "*/checkpoints/last.pt",
}
# Top-level keys of a transfer sweep config that are arguments of `memcores transfer`, not RL
# config keys: they are taken out, and the rest is the RL config given to --config.
TRANSFER_KEYS = ("suite", "episodes", "argmax")
TRIAL_FILE = "trial.json"
SWEEP_FILE = "sweep.json"
LOG_TAIL_LINES = 15
# Config schema of each trial command ("module:Class"), used to check every trial's config
# before the sweep folder is created. Commands without an entry are checked by the trial itself.
SCHEMAS = {
    "train": "agents.rl_config:RLConfig",
    "supervised": "agents.supervised_config:SupervisedConfig",
    "transfer": "agents.rl_config:RLConfig",
}


class SweepError(ValueError):
    """A sweep's arguments are wrong (bad grid, unknown command, conflicting earlier trial)."""


@dataclasses.dataclass
class Trial:
    """One point of the grid.

    :param name: folder name inside the sweep, built from the grid values (``name=lstm,seed=0``).
    :param assignment: the grid values of this trial, ``{"core.name": "lstm", ...}``.
    :param overrides: every dotted override given to the command, ``run.dir`` last.
    :param argv: the full command line of the child process.
    :param run_dir: absolute path of the trial's run directory.
    :param log_path: absolute path of the trial's stdout/stderr log.
    :param cwd: working directory of the child process.
    :param config: the config file the child is given.
    :param env: variables set for the child on top of the environment of the process that
        runs it (only these travel to Ray workers, never the whole environment).
    :param files: files (path -> text) written before the child starts, e.g. the RL config of
        a transfer sweep without its ``suite:`` key.
    :param suite: the transfer suite of a transfer trial.
    :param config_sha256: hash of the sweep's config file when the trials were made.
    :param cpus: CPUs the trial is scheduled with on Ray (its thread count).
    :param gpus: GPUs (or a fraction) the trial is scheduled with on Ray.
    :param resume: how an unfinished earlier attempt is continued instead of restarted: the
        flag appended to the command (``"--resume"``), ``""`` for a command that resumes by
        itself (transfer), None to restart from scratch.
    :param resume_from: glob (in the run folder) of the checkpoint the command resumes from;
        without a match the trial restarts from scratch even with ``resume``.
    :param timeout: seconds after which the child is killed (None: no limit).
    """

    name: str
    assignment: dict[str, str]
    overrides: list[str]
    argv: list[str]
    run_dir: str
    log_path: str
    cwd: str
    config: str = ""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, str] = dataclasses.field(default_factory=dict)
    suite: str = ""
    config_sha256: str = ""
    cpus: int = 1
    gpus: float = 0.0
    resume: str | None = None
    resume_from: str = "**/*.pt"
    python: str = sys.executable
    timeout: float | None = None

    def spec(self) -> dict[str, Any]:
        """What decides whether an earlier result of this trial can be reused: the command line
        (the interpreter's path aside, so another venv can resume a sweep) and the content of
        the config file (editing it changes the experiment even if its path stays)."""
        return {
            "argv": self.argv,
            "same_as": [("{python}" if a == self.python else a) for a in self.argv],
            "config_sha256": self.config_sha256,
        }


@dataclasses.dataclass
class TrialResult:
    """How a trial ended. ``status``: ok | failed | killed | timeout | skipped | error."""

    name: str
    status: str
    returncode: int | None = None
    seconds: float = 0.0
    message: str = ""
    run_dir: str = ""
    log_path: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")


# --------------------------------------------------------------------------- grid and trials


def parse_grid(items: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``["core.name=lstm,ur_lstm", "train.seed=0,1"]`` -> ``[("core.name", ["lstm", ...]), ...]``.

    Values stay strings; the command parses them like any other override. Values cannot hold
    commas (list-valued keys are swept with one config file per value instead).
    """
    grid: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
            raise SweepError(f"--grid {item!r} must look like section.key=value1,value2")
        values = [v.strip() for v in text.split(",")]
        if not text.strip() or any(not v for v in values):
            raise SweepError(f"--grid {item!r} has an empty value; give value1,value2,...")
        if key in seen:
            raise SweepError(f"--grid key {key!r} is given twice; put all its values in one --grid")
        if len(set(values)) != len(values):
            raise SweepError(f"--grid {item!r} repeats a value")
        if key == "run.dir":
            raise SweepError("run.dir cannot be swept: each trial's run.dir is set by the sweep")
        seen.add(key)
        grid.append((key, values))
    return grid


def expand_grid(grid: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """The cartesian product of the grid, the last key varying fastest (like nested loops)."""
    keys = [k for k, _ in grid]
    return [
        dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(v for _, v in grid))
    ]


def trial_name(assignment: dict[str, str]) -> str:
    """A readable, file-system-safe folder name: ``{"core.name": "lstm", "train.seed": "0"}`` ->
    ``name=lstm,seed=0``. The last part of each key is used unless two keys share it."""
    if not assignment:
        return "trial"
    last = [k.rsplit(".", 1)[-1] for k in assignment]
    parts = []
    for key, short in zip(assignment, last, strict=True):
        label = short if last.count(short) == 1 else key
        value = re.sub(r"[^\w.+-]+", "-", str(assignment[key])).strip("-") or "_"
        parts.append(f"{label}={value}")
    return ",".join(parts)


def infer_command(config: dict[str, Any]) -> str:
    """Which command a config belongs to: a ``task:`` section means ``supervised``, a ``suite:``
    key means ``transfer``, anything else ``train``."""
    if "task" in config:
        return "supervised"
    if "suite" in config:
        return "transfer"
    return "train"


def build_argv(template: str, lists: dict[str, Sequence[str]], words: dict[str, str]) -> list[str]:
    """Fill a command template. A placeholder of ``lists`` (``{overrides}``, ``{extra}``) must
    stand alone and expands to several words; those of ``words`` (``{python}``, ``{command}``,
    ``{config}``, ``{run_dir}``, ``{suite}``) may appear anywhere."""
    parts = shlex.split(template)
    if "{overrides}" not in parts:
        raise SweepError(f"--command-template {template!r} must contain {{overrides}}")
    argv: list[str] = []
    for word in parts:
        name = word[1:-1] if word.startswith("{") and word.endswith("}") else None
        if name in lists:
            argv.extend(lists[name])
            continue
        try:
            argv.append(word.format(**words))
        except (KeyError, IndexError) as err:
            valid = ", ".join("{" + k + "}" for k in [*words, *lists])
            raise SweepError(
                f"--command-template {template!r}: unknown placeholder {err}; valid: {valid}"
            ) from None
    return argv


def split_transfer_config(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(arguments of `memcores transfer` found in the config, the RL config without them)."""
    args = {k: raw[k] for k in TRANSFER_KEYS if k in raw}
    return args, {k: v for k, v in raw.items() if k not in TRANSFER_KEYS}


def make_trials(
    config_path: str | Path,
    grid: Sequence[tuple[str, Sequence[str]]],
    out_dir: str | Path,
    *,
    command: str | None = None,
    overrides: Sequence[str] = (),
    template: str = DEFAULT_TEMPLATE,
    timeout: float | None = None,
    threads_per_trial: int = 1,
    gpus_per_trial: float = 0.0,
    resume: bool = False,
) -> tuple[str, list[Trial]]:
    """Validate the sweep's inputs and build its trials; nothing is written.

    :returns: the command (given or inferred from the config) and the trials in grid order.
    :raises SweepError: bad grid/override/command; :class:`~experiments.config.ConfigError`
        for a missing or malformed config file.
    """
    config_path = Path(config_path).resolve()
    raw = read_yaml_mapping(config_path)
    config_sha256 = hashlib.sha256(config_path.read_bytes()).hexdigest()
    if command is None:
        command = infer_command(raw)
    if command not in COMMANDS:
        raise SweepError(f"unknown trial command {command!r}; valid: {', '.join(COMMANDS)}")
    for item in overrides:
        key, _ = parse_override(item)
        if key == "run.dir":
            raise SweepError(
                "run.dir cannot be overridden: each trial's run.dir is set by the sweep"
            )
    grid_keys = {k for k, _ in grid}
    clash = [o for o in overrides if parse_override(o)[0] in grid_keys]
    if clash:
        raise SweepError(f"override(s) {clash} also appear in --grid; keep one of them")
    out = Path(out_dir).resolve()
    # Each trial is one process on a shared machine: keep its math libraries to the number of
    # threads it was given instead of one per core each (which oversubscribes the CPUs).
    env = {
        var: str(threads_per_trial)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
        if var not in os.environ
    }
    config_file = str(config_path)
    files: dict[str, str] = {}
    transfer_args: dict[str, Any] = {}
    if command == "transfer":
        transfer_args, rl_config = split_transfer_config(raw)
        # `episodes=10` on the command line sets a transfer argument like the config key does
        for item in [o for o in overrides if parse_override(o)[0] in TRANSFER_KEYS]:
            key, value = parse_override(item)
            transfer_args[key] = value
        overrides = [o for o in overrides if parse_override(o)[0] not in TRANSFER_KEYS]
        if transfer_args:
            # transfer's --config must be a plain RL config: give it a copy without the keys
            config_file = str(out / "transfer_config.yaml")
            files[config_file] = yaml.safe_dump(rl_config, sort_keys=False)
        bad = [k for k in grid_keys if k in TRANSFER_KEYS and k != "suite"]
        if bad:
            raise SweepError(f"--grid {bad[0]} cannot be swept; valid transfer grid key: suite")
    elif "suite" in grid_keys:
        raise SweepError("--grid suite=... is for transfer sweeps (--command transfer)")
    if command == "transfer" and template == DEFAULT_TEMPLATE:
        template = TRANSFER_TEMPLATE
    # How an interrupted trial continues: `train`/`supervised` (and a custom template's
    # command) take --resume; `transfer` resumes its unfinished env pairs by itself.
    resume_how: str | None = None
    if resume:
        resume_how = "" if command == "transfer" else "--resume"
    resume_from = (
        RESUME_FROM.get(command, "**/*.pt") if template in DEFAULT_TEMPLATES else "**/*.pt"
    )
    trials = []
    names: set[str] = set()
    for assignment in expand_grid(grid):
        name = trial_name(assignment)
        if name in names:  # two values that sanitise to the same folder name
            raise SweepError(f"two grid points map to the same trial folder {name!r}")
        names.add(name)
        run_dir = out / name
        dotted = {k: v for k, v in assignment.items() if k not in TRANSFER_KEYS}
        trial_overrides = [*overrides, *(f"{k}={v}" for k, v in dotted.items())]
        extra: list[str] = []
        suite = ""
        if command == "transfer":
            suite = str(assignment.get("suite", transfer_args.get("suite") or ""))
            if not suite:
                raise SweepError(
                    "a transfer sweep needs a suite: `suite: NAME` in the config or "
                    "--grid suite=NAME1,NAME2 (see `memcores list suites`)"
                )
            if transfer_args.get("episodes") is not None:
                extra += ["--episodes", str(transfer_args["episodes"])]
            if transfer_args.get("argmax"):
                extra.append("--argmax")
        else:
            # transfer sets each env pair's run.dir under --out itself
            trial_overrides.append(f"run.dir={run_dir}")
        words = {
            "python": sys.executable,
            "command": command,
            "config": config_file,
            "run_dir": str(run_dir),
            "suite": suite,
        }
        trials.append(
            Trial(
                name=name,
                assignment=dict(assignment),
                overrides=trial_overrides,
                argv=build_argv(template, {"overrides": trial_overrides, "extra": extra}, words),
                run_dir=str(run_dir),
                log_path=str(out / "logs" / f"{name}.log"),
                cwd=os.getcwd(),
                config=config_file,
                env=env,
                files=files,
                suite=suite,
                config_sha256=config_sha256,
                cpus=max(1, threads_per_trial),
                gpus=gpus_per_trial,
                resume=resume_how,
                resume_from=resume_from,
                timeout=timeout,
            )
        )
    return command, trials


def validate_trials(command: str, trials: Sequence[Trial]) -> bool:
    """Load every trial's config with the command's schema, so a wrong key, value, core or
    suite name stops the sweep before anything is written (the check the command makes).

    :returns: False when the command has no known schema (nothing was checked).
    :raises ConfigError: the first trial whose config is wrong, named in the message.
    """
    import importlib

    from experiments.config import ConfigError, build, set_dotted

    target = SCHEMAS.get(command)
    if target is None:
        return False
    module_name, _, class_name = target.partition(":")
    try:
        schema = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):
        return False
    from cores import CORES

    suites: Any = None
    if command == "transfer":
        from envs.suites import SUITES as suites
    for trial in trials:
        if trial.config in trial.files:
            raw = yaml.safe_load(trial.files[trial.config]) or {}
        else:
            raw = read_yaml_mapping(trial.config)
        for item in trial.overrides:
            set_dotted(raw, *parse_override(item))
        try:
            config = build(schema, raw, prefix="")
        except ConfigError as err:
            raise ConfigError(f"trial {trial.name}: {err}") from None
        core = getattr(getattr(config, "core", None), "name", None)
        if core is not None and core not in CORES:
            raise ConfigError(
                f"trial {trial.name}: unknown core {core!r}; valid: {', '.join(CORES)}"
            )
        if suites is not None and trial.suite not in suites:
            raise ConfigError(
                f"trial {trial.name}: unknown suite {trial.suite!r}; valid: {', '.join(suites)}"
            )
    return True


# --------------------------------------------------------------------------- one trial


def write_json_atomic(path: str | Path, data: dict[str, Any]) -> None:
    """Write JSON via a temp file in the same folder, fsync, rename: never half a file."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_trial_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The ``trial.json`` of a run directory, or None if absent/unreadable."""
    path = Path(run_dir) / TRIAL_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def log_tail(path: str | Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def describe_exit(returncode: int) -> tuple[str, str]:
    """(status, message) for a child's exit code; negative codes are signals."""
    if returncode == 0:
        return "ok", ""
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode).name
        except ValueError:
            sig = f"signal {-returncode}"
        return "killed", f"killed by {sig}"
    return "failed", f"exit code {returncode}"


def has_checkpoint(run_dir: Path, pattern: str) -> bool:
    """Whether an earlier attempt left the checkpoint ``pattern`` (a glob) in its run folder."""
    return run_dir.is_dir() and any(run_dir.glob(pattern))


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGKILL the child when its parent dies, so a trial
    cannot outlive a Ray worker that Ray killed (cancelled sweep, lost node); None elsewhere.

    ``prctl`` is looked up here, in the parent: the child, forked from a threaded process,
    then only makes one foreign call before exec (no imports, no dlopen).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def hook() -> None:
        prctl(pr_set_pdeathsig, sigkill)

    return hook


def run_trial(
    trial: Trial,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    die_with_parent: bool = False,
) -> TrialResult:
    """Run one trial to its end in a child process and record the outcome in ``trial.json``.

    Never raises for a failing trial: the failure is the result. An earlier, unfinished attempt
    in the same folder is continued from its checkpoint when ``trial.resume`` says how and one
    exists; otherwise it is removed first so its events cannot mix with the new ones.
    """
    run_dir, log_path = Path(trial.run_dir), Path(trial.log_path)
    extra: list[str] = []
    resumed = trial.resume is not None and has_checkpoint(run_dir, trial.resume_from)
    if resumed:
        (run_dir / TRIAL_FILE).unlink(missing_ok=True)  # the failed attempt's record
        extra = [trial.resume] if trial.resume else []
    elif run_dir.exists():
        shutil.rmtree(run_dir)
    for path, text in trial.files.items():
        write_text_atomic(path, text)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    status, message, returncode = "error", "", None
    with log_path.open("a" if resumed else "w") as log:
        log.write(f"$ {shlex.join([*trial.argv, *extra])}\n")
        log.flush()
        try:
            argv = [*trial.argv, *extra]
            if argv[0] == trial.python and not os.path.exists(argv[0]):
                argv[0] = sys.executable  # a Ray worker whose Python lives elsewhere
            proc = subprocess.Popen(
                argv,
                cwd=trial.cwd,
                env={**os.environ, **trial.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_pdeathsig_hook() if die_with_parent else None,
            )
        except OSError as err:
            message = f"could not start: {err}"
        else:
            if on_start is not None:
                on_start(proc)
            try:
                returncode = proc.wait(timeout=trial.timeout)
                status, message = describe_exit(returncode)
            except subprocess.TimeoutExpired:
                proc.kill()
                returncode = proc.wait()
                status, message = "timeout", f"killed after the {trial.timeout:g}s trial timeout"
            except BaseException:
                # The sweep itself is being stopped (Ctrl-C, Ray cancel): take the child along.
                proc.kill()
                proc.wait()
                raise
    seconds = time.time() - start
    if status != "ok":
        tail = log_tail(log_path)
        if tail:
            message += "\n" + tail
    record = {
        "name": trial.name,
        "status": status,
        "returncode": returncode,
        "message": message,
        "seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "assignment": trial.assignment,
        "overrides": trial.overrides,
        "log": str(log_path),
        "resumed": resumed,
        **trial.spec(),
    }
    # trial.json goes into the run dir (created by the command, or by us if it failed early).
    write_json_atomic(run_dir / TRIAL_FILE, record)
    return TrialResult(
        trial.name, status, returncode, seconds, message, str(run_dir), str(log_path)
    )


# --------------------------------------------------------------------------- backends


def run_local(
    trials: Sequence[Trial],
    max_concurrent: int,
    report: Callable[[TrialResult], None] = lambda r: None,
) -> list[TrialResult]:
    """Run trials in child processes, at most ``max_concurrent`` at a time.

    Threads only wait on the children, so one trial's failure cannot stop another. On Ctrl-C
    every running child is killed before the exception propagates.
    """
    running: set[subprocess.Popen] = set()
    lock = threading.Lock()

    def track(proc: subprocess.Popen) -> None:
        with lock:
            running.add(proc)

    def one(trial: Trial) -> TrialResult:
        result = run_trial(trial, on_start=track)
        report(result)
        return result

    results: dict[str, TrialResult] = {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_concurrent))
    try:
        futures = {pool.submit(one, t): t for t in trials}
        for future in concurrent.futures.as_completed(futures):
            trial = futures[future]
            try:
                results[trial.name] = future.result()
            except Exception as err:  # a bug in our own bookkeeping, not in the trial
                results[trial.name] = TrialResult(
                    trial.name, "error", message=repr(err), run_dir=trial.run_dir
                )
                report(results[trial.name])
    except BaseException:
        with lock:
            for proc in running:
                if proc.poll() is None:
                    proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [results[t.name] for t in trials]


def ray_available() -> bool:
    """Whether Ray Tune can be imported (the ``memcores[ray]`` extra)."""
    try:
        import ray  # noqa: F401
        from ray import tune  # noqa: F401
    except ImportError:
        return False
    return True


def _ray_trainable(config: dict[str, Any]) -> dict[str, Any]:
    """Ray Tune function trainable: run one trial in a child process; the final result is its
    outcome. Never raises for a failing trial, so Tune carries on with the others."""
    trial = Trial(**config["trial"])
    result = run_trial(trial, die_with_parent=True)
    print(f"trial {trial.name}: {result.status} in {result.seconds:.1f}s", flush=True)
    return {
        "memcores_status": result.status,
        "memcores_returncode": -999 if result.returncode is None else result.returncode,
        "memcores_seconds": result.seconds,
        "memcores_message": result.message,
    }


def _ray_trial_dirname(tune_trial: Any) -> str:
    # Tune's default folder name repeats the whole config; the id is enough (ours is elsewhere).
    return f"{tune_trial.trial_id}"


def _ray_trial_name(tune_trial: Any) -> str:
    return tune_trial.config["trial"]["name"]


def check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast on a ``host:port`` / ``ray://host:port`` address nobody listens on: Ray itself
    keeps retrying such an address for many minutes. ``auto`` is left to Ray.

    :raises RuntimeError: the port does not accept a TCP connection within ``timeout``.
    """
    import socket

    match = re.fullmatch(r"(?:ray://)?\[?([^\]]+?)\]?:(\d+)", address.strip())
    if not match:
        return
    host, port = match.group(1), int(match.group(2))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as err:
        raise RuntimeError(
            f"no Ray cluster answers at {address} ({err}); start one with `ray start --head` "
            "or check the address"
        ) from None


def connect_ray(address: str | None, max_concurrent: int, cpus_per_trial: int = 1) -> bool:
    """Connect to the Ray cluster at ``address``, or start a private local Ray with
    ``max_concurrent * cpus_per_trial`` CPUs; returns whether this call started/connected it
    (then the caller shuts it down).

    :raises RuntimeError: the cluster cannot be reached (one line, no traceback at the CLI).
    """
    # Tune's console tables repeat what the sweep reports itself; the legacy reporter with
    # verbose=0 prints nothing.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    if ray.is_initialized():
        return False
    if address:
        check_reachable(address)
    try:
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(
                num_cpus=max(1, max_concurrent) * max(1, cpus_per_trial),
                include_dashboard=False,
                log_to_driver=True,
                configure_logging=True,
                logging_level="WARNING",
            )
    except (ConnectionError, TimeoutError) as err:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise RuntimeError(f"could not connect to {where}: {err}") from err
    return True


def run_ray(
    trials: Sequence[Trial],
    max_concurrent: int,
    storage_dir: str | Path,
    address: str | None = None,
    report: Callable[[TrialResult], None] = lambda r: None,
) -> list[TrialResult]:
    """Run trials with Ray Tune: a function trainable per trial, each running the command in a
    child process (so a crash or a kill of the trial cannot take a Ray worker down).

    Without ``address`` a private local Ray instance with ``max_concurrent`` CPUs is started and
    shut down afterwards; with an address (``auto``, ``ray://host:10001``) the trials run on that
    cluster, whose workers must see the same paths (shared filesystem) and have memcores
    installed. Ray's session logs stay in Ray's temp dir (``/tmp/ray``); Tune's experiment state
    goes to ``storage_dir``.
    """
    from ray import tune

    started_here = connect_ray(address, max_concurrent)
    try:
        storage = Path(storage_dir).resolve()
        storage.mkdir(parents=True, exist_ok=True)
        param_space = {"trial": tune.grid_search([dataclasses.asdict(t) for t in trials])}
        # every trial of a sweep asks for the same resources
        resources: dict[str, float] = {"cpu": trials[0].cpus}
        if trials[0].gpus:
            resources["gpu"] = trials[0].gpus
        tuner = tune.Tuner(
            tune.with_resources(_ray_trainable, resources),
            param_space=param_space,
            tune_config=tune.TuneConfig(
                max_concurrent_trials=max(1, max_concurrent),
                trial_dirname_creator=_ray_trial_dirname,
                trial_name_creator=_ray_trial_name,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                storage_path=str(storage),
                name=f"tune-{time.strftime('%Y%m%d-%H%M%S')}",
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
            ),
        )
        grid = tuner.fit()
        results: dict[str, TrialResult] = {}
        for res in grid:
            spec = res.config["trial"]
            metrics = res.metrics or {}
            if res.error is not None or "memcores_status" not in metrics:
                # The worker itself died (node lost, OOM-killed Ray worker): use what the trial
                # wrote if it got that far, else report Ray's error.
                record = read_trial_record(spec["run_dir"]) or {}
                result = TrialResult(
                    spec["name"],
                    record.get("status", "error"),
                    record.get("returncode"),
                    float(record.get("seconds", 0.0)),
                    record.get("message") or f"Ray trial error: {res.error}",
                    spec["run_dir"],
                    spec["log_path"],
                )
            else:
                code = metrics["memcores_returncode"]
                result = TrialResult(
                    spec["name"],
                    metrics["memcores_status"],
                    None if code == -999 else int(code),
                    float(metrics["memcores_seconds"]),
                    metrics["memcores_message"],
                    spec["run_dir"],
                    spec["log_path"],
                )
            results[result.name] = result
            report(result)
    finally:
        if started_here:
            import ray

            ray.shutdown()
    return [
        results.get(t.name, TrialResult(t.name, "error", message="Ray returned no result"))
        for t in trials
    ]


# --------------------------------------------------------------------------- the sweep


def split_finished(trials: Sequence[Trial]) -> tuple[list[Trial], list[Trial]]:
    """(finished, to_run). A trial is finished when its trial.json says ok for the same argv.

    :raises SweepError: a finished trial of the same name ran a different command line (another
        config or other overrides): reusing it would mix two experiments in one sweep.
    """
    finished, todo = [], []
    for trial in trials:
        record = read_trial_record(trial.run_dir)
        if record and record.get("status") == "ok":
            spec = trial.spec()
            where = f"trial {trial.name!r} in {Path(trial.run_dir).parent} already finished"
            argv = record.get("argv", [])
            same_as = record.get(
                "same_as", [("{python}" if a == trial.python else a) for a in argv]
            )
            if same_as != spec["same_as"]:
                raise SweepError(
                    f"{where} with another command line:\n"
                    f"  was: {shlex.join(record.get('argv', []))}\n"
                    f"  now: {shlex.join(trial.argv)}\nuse another --out or delete that folder"
                )
            if record.get("config_sha256", spec["config_sha256"]) != spec["config_sha256"]:
                raise SweepError(
                    f"{where} with another version of the config file {trial.config}; "
                    "use another --out or delete that folder"
                )
            finished.append(trial)
        else:
            todo.append(trial)
    return finished, todo


def choose_backend(backend: str, address: str | None) -> str:
    """Resolve ``auto`` to ``ray`` when Ray is installed, else ``local``."""
    if backend not in BACKENDS:
        raise SweepError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    if address and backend == "local":
        raise SweepError("--address needs the Ray backend; drop --backend local")
    if backend == "local":
        return "local"
    if ray_available():
        return "ray"
    if backend == "ray" or address:
        raise SweepError(
            "Ray is not installed; install the extra with `pip install 'memcores[ray]'` "
            "or use --backend local"
        )
    return "local"


def run_sweep(
    trials: Sequence[Trial],
    out_dir: str | Path,
    *,
    backend: str = "auto",
    address: str | None = None,
    max_concurrent: int = 1,
    meta: dict[str, Any] | None = None,
    echo: Callable[[str], None] = print,
) -> list[TrialResult]:
    """Run every unfinished trial; returns one result per trial (``skipped`` for finished ones).

    Writes ``sweep.json`` before and after running. Failures never stop the sweep.
    """
    out = Path(out_dir).resolve()
    resolved = choose_backend(backend, address)
    finished, todo = split_finished(trials)
    connected_here = False
    if resolved == "ray" and todo:
        # Reach the cluster before writing anything: a wrong address leaves no half sweep.
        connected_here = connect_ray(address, max_concurrent, todo[0].cpus)
    try:
        return _run_sweep(
            trials, out, resolved, backend, address, max_concurrent, meta, echo, finished, todo
        )
    finally:
        if connected_here:
            import ray

            ray.shutdown()


def _run_sweep(
    trials: Sequence[Trial],
    out: Path,
    resolved: str,
    backend: str,
    address: str | None,
    max_concurrent: int,
    meta: dict[str, Any] | None,
    echo: Callable[[str], None],
    finished: Sequence[Trial],
    todo: Sequence[Trial],
) -> list[TrialResult]:
    out.mkdir(parents=True, exist_ok=True)
    sweep_meta = {**(meta or {}), "trials": [t.name for t in trials], "backend": resolved}
    write_json_atomic(out / SWEEP_FILE, {**sweep_meta, "state": "running"})
    where = f"Ray cluster at {address}" if address else f"{max_concurrent} at a time"
    if resolved == "ray":
        how = f"Ray Tune ({where})"
    else:
        why = "" if backend == "local" else " (Ray not installed: pip install 'memcores[ray]')"
        how = f"local processes{why}, {max_concurrent} at a time"
    echo(
        f"sweep {out}: {len(trials)} trials, {len(finished)} finished earlier (skipped), "
        f"{len(todo)} to run with {how}"
    )
    done = [0]
    lock = threading.Lock()

    def report(result: TrialResult) -> None:
        with lock:
            done[0] += 1
            echo(f"[{done[0]}/{len(todo)}] {result.name}: {result.status} ({result.seconds:.1f}s)")

    new: list[TrialResult] = []
    if todo:
        if resolved == "ray":
            new = run_ray(todo, max_concurrent, out / ".ray", address=address, report=report)
        else:
            new = run_local(todo, max_concurrent, report=report)
    by_name = {r.name: r for r in new}
    results = [
        by_name.get(t.name) or TrialResult(t.name, "skipped", 0, 0.0, "", t.run_dir, t.log_path)
        for t in trials
    ]
    write_json_atomic(
        out / SWEEP_FILE,
        {
            **sweep_meta,
            "state": "done",
            "results": {r.name: {"status": r.status, "returncode": r.returncode} for r in results},
        },
    )
    return results


def summarize(results: Sequence[TrialResult]) -> str:
    """A short text summary: counts, then each failed trial with its reason and log."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    order = ["ok", "skipped", "failed", "killed", "timeout", "error"]
    ranked = sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    lines = ["summary: " + ", ".join(f"{n} {s}" for s, n in ranked)]
    for r in results:
        if not r.ok:
            first, _, rest = r.message.partition("\n")
            lines.append(f"  FAILED {r.name}: {first} (log: {r.log_path})")
            lines.extend(f"    | {line}" for line in rest.splitlines())
    return "\n".join(lines)
