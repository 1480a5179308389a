"""Reliability guarantees: one writer per run folder, refusals before anything is written,
divergence reported as a failure, and one-line errors for bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents.run_lock import LOCK_NAME, RunFolderBusy, RunLock

REPO = Path(__file__).resolve().parents[1]


# ============================================================================ run lock
def test_second_lock_on_a_folder_is_refused_naming_folder_and_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunLock(run, "memcores train"):
        with pytest.raises(RunFolderBusy, match=rf"{run}.*process {os.getpid()}.*memcores train"):
            RunLock(run).acquire()
    with RunLock(run) as lock:  # released: free again
        assert lock.held


def test_lock_creates_the_folder_and_removes_it_when_nothing_was_written(tmp_path: Path) -> None:
    run = tmp_path / "a" / "run"
    with RunLock(run):
        assert (run / LOCK_NAME).is_file()
    assert not run.exists()
    with RunLock(run):
        (run / "config.yaml").write_text("x: 1\n")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_lock_of_a_killed_process_is_not_stale(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code = (
        "import sys, time\n"
        "from agents.run_lock import RunLock\n"
        f"RunLock({str(run)!r}, 'holder').acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
        with pytest.raises(RunFolderBusy, match=rf"process {proc.pid} .*holder"):
            RunLock(run).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run / LOCK_NAME).exists()  # the file survives a kill -9, the lock does not
    with RunLock(run) as lock:
        assert lock.held


def test_lock_on_a_file_path_is_a_one_line_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(FileExistsError, match="is not a folder"):
        RunLock(target).acquire()
