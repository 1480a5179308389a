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

from memcores.experiments.config import parse_override, parse_yaml, read_yaml, set_dotted, shorten
from memcores.experiments.core_compare import check_cores, comparison_rows, retention_rows
from memcores.experiments.plotting import auto_panel_key, plot_against, plot_runs
from memcores.experiments.records import (
    CURVE_FILE,
    POLICY_FILE,
    RECORD_FILE,
    Run,
    curve_file,
    find_runs,
    get_dotted,
    is_incomplete,
    open_csv_text,
    read_config,
    read_record,
    read_rows,
)
from memcores.experiments.run_groups import seed_count, variant_names
from memcores.experiments.sweep import SWEEP_FILE, TRIAL_FILE
from memcores.experiments.transfer_plot import TransferPoint, plot_retention, plot_transfer

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
    found: list[Run] = dataclasses.field(default_factory=list)
    """Its run folders and records (:func:`experiments.records.find_runs`)."""
    variant: str = ""
    """What sets its config apart from the other trials of its core and env
    (:func:`experiments.run_groups.variant_names`); ``""`` where they agree."""
    core_options: str = ""
    """The swept core options it ran with, as ``memcores bench cores`` names them
    (``":memory_len=16"``): the transfer tables label its core ``gtrxl:memory_len=16`` so
    that runs of one core with different options are never pooled."""

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
    variant: str = ""
    """What sets its config apart from the other runs of its table row (see TrialInfo)."""

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
        for r in trial.found:
            run = RunInfo(r.path, trial, r.config, r)
            runs.setdefault(run_key(run), run)
    return list(runs.values())


def seed_of(item: TrialInfo | RunInfo) -> Any:
    """The item's seed; its folder where the config names none (each run its own seed)."""
    seed = item.get("train.seed")
    return item.path if seed is None else seed


def assign_variants(items: Sequence[TrialInfo] | Sequence[RunInfo], keys: Sequence[str]) -> None:
    """Set each item's ``variant``: the config keys on which it differs from the other items
    with the same ``keys`` values (env, core, swept keys), so that only seeds are pooled."""
    names = variant_names(
        items,
        lambda item: item.config or _settings_of(item),
        lambda item: tuple(str(item.get(k)) for k in keys),
    )
    for item, name in zip(items, names, strict=True):
        item.variant = name


def _settings_of(item: TrialInfo | RunInfo) -> dict[str, Any]:
    trial = item if isinstance(item, TrialInfo) else item.trial
    return trial.settings


def core_label(item: TrialInfo | RunInfo, core: str | None = None) -> str:
    """The core name, with what sets the item's config apart in brackets (``lstm
    [agent.n_epochs=4]``): runs that differ in more than the seed are never pooled."""
    name = str(core if core is not None else item.get("core.name", "-"))
    return f"{name} [{item.variant}]" if item.variant not in ("", "-") else name


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
        except ValueError:  # an unreadable record, an unbalanced quote in a hand-made command
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
        section = parse_yaml(config.read_text()).get("search") if sampled else None
    except (OSError, ValueError, AttributeError, yaml.YAMLError):  # moved, not a mapping
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
    seeds: dict[tuple[str, str], list[Any]] = {}
    for run in runs:
        points = read_progress(run).get(metric)
        if points:
            core, column = core_label(run), str(run.get(column_key, "-"))
            cells.setdefault(core, {}).setdefault(column, []).append(points[-1][1])
            seeds.setdefault((core, column), []).append(seed_of(run))
    if not cells:
        return None
    seen = {c for by_column in cells.values() for c in by_column}
    columns = [str(v) for v in grid.get(column_key, []) if str(v) in seen]
    columns += sorted(seen - set(columns), key=lambda c: (_number(c) is None, _number(c) or 0, c))
    cores = sorted(cells, key=lambda c: order_key((c,), ["core.name"], grid))
    rows = [
        [core]
        + [
            f"{mean_std(cells[core][c])} ({seed_count(seeds[core, c])})"
            if c in cells[core]
            else "-"
            for c in columns
        ]
        for core in cores
    ]
    short = column_key.rsplit(".", 1)[-1]
    return markdown_table(["core.name", *(f"{short}={c}" for c in columns)], rows)


