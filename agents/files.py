"""Atomic file writes shared by checkpoints, configs and sweep records (no torch import)."""

from __future__ import annotations

import errno
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the file asked for, not the temp file
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if _disk_full(err):
            raise DiskFullError(path) from err
        raise
    return path


class DiskFullError(OSError):
    """The device ran out of space while a file was written; the message names the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ENOSPC, f"no space left on device writing {path}")

    def __str__(self) -> str:
        return str(self.strerror)


def _disk_full(err: BaseException) -> bool:
    """Whether a failed write ran out of space: ``ENOSPC``/``EDQUOT`` from Python, or
    ``torch.save``'s "[enforce fail at inline_container.cc] ... unexpected pos", which is
    how it reports a short write to a full device."""
    if isinstance(err, OSError):
        return err.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(err, RuntimeError) and "unexpected pos" in str(err)
