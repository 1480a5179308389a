"""Markdown result report of a sweep or a results folder: tables over seeds, and plots.

Reads, through :mod:`experiments.records`, what a sweep left in its folder (``trial.json``:
the outcome Tune reported; each run folder's ``config.yaml`` and ``progress.csv``; any other
``*.csv`` a trial wrote, e.g. the train/test table of a transfer trial) and committed records
(``record.json``, ``config.yaml``, ``curve.csv``, evaluation results). Nothing is re-run.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import shlex
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from experiments.config import parse_override, set_dotted
from experiments.core_compare import check_cores, comparison_rows
from experiments.plotting import auto_panel_key, plot_against, plot_runs
from experiments.records import (
    CURVE_FILE,
    RECORD_FILE,
    Run,
    find_runs,
    get_dotted,
    open_csv_text,
    read_config,
    read_record,
)
from experiments.sweep import SWEEP_FILE, TRIAL_FILE
from experiments.transfer_plot import TransferPoint, plot_transfer

# Metrics reported when none are asked for, in this order, if some trial logged them.
DEFAULT_METRICS = (
    "eval/accuracy",
    "eval/loss",
    "eval/mse",
    "rollout/ep_rew_mean",
    "rollout/success_rate",
)
# A metric whose name matches this is better when lower (best = min instead of max).
LOWER_IS_BETTER = re.compile(r"loss|mse|error|ep_len|bpc|perplexity", re.IGNORECASE)
LABEL_KEYS = ("env.id", "task.name", "suite")
# Learning curves (a run's progress.csv, a record's curve.csv) are tabulated per metric, not
# as result tables: averaging their rows over steps means nothing.
SKIP_CSVS = ("progress.csv", CURVE_FILE)
# Columns of a trial's result CSV that differ per trial by construction (paths): left out so
# the seeds of one row are averaged instead of listed apart.
SKIP_COLUMNS = re.compile(r"(^|_)(dir|path|file)$")


@dataclasses.dataclass
class TrialInfo:
    """What the report knows about one trial (or hand-made run) folder."""

    name: str
    path: Path
    status: str
    config: dict[str, Any]
    seconds: float | None = None
    message: str = ""
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The trial's dotted overrides as a tree: the fallback when it has no config.yaml of its
    own (a transfer trial keeps one per env pair, in sub-folders)."""

    def get(self, key: str, default: Any = None) -> Any:
        value = get_dotted(self.config, key)
        return get_dotted(self.settings, key, default) if value is None else value


@dataclasses.dataclass
class RunInfo:
    """A folder with a ``progress.csv`` inside a finished trial (the trial folder itself, or
    one env pair's run of a transfer trial)."""

    path: Path
    trial: TrialInfo
    config: dict[str, Any]
    run: Run | None = None

    def get(self, key: str, default: Any = None) -> Any:
        value = get_dotted(self.config, key)
        return self.trial.get(key, default) if value is None else value


def settings_tree(overrides: Sequence[str]) -> dict[str, Any]:
    """``["core.name=lstm", "train.seed=0"]`` -> ``{"core": {"name": "lstm"}, ...}``."""
    tree: dict[str, Any] = {}
    for item in overrides:
        try:
            set_dotted(tree, *parse_override(item))
        except ValueError:
            continue
    return tree


def run_key(item: TrialInfo | RunInfo) -> str:
    """The training run ``item`` comes from. The records of a transfer trial's pairs that share
    a train env (one run tested on two envs) name the same run folder, so they count once."""
    return str(item.get("run.dir") or item.path)


def load_runs(trials: Sequence[TrialInfo]) -> list[RunInfo]:
    """Every run folder and record of the finished trials, one per training run (hidden
    folders skipped)."""
    runs: dict[str, RunInfo] = {}
    for trial in trials:
        if trial.status != "ok":
            continue
        try:
            found = find_runs([trial.path])
        except FileNotFoundError:  # a trial that logged nothing
            continue
        for r in found:
            run = RunInfo(r.path, trial, r.config, r)
            runs.setdefault(run_key(run), run)
    return list(runs.values())


def load_sweep_meta(sweep_dir: Path) -> dict[str, Any]:
    """``sweep.json`` of the folder, ``{}`` if it was not made by ``memcores sweep``."""
    try:
        return json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return {}