def load_trials(sweep_dir: Path) -> list[TrialInfo]:
    """Every trial folder (``*/trial.json``), record (``record.json``) and run folder with a
    config but no trial.json. A trial whose files are unreadable, empty or missing (a record
    folder without ``record.json``, an empty ``curve.csv``, a corrupt ``config.yaml``) gets the
    status ``broken`` and a message that names the file.

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
        trials[folder] = _trial(
            folder,
            record.get("status", "unknown"),
            record.get("seconds"),
            record.get("message", ""),
            settings_tree(record.get("overrides", [])),
        )
    for record_path in sorted(sweep_dir.rglob(RECORD_FILE)):
        folder = record_path.parent
        if folder not in trials and not _hidden(folder, sweep_dir):
            try:
                seconds = read_record(folder).record.get("wall_seconds")
            except ValueError as err:
                trials[folder] = TrialInfo(folder.name, folder, BROKEN, {}, message=str(err))
                continue
            trials[folder] = _trial(folder, "ok", seconds)
    for folder in half_written_records(sweep_dir, trials):
        message = f"no {RECORD_FILE} in {folder} (a record is complete once it is written)"
        trials[folder] = TrialInfo(folder.name, folder, BROKEN, {}, message=message)
    for config_path in sorted(sweep_dir.glob("*/config.yaml")):
        folder = config_path.parent
        if folder not in trials and not folder.name.startswith("."):
            trials[folder] = _trial(folder, "ok")
    if not trials:
        raise FileNotFoundError(
            f"{sweep_dir} holds no trials (no */{TRIAL_FILE}, */config.yaml or {RECORD_FILE}); "
            "give the folder of `memcores sweep --out` or a results folder"
        )
    for trial in trials.values():
        if trial.status == "ok":
            _find_runs(trial)
    return [trials[k] for k in sorted(trials)]


BROKEN = "broken"
"""Status of a trial whose files cannot be read (see :func:`load_trials`)."""


def _hidden(folder: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in folder.relative_to(root).parts)


def _trial(
    folder: Path,
    status: str,
    seconds: float | None = None,
    message: str = "",
    settings: dict[str, Any] | None = None,
) -> TrialInfo:
    """A :class:`TrialInfo` with its config; ``broken`` when the config is corrupt."""
    try:
        config = read_config(folder, folder)
    except ValueError as err:
        return TrialInfo(folder.name, folder, BROKEN, {}, seconds, str(err), settings or {})
    return TrialInfo(folder.name, folder, status, config, seconds, message, settings or {})


def half_written_records(root: Path, known: dict[Path, TrialInfo]) -> list[Path]:
    """Folders that hold a record's other files (``curve.csv``, ``policy.pt``) but no
    ``record.json``, outside the trials already found."""
    folders = {p.parent for name in (CURVE_FILE, POLICY_FILE) for p in root.rglob(name)}
    return sorted(
        f
        for f in folders
        if not (f / RECORD_FILE).is_file()
        and not _hidden(f, root)
        and not any(f == k or k in f.parents for k in known)
    )


def _find_runs(trial: TrialInfo) -> None:
    """Fill ``trial.found``; mark the trial broken when it logged nothing or a curve is empty."""
    try:
        trial.found = find_runs([trial.path])
    except FileNotFoundError:
        trial.status, trial.message = BROKEN, f"nothing logged in {trial.path}"
        return
    except ValueError as err:  # an unreadable record.json or config.yaml below it
        trial.status, trial.message = BROKEN, str(err)
        return
    for run in trial.found:
        curve = curve_file(run.path)
        if run.is_record and not (run.path / CURVE_FILE).is_file():
            trial.status, trial.message = BROKEN, f"no {CURVE_FILE} in {run.path}"
        elif not read_rows(curve):
            trial.status, trial.message = BROKEN, f"empty {curve.name}: {curve}"
        else:
            continue
        trial.found = []
        return


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
    threshold: float | None = None,
) -> str | None:
    """Final and best value of ``metric`` per row (mean ± std over seeds); None if unlogged.

    A row pools the runs that share ``keys`` and every other setting (their ``variant``, shown
    in a ``config`` column when some row has one, :data:`VARIANT_NOTE`); ``seeds`` counts
    distinct seeds. The best value is the record's own (from its full curve) where it keeps
    one. ``threshold``: one more column, each run's first step at which ``metric`` reached it
    (:func:`first_crossing`).
    """
    lower = bool(LOWER_IS_BETTER.search(metric))
    groups: dict[tuple[str, ...], list[tuple[float, float, float, Any]]] = {}
    crossings: dict[tuple[str, ...], list[tuple[Any, str]]] = {}
    for run in runs:
        points = read_progress(run).get(metric)
        if not points:
            continue
        best = recorded_best(run, metric, lower)
        if best is None:
            values = [v for _, v in points]
            best = min(values) if lower else max(values)
        key = (*(str(run.get(k, "-")) for k in keys), run.variant)
        groups.setdefault(key, []).append((points[-1][1], best, points[-1][0], seed_of(run)))
        if threshold is not None:
            crossings.setdefault(key, []).append(
                (seed_of(run), first_crossing(run, metric, threshold))
            )
    if not groups:
        return None
    variants = any(key[-1] for key in groups)
    header = [*keys, *(["config"] if variants else [])]
    header += ["seeds", "final", f"best ({'min' if lower else 'max'})", "steps"]
    header += [f"first ≥ {threshold:g} (per run)"] if threshold is not None else []
    rows = []
    for key, items in sorted(groups.items(), key=lambda kv: order_key(kv[0], keys, grid or {})):
        finals, bests, steps, seeds = zip(*items, strict=True)
        step_text = f"{int(min(steps))}" + (
            f"-{int(max(steps))}" if min(steps) != max(steps) else ""
        )
        cells = [seed_count(seeds), mean_std(finals), mean_std(bests), step_text]
        if threshold is not None:
            ordered = sorted(crossings[key], key=lambda c: _seed_rank(str(c[0])))
            cells.append(" / ".join(text for _, text in ordered))
        rows.append([*key[:-1], *([key[-1] or "-"] if variants else []), *cells])
    notes = [VARIANT_NOTE] if variants else []
    if threshold is not None:
        notes.append(THRESHOLD_NOTE.format(t=threshold, m=metric))
    return "\n\n".join([markdown_table(header, rows), *notes])


THRESHOLD_NOTE = (
    "`first ≥ {t:g}`: each run's first logged step with `{m}` ≥ {t:g}, in seed order (`never`: "
    "not reached), from the full curve: a run folder's `progress.csv` or the number its record "
    "computed from it; `*`: from the record's thinned `curve.csv` (the record keeps no such "
    "number), which can show a crossing later than the run had it."
)


def first_crossing(run: RunInfo, metric: str, threshold: float) -> str:
    """The first step at which ``metric`` reached ``threshold`` (``"never"``), read from the
    record's derived numbers where it has them for this level, else from the curve (marked
    ``*`` when that curve is a record's thinned one)."""
    record = run.run.record if run.run is not None else {}
    recorded = (record.get("derived") or {}).get("first_at_least", {}).get(metric, {})
    if f"{threshold:g}" in recorded:
        step = recorded[f"{threshold:g}"]
        return "never" if step is None else str(int(step))
    step = next((s for s, v in read_progress(run).get(metric, []) if v >= threshold), None)
    mark = "*" if record else ""
    return f"never{mark}" if step is None else f"{int(step)}{mark}"


