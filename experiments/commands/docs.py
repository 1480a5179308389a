"""``memcores docs [--check|--list]``: rewrite the generated tables of README.md, docs/ and
results/ (and each bench record's REPORT.md) from the committed records, or (``--check``) only
list what differs from them, or (``--list``) list every table with numbers and its source.
Run from the repository root.

See :mod:`experiments.doc_blocks` for the block markers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memcores.agents.files import write_text_atomic
from memcores.experiments import doc_blocks
from memcores.experiments.bench.record import REPORT, read_record, render_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 when a block or a quoted report differs from its records",
    )
    parser.add_argument(
        "--list", action="store_true", help="list every table with numbers and where it comes from"
    )


def run(args: argparse.Namespace) -> int:
    if not (doc_blocks.REPO / "docs").is_dir():  # an installed wheel ships no docs or results
        raise ValueError(
            "memcores docs is a developer command: it rewrites README.md, docs/ and results/ "
            "of a checkout (git clone the repository, install it with `pip install -e .`)"
        )
    if args.list:
        for line in doc_blocks.inventory():
            print(line)
        return 0
    if args.check:
        problems = doc_blocks.check()
        for line in problems:
            print(line)
        print(f"{len(problems)} difference(s)" if problems else "every generated block matches")
        return 1 if problems else 0
    changed = 0
    for doc in doc_blocks.block_files():
        text, problems = doc_blocks.regenerate(doc)
        for line in problems:
            print(line)
        if text != doc.read_text(encoding="utf-8"):
            doc.write_text(text, encoding="utf-8")
            changed += 1
    for folder in sorted(p.parent for p in Path("results/bench").glob("*/record.json")):
        fresh = render_report(read_record(folder))
        report = folder / REPORT
        if not report.is_file() or report.read_text(encoding="utf-8") != fresh:
            write_text_atomic(report, fresh)
            changed += 1
    print(f"rewrote {changed} file(s)")
    return 0
