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

    The file gets the permissions a plain ``open(path, "w")`` would give it (``0o666`` less
    the user's umask), not the owner-only mode of a temp file, so run folders can be shared.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:  # name the file asked for, not the temp file
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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


def current_umask() -> int:
    """The process's umask, read without changing it (Linux reports it in
    ``/proc/self/status``; elsewhere it is set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
