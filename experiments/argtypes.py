"""``argparse`` types that refuse out-of-range numbers while the command line is parsed, so a
bad value stops a command before it prints, trains or writes anything."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from memcores.agents.run_config import MAX_SEED


def _number(text: str, kind: type, lowest: float, strict: bool) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value) or value < lowest or (strict and value == lowest):
        bound = f"> {lowest:g}" if strict else f">= {lowest:g}"
        raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (episodes, repetitions, sizes)."""
    return int(_number(text, int, 1, strict=False))


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (retries)."""
    return int(_number(text, int, 0, strict=False))


def seed(text: str) -> int:
    """A seed: an integer in ``0..MAX_SEED``, the range of ``train.seed``."""
    value = int(_number(text, int, -math.inf, strict=False))
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_SEED}, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (frame rates)."""
    return float(_number(text, float, 0.0, strict=True))


def finite_float(text: str) -> float:
    """Any finite number (levels, thresholds): not ``nan`` nor ``inf``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (resources, where 0 asks for none)."""
    return float(_number(text, float, 0.0, strict=False))


def output_file(text: str) -> str:
    """A file path that can be written: not a folder, and its nearest existing ancestor is a
    writable folder (missing folders are created when the file is written, not here)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    ancestor = next((p for p in path.absolute().parents if p.exists()), Path("/"))
    if not ancestor.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: folder {ancestor} is read-only")
    return text
