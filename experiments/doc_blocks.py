"""Doc tables generated from committed records, and the check that they still match.

A table of measured numbers in README.md or docs/ sits in a *generated block*::

    <!-- generated: COMMAND from SOURCE [table N[,M...]] -->
    ...the tables, exactly as rendered from SOURCE...
    <!-- end generated -->

``SOURCE`` is a repository path, either

- a bench record folder (``results/bench/<name>``, see :mod:`experiments.bench.record`): the
  block is its tables (all, or ``table N,...``, 1-based) and a caption naming the command, the
  machine and the date, linking the record; or
- a report written by ``memcores report`` (its ``- made by:`` line holds the command): the block
  is its ``table N`` (default 1), verbatim.

``COMMAND`` must be the command that made SOURCE. ``memcores docs`` rewrites every block from
its source; ``memcores docs --check`` changes nothing and lists each block that differs, and
re-runs each quoted report's command into a temporary folder (tables only: reports read
records, nothing trains) to check the report against its records, so a hand edit of a record,
a report or a block fails. Benchmarks are not re-run: tests re-measure the cheap, machine-free
ones (memory in bytes) against their records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import tempfile
from pathlib import Path

from memcores.experiments.bench import record as bench_record

REPO = Path(__file__).resolve().parents[1]
BEGIN = re.compile(
    r"^<!-- generated: (?P<command>.+?) from (?P<source>\S+?)(?: table (?P<n>[\d,]+))? -->$"
)
END = "<!-- end generated -->"
MADE_BY = re.compile(r"^- made by: `(?P<command>memcores report .+)`$", re.MULTILINE)


@dataclasses.dataclass
class Block:
    """One generated block of a doc: its marker's fields and the lines between the markers
    (``start``/``end``: 0-based indices of the two marker lines)."""

    command: str
    source: str
    tables: list[int]
    start: int
    end: int
    body: str


def doc_files(repo: Path = REPO) -> list[Path]:
    """README.md and every Markdown file under docs/: what teaches, every table of measured
    numbers in it generated (:func:`inventory`)."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def block_files(repo: Path = REPO) -> list[Path]:
    """Every file whose generated blocks are kept up to date: the docs and results/'s
    Markdown write-ups."""
    return [*doc_files(repo), *sorted((repo / "results").rglob("*.md"))]


def find_blocks(text: str) -> list[Block]:
    """The generated blocks of a Markdown text.

    :raises ValueError: a marker is malformed or a block is not closed (the line is named).
    """
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("<!-- generated"):
            match = BEGIN.match(line)
            if not match:
                raise ValueError(
                    f"line {i + 1}: malformed marker {line!r}; write "
                    "'<!-- generated: COMMAND from SOURCE [table N] -->'"
                )
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
            if end is None:
                raise ValueError(f"line {i + 1}: generated block without {END!r}")
            numbers = [int(n) for n in (match["n"] or "").split(",") if n]
            body = "\n".join(lines[i + 1 : end])
            blocks.append(Block(match["command"], match["source"], numbers, i, end, body))
            i = end
        i += 1
    return blocks


def markdown_tables(text: str) -> list[str]:
    """Every table of a Markdown text (header, delimiter and rows), code blocks skipped."""
    tables, current, in_code = [], [], False
    for line in [*text.splitlines(), ""]:
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            current.append(line)
            continue
        if len(current) >= 2:
            tables.append("\n".join(current))
        current = []
    return tables


def report_command(path: Path) -> str:
    """The ``memcores report`` command a report was made by.

    :raises ValueError: the file has no ``- made by:`` line.
    """
    match = MADE_BY.search(path.read_text(encoding="utf-8"))
    if not match:
        raise ValueError(f"{path} names no '- made by: `memcores report ...`' line")
    return match["command"]


