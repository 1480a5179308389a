"""The ``memcores`` command line: ``memcores COMMAND [args]``.

Each command lives in ``experiments/commands/<module>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; it is imported only when used, so ``memcores list cores`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from memcores.agents.divergence import TrainingDiverged
from memcores.experiments.malloc import keep_freed_memory

# command -> (module under experiments.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("list_cmd", "list registered cores, tasks, envs or transfer suites"),
    "train": ("train", "train a recurrent PPO/A2C/PQN/R2D2 agent from a config"),
    "evaluate": ("evaluate", "evaluate a trained agent on any env id"),
    "transfer": ("transfer", "train on each env of a suite and evaluate on its larger twin"),
    "visualize": ("visualize", "record a GIF of a trained agent"),
    "supervised": ("supervised", "train a core on a supervised sequence task"),
    "diagnose": ("diagnose", "gradient-vs-lag profile and gate time-scale histogram"),
    "bench": ("bench", "benchmarks: cores, rl, envs, memory"),
    "sweep": ("sweep", "run a grid of trials on Ray Tune (locally or on a cluster)"),
    "plot": ("plot", "learning curves of runs, sweeps and results records"),
    "report": ("report", "markdown result tables and plots for a sweep"),
    "record": ("record", "write a run's small results record (results/<experiment>/<trial>)"),
    "docs": ("docs", "regenerate (or --check) the docs' tables from the committed records"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: memcores [--version] COMMAND [args]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "run `memcores COMMAND --help` for a command's options"]
    return "\n".join(lines)


EXIT_BAD_INPUT = 2
"""Exit code of bad input, a refused run folder, a missing or corrupt file, an OS error."""
EXIT_DIVERGED = 3
"""Exit code of a run stopped by the divergence policy (too many skipped updates)."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``memcores`` console script; returns the exit code.

    ``memcores --debug COMMAND ...`` (or ``MEMCORES_DEBUG=1``) shows the traceback of errors
    that are otherwise one line.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(os.environ.get("MEMCORES_DEBUG"))
    if argv[:1] == ["--debug"]:
        debug, argv = True, argv[1:]
    if argv[:1] == ["--version"]:
        from memcores import __version__

        return _say(f"memcores {__version__}", 0)
    if not argv or argv[0] in ("-h", "--help"):
        return _say(_usage(), 0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"memcores: unknown command {name!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name, help_ = COMMANDS[name]
    keep_freed_memory()
    module = importlib.import_module(f"memcores.experiments.commands.{module_name}")
    parser = argparse.ArgumentParser(prog=f"memcores {name}", description=help_)
    module.add_arguments(parser)
    try:  # options may follow the dotted overrides
        args = parser.parse_intermixed_args(rest)
    except TypeError:  # a command that passes its arguments on (nargs=REMAINDER) as they are
        args = parser.parse_args(rest)
    try:
        code = int(module.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        _reader_left()
        return 0
    except BAD_INPUT as err:
        # Bad input gets one line, not a traceback; any other exception is a bug and keeps it.
        if debug:
            raise
        print(f"memcores {name}: error: {one_line(err)}{_debug_hint(err)}", file=sys.stderr)
        return EXIT_DIVERGED if isinstance(err, TrainingDiverged) else EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"memcores {name}: interrupted", file=sys.stderr)
        return 130


def _say(text: str, code: int) -> int:
    """Print ``text`` on stdout and return ``code``; a reader that left is a normal end."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _reader_left()
    return code


def _reader_left() -> None:
    """The reader of our output left (``memcores list envs | head -2``): point stdout at
    /dev/null so that the interpreter's final flush cannot fail again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, OSError, RuntimeError, EOFError)
"""What a user's input or files can cause: config and value errors (``ConfigError`` is a
``ValueError``), missing/unreadable/unwritable files and folders (``OSError``), corrupt
checkpoints, busy run folders and diverged runs (``RuntimeError`` subclasses), truncated
files (``EOFError``)."""


def _debug_hint(err: BaseException) -> str:
    """A pointer to ``--debug`` for errors that may come from a library rather than from input
    (a plain or third-party ``RuntimeError``): if it is a bug, its traceback is one flag away."""
    ours = type(err).__module__.split(".")[0] == "memcores"
    if ours or isinstance(err, (ValueError, OSError, EOFError)):
        return ""
    return " (memcores --debug shows the traceback)"


MESSAGE_LIMIT = 600
"""Most characters of an error message that are printed. memcores' own messages cut the
values they echo; a library's message may hold a whole value (gymnasium echoes every
constructor option of an env)."""


def one_line(err: BaseException) -> str:
    """The message of ``err`` on one line, cut to :data:`MESSAGE_LIMIT` characters; an
    ``OSError`` as ``strerror: filename``."""
    text = str(err)
    if isinstance(err, OSError) and err.filename and err.strerror:  # not "[Errno 13] ..."
        text = f"{err.strerror}: {err.filename}"
    if not text:
        text = type(err).__name__
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    if len(text) > MESSAGE_LIMIT:
        cut = len(text) - MESSAGE_LIMIT
        text = f"{text[:MESSAGE_LIMIT]}... ({cut:,} more characters cut)"
    return text


if __name__ == "__main__":
    raise SystemExit(main())
