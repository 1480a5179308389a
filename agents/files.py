"""Atomic file writes shared by checkpoints, configs and sweep records (no torch import)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda handle: handle.write(text.encode()))


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(handle)`` on a temp file beside ``path``, fsync it, then rename it over
    ``path``: readers see the old file or the new one, never half a file. On any error the
    temp file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