def render(block: Block, doc: Path, repo: Path = REPO) -> str:
    """What ``block`` of ``doc`` must hold, from its source.

    :raises ValueError: the source is missing or is neither a bench record nor a report, the
        marker's command is not the source's, or a table number is out of range.
    """
    source = repo / block.source
    if (source / bench_record.RECORD).is_file():
        record = bench_record.read_record(source)
        command = record["command"]
        count = len(record["tables"])
        if any(not 1 <= n <= count for n in block.tables):
            raise ValueError(f"{block.source} has {count} table(s), not {block.tables}")
        link = os.path.relpath(source / bench_record.RECORD, doc.parent)
        text = bench_record.render_block(record, block.tables or None, link)
    elif source.is_file() and source.suffix == ".md":
        command = report_command(source)
        tables = markdown_tables(source.read_text(encoding="utf-8"))
        picked = block.tables or [1]
        if any(not 1 <= n <= len(tables) for n in picked):
            raise ValueError(f"{block.source} has {len(tables)} table(s), not {picked}")
        text = "\n\n".join(tables[n - 1] for n in picked)
    else:
        raise ValueError(f"{block.source} is neither a bench record folder nor a report file")
    if block.command != command:
        raise ValueError(f"{block.source} was made by `{command}`, not `{block.command}`")
    return text


def regenerate(doc: Path, repo: Path = REPO) -> tuple[str, list[str]]:
    """``doc``'s text with every block rendered again, and one line per block that changed
    or could not be rendered."""
    text = doc.read_text(encoding="utf-8")
    lines = text.splitlines()
    problems: list[str] = []
    try:
        blocks = find_blocks(text)
    except ValueError as err:
        return text, [f"{doc.relative_to(repo)}: {err}"]
    for block in reversed(blocks):
        where = f"{doc.relative_to(repo)}:{block.start + 1}"
        try:
            fresh = render(block, doc, repo)
        except ValueError as err:
            problems.append(f"{where}: {err}")
            continue
        if fresh != block.body:
            problems.append(f"{where}: the block differs from {block.source}")
            lines[block.start + 1 : block.end] = fresh.splitlines()
    return "\n".join(lines) + ("\n" if text.endswith("\n") else ""), problems[::-1]


def quoted_reports(docs: list[Path], repo: Path = REPO) -> list[Path]:
    """The report files that generated blocks quote."""
    found: dict[Path, None] = {}
    for doc in docs:
        with contextlib.suppress(ValueError):
            for block in find_blocks(doc.read_text(encoding="utf-8")):
                source = repo / block.source
                if source.is_file():
                    found[source] = None
    return list(found)


def check_report(report: Path, repo: Path = REPO) -> list[str]:
    """Re-run the report's command (tables only, into a temporary file) from ``repo`` and
    compare its tables with the committed report's: one line per table that differs."""
    from memcores.experiments.cli import main as memcores

    argv = shlex.split(report_command(report))[1:]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.md"
        argv = _with_out(argv, out) + ["--no-plots"]
        cwd = Path.cwd()
        try:
            os.chdir(repo)
            with contextlib.redirect_stdout(io.StringIO()):
                code = memcores(argv)
        finally:
            os.chdir(cwd)
        if code != 0 or not out.is_file():
            return [f"{report.relative_to(repo)}: `{shlex.join(argv)}` failed (exit {code})"]
        fresh = markdown_tables(out.read_text(encoding="utf-8"))
    committed = markdown_tables(report.read_text(encoding="utf-8"))
    if len(fresh) != len(committed):
        return [
            f"{report.relative_to(repo)}: {len(committed)} tables, the records give {len(fresh)}"
        ]
    return [
        f"{report.relative_to(repo)}: table {n} differs from what its records give"
        for n, (a, b) in enumerate(zip(committed, fresh, strict=True), 1)
        if a != b
    ]


