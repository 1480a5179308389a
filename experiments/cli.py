"""The ``memcores`` command line: ``memcores COMMAND [args]``.

Each command lives in ``experiments/commands/<module>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when used, so ``memcores list cores`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from experiments.malloc import keep_freed_memory

# command -> (module under experiments.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list_cmd", "list registered cores, tasks, envs or transfer suites"),
    "train": ("train", "train a recurrent PPO/A2C agent from a config"),
    "evaluate": ("evaluate", "evaluate a trained agent on any env id"),
    "transfer": ("transfer", "train on each env of a suite and evaluate on its larger twin"),
    "visualize": ("visualize", "record a GIF of a trained agent"),
    "supervised": ("supervised", "train a core on a supervised sequence task"),
    "diagnose": ("diagnose", "gradient-vs-lag profile and gate time-scale histogram"),
    "bench": ("bench", "benchmarks: cores, rl, envs, memory"),
    "sweep": ("sweep", "run a grid of trials (Ray Tune or local processes)"),
    "plot": ("plot", "learning curves from TensorBoard logs"),
    "report": ("report", "markdown result tables and plots for a sweep"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: memcores COMMAND [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "run `memcores COMMAND --help` for a command's options"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``memcores`` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"memcores: unknown command {name!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, help_ = COMMANDS[name]
    keep_freed_memory()
    module = importlib.import_module(f"experiments.commands.{module_name}")
    parser = argparse.ArgumentParser(prog=f"memcores {name}", description=help_)
    module.add_arguments(parser)
    try:  # options may follow the dotted overrides
        args = parser.parse_intermixed_args(rest)
    except TypeError:  # a command that passes its arguments on (nargs=REMAINDER) as they are
        args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # Bad input gets a one-line message, not a traceback (MEMCORES_DEBUG=1 shows it).
        import os

        if os.environ.get("MEMCORES_DEBUG"):
            raise
        print(f"memcores {name}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
