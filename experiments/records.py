"""Results records that outlive run folders, and the one reader of runs, records and sweeps.

A *record* is the small text summary of one finished run, committed under
``results/<experiment>/<trial>/``::

    record.json   {"format": "memcores-record/1", "kind": "rl" | "supervised", "experiment",
                   "trial", "command", "frames" | "updates", "wall_seconds", "hardware", "seed",
                   "core", "env" | "task", "final": {metric: value}, "eval": {env_or_split:
                   {metric: value, "episodes": n}}, "created", "planned", "incomplete",
                   "derived"}; an RL evaluation's metrics are "return" and "success" (means
                  over its episodes); "derived" holds numbers computed from the full
                  progress.csv (see :func:`derive`), which the thinned curve cannot give
    config.yaml   the full resolved config
    curve.csv     the learning curve at coarse resolution (<= 300 rows, ``step`` first)
    policy.pt     optional: the final policy (no reconstruction decoder), only when it stays
                  under 1 MB

A *run folder* is what ``memcores train`` / ``memcores supervised`` write (``config.yaml``,
``progress.csv``, events, checkpoints). :func:`find_runs` reads both kinds into the same
:class:`Run` (config + curves + eval results), so reports, plots and sweeps never care which
one they were given.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import json
import math
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from memcores.agents.files import atomic_write, write_text_atomic
from memcores.experiments.config import parse_yaml

FORMAT = "memcores-record/1"
RECORD_FILE = "record.json"
CURVE_FILE = "curve.csv"
# agents.checkpoint.RECORD_POLICY_NAME and CHECKPOINT_NAME (kept literal: importing torch to
# read records would slow every command that only reads them)
POLICY_FILE = "policy.pt"
RL_CHECKPOINT = "checkpoints/last.pt"
PROGRESS_FILE = "progress.csv"
MAX_CURVE_ROWS = 300
MAX_POLICY_BYTES = 1_000_000
THRESHOLDS = (0.5, 0.8, 0.9, 0.95, 0.99)
"""Levels whose first crossing (``value >= level``) :func:`derive` records per metric."""
DERIVED_PREFIXES = ("rollout/", "eval/", "test/", "transfer/")
"""Metrics whose best value and threshold crossings a record keeps (not train/ or time/)."""
RUN_FOLDER_FILES = ("progress.csv", "checkpoints", "events.out.tfevents.*", "results.json")
"""What a run folder holds and a record never does: a record written there would replace the
run's own ``config.yaml`` beside its checkpoints."""
SAME_RUN_IGNORES = ("train.total_steps", "train.steps")
"""Config keys a record of the same run may change: a resumed run with a longer budget."""


# --------------------------------------------------------------------------- the in-memory run
@dataclasses.dataclass
class Curve:
    """A scalar series of one run. ``steps``, ``values``: [N] arrays, steps increasing."""

    steps: np.ndarray
    values: np.ndarray


@dataclasses.dataclass
class Run:
    """One run folder or one committed record, as reports and plots see it.

    :param path: the folder (run folder or record folder).
    :param config: its resolved config (``{}`` when none was found).
    :param record: the content of ``record.json`` (``{}`` for a run folder).
    """

    path: Path
    config: dict[str, Any]
    record: dict[str, Any] = dataclasses.field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return get_dotted(self.config, key, default)

    @property
    def is_record(self) -> bool:
        return bool(self.record)

    @property
    def evals(self) -> dict[str, dict[str, float]]:
        """Evaluation results ``{env_or_split: {metric: value, "episodes": n}}``."""
        return dict(self.record.get("eval") or {})

    def curves(self) -> dict[str, Curve]:
        """Every logged scalar of the run (see :func:`read_curves`)."""
        return read_curves(self.path)


def get_dotted(tree: dict[str, Any], key: str, default: Any = None) -> Any:
    """``tree["a"]["b"]`` for ``key="a.b"``. Free-form section keys saved under ``options``
    (``task.length`` is stored as ``task.options.length``) are found too."""
    node: Any = tree
    for i, part in enumerate(key.split(".")):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and isinstance(node.get("options"), dict) and i > 0:
            if part not in node["options"]:
                return default
            node = node["options"][part]
        else:
            return default
    return node