def _with_out(argv: list[str], out: Path) -> list[str]:
    """``argv`` with its ``--out`` replaced by ``out``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--out":
            skip = True
            continue
        if not arg.startswith("--out="):
            kept.append(arg)
    return [*kept, "--out", str(out)]


def check(docs: list[Path] | None = None, repo: Path = REPO, reports: bool = True) -> list[str]:
    """Every difference between the docs' blocks and their sources, between each bench
    record's ``REPORT.md`` and its ``record.json``, and (with ``reports``) between the quoted
    reports and their records; empty when all match."""
    docs = block_files(repo) if docs is None else docs
    problems = []
    for doc in docs:
        problems += regenerate(doc, repo)[1]
    for folder in sorted(p.parent for p in (repo / "results" / "bench").glob("*/record.json")):
        report = folder / bench_record.REPORT
        try:
            fresh = bench_record.render_report(bench_record.read_record(folder))
        except ValueError as err:  # a record edited into another shape
            problems.append(str(err).replace(f"{repo}/", ""))
            continue
        if not report.is_file() or report.read_text(encoding="utf-8") != fresh:
            problems.append(f"{report.relative_to(repo)}: differs from its record.json")
    if reports:
        for report in quoted_reports(docs, repo):
            problems += check_report(report, repo)
    return problems


# A measured-looking number outside backticks: a decimal, a ratio (``1.5x``) or a percentage.
MEASURED = re.compile(r"\d\.\d|\b\d+(?:\.\d+)?x\b|\d\s?%")


def table_spans(text: str) -> list[tuple[int, int]]:
    """``(first, last)`` 0-based line indices of each Markdown table, code blocks skipped."""
    spans, start, in_code = [], None, False
    lines = text.splitlines()
    for i, line in enumerate([*lines, ""]):
        if line.startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("|"):
            start = i if start is None else start
            continue
        if start is not None and i - start >= 2:
            spans.append((start, i - 1))
        start = None
    return spans


# The header of a reference table (options, config keys, task definitions): its numbers are
# settings, not measurements.
REFERENCE_HEADER = re.compile(r"\|\s*(?:default|option|key|definition)\s*\|", re.IGNORECASE)
RESULTS_LINK = re.compile(r"\]\(((?:\.\./)*results/[^)\s#]*)")


def has_measured_numbers(rows: list[str]) -> bool:
    """Whether a table's body rows hold a measured-looking number (code spans ignored)."""
    return any(MEASURED.search(re.sub(r"`[^`]*`", "", row)) for row in rows)


def rows_link_records(doc: Path, rows: list[str]) -> bool:
    """Whether every row links a record or report under results/ that exists (a table of
    results gathered from several studies, each row naming where its numbers are)."""
    for row in rows:
        links = RESULTS_LINK.findall(row)
        if not links or not all((doc.parent / link).exists() for link in links):
            return False
    return True


def inventory(repo: Path = REPO) -> list[str]:
    """One line per table with measured numbers in README.md and docs/ (reference tables of
    options and defaults left out): where it is and where its numbers come from (a generated
    block's source, the report's own command, or a results/ link in every row); ``ORPHAN``
    where none."""
    lines = []
    for doc in doc_files(repo):
        text = doc.read_text(encoding="utf-8")
        rows = text.splitlines()
        blocks = find_blocks(text)
        made_by = MADE_BY.search(text)
        for first, last in table_spans(text):
            body = rows[first + 2 : last + 1]
            if REFERENCE_HEADER.search(rows[first]) or not has_measured_numbers(body):
                continue
            where = f"{doc.relative_to(repo)}:{first + 1}"
            block = next((b for b in blocks if b.start < first < b.end), None)
            if block:
                lines.append(f"{where}  from {block.source} ({block.command})")
            elif made_by:
                lines.append(f"{where}  report made by `{made_by['command']}`")
            elif rows_link_records(doc, body):
                lines.append(f"{where}  each row links its record under results/")
            else:
                lines.append(f"{where}  ORPHAN")
    return lines