VARIANT_NOTE = (
    "`config`: the settings in which a row's runs differ from the most common setting among "
    "the runs of the same env and core (`-`: none); runs that differ in more than the seed "
    "are never pooled in one row."
)


def recorded_best(run: RunInfo, metric: str, lower: bool) -> float | None:
    """The best value of ``metric`` a record computed from its full curve, if it has one."""
    record = run.run.record if run.run is not None else {}
    best = (record.get("derived") or {}).get("min" if lower else "max", {}).get(metric)
    return float(best[1]) if best else None


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
    """A reference table: ``title`` and ``label`` (text), and ``train``/``test`` blocks
    ``{env: {core: value}}`` (env names as :func:`short_env` prints them, values numbers or
    ``null``), e.g. a paper's transfer table; read by the checked YAML loader.

    :raises ValueError: a missing or malformed file, or a value of the wrong type (one line
        naming the file and the key).
    """
    path = Path(path)
    data = read_yaml(path, "reference file")
    if not isinstance(data, dict) or not {"train", "test"} & set(data):
        raise ValueError(f"reference file {path} needs `train:` and/or `test:` blocks")
    for key in ("title", "label"):
        if not isinstance(data.get(key, ""), str):
            raise ValueError(f"reference {path}: {key} must be text, got {shorten(data[key])}")
    for block in ("train", "test"):
        envs = data.get(block) or {}
        if not isinstance(envs, dict):
            raise ValueError(f"reference {path}: {block} must map env -> {{core: value}}")
        for env, cores in envs.items():
            if not isinstance(cores, dict):
                raise ValueError(f"reference {path}: {block}.{env} must map core -> value")
            for core, value in cores.items():
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if value is not None and not (number and math.isfinite(value)):
                    raise ValueError(
                        f"reference {path}: {block}.{env}.{core} must be a number or null, "
                        f"got {shorten(value)}"
                    )
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
) -> Iterator[tuple[str, str, dict[str, str], str]]:
    """``(core, run, row, seed)`` for every train/test row of the trials' result CSVs and
    records that has ``quantity`` (``run`` names the training run the row evaluates)."""
    columns_needed = {"train_env", "test_env", f"train_{quantity}", f"test_{quantity}"}
    for trial, _path, rows in [*result_tables(trials), *record_transfer_rows(trials)]:
        if not columns_needed <= set(rows[0]):
            continue
        for row in rows:
            name = str(trial.get("core.name") or row.get("core") or "-")
            core = core_label(trial, name + trial.core_options)
            yield core, row.get("run") or str(trial.path), row, str(seed_of(trial))


