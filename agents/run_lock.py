"""One writer per run folder: an advisory lock that a crash cannot leave stale.

:class:`RunLock` holds ``fcntl.flock`` on ``<folder>/.memcores.lock`` for as long as a
process writes into the folder. The kernel drops the lock when the process ends, however it
ends (``kill -9`` included), so a crashed run never blocks the next one; the file itself only
records who holds it (pid, host, command) for the error message a second writer gets::

    with RunLock(run_dir, "memcores train"):
        ...  # write config.yaml, events, progress.csv, checkpoints

The lock is per open file, so two ``RunLock`` objects on one folder exclude each other even
inside one process. Locks are advisory: only processes that take them are kept out.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from pathlib import Path
from types import TracebackType

LOCK_NAME = ".memcores.lock"
"""The lock file inside a run folder (ignored when deciding whether a folder holds a run)."""


class RunFolderBusy(RuntimeError):
    """Another process holds the run folder's lock; the message names the folder and holder."""


class RunLock:
    """Exclusive, non-blocking lock on a run folder, held from :meth:`acquire` to :meth:`release`.

    :param folder: the run folder; created on :meth:`acquire` if missing (and removed again on
        :meth:`release` when the lock created it and nothing else was written into it).
    :param purpose: what the holder is doing, shown to a second writer (``"memcores train"``).
    """

    def __init__(self, folder: str | Path, purpose: str = "") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.purpose = purpose or Path(sys.argv[0]).name
        self._fd: int | None = None
        self._created_folder = False

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        """Take the lock or raise at once.

        :raises RunFolderBusy: another process (or another ``RunLock`` here) holds it.
        :raises OSError: the folder cannot be created or written (a file of that name, no
            permission), with the folder named in the message.
        """
        if self._fd is not None:
            return self
        if self.folder.exists() and not self.folder.is_dir():
            raise FileExistsError(f"run folder {self.folder} exists and is not a folder")
        if self.folder.is_symlink() and not self.folder.exists():
            raise FileExistsError(
                f"run folder {self.folder} is a symbolic link that leads nowhere (a loop of "
                "links or a missing target); give another run.dir"
            )
        self._created_folder = not self.folder.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise type(err)(f"cannot create run folder {self.folder}: {err.strerror}") from err
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                self._remove_folder_if_created()
                raise type(err)(
                    f"cannot write into run folder {self.folder}: {err.strerror}"
                ) from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise RunFolderBusy(
                    f"run folder {self.folder} is in use by {holder}; wait for it to finish "
                    "or choose another folder"
                ) from None
            # A releasing holder unlinks the file before unlocking it: if the name now points
            # at another file (or none), this lock guards nothing; take the new file's.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        holder = f"process {os.getpid()} on {socket.gethostname()} ({self.purpose})\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder.encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up and remove the lock file (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.path.unlink(missing_ok=True)  # before unlocking: see acquire()
        finally:
            os.close(fd)  # closing drops the flock
        self._remove_folder_if_created()

    def _remove_folder_if_created(self) -> None:
        if self._created_folder:
            try:
                self.folder.rmdir()  # only succeeds when nothing was written into it
            except OSError:
                pass

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """What the holder wrote into the lock file, or a generic description."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another process"


def run_files(folder: str | Path, patterns: tuple[str, ...]) -> list[Path]:
    """The files and folders in ``folder`` that match any glob of ``patterns`` (sorted): what
    an earlier run left there. The lock file never counts."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = {path for pattern in patterns for path in folder.glob(pattern)}
    return sorted(p for p in found if p.name != LOCK_NAME)


def refuse_earlier_run(
    folder: str | Path, patterns: tuple[str, ...], checkpoint: Path, overwrite: bool
) -> None:
    """Raise ``ValueError`` if ``folder`` holds files of an earlier run (``patterns``) and
    ``overwrite`` is off; the message offers ``--resume`` when ``checkpoint`` exists. Shared by
    the RL and supervised trainers so both refuse, and word the refusal, the same way."""
    leftovers = run_files(folder, patterns)
    if leftovers and not overwrite:
        names = ", ".join(p.name for p in leftovers[:4])
        how = "pass --resume to continue it, " if checkpoint.is_file() else ""
        raise ValueError(
            f"run folder {folder} already holds a run ({names}); {how}"
            "set run.overwrite=true to start over, or choose another run.dir"
        )