def open_csv_text(path: Path) -> io.StringIO:
    """The text of a CSV file, ready for :mod:`csv` (newlines kept as written).

    :raises ValueError: the file is not UTF-8 text; the message names it (a bare codec error
        would not say which of a sweep's files is broken).
    """
    try:
        return io.StringIO(path.read_bytes().decode("utf-8"), newline="")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path} is not a UTF-8 text CSV file ({err.reason} at byte {err.start})"
        ) from None


def read_rows(path: Path) -> list[dict[str, float]]:
    """Rows of a ``progress.csv``/``curve.csv`` as ``{column: value}``; empty, non-numeric and
    non-finite cells are left out. A step logged twice (a resumed run) keeps its later row."""
    if not path.is_file():
        return []
    by_step: dict[float, dict[str, float]] = {}
    with open_csv_text(path) as handle:
        for row in csv.DictReader(handle):
            values: dict[str, float] = {}
            for key, text in row.items():
                if key is None or text in ("", None):
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                if math.isfinite(value):
                    values[key] = value
            if "step" in values:
                by_step[values["step"]] = values
    return [by_step[s] for s in sorted(by_step)]


def curve_file(folder: Path) -> Path:
    """The curve of a folder: ``curve.csv`` of a record, else ``progress.csv`` of a run."""
    curve = folder / CURVE_FILE
    return curve if (folder / RECORD_FILE).is_file() and curve.is_file() else folder / PROGRESS_FILE


def read_curves(folder: str | Path) -> dict[str, Curve]:
    """``{tag: Curve}`` of every scalar a run folder or record logged."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for row in read_rows(curve_file(Path(folder))):
        for tag, value in row.items():
            if tag != "step":
                steps, values = series.setdefault(tag, ([], []))
                steps.append(row["step"])
                values.append(value)
    return {
        tag: Curve(np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
        for tag, (s, v) in series.items()
    }


def read_saved_config(path: Path) -> Any:
    """A run's or record's ``config.yaml``, read by the checked loader
    (:func:`experiments.config.parse_yaml`).

    :raises ValueError: the file is not valid YAML or is refused (the message names it).
    """
    try:
        return parse_yaml(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else "bad YAML"
        raise ValueError(f"corrupt config {path}: {first}") from None


def read_config(folder: Path, root: Path) -> dict[str, Any]:
    """The ``config.yaml`` of ``folder`` or of its nearest parent up to ``root``.

    :raises ValueError: the file is not valid YAML (the message names it).
    """
    for parent in [folder, *folder.parents]:
        path = parent / "config.yaml"
        if path.is_file():
            data = read_saved_config(path)
            return data if isinstance(data, dict) else {}
        if parent == root or parent == parent.parent:
            break
    return {}


def read_record(folder: str | Path) -> Run:
    """The :class:`Run` of a record folder.

    :raises ValueError: ``record.json`` is unreadable or not a memcores record.
    """
    folder = Path(folder)
    path = folder / RECORD_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"unreadable record {path}: {err}") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not a memcores record (format {FORMAT!r})")
    return Run(folder, read_config(folder, folder), record)


def _hidden(folder: Path, root: Path) -> bool:
    return any(part.startswith(".") for part in folder.relative_to(root).parts)


def find_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run folder (``progress.csv``) and record (``record.json``) at or below ``paths``.

    Hidden folders (Tune's bookkeeping) are skipped; a folder with both counts as a record.
    A run's config is its own ``config.yaml`` or, for nested runs (one per env pair of a
    transfer trial), the nearest parent's. Sorted by path.

    :raises FileNotFoundError: a path does not exist or holds neither.
    """
    found: dict[Path, Run] = {}
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"no such run, sweep or results folder: {root}")
        folders = {p.parent for p in root.rglob(RECORD_FILE)} | {
            p.parent for p in root.rglob(PROGRESS_FILE)
        }
        if root.is_file():
            folders = {root.parent} if root.name in (RECORD_FILE, PROGRESS_FILE) else set()
        folders = {f for f in folders if root.is_file() or not _hidden(f, root)}
        if not folders:
            raise FileNotFoundError(
                f"no run folders ({PROGRESS_FILE}) or records ({RECORD_FILE}) under {root}"
            )
        for folder in folders:
            if (folder / RECORD_FILE).is_file():
                found[folder.resolve()] = read_record(folder)
            else:
                found[folder.resolve()] = Run(folder, read_config(folder, root))
    return [found[k] for k in sorted(found)]


