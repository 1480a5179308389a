"""``memcores bench memory [rel|lru|all] [options]``: peak memory and time of long sequences.

Two sections, each its own module: ``rel`` (lstm vs rel_lstm vs mem_lstm, forward+backward
over T) in :mod:`experiments.bench.memory_rel`, and ``lru`` (BPTT vs streaming online
learning vs inference) in :mod:`experiments.bench.memory_lru`.
"""

from __future__ import annotations

import argparse
import importlib

SECTIONS = {
    "rel": "memcores.experiments.bench.memory_rel",
    "lru": "memcores.experiments.bench.memory_lru",
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="memcores bench memory", description=__doc__)
    parser.add_argument("section", nargs="?", default="all", choices=[*SECTIONS, "all"])
    args, rest = parser.parse_known_args(argv)
    names = list(SECTIONS) if args.section == "all" else [args.section]
    if len(names) > 1 and any(a == "--out" or a.startswith("--out=") for a in rest):
        # each section writes its own record; one folder cannot hold both
        parser.error("--out needs one section (rel or lru); without it each writes its own")
    for name in names:
        print(f"== bench memory: {name}")
        importlib.import_module(SECTIONS[name]).main(rest)
    return 0
