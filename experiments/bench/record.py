"""Bench records: what a benchmark measured, on which machine, by which command.

Every CPU benchmark (``memcores bench cores|memory|envs|rl``) ends by writing its tables to
``results/bench/<name>/`` (``--out DIR`` elsewhere, ``--no-record`` not at all; a ``--quick``
smoke run writes one only with ``--out``)::

    record.json   {"format": "memcores-bench/1", "bench": "memory_lru", "command":
                   "memcores bench memory lru", "machine": {"cpu", "cpus", "torch", "gpu"},
                   "created", "tables": [{"title", "columns", "rows"}], "notes": [...],
                   "numbers": {...}}
    REPORT.md     the same tables rendered as Markdown, with the machine and the command

Cells are the numbers as the benchmark prints them (strings); ``numbers`` holds the raw
measurements where a test re-measures them (memory in bytes). ``memcores docs --check``
renders the doc blocks that quote a record from ``record.json`` and checks ``REPORT.md`` too.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shlex
from pathlib import Path
from typing import Any

from memcores.agents.files import write_text_atomic

BENCH_FORMAT = "memcores-bench/1"
ROOT = Path("results/bench")
RECORD = "record.json"
REPORT = "REPORT.md"


@dataclasses.dataclass
class Table:
    """One result table: a title, column names and rows of printed cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``, else the platform's),
    without trademark signs (``Xeon(R)`` -> ``Xeon``)."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return plain_cpu_name(name)


def plain_cpu_name(name: str) -> str:
    """``name`` without ``(R)``/``(TM)`` signs and doubled spaces."""
    return " ".join(re.sub(r"\((?:R|TM)\)", "", name, flags=re.IGNORECASE).split())


def machine() -> dict[str, Any]:
    """``{"cpu": model, "cpus": count, "torch": version, "gpu": name or None}``."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__.split("+")[0],
        "gpu": gpu,
    }


def machine_line(info: dict[str, Any]) -> str:
    """``"2-core AMD EPYC CPU, torch 2.13.0"`` (plus the GPU when one was used)."""
    line = f"{info['cpus']}-core {info['cpu']} CPU, torch {info['torch']}"
    return f"{line}, {info['gpu']}" if info.get("gpu") else line


def markdown_table(table: Table) -> str:
    """The table as GitHub Markdown (``|`` in a cell escaped)."""

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    lines = [row(table.columns), "|" + "---|" * len(table.columns)]
    return "\n".join([*lines, *(row(r) for r in table.rows)])


def caption(record: dict[str, Any], link: str | None = None) -> str:
    """One line naming the command, the machine, the date and (``link``) the record."""
    date = record["created"][:10]
    text = f"`{record['command']}` on a {machine_line(record['machine'])}, {date}"
    return f"{text} ([record]({link}))." if link else f"{text}."


def tables_of(record: dict[str, Any]) -> list[Table]:
    return [Table(t["title"], t["columns"], t["rows"]) for t in record["tables"]]


def render_block(record: dict[str, Any], which: list[int] | None, link: str | None) -> str:
    """Tables ``which`` (1-based; all when None) of a record, each under its bold title, then
    the caption: what a doc's generated block holds."""
    tables = tables_of(record)
    picked = [tables[i - 1] for i in which] if which else tables
    parts = []
    for table in picked:
        parts += [f"**{table.title}**", "", markdown_table(table), ""]
    return "\n".join([*parts, caption(record, link)])


def render_report(record: dict[str, Any]) -> str:
    """The ``REPORT.md`` of a record."""
    lines = [f"# Bench: {record['bench']}", "", caption(record), ""]
    for table in tables_of(record):
        lines += [f"## {table.title}", "", markdown_table(table), ""]
    if record.get("notes"):
        lines += ["## Notes", "", *(f"- {n}" for n in record["notes"]), ""]
    return "\n".join(lines)


def read_record(folder: str | Path) -> dict[str, Any]:
    """The content of a bench record folder's ``record.json``.

    :raises ValueError: missing, unreadable or not a bench record (the message names it).
    """
    path = Path(folder) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"unreadable bench record {path}: {err}") from None
    if not isinstance(record, dict) or record.get("format") != BENCH_FORMAT:
        raise ValueError(f"{path} is not a bench record (format {BENCH_FORMAT!r})")
    check_fields(record, path)
    return record


RECORD_FIELDS = {"bench": str, "command": str, "created": str, "machine": dict, "tables": list}
"""The fields every rendering of a bench record reads, and their JSON types."""
_JSON = {str: "string", dict: "mapping", list: "list"}


def check_fields(record: dict[str, Any], path: Path) -> None:
    """Whether ``record`` has the fields a rendering reads, of the right types: a record
    edited by hand then fails with one line, not deep inside the rendering.

    :raises ValueError: naming the first field that is missing or of another type.
    """
    for key, kind in RECORD_FIELDS.items():
        if not isinstance(record.get(key), kind):
            got = type(record[key]).__name__ if key in record else "nothing"
            raise ValueError(f"{path}: {key!r} must be a {_JSON[kind]}, got {got}")
    for key in ("cpus", "cpu", "torch"):
        if key not in record["machine"]:
            raise ValueError(f"{path}: 'machine' has no {key!r}")
    for i, table in enumerate(record["tables"], 1):
        ok = isinstance(table, dict) and isinstance(table.get("title"), str)
        ok = ok and all(isinstance(table.get(k), list) for k in ("columns", "rows"))
        if not (ok and all(isinstance(row, list) for row in table["rows"])):
            raise ValueError(
                f"{path}: table {i} of 'tables' must be "
                '{"title": text, "columns": [...], "rows": [[...], ...]}'
            )


def add_record_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """``--out DIR`` and ``--no-record``: where the bench writes its record."""
    parser.add_argument(
        "--out",
        default=None,
        help=f"record folder (record.json + REPORT.md); default {ROOT / name}, "
        "none for a --quick run",
    )
    parser.add_argument("--no-record", action="store_true", help="print only, write no record")


def record_folder(args: argparse.Namespace, name: str) -> Path | None:
    """The folder the bench writes to: ``--out``, else ``results/bench/<name>`` unless
    ``--no-record`` or ``--quick`` (a smoke run must not replace a measurement)."""
    if args.no_record:
        return None
    if args.out:
        return Path(args.out)
    return None if getattr(args, "quick", False) else ROOT / name


def write_record(
    out: Path | None,
    *,
    bench: str,
    argv: list[str],
    tables: list[Table],
    notes: list[str] | None = None,
    numbers: dict[str, Any] | None = None,
) -> Path | None:
    """Write ``record.json`` and ``REPORT.md`` into ``out`` (nothing when ``out`` is None).

    :param bench: the record's name, e.g. ``"memory_lru"``.
    :param argv: the bench command after ``memcores bench``, e.g. ``["memory", "lru"]``, as
        typed (an ``--out`` stays in it: the command re-makes this record where it lies).
    :returns: the path of ``record.json``, or None.
    """
    if out is None:
        return None
    record = {
        "format": BENCH_FORMAT,
        "bench": bench,
        "command": shlex.join(["memcores", "bench", *argv]),
        "machine": machine(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tables": [dataclasses.asdict(t) for t in tables],
        "notes": list(notes or []),
        "numbers": numbers or {},
    }
    write_text_atomic(out / REPORT, render_report(record))
    path = write_text_atomic(out / RECORD, json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")
    return path