# --------------------------------------------------------------------------- writing records
def hardware() -> str:
    """``"2-core x86_64 CPU, torch 2.13.0 CPU build"`` (plus the GPU when one is visible)."""
    import torch

    cpu = f"{os.cpu_count()}-core {platform.machine()} CPU"
    if torch.cuda.is_available():
        return f"{cpu}, {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"{cpu}, torch {torch.__version__.split('+')[0]} CPU build"


def downsample(rows: list[dict[str, float]], limit: int = MAX_CURVE_ROWS) -> list[dict]:
    """At most ``limit`` rows, evenly spaced, the first and the last always kept."""
    if len(rows) <= limit:
        return rows
    picks = np.unique(np.linspace(0, len(rows) - 1, limit).round().astype(int))
    return [rows[i] for i in picks]


def _csv_text(rows: list[dict[str, float]]) -> str:
    columns = ["step", *dict.fromkeys(k for r in rows for k in r if k != "step")]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (int(v) if k == "step" else f"{v:.6g}") for k, v in row.items()})
    return buffer.getvalue()


def _final(rows: list[dict[str, float]]) -> dict[str, float]:
    """The last logged value of every column (a metric not logged every row keeps its last)."""
    final: dict[str, float] = {}
    for row in rows:
        final.update({k: v for k, v in row.items() if k != "step"})
    return final