def transfer_points(trials: Sequence[TrialInfo], quantity: str = "return") -> list[TransferPoint]:
    """Each core's train and test ``quantity`` per (train env, test env) pair, one value per
    run, for the transfer figure (:func:`experiments.transfer_plot.plot_transfer`)."""
    points: dict[tuple[str, str, str], TransferPoint] = {}
    for core, _run, row, seed in transfer_rows(trials, quantity):
        train, test = _number(row[f"train_{quantity}"]), _number(row[f"test_{quantity}"])
        if train is None or test is None:
            continue
        pair = (short_env(row["train_env"]), short_env(row["test_env"]))
        point = points.setdefault((core, *pair), TransferPoint(core, *pair))
        point.train.append(train)
        point.test.append(test)
        point.seeds.append(seed)
    for point in points.values():  # runs in seed order (seed=10 after seed=2)
        order = sorted(range(len(point.seeds)), key=lambda i: _seed_rank(point.seeds[i]))
        point.train, point.test = [point.train[i] for i in order], [point.test[i] for i in order]
        point.seeds = [point.seeds[i] for i in order]
    return list(points.values())


def _seed_rank(seed: str) -> tuple[float, str]:
    number = _number(seed)
    return (math.inf if number is None else number, seed)


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
    for core, run, row, _seed in transfer_rows(trials, quantity):
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
    ref = reference or {}
    ours = [c for c in cores if any(c in v for v in cells.values())]
    header, columns = transfer_columns(ours, ref, envs)
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


def transfer_columns(
    ours: Sequence[str], ref: dict[str, Any], envs: dict[str, list[str]]
) -> tuple[list[str], list[tuple[str, str]]]:
    """Header and ``(core, "ours" | "ref")`` columns of the transfer table: each core of ours,
    the reference's column beside it where the reference has that core, then the reference's
    other cores."""
    ref_cores: list[str] = []
    for block in ("train", "test"):
        for env in envs[block]:
            for core in (ref.get(block) or {}).get(env, {}):
                if core not in ref_cores:
                    ref_cores.append(core)
    header = ["Environment"]
    columns: list[tuple[str, str]] = []
    for core in [*ours, *(c for c in ref_cores if c not in ours)]:
        if core in ours:
            columns.append((core, "ours"))
            header.append(core)
        if core in ref_cores:
            columns.append((core, "ref"))
            header.append(f"{core} ({ref.get('label', 'ref')})")
    return header, columns


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