def records_grid(folder: Path) -> dict[str, list[str]]:
    """The swept keys of a results folder, in grid order: the ``--grid`` options of the
    ``memcores sweep`` command lines that its records keep (``{}`` if none was a sweep)."""
    grid: dict[str, list[str]] = {}
    for path in sorted(folder.rglob(RECORD_FILE)):
        try:
            run = read_record(path.parent)
            words = shlex.split(str(run.record.get("command", "")))
        except ValueError:  # an unbalanced quote in a hand-written command
            continue
        if "sweep" not in words[:3]:
            continue
        for flag, value in zip(words, words[1:], strict=False):
            if flag == "--grid" and "=" in value:
                key, values = value.split("=", 1)
                known = grid.setdefault(key, [])
                known += [v for v in values.split(",") if v not in known]
        for key in searched_keys(words):  # a random/Optuna search or PBT: its sampled keys
            known = grid.setdefault(key, [])
            value = str(run.get(key))
            known += [value] if value not in known else []
    return grid


def searched_keys(words: Sequence[str]) -> list[str]:
    """The ``search:`` keys of a ``memcores sweep`` command that samples them (``--search
    random|optuna``, ``--scheduler pbt``), read from its config file; [] otherwise."""
    if not ({"--search", "--scheduler"} & set(words)) or len(words) < 3:
        return []
    sampled = any(
        (flag, value) in {("--search", "random"), ("--search", "optuna"), ("--scheduler", "pbt")}
        for flag, value in zip(words, words[1:], strict=False)
    )
    config = Path(words[words.index("sweep") + 1])
    try:
        section = yaml.safe_load(config.read_text()).get("search") if sampled else None
    except (OSError, ValueError, AttributeError):  # the config moved or is not a mapping
        return []
    return [str(k) for k in section] if isinstance(section, dict) else []


def numeric_axis(grid: dict[str, Sequence[Any]]) -> str | None:
    """The one swept key, besides the env, core and seed, whose values are all numbers (a
    delay, a length): the report tabulates and plots the final value against it."""
    skip = {*LABEL_KEYS, "core.name", *seed_keys(list(grid))}
    keys = [
        k
        for k, values in grid.items()
        if k not in skip and len(values) > 1 and all(_number(str(v)) is not None for v in values)
    ]
    return keys[0] if len(keys) == 1 else None


def pivot_table(
    runs: Sequence[RunInfo], metric: str, column_key: str, grid: dict[str, Sequence[Any]]
) -> str | None:
    """Last logged ``metric`` with one row per core and one column per value of
    ``column_key``: mean ± std over seeds, the seed count in brackets."""
    cells: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        points = read_progress(run).get(metric)
        if points:
            by_column = cells.setdefault(str(run.get("core.name", "-")), {})
            by_column.setdefault(str(run.get(column_key, "-")), []).append(points[-1][1])
    if not cells:
        return None
    seen = {c for by_column in cells.values() for c in by_column}
    columns = [str(v) for v in grid.get(column_key, []) if str(v) in seen]
    columns += sorted(seen - set(columns), key=lambda c: (_number(c) is None, _number(c) or 0, c))
    cores = sorted(cells, key=lambda c: order_key((c,), ["core.name"], grid))
    rows = [
        [core]
        + [
            f"{mean_std(cells[core][c])} ({len(cells[core][c])})" if c in cells[core] else "-"
            for c in columns
        ]
        for core in cores
    ]
    short = column_key.rsplit(".", 1)[-1]
    return markdown_table(["core.name", *(f"{short}={c}" for c in columns)], rows)


