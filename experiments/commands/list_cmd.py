"""``memcores list cores|tasks|envs|suites``."""

from __future__ import annotations

import argparse

WHAT = ("cores", "tasks", "envs", "suites")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=WHAT, help="what to list")
    parser.add_argument(
        "--options", action="store_true", help="cores: also show each core's options and defaults"
    )


def run(args: argparse.Namespace) -> int:
    rows: list[tuple[str, str]] = []
    if args.what == "cores":
        from memcores.cores import CORES, core_options

        for name, spec in CORES.items():
            line = spec.description
            if args.options:
                opts = ", ".join(f"{k}={v!r}" for k, v in core_options(name).items())
                line += f"\n      options: {opts or '(none)'}"
            rows.append((name, line))
    elif args.what == "tasks":
        from memcores.envs.sequences import TASKS

        rows = [(name, spec.description) for name, spec in TASKS.items()]
    elif args.what == "envs":
        from memcores.envs.suites import list_envs

        rows = list(list_envs())
    else:
        from memcores.envs.suites import SUITES

        rows = [
            (name, f"{s.description}: " + ", ".join(f"{a} -> {b}" for a, b in s.pairs))
            for name, s in SUITES.items()
        ]
    width = max((len(n) for n, _ in rows), default=0)
    for name, text in rows:
        print(f"{name:<{width}}  {text}")
    return 0
