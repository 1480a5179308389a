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