def header_lines(title: str, ctx: ReportContext) -> list[str]:
    """Title, what was swept (from ``sweep.json``), the trial count and how to read tables."""
    lines = [f"# {title}", ""]
    meta, trials = ctx.meta, ctx.trials
    if ctx.command:
        lines.append(f"- made by: `{ctx.command}`")
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
    short = len(incomplete_runs(ctx.runs))
    cut = f", {short} incomplete" if short else ""
    lines += [
        f"- {label}: {len(runs)} ({len(ok_runs)} ok, {not_ok} not ok{cut}){records}{budget}",
        "",
    ]
    if "metrics" in ctx.sections:
        lines += [
            "Tables: mean ± sample std over seeds of the last logged value (final) and of the "
            "best value of each run; `steps` is the step of the last logged value.",
            "",
        ]
    return lines


def incomplete_runs(runs: Sequence[RunInfo]) -> list[tuple[RunInfo, int, int]]:
    """``(run, done, planned)`` of the records whose run stopped before its budget (the
    record's ``incomplete`` flag, or its frames/updates against its config for records made
    before the flag existed)."""
    out = []
    for run in runs:
        record = run.run.record if run.run is not None else {}
        if record and record.get("incomplete", is_incomplete(record, run.config)):
            unit = "updates" if record.get("kind") == "supervised" else "frames"
            planned = get_dotted(
                run.config, "train.steps" if unit == "updates" else "train.total_steps"
            )
            out.append(
                (run, int(record.get(unit) or 0), int(record.get("planned") or planned or 0))
            )
    return out


SECTIONS = ("metrics", "transfer", "comparison", "tables", "failures")
"""The parts of a report, in order (``memcores report --sections``)."""


@dataclasses.dataclass
class ReportContext:
    """What every section of a report reads: the folder's trials and runs and the options."""

    out: Path
    meta: dict[str, Any]
    trials: list[TrialInfo]
    runs: list[RunInfo]
    keys: list[str]
    plots: bool = True
    spread: str = "minmax"
    reference: dict[str, Any] | None = None
    reference_name: str = ""
    compare: tuple[str, ...] = ()
    quantity: str = "return"
    retention: bool = False
    sections: Sequence[str] = SECTIONS
    command: str = ""
    """The ``memcores report`` command that writes the report, shown in its header."""
    threshold: float | None = None
    """A level whose first crossing per run the metric tables show (``--threshold``)."""

    @property
    def grid(self) -> dict[str, Sequence[Any]]:
        return self.meta.get("grid", {})

    @property
    def core_order(self) -> list[str]:
        return [str(c) for c in self.grid.get("core.name", [])]

    @property
    def env_order(self) -> dict[str, list[str]]:
        """Row order of the transfer tables: the reference's, if any."""
        return {block: list((self.reference or {}).get(block) or {}) for block in ("train", "test")}

    def png(self, name: str) -> Path:
        """Where a figure of the report goes: beside it, named after it."""
        return self.out.parent / f"{self.out.stem}_{name}.png"


def metric_sections(ctx: ReportContext, metrics: Sequence[str]) -> list[str]:
    """Per metric: the table over seeds, the pivot against a numeric swept key, the plots."""
    lines: list[str] = []
    plot_paths = [r.path for r in ctx.runs]
    plots = ctx.plots and bool(plot_paths)
    panel_key = auto_panel_key(find_runs(plot_paths)) if plots else None
    group_by = [k for k in ctx.keys if k not in LABEL_KEYS]
    axis = numeric_axis(ctx.grid)
    for metric in metrics:
        table = metric_table(ctx.runs, metric, ctx.keys, ctx.grid, ctx.threshold)
        if table is None:
            continue
        lines += [f"## {metric}", "", table, ""]
        if axis:
            pivot = pivot_table(ctx.runs, metric, axis, ctx.grid)
            lines += [f"Last logged value against `{axis}`, mean ± std (seeds):", "", pivot, ""]
            if plots:
                png = ctx.png(f"{slug(metric)}_vs_{slug(axis)}")
                others = [k for k in group_by if k != axis]
                plot_against(plot_paths, metric, axis, png, group_by=others, spread=ctx.spread)
                lines += [f"![{metric} against {axis}]({png.name})", ""]
        if plots:
            png = ctx.png(slug(metric))
            try:
                plot_runs(
                    plot_paths,
                    metric,
                    png,
                    group_by=group_by,
                    panel_by=panel_key,
                    spread=ctx.spread,
                )
            except ValueError as err:  # e.g. --log-y on non-positive values
                lines += [f"(no plot: {err})", ""]
            else:
                lines += [f"![{metric}]({png.name})", ""]
    return lines