def derive(rows: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Numbers that need the full curve, for every result metric (see :data:`DERIVED_PREFIXES`):
    ``{"max": {metric: [step, value]}, "min": {...}, "first_at_least": {metric: {"0.9": step
    or None}}}``. The committed curve is thinned to :data:`MAX_CURVE_ROWS` rows, so a crossing
    or a best value read from it can be later or lower than the run's.

    :param rows: every row of the run's ``progress.csv`` (:func:`read_rows`), steps increasing.
    """
    out: dict[str, dict[str, Any]] = {"max": {}, "min": {}, "first_at_least": {}}
    metrics = dict.fromkeys(k for r in rows for k in r if k.startswith(DERIVED_PREFIXES))
    for metric in metrics:
        points = [(int(r["step"]), r[metric]) for r in rows if metric in r]
        # the earliest step wins a tie: when the run first got there
        out["max"][metric] = list(max(points, key=lambda p: (p[1], -p[0])))
        out["min"][metric] = list(min(points, key=lambda p: (p[1], p[0])))
        out["first_at_least"][metric] = {
            f"{level:g}": next((step for step, v in points if v >= level), None)
            for level in THRESHOLDS
        }
    return out


def planned_length(config: dict[str, Any]) -> int | None:
    """The frames (RL ``train.total_steps``) or updates (supervised ``train.steps``) the run
    was configured for."""
    key = "train.steps" if "task" in config else "train.total_steps"
    value = get_dotted(config, key)
    return int(value) if isinstance(value, int | float) else None


def is_incomplete(record: dict[str, Any], config: dict[str, Any]) -> bool:
    """Whether the run stopped before its budget (interrupted, or stopped early by a sweep
    scheduler); a supervised run that reached ``train.target_accuracy`` is complete."""
    planned = planned_length(config)
    done = record.get("updates" if record.get("kind") == "supervised" else "frames")
    if planned is None or done is None or done >= planned:
        return False
    target = get_dotted(config, "train.target_accuracy")
    accuracy = (record.get("final") or {}).get("eval/accuracy")
    return not (target is not None and accuracy is not None and accuracy >= target)


def make_record(
    run_dir: str | Path,
    *,
    experiment: str,
    trial: str,
    command: str = "",
    eval_results: dict[str, dict[str, float]] | None = None,
    wall_seconds: float | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, float]]]:
    """Build ``(record.json content, config, full curve rows)`` from a finished run folder.

    :param eval_results: ``{env_or_split: {metric: value, "episodes": n}}`` (transfer
        evaluations); a supervised run's test/transfer metrics come from its ``results.json``.
    :param wall_seconds: the run's wall time; default: the supervised run's own measure, or
        for RL the frames divided by the last logged ``time/fps``.
    :raises FileNotFoundError: ``run_dir`` has no ``config.yaml`` or no ``progress.csv`` rows.
    """
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    config = read_saved_config(config_path) or {}
    if not isinstance(config, dict):
        raise ValueError(f"corrupt config {config_path}: not a mapping")
    rows = read_rows(run_dir / PROGRESS_FILE)
    if not rows:
        raise FileNotFoundError(f"{run_dir} has no {PROGRESS_FILE} rows: the run never logged")
    supervised = "task" in config
    final = _final(rows)
    record: dict[str, Any] = {"format": FORMAT, "kind": "supervised" if supervised else "rl"}
    record.update(experiment=experiment, trial=trial, command=command)
    step = int(rows[-1]["step"])
    evals = dict(eval_results or {})
    if supervised:
        results = _json_or_empty(run_dir / "results.json")
        final.update(results.get("final", {}))
        record["updates"] = int(results.get("step", step))
        wall = results.get("wall_s")
        for key, value in results.get("final", {}).items():
            split, _, metric = key.rpartition("/")
            if split in ("eval", "test") or split.startswith("transfer/"):
                evals.setdefault(split, {})[metric] = value
    else:
        record["frames"] = step
        fps = final.get("time/fps")
        wall = step / fps if fps else None
    # milliseconds: a smoke run of a few updates takes well under 0.1 s on a fast CPU
    record["wall_seconds"] = round(
        float(wall_seconds if wall_seconds is not None else wall or 0), 3
    )
    record["hardware"] = hardware()
    record["seed"] = get_dotted(config, "train.seed")
    record["core"] = get_dotted(config, "core.name")
    if supervised:
        record["task"] = get_dotted(config, "task.name")
    else:
        record["env"] = get_dotted(config, "env.id")
    record["final"] = final
    record["eval"] = evals
    record["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record["planned"] = planned_length(config)
    record["incomplete"] = is_incomplete(record, config)
    record["derived"] = derive(rows)
    record.update(extra or {})
    return record, config, rows


def write_record(
    run_dir: str | Path,
    out: str | Path,
    *,
    command: str = "",
    eval_results: dict[str, dict[str, float]] | None = None,
    wall_seconds: float | None = None,
    policy: bool = False,
    extra: dict[str, Any] | None = None,
    replace: bool = False,
    require_policy: bool = False,
) -> Path:
    """Write the record of ``run_dir`` into ``out`` (``results/<experiment>/<trial>``).

    Each file is written atomically (temp file + rename), ``record.json`` last, so a folder
    with a ``record.json`` is complete; everything is checked before the first file is
    written. ``policy``: also save the final policy weights as ``policy.pt`` when they stay
    under 1 MB (RL runs only; re-evaluate with ``memcores evaluate OUT/policy.pt --env ...``).

    :param replace: overwrite a record of a different run in ``out``, or write into a run
        folder (by default refused; a record of the same run, e.g. after a resume with a
        longer budget, is updated).
    :param require_policy: with ``policy``, refuse a run whose policy cannot be kept (not an
        RL run, no checkpoint, over 1 MB) instead of recording ``"policy": null``.
    :returns: the path of ``record.json``.
    :raises FileNotFoundError: ``run_dir`` is not a finished run folder.
    :raises FileExistsError: ``out`` is a run folder, or holds a record of a different run,
        and not ``replace``.
    :raises ValueError: ``policy`` and the checkpoint is not a memcores RL checkpoint; a
        policy that ``require_policy`` cannot keep.
    """
    out = Path(out)
    record, config, rows = make_record(
        run_dir,
        experiment=out.parent.name,
        trial=out.name,
        command=command,
        eval_results=eval_results,
        wall_seconds=wall_seconds,
        extra=extra,
    )
    if not replace:
        check_not_a_run_folder(out, Path(run_dir))
        check_same_run(out, record, config)
    weights = None
    if policy and record["kind"] == "rl":
        weights = _slim_policy(Path(run_dir) / RL_CHECKPOINT)
    if require_policy and weights is None:
        raise ValueError(_why_no_policy(Path(run_dir), record["kind"]))
    write_text_atomic(out / "config.yaml", yaml.safe_dump(config, sort_keys=False))
    write_text_atomic(out / CURVE_FILE, _csv_text(downsample(rows)))
    if policy and record["kind"] == "rl":
        record["policy"] = None
        if weights is not None:
            atomic_write(out / POLICY_FILE, lambda handle: handle.write(weights))
            record["policy"] = POLICY_FILE
    return write_text_atomic(out / RECORD_FILE, json.dumps(record, indent=2) + "\n")


def check_not_a_run_folder(out: Path, run_dir: Path) -> None:
    """Refuse to write a record into another run's folder (its ``config.yaml`` would be
    replaced); the recorded run's own folder is allowed (its config is the same).

    :raises FileExistsError: naming the folder and the run files found there.
    """
    if out.resolve() == run_dir.resolve():
        return
    found = sorted({p.name for pattern in RUN_FOLDER_FILES for p in out.glob(pattern)})
    if found:
        raise FileExistsError(
            f"--out {out} is a run folder (it holds {', '.join(found[:3])}); a record goes in "
            "a folder of its own, results/<experiment>/<trial> (--replace writes there anyway)"
        )


def _why_no_policy(run_dir: Path, kind: str) -> str:
    """Why ``--policy`` cannot keep ``run_dir``'s policy (:func:`_slim_policy` gave none)."""
    if kind != "rl":
        return f"--policy keeps RL policies only; {run_dir} is a {kind} run"
    checkpoint = run_dir / RL_CHECKPOINT
    if not checkpoint.is_file():
        return f"--policy: {run_dir} has no checkpoint ({RL_CHECKPOINT}) to take the policy from"
    return (
        f"--policy: the policy of {run_dir} is over the {MAX_POLICY_BYTES / 1e6:g} MB a record "
        "keeps; record it without --policy (re-evaluate from the run folder instead)"
    )


