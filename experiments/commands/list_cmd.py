"""``memcores list cores|tasks|envs|suites|configs``."""

from __future__ import annotations

import argparse

WHAT = ("cores", "tasks", "envs", "suites", "configs")


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
    elif args.what == "configs":
        rows = config_rows()
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


DESCRIPTION_CHARS = 110
"""Most characters of a config's description in ``memcores list configs``."""


def config_rows() -> list[tuple[str, str]]:
    """``(name, "COMMAND  description")`` of every shipped config: the command that reads it
    (``sweep`` for the sweep, search and PBT configs, ``report`` for a paper's reference
    table) and the start of its leading comment."""
    from memcores.experiments.config import read_yaml_mapping, shipped_configs
    from memcores.experiments.sweep import infer_command

    rows = []
    for name, path in shipped_configs().items():
        base = name.rsplit("/", 1)[-1]
        if name.startswith("references/"):
            command = "report"  # a paper's table: `memcores report SWEEP --reference NAME`
        elif base.startswith(("sweep_", "search_", "pbt_")):
            command = "sweep"
        else:
            command = infer_command(read_yaml_mapping(path))
        rows.append((name, f"{command:<10}  {_description(path.read_text(encoding='utf-8'))}"))
    return rows


def _description(text: str) -> str:
    """A config's leading ``#`` comment on one line, cut to :data:`DESCRIPTION_CHARS`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    words = " ".join(lines)
    if len(words) > DESCRIPTION_CHARS:
        words = words[: DESCRIPTION_CHARS - 3].rstrip() + "..."
    return words