def load_trials(sweep_dir: Path) -> list[TrialInfo]:
    """Every trial folder (``*/trial.json``) plus run folders with a config but no trial.json.

    :raises FileNotFoundError: the folder is missing or holds neither.
    """
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"no such sweep folder: {sweep_dir}")
    trials: dict[Path, TrialInfo] = {}
    for record_path in sorted(sweep_dir.glob(f"*/{TRIAL_FILE}")):
        folder = record_path.parent
        try:
            record = json.loads(record_path.read_text())
        except ValueError:
            record = {"status": "error", "message": f"unreadable {record_path}"}
        trials[folder] = TrialInfo(
            name=folder.name,
            path=folder,
            status=record.get("status", "unknown"),
            config=read_config(folder, folder),
            seconds=record.get("seconds"),
            message=record.get("message", ""),
            settings=settings_tree(record.get("overrides", [])),
        )
    for record_path in sorted(sweep_dir.rglob(RECORD_FILE)):
        folder = record_path.parent
        if folder not in trials and not any(p.startswith(".") for p in folder.parts):
            record = read_record(folder).record
            seconds = record.get("wall_seconds")
            trials[folder] = TrialInfo(
                folder.name, folder, "ok", read_config(folder, folder), seconds
            )
    for config_path in sorted(sweep_dir.glob("*/config.yaml")):
        folder = config_path.parent
        if folder not in trials and not folder.name.startswith("."):
            trials[folder] = TrialInfo(folder.name, folder, "ok", read_config(folder, folder))
    if not trials:
        raise FileNotFoundError(
            f"{sweep_dir} holds no trials (no */{TRIAL_FILE}, */config.yaml or {RECORD_FILE}); "
            "give the folder of `memcores sweep --out` or a results folder"
        )
    return [trials[k] for k in sorted(trials)]


def read_progress(run: RunInfo) -> dict[str, list[tuple[float, float]]]:
    """``{tag: [(step, value), ...]}`` of a run folder or record."""
    curves = run.run.curves() if run.run is not None else {}
    return {
        tag: list(zip(c.steps.tolist(), c.values.tolist(), strict=True))
        for tag, c in curves.items()
    }


def mean_std(values: Sequence[float]) -> str:
    """``"0.812 ± 0.031"`` (sample std over seeds), or the value alone for one seed."""
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.4g}"
    return f"{mean:.4g} ± {statistics.stdev(values):.2g}"


def seed_keys(keys: Sequence[str]) -> set[str]:
    return {k for k in keys if k.rsplit(".", 1)[-1] == "seed"}


def row_keys(items: Sequence[TrialInfo | RunInfo], grid_keys: Sequence[str]) -> list[str]:
    """Config keys that make one table row each: env/task label, core, other swept keys.
    Seeds are never a row key: they are what rows average over."""
    keys = [k for k in LABEL_KEYS if any(t.get(k) is not None for t in items)][:1]
    keys.append("core.name")
    seeds = seed_keys(grid_keys)
    # A swept key no item's config holds (a transfer trial's `suite`, which its records keep
    # as env ids) would only add a column of dashes.
    keys += [
        k
        for k in grid_keys
        if k not in keys and k not in seeds and any(t.get(k) is not None for t in items)
    ]
    return keys


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metric_table(
    runs: Sequence[RunInfo],
    metric: str,
    keys: Sequence[str],
    grid: dict[str, Sequence[Any]] | None = None,
) -> str | None:
    """Final and best value of ``metric`` per row (mean ± std over seeds); None if unlogged."""
    lower = bool(LOWER_IS_BETTER.search(metric))
    groups: dict[tuple[str, ...], list[tuple[float, float, float]]] = {}
    for run in runs:
        points = read_progress(run).get(metric)
        if not points:
            continue
        values = [v for _, v in points]
        best = min(values) if lower else max(values)
        key = tuple(str(run.get(k, "-")) for k in keys)
        groups.setdefault(key, []).append((values[-1], best, points[-1][0]))
    if not groups:
        return None
    header = [k for k in keys] + ["seeds", "final", f"best ({'min' if lower else 'max'})", "steps"]
    rows = []
    for key, items in sorted(groups.items(), key=lambda kv: order_key(kv[0], keys, grid or {})):
        finals, bests, steps = zip(*items, strict=True)
        step_text = f"{int(min(steps))}" + (
            f"-{int(max(steps))}" if min(steps) != max(steps) else ""
        )
        rows.append([*key, len(items), mean_std(finals), mean_std(bests), step_text])
    return markdown_table(header, rows)


def result_csvs(trial: TrialInfo) -> list[Path]:
    """Tables a trial wrote besides its learning curve (e.g. transfer's train/test reward table)."""
    return sorted(
        p
        for p in trial.path.rglob("*.csv")
        if p.name not in SKIP_CSVS and not any(part.startswith(".") for part in p.parts)
    )