def transfer_sections(ctx: ReportContext) -> list[str]:
    """Train/test tables per env pair, one per quantity, with the transfer figure."""
    lines: list[str] = []
    rank = order_rank(ctx.env_order["train"])
    for quantity in TRANSFER_QUANTITIES:
        # Published transfer tables (the thesis's Table 7) give returns only.
        ref = ctx.reference if quantity == "return" else None
        table = transfer_table(ctx.trials, ref, ctx.core_order, quantity, ctx.env_order)
        if not table:
            continue
        heading = f"Train/test {quantity} per env pair (mean ± std over seeds)"
        if ref:
            heading += f"; {ref.get('label', 'ref')}: {ref.get('title', ctx.reference_name)}"
        lines += [f"## {heading}", "", table, ""]
        if ctx.plots:
            png = ctx.png(f"train_vs_test_{quantity}")
            points = sorted(transfer_points(ctx.trials, quantity), key=lambda p: rank(p.train_env))
            plot_transfer(points, png, quantity, ref, ctx.core_order)
            lines += [f"![train vs test {quantity}]({png.name})", ""]
    return lines


def comparison_sections(ctx: ReportContext, points: Sequence[TransferPoint]) -> list[str]:
    """``--compare``: each other core against the base per env pair and run, or with
    ``--retention`` one table of train, test and retention (test / train of each run) of
    every core with Welch's p against the base, and its figure."""
    if not ctx.compare:
        return []
    base, others = ctx.compare[0], ctx.compare[1:]
    rank = order_rank(ctx.env_order["train"])
    points = sorted(points, key=lambda p: rank(p.train_env))
    q = ctx.quantity
    if ctx.retention:
        header, rows = retention_rows(points, base, others)
        lines = [
            f"## Retention of {q}: test / train per run, against `{base}`",
            "",
            RETENTION_NOTE.format(q=q, base=base),
            "",
            markdown_table(header, rows),
            "",
        ]
        if ctx.plots and rows:
            # one retention figure per report: it takes the report's own name
            png = plot_retention(points, [base, *others], ctx.out.with_suffix(".png"), q)
            lines += [f"![train and test {q} per run]({png.name})", ""]
        return lines
    lines = []
    for other in others:
        for block in ("test", "train"):
            header, rows = comparison_rows(points, base, other, block)
            if rows:
                lines += [
                    f"## `{other}` against `{base}`, {block} {q} per run",
                    "",
                    f"Difference: `{other}`'s mean minus `{base}`'s. Separation: `above` / "
                    f"`below` when every `{other}` run is above / below every `{base}` run. "
                    "Welch p: two-sided, unequal variances.",
                    "",
                    markdown_table(header, rows),
                    "",
                ]
    return lines


RETENTION_NOTE = (
    "Per env pair and core: {q} on the train env and on the test env (mean ± sample std over "
    "seeds), and the retention ratio test / train of each run (the same policy on both envs; "
    "runs in seed order). Welch p: two-sided t-test with unequal variances of the core's runs "
    "against `{base}`'s, on the test {q} and on the retention ratio; `-` with fewer than two "
    "runs a side."
)


def table_sections(ctx: ReportContext) -> list[str]:
    """Tables the trials wrote themselves (transfer's train/test table), averaged over seeds."""
    keys = row_keys(ctx.trials, list(ctx.grid))
    lines: list[str] = []
    for name, table in csv_tables(ctx.trials, keys, ctx.grid).items():
        lines += [f"## Table `{name}` (per trial, averaged over seeds)", "", table, ""]
    return lines


def failure_sections(ctx: ReportContext) -> list[str]:
    """The trials that failed or whose files are broken, and the runs that stopped early."""
    lines: list[str] = []
    failed = [t for t in ctx.trials if t.status != "ok"]
    if failed:
        rows = [
            [t.name, t.status, (t.message.splitlines() or [""])[0].replace("|", "/")]
            for t in failed
        ]
        heading = "Trials that did not finish"
        if any(t.status == BROKEN for t in failed):
            heading = "Trials that did not finish or are broken"
        lines += [f"## {heading}", "", markdown_table(["trial", "status", "reason"], rows), ""]
    short = incomplete_runs(ctx.runs)
    if short:
        rows = [[display_path(str(run.path)), done, planned] for run, done, planned in short]
        lines += [
            "## Incomplete runs",
            "",
            "Their records stop before the run's budget (interrupted, or stopped early by a "
            "scheduler); the tables above include them.",
            "",
            markdown_table(["record", "steps done", "budget"], rows),
            "",
        ]
    return lines


