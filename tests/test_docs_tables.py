"""Every Markdown table in the README and docs renders on GitHub: each row has as many cells as
its header (a ``|`` inside a cell, even inside backticks, must be written ``\\|``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

CELL_SEPARATOR = re.compile(r"(?<!\\)\|")
DELIMITER_ROW = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?$")


def cells(row: str) -> int:
    """Cells of a table row as GitHub splits it: at every ``|`` not escaped by a backslash."""
    text = row.strip()
    text = text[1:] if text.startswith("|") else text
    text = text[:-1] if text.endswith("|") and not text.endswith("\\|") else text
    return len(CELL_SEPARATOR.split(text))


def broken_rows(text: str) -> list[tuple[int, int, int]]:
    """``(line number, cells, header cells)`` of each table row whose cell count differs from
    its header's. A table is a header row, a delimiter row (``|---|---|``) and the ``|`` rows
    after them; fenced code blocks are skipped."""
    lines = text.splitlines()
    found, in_code, i = [], False, 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("```"):
            in_code = not in_code
        elif (
            not in_code
            and "|" in line
            and i + 1 < len(lines)
            and DELIMITER_ROW.match(lines[i + 1].strip())
            and "-" in lines[i + 1]
        ):
            width = cells(line)
            j = i + 1
            while j < len(lines) and lines[j].strip().startswith("|"):
                if cells(lines[j]) != width:
                    found.append((j + 1, cells(lines[j]), width))
                j += 1
            i = j
            continue
        i += 1
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_table_row_has_the_headers_cell_count(doc: Path) -> None:
    assert broken_rows(doc.read_text(encoding="utf-8")) == []


def test_the_table_check_catches_an_unescaped_pipe() -> None:
    good = "| a | b |\n|---|---|\n| `x\\|y` | 2 |\n"
    bad = "| a | b |\n|---|---|\n| `x|y` | 2 |\n"
    assert broken_rows(good) == []
    assert broken_rows(bad) == [(3, 3, 2)]


# --------------------------------------------------------------------------- generated tables
# Every table of measured numbers in README.md and docs/ is rendered from a committed record
# (experiments/doc_blocks.py); `memcores docs --check` is what these tests run.
import json  # noqa: E402
import shutil  # noqa: E402

from memcores.experiments import doc_blocks  # noqa: E402
from memcores.experiments.bench import record as bench_record  # noqa: E402

QUOTED_REPORTS = doc_blocks.quoted_reports(doc_blocks.block_files())


def test_every_generated_block_matches_its_record() -> None:
    assert doc_blocks.check(reports=False) == []


@pytest.mark.parametrize("report", QUOTED_REPORTS, ids=lambda p: str(p.relative_to(REPO)))
def test_each_quoted_report_matches_its_records(report: Path) -> None:
    """The report's `memcores report` command, re-run on the committed records (tables only),
    gives the committed report's tables."""
    assert doc_blocks.check_report(report) == []


def test_every_table_with_numbers_names_its_source() -> None:
    """The list `memcores docs --list` prints: no table of measured numbers in README.md or
    docs/ that is not generated from a record or a report."""
    listing = doc_blocks.inventory()
    orphans = [line for line in listing if line.endswith("ORPHAN")]
    assert listing and not orphans, "\n".join(orphans)