def result_tables(trials: Iterable[TrialInfo]) -> Iterator[tuple[TrialInfo, Path, list[dict]]]:
    """``(trial, csv path, rows)`` for every non-empty result CSV of the finished trials."""
    for trial in trials:
        if trial.status != "ok":
            continue
        for path in result_csvs(trial):
            with open_csv_text(path) as handle:
                rows = list(csv.DictReader(handle))
            if rows:
                yield trial, path, rows


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def csv_tables(
    trials: Sequence[TrialInfo],
    keys: Sequence[str],
    grid: dict[str, Sequence[Any]] | None = None,
) -> dict[str, str]:
    """One markdown table per result-CSV file name, rows averaged over seeds.

    A row is identified by the trial's row keys (core, ...) that the CSV does not hold itself
    plus the CSV's text columns (env ids, ...); its numeric columns are averaged over the
    trials (seeds) that share them.
    """
    tables: dict[str, dict[tuple[str, ...], dict[str, list[float]]]] = {}
    layouts: dict[str, tuple[list[str], list[str], list[str]]] = {}
    for trial, path, rows in result_tables(trials):
        name = str(path.relative_to(trial.path))
        if name not in layouts:
            columns = [c for c in rows[0] if c and not SKIP_COLUMNS.search(c)]
            numeric = [c for c in columns if all(_number(r[c]) is not None for r in rows)]
            text = [c for c in columns if c not in numeric]
            own = [k for k in keys if k not in columns]
            layouts[name] = (own, text, numeric)
        own, text, numeric = layouts[name]
        table = tables.setdefault(name, {})
        for row in rows:
            key = tuple(str(trial.get(k, "-")) for k in own) + tuple(
                str(row.get(c, "")) for c in text
            )
            cells = table.setdefault(key, {})
            for c in numeric:
                value = _number(row.get(c, ""))
                if value is not None:
                    cells.setdefault(c, []).append(value)
    out = {}
    for name, table in tables.items():
        own, text, numeric = layouts[name]
        rows = [
            [*key, max((len(v) for v in cells.values()), default=0)]
            + [mean_std(cells.get(c, [])) for c in numeric]
            for key, cells in sorted(
                table.items(), key=lambda kv: order_key(kv[0], own, grid or {})
            )
        ]
        out[name] = markdown_table([*own, *text, "seeds", *numeric], rows)
    return out


TRANSFER_QUANTITIES = ("return", "success")
"""What a transfer table can show per env pair: the columns ``train_<q>`` and ``test_<q>``."""


def short_env(env_id: str) -> str:
    """``MiniGrid-DoorKey-5x5-v0`` -> ``DoorKey-5x5`` (the names the thesis tables print)."""
    name = env_id.split("/")[-1]
    name = re.sub(r"^(MiniGrid|BabyAI)-", "", name)
    return re.sub(r"-v\d+$", "", name)