def load_context(
    sweep_dir: Path, out: Path, reference: str | Path | None, **options: Any
) -> ReportContext:
    """Read the folder once: its trials, runs, grid, row keys and config variants."""
    meta = load_sweep_meta(sweep_dir)
    trials = load_trials(sweep_dir)
    if not meta and (grid := records_grid(sweep_dir)):
        meta = {"grid": grid}
    runs = load_runs(trials)
    keys = row_keys(runs or trials, list(meta.get("grid", {})))
    assign_variants(runs, keys)
    assign_variants(trials, row_keys(trials, list(meta.get("grid", {}))))
    swept = [k for k in meta.get("grid", {}) if k.startswith("core.") and k != "core.name"]
    for trial in trials:
        values = ((k.removeprefix("core."), trial.get(k)) for k in swept)
        trial.core_options = "".join(f":{k}={v}" for k, v in values if v is not None)
    ref = load_reference(reference) if reference else None
    return ReportContext(
        out, meta, trials, runs, keys, reference=ref, reference_name=str(reference or ""), **options
    )


def build_report(
    sweep_dir: str | Path,
    out: str | Path,
    metrics: Sequence[str] | None = None,
    spread: str = "minmax",
    plots: bool = True,
    title: str | None = None,
    reference: str | Path | None = None,
    compare: Sequence[str] | None = None,
    quantity: str = "return",
    retention: bool = False,
    sections: Sequence[str] = SECTIONS,
    command: str = "",
    threshold: float | None = None,
) -> str:
    """Write the markdown report ``out`` (plots as PNGs beside it) and return its text.

    :param metrics: scalar tags to tabulate and plot; default: those of :data:`DEFAULT_METRICS`
        that some trial logged.
    :param reference: YAML of published numbers (:func:`load_reference`) shown beside ours in
        the transfer table.
    :param compare: ``(base, other, ...)`` cores whose transfer runs are set side by side per
        pair (:mod:`experiments.core_compare`), on ``quantity`` (one of
        :data:`TRANSFER_QUANTITIES`); ``retention``: one table of train, test and test / train
        per run instead, with its figure.
    :param sections: which of :data:`SECTIONS` to write, in their order.
    :param command: the command line that makes the report, to print in its header.
    :param threshold: add each run's first step with the metric at or above it to the metric
        tables (:func:`first_crossing`).
    :raises ValueError: an unknown section or quantity, a compared core without transfer
        runs, a metric no run logged (nothing is written then).
    """
    check_choice("section", sections, SECTIONS)
    check_choice("quantity", [quantity], TRANSFER_QUANTITIES)
    sweep_dir, out = Path(sweep_dir), Path(out)
    options = dict(plots=plots, spread=spread, compare=tuple(compare or ()), quantity=quantity)
    ctx = load_context(sweep_dir, out, reference, retention=retention, **options)
    ctx.sections, ctx.command, ctx.threshold = tuple(sections), command, threshold
    # read once: checked before anything is written, tabulated at the end
    points = transfer_points(ctx.trials, quantity) if compare else []
    if compare:
        check_cores(points, ctx.compare)
    metrics = choose_metrics(ctx.runs, metrics) if "metrics" in sections else []
    parts = {
        "metrics": lambda: metric_sections(ctx, metrics),
        "transfer": lambda: transfer_sections(ctx),
        "comparison": lambda: comparison_sections(ctx, points),
        "tables": lambda: table_sections(ctx),
        "failures": lambda: failure_sections(ctx),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = header_lines(title or f"Sweep report: {sweep_dir.name}", ctx)
    lines += [line for name in SECTIONS if name in sections for line in parts[name]()]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def check_choice(what: str, given: Sequence[str], valid: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first of ``given`` not in ``valid`` and the choices."""
    for name in given:
        if name not in valid:
            raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(valid)}")