def _bench_repo(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A repository with one bench record and a doc quoting it, rendered."""
    out = tmp_path / "results" / "bench" / "toy"
    table = bench_record.Table("peak MiB", ["method", "T=8"], [["stream", "4.45"]])
    bench_record.write_record(out, bench="toy", argv=["toy"], tables=[table])
    (tmp_path / "docs").mkdir()
    doc = tmp_path / "docs" / "toy.md"
    doc.write_text(
        "# Toy\n\n<!-- generated: memcores bench toy from results/bench/toy -->\n"
        "<!-- end generated -->\n\nMore text.\n"
    )
    (tmp_path / "README.md").write_text("# readme\n")
    text, problems = doc_blocks.regenerate(doc, tmp_path)
    assert problems == ["docs/toy.md:3: the block differs from results/bench/toy"]
    doc.write_text(text)
    return doc, out / bench_record.RECORD, out


def test_the_check_fails_when_a_record_or_a_block_is_edited_by_hand(tmp_path: Path) -> None:
    doc, record_file, _ = _bench_repo(tmp_path)
    assert (
        "| stream | 4.45 |" in doc.read_text()
        and "[record](../results/bench/toy/record.json)" in doc.read_text()
    )
    assert doc_blocks.check(repo=tmp_path) == []
    # a number typed into the block
    good = doc.read_text()
    doc.write_text(good.replace("4.45", "1.08"))
    assert doc_blocks.check(repo=tmp_path) == [
        "docs/toy.md:3: the block differs from results/bench/toy"
    ]
    doc.write_text(good)
    # a number typed into the record
    record = json.loads(record_file.read_text())
    record["tables"][0]["rows"][0][1] = "1.08"
    record_file.write_text(json.dumps(record))
    assert doc_blocks.check(repo=tmp_path) == [
        "docs/toy.md:3: the block differs from results/bench/toy",
        "results/bench/toy/REPORT.md: differs from its record.json",
    ]
    # the marker must name the command that made the record
    record_file.write_text(json.dumps({**record, "command": "memcores bench other"}))
    assert "was made by `memcores bench other`" in doc_blocks.check(repo=tmp_path)[0]


def test_malformed_and_unclosed_markers_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line 1: malformed marker"):
        doc_blocks.find_blocks("<!-- generated: no source -->\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="line 2: generated block without"):
        doc_blocks.find_blocks("x\n<!-- generated: c from results/x -->\n| a |\n")


def test_the_inventory_flags_a_table_with_numbers_outside_a_block(tmp_path: Path) -> None:
    doc, _, _ = _bench_repo(tmp_path)
    assert doc_blocks.inventory(tmp_path) == [
        "docs/toy.md:6  from results/bench/toy (memcores bench toy)"
    ]
    doc.write_text(doc.read_text() + "\n| core | x nn.LSTM |\n|---|---|\n| lstm | 1.19 |\n")
    assert doc_blocks.inventory(tmp_path)[-1].endswith("ORPHAN")
    # option tables without measured numbers are not results
    (tmp_path / "docs" / "opts.md").write_text("| key | default |\n|---|---|\n| `lr` | `3e-4` |\n")
    assert not any("opts.md" in line for line in doc_blocks.inventory(tmp_path))


def test_a_report_edited_by_hand_or_from_an_edited_record_fails(tmp_path: Path) -> None:
    """memory_match_retention.md against copies of its records: equal, then one record's
    success changed, then one cell of the report changed."""
    report = REPO / "results" / "sweeps" / "memory_match_retention.md"
    for record in (REPO / "results" / "memory_match").rglob("record.json"):
        dest = tmp_path / record.parent.relative_to(REPO)
        dest.mkdir(parents=True)
        for name in ("record.json", "config.yaml", "curve.csv"):
            if (record.parent / name).is_file():
                shutil.copy(record.parent / name, dest / name)
    (tmp_path / "results" / "sweeps").mkdir()
    copy = tmp_path / "results" / "sweeps" / report.name
    shutil.copy(report, copy)
    assert doc_blocks.check_report(copy, tmp_path) == []
    edited = next((tmp_path / "results" / "memory_match").glob("name=lstm,seed=0/*LongDelay"))
    record = json.loads((edited / "record.json").read_text())
    for metrics in record["eval"].values():
        metrics["success"] = 0.99
    (edited / "record.json").write_text(json.dumps(record))
    assert doc_blocks.check_report(copy, tmp_path) == [
        "results/sweeps/memory_match_retention.md: table 1 differs from what its records give"
    ]
    shutil.copy(report, copy)
    (edited / "record.json").write_text(
        (REPO / edited.relative_to(tmp_path) / "record.json").read_text()
    )
    copy.write_text(report.read_text().replace("0.930 ± 0.130", "0.950 ± 0.130"))
    assert doc_blocks.check_report(copy, tmp_path) == [
        "results/sweeps/memory_match_retention.md: table 1 differs from what its records give"
    ]