def load_reference(path: str | Path) -> dict[str, Any]:
    """A reference table: ``title``, and ``train``/``test`` blocks ``{env: {core: value}}``
    (env names as :func:`short_env` prints them), e.g. a paper's transfer table."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference file not found: {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or not {"train", "test"} & set(data):
        raise ValueError(f"reference file {path} needs `train:` and/or `test:` blocks")
    for block in ("train", "test"):
        for env, cores in (data.get(block) or {}).items():
            if not isinstance(cores, dict):
                raise ValueError(f"reference {path}: {block}.{env} must map core -> value")
    return data


def record_transfer_rows(trials: Iterable[TrialInfo]) -> Iterator[tuple[TrialInfo, Path, list]]:
    """Transfer rows of committed records: their evaluation on the train env and the test env."""
    for trial in trials:
        path = trial.path / RECORD_FILE
        if trial.status != "ok" or not path.is_file():
            continue
        run = read_record(trial.path)
        record = run.record
        evals, train_env, test_env = (
            record.get("eval", {}),
            record.get("env"),
            record.get("test_env"),
        )
        if train_env in evals and test_env in evals:
            row = {"train_env": train_env, "test_env": test_env, "core": record.get("core")}
            row["run"] = run_key(trial)  # the run its pairs share
            for quantity in TRANSFER_QUANTITIES:
                row[f"train_{quantity}"] = str(evals[train_env].get(quantity))
                row[f"test_{quantity}"] = str(evals[test_env].get(quantity))
            yield trial, path, [row]


def transfer_rows(
    trials: Sequence[TrialInfo], quantity: str = "return"
) -> Iterator[tuple[str, str, dict[str, str]]]:
    """``(core, run, row)`` for every train/test row of the trials' result CSVs and records
    that has ``quantity`` (``run`` names the training run the row evaluates)."""
    columns_needed = {"train_env", "test_env", f"train_{quantity}", f"test_{quantity}"}
    for trial, _path, rows in [*result_tables(trials), *record_transfer_rows(trials)]:
        if not columns_needed <= set(rows[0]):
            continue
        for row in rows:
            core = str(trial.get("core.name") or row.get("core") or "-")
            yield core, row.get("run") or str(trial.path), row


def transfer_points(trials: Sequence[TrialInfo], quantity: str = "return") -> list[TransferPoint]:
    """Each core's train and test ``quantity`` per (train env, test env) pair, one value per
    run, for the transfer figure (:func:`experiments.transfer_plot.plot_transfer`)."""
    points: dict[tuple[str, str, str], TransferPoint] = {}
    for core, _run, row in transfer_rows(trials, quantity):
        train, test = _number(row[f"train_{quantity}"]), _number(row[f"test_{quantity}"])
        if train is None or test is None:
            continue
        pair = (short_env(row["train_env"]), short_env(row["test_env"]))
        point = points.setdefault((core, *pair), TransferPoint(core, *pair))
        point.train.append(train)
        point.test.append(test)
    return list(points.values())


def order_rank(order: Sequence[str]) -> Callable[[str], int]:
    """A sort key that puts names in ``order`` first, in that order, and the rest after them
    (a stable sort keeps theirs)."""
    rank = {name: i for i, name in enumerate(order)}
    return lambda name: rank.get(name, len(rank))


def transfer_table(
    trials: Sequence[TrialInfo],
    reference: dict[str, Any] | None = None,
    core_order: Sequence[str] = (),
    quantity: str = "return",
    env_order: dict[str, Sequence[str]] | None = None,
) -> str | None:
    """The thesis's Table 7 layout: a Train block and a Test block of env rows, one column per
    core (mean ± std over seeds of ``quantity``, one of :data:`TRANSFER_QUANTITIES`), the
    reference's numbers in a column beside each core it has. Built from trial CSVs and records
    with train_env/test_env/train_<quantity>/test_<quantity>; None where none has them.

    :param env_order: ``{"train": [...], "test": [...]}`` row order (a published table's);
        envs it does not name follow in the order they were found.
    """
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    envs: dict[str, list[str]] = {"train": [], "test": []}
    cores: list[str] = list(core_order)
    # A run tested on two envs is one train return: a trial's CSV trains each env once, and
    # the records of its pairs name their shared run.
    seen: set[tuple[str, str, str]] = set()
    for core, run, row in transfer_rows(trials, quantity):
        if core not in cores:
            cores.append(core)
        for block in ("train", "test"):
            env = short_env(row[f"{block}_env"])
            if env not in envs[block]:
                envs[block].append(env)
            value = _number(row[f"{block}_{quantity}"])
            key = (run, block, env)
            if value is not None and key not in seen:
                seen.add(key)
                cells.setdefault((block, env), {}).setdefault(core, []).append(value)
    if not cells:
        return None
    for block, names in (env_order or {}).items():
        envs[block].sort(key=order_rank(names))
    ours = [c for c in cores if any(c in v for v in cells.values())]
    ref = reference or {}
    ref_cores: list[str] = []
    for block in ("train", "test"):
        for env in envs[block]:
            for core in (ref.get(block) or {}).get(env, {}):
                if core not in ref_cores:
                    ref_cores.append(core)
    ref_name = ref.get("label", "ref")
    header = ["Environment"]
    columns: list[tuple[str, str]] = []  # (core, "ours"|"ref")
    for core in [*ours, *(c for c in ref_cores if c not in ours)]:
        if core in ours:
            columns.append((core, "ours"))
            header.append(core)
        if core in ref_cores:
            columns.append((core, "ref"))
            header.append(f"{core} ({ref_name})")
    rows: list[list[Any]] = []
    for block in ("train", "test"):
        rows.append([f"**{block.capitalize()}**", *([""] * len(columns))])
        for env in envs[block]:
            row: list[Any] = [env]
            for core, kind in columns:
                if kind == "ours":
                    row.append(mean_std(cells.get((block, env), {}).get(core, [])))
                else:
                    value = (ref.get(block) or {}).get(env, {}).get(core)
                    row.append("-" if value is None else f"{value:g}")
            rows.append(row)
    return markdown_table(header, rows)


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return path


def order_key(
    key: tuple[str, ...], keys: Sequence[str], grid: dict[str, Sequence[Any]]
) -> tuple[Any, ...]:
    """Sort rows in the order the grid lists its values (lstm before ur_lstm if so given),
    other columns alphabetically."""
    out: list[Any] = []
    for name, value in zip(keys, key, strict=False):
        values = [str(v) for v in grid.get(name, [])]
        out.append((values.index(value), "") if value in values else (len(values), value))
    out.extend((0, v) for v in key[len(keys) :])
    return tuple(out)


def slug(text: str) -> str:
    return re.sub(r"[^\w]+", "_", text).strip("_")


def choose_metrics(runs: Sequence[RunInfo], metrics: Sequence[str] | None) -> list[str]:
    """The metrics asked for (each must have been logged), or the default ones logged.

    :raises ValueError: an asked metric no run logged (the message lists those logged).
    """
    logged: set[str] = set()
    for run in runs:
        logged.update(read_progress(run))
    if not metrics:
        return [m for m in DEFAULT_METRICS if m in logged]
    missing = [m for m in metrics if m not in logged]
    if missing:
        raise ValueError(
            f"metric(s) {missing} were not logged by any trial; logged: "
            f"{', '.join(sorted(logged)) or '(none)'}"
        )
    return list(metrics)


def header_lines(title: str, meta: dict[str, Any], trials: Sequence[TrialInfo]) -> list[str]:
    """Title, what was swept (from ``sweep.json``), the trial count and how to read tables."""
    lines = [f"# {title}", ""]
    ok = [t for t in trials if t.status == "ok"]
    if meta:
        grid = ", ".join(
            f"`{k}` = {', '.join(map(str, v))}" for k, v in meta.get("grid", {}).items()
        )
        if "command" in meta:
            on = f" on `{display_path(meta['config'])}`" if "config" in meta else ""
            lines.append(f"- command: `memcores {meta['command']}`{on}")
        lines.append(f"- grid: {grid or '(none)'}")
        if meta.get("overrides"):
            lines.append(f"- overrides for every trial: `{' '.join(meta['overrides'])}`")
        if "backend" in meta:
            lines.append(f"- backend: {meta['backend']}")
    seconds = list({run_key(t): t.seconds for t in trials if t.seconds is not None}.values())
    budget = f", {sum(seconds) / 60:.1f} trial-minutes in total" if seconds else ""
    # A transfer run tested on several envs leaves one record per test env: count runs.
    runs, ok_runs = {run_key(t) for t in trials}, {run_key(t) for t in ok}
    label, records = "trials", ""
    if len(trials) != len(runs):
        label, records = "training runs", f", {len(trials)} records"
    not_ok = len(runs) - len(ok_runs)
    lines += [f"- {label}: {len(runs)} ({len(ok_runs)} ok, {not_ok} not ok){records}{budget}", ""]
    lines += [
        "Tables: mean ± sample std over seeds of the last logged value (final) and of the best "
        "value of each run; `steps` is the step of the last logged value.",
        "",
    ]
    return lines


def build_report(
    sweep_dir: str | Path,
    out: str | Path,
    metrics: Sequence[str] | None = None,
    spread: str = "minmax",
    plots: bool = True,
    title: str | None = None,
    reference: str | Path | None = None,
    compare: tuple[str, str] | None = None,
) -> str:
    """Write the markdown report ``out`` (plots as PNGs beside it) and return its text.

    :param metrics: scalar tags to tabulate and plot; default: those of :data:`DEFAULT_METRICS`
        that some trial logged.
    :param reference: YAML of published numbers (:func:`load_reference`) shown beside ours in
        the transfer table.
    :param compare: ``(base, other)`` cores whose transfer runs are set side by side per pair
        (:mod:`experiments.core_compare`).
    """
    ref = load_reference(reference) if reference else None
    sweep_dir = Path(sweep_dir)
    out = Path(out)
    meta = load_sweep_meta(sweep_dir)
    trials = load_trials(sweep_dir)
    # read once: checked before anything is written, tabulated at the end
    compare_points = transfer_points(trials) if compare else []
    if compare:
        check_cores(compare_points, compare)
    if not meta and (grid := records_grid(sweep_dir)):
        meta = {"grid": grid}
    runs = load_runs(trials)
    grid_keys = list(meta.get("grid", {}))
    keys = row_keys(runs or trials, grid_keys)
    metrics = choose_metrics(runs, metrics)

    lines = header_lines(title or f"Sweep report: {sweep_dir.name}", meta, trials)
    failed = [t for t in trials if t.status != "ok"]
    out.parent.mkdir(parents=True, exist_ok=True)
    # Plot the same runs the tables use: those of finished trials.
    plot_paths = [r.path for r in runs]
    plots = plots and bool(plot_paths)
    panel_key = auto_panel_key(find_runs(plot_paths)) if plots else None
    group_by = [k for k in keys if k not in LABEL_KEYS]
    axis = numeric_axis(meta.get("grid", {}))
    for metric in metrics:
        table = metric_table(runs, metric, keys, meta.get("grid"))
        if table is None:
            continue
        lines += [f"## {metric}", "", table, ""]
        if axis:
            pivot = pivot_table(runs, metric, axis, meta.get("grid", {}))
            lines += [f"Last logged value against `{axis}`, mean ± std (seeds):", "", pivot, ""]
            if plots:
                png = out.parent / f"{out.stem}_{slug(metric)}_vs_{slug(axis)}.png"
                others = [k for k in group_by if k != axis]
                plot_against(plot_paths, metric, axis, png, group_by=others, spread=spread)
                lines += [f"![{metric} against {axis}]({png.name})", ""]
        if plots:
            png = out.parent / f"{out.stem}_{slug(metric)}.png"
            try:
                plot_runs(
                    plot_paths, metric, png, group_by=group_by, panel_by=panel_key, spread=spread
                )
            except ValueError as err:  # e.g. --log-y on non-positive values
                lines += [f"(no plot: {err})", ""]
            else:
                lines += [f"![{metric}]({png.name})", ""]

    core_order = [str(c) for c in meta.get("grid", {}).get("core.name", [])]
    env_order = {block: list((ref or {}).get(block) or {}) for block in ("train", "test")}
    for quantity in TRANSFER_QUANTITIES:
        # Published transfer tables (the thesis's Table 7) give returns only.
        quantity_ref = ref if quantity == "return" else None
        table7 = transfer_table(trials, quantity_ref, core_order, quantity, env_order)
        if table7:
            title7 = f"Train/test {quantity} per env pair (mean ± std over seeds)"
            if quantity_ref:
                label = quantity_ref.get("label", "ref")
                title7 += f"; {label}: {quantity_ref.get('title', reference)}"
            lines += [f"## {title7}", "", table7, ""]
            if plots:
                png = out.parent / f"{out.stem}_train_vs_test_{quantity}.png"
                rank = order_rank(env_order["train"])
                points = sorted(transfer_points(trials, quantity), key=lambda p: rank(p.train_env))
                plot_transfer(points, png, quantity, quantity_ref, core_order)
                lines += [f"![train vs test {quantity}]({png.name})", ""]
    if compare:
        base, other = compare
        rank = order_rank(env_order["train"])
        points = sorted(compare_points, key=lambda p: rank(p.train_env))
        for block in ("test", "train"):
            header, rows = comparison_rows(points, base, other, block)
            if rows:
                lines += [
                    f"## `{other}` against `{base}`, {block} return per run",
                    "",
                    f"Difference: `{other}`'s mean minus `{base}`'s. Separation: `above` / "
                    f"`below` when every `{other}` run is above / below every `{base}` run. "
                    "Welch p: two-sided, unequal variances.",
                    "",
                    markdown_table(header, rows),
                    "",
                ]
    trial_keys = row_keys(trials, grid_keys)
    for name, table in csv_tables(trials, trial_keys, meta.get("grid")).items():
        lines += [f"## Table `{name}` (per trial, averaged over seeds)", "", table, ""]

    if failed:
        rows = [
            [t.name, t.status, (t.message.splitlines() or [""])[0].replace("|", "/")]
            for t in failed
        ]
        lines += [
            "## Trials that did not finish",
            "",
            markdown_table(["trial", "status", "reason"], rows),
            "",
        ]
    text = "\n".join(lines)
    out.write_text(text)
    return text