def check_same_run(out: Path, record: dict[str, Any], config: dict[str, Any]) -> None:
    """Refuse to overwrite a record in ``out`` that another run wrote: a different kind,
    experiment setting or seed (a longer budget of the same run is allowed).

    :raises FileExistsError: naming the record and the first difference.
    """
    if not has_record(out):
        return
    from memcores.experiments.run_groups import settings

    try:
        old = read_record(out)
    except ValueError:  # an unreadable record is not a run's record: writing repairs it
        return
    old_settings = settings(old.config, SAME_RUN_IGNORES)
    new_settings = settings(config, SAME_RUN_IGNORES)
    diffs = [k for k in ("kind", "seed") if old.record.get(k) != record.get(k)]
    diffs += sorted(
        k
        for k in old_settings.keys() | new_settings.keys()
        if old_settings.get(k) != new_settings.get(k)
    )
    if diffs:
        key = diffs[0]
        before = old.record.get(key) if key in record else old_settings.get(key, "unset")
        after = record.get(key) if key in record else new_settings.get(key, "unset")
        raise FileExistsError(
            f"{out / RECORD_FILE} holds the record of a different run ({key}: {before} there, "
            f"{after} here{f'; {len(diffs) - 1} more keys differ' if len(diffs) > 1 else ''}); "
            "give another --out, or --replace to overwrite it"
        )


def _slim_policy(checkpoint: Path) -> bytes | None:
    """What acting needs from the checkpoint, serialised, if under the size limit: no
    optimiser or RNG state, and no reconstruction decoder (a training-only head, often most
    of the weights). None without a checkpoint or over the limit.

    :raises ValueError: the file is not a memcores RL checkpoint (one line, no torch advice).
    """
    import torch

    from memcores.agents.checkpoint import load_checkpoint

    if not checkpoint.is_file():
        return None
    try:
        payload = load_checkpoint(checkpoint)
    except Exception as err:  # CheckpointError and whatever a foreign file raises
        raise ValueError(str(err).splitlines()[0]) from None
    weights = payload.get("model")
    if not isinstance(weights, dict) or not all(isinstance(k, str) for k in weights):
        raise ValueError(f"{checkpoint} is not a memcores RL checkpoint (no policy weights)")
    slim = {k: v for k, v in payload.items() if k not in ("optimizer", "rng")}
    slim["model"] = {k: v for k, v in weights.items() if not k.startswith("decoder.")}
    buffer = io.BytesIO()
    torch.save(slim, buffer)
    return buffer.getvalue() if buffer.tell() < MAX_POLICY_BYTES else None


def _json_or_empty(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def has_record(out: str | Path) -> bool:
    """Whether ``out`` holds a complete record (``record.json`` is written last)."""
    return (Path(out) / RECORD_FILE).is_file()
