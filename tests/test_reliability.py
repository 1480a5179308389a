"""Reliability guarantees: one writer per run folder, refusals before anything is written,
divergence reported as a failure, and one-line errors for bad input."""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rl_helpers import TINY

from memcores.agents.divergence import DivergenceGuard, TrainingDiverged
from memcores.agents.rl_trainer import CHECKPOINT_NAME
from memcores.agents.run_lock import LOCK_NAME, RunFolderBusy, RunLock
from memcores.agents.supervised import CHECKPOINT
from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError

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


# ============================================================================ CLI helpers
RL_CONFIG = "experiments/configs/demo_rl.yaml"
SUP_CONFIG = "experiments/configs/demo_copy.yaml"
SUP_TINY = [
    "task.length=5",
    "task.n_tokens=3",
    "task.alphabet=3",
    "core.name=lstm",
    "core.hidden_size=16",
    "train.steps=20",
    "train.batch_size=16",
    "train.eval_every=10",
    "train.eval_size=32",
    "train.log_every=5",
    "train.target_accuracy=null",
    "train.device=cpu",
    "train.progress=false",
    "run.overwrite=false",
]
"""20 updates of a hidden-16 LSTM on a copy task of length 5."""
COMMANDS = ["train", "supervised"]


def cli(command: str, run: Path, *overrides: str, resume: bool = False) -> int:
    """``memcores train|supervised`` with a tiny config into ``run``."""
    if command == "train":
        args = ["train", RL_CONFIG, *TINY, f"run.dir={run}", *overrides]
    else:
        args = ["supervised", SUP_CONFIG, *SUP_TINY, f"run.dir={run}", *overrides]
    return main([*args, "--resume"] if resume else args)


def one_error_line(capsys: pytest.CaptureFixture, command: str) -> str:
    """The command's stderr, asserted to be a single ``memcores CMD: error: ...`` line."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"memcores {command}: error: "), err
    return err


def checkpoint_of(command: str, run: Path) -> Path:
    return run / (CHECKPOINT_NAME if command == "train" else CHECKPOINT)


# ============================================================================ one writer
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("resume", [False, True])
def test_second_writer_is_refused_naming_the_holder(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, resume: bool
) -> None:
    run = tmp_path / "run"
    if resume:
        assert cli(command, run) == 0
        capsys.readouterr()
    before = sorted(p.name for p in run.rglob("*")) if run.exists() else []
    with RunLock(run, "another training"):
        assert cli(command, run, "train.seed=1", resume=resume) == 2
        err = one_error_line(capsys, command)
        assert f"run folder {run} is in use by process {os.getpid()}" in err
        assert "another training" in err
        assert sorted(p.name for p in run.rglob("*") if p.name != LOCK_NAME) == before


# ============================================================================ earlier runs
def _fake_leftovers(run: Path) -> dict[str, str]:
    """What a run killed before its first checkpoint leaves behind."""
    run.mkdir(parents=True)
    files = {"config.yaml": "old: true\n", "progress.csv": "step,x\n1024,1\n2048,2\n"}
    for name, text in files.items():
        (run / name).write_text(text)
    return files


@pytest.mark.parametrize("command", COMMANDS)
def test_earlier_run_without_checkpoint_is_refused_unless_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str
) -> None:
    run = tmp_path / "run"
    files = _fake_leftovers(run)
    assert cli(command, run) == 2
    err = one_error_line(capsys, command)
    assert "already holds a run" in err and "run.overwrite=true" in err and "--resume" not in err
    assert {p.name: p.read_text() for p in run.iterdir()} == files  # untouched
    assert cli(command, run, "run.overwrite=true") == 0
    steps = [row.split(",")[0] for row in (run / "progress.csv").read_text().splitlines()[1:]]
    assert steps == sorted(set(steps), key=int) and "2048" not in steps  # only the new run
    assert "old" not in (run / "config.yaml").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_resume_removes_temp_files_of_a_kill_during_a_checkpoint_write(
    tmp_path: Path, command: str
) -> None:
    run = tmp_path / "run"
    assert cli(command, run) == 0
    ckpt = checkpoint_of(command, run)
    leftover = ckpt.parent / f".{ckpt.name}.k1ll3d.tmp"
    leftover.write_bytes(b"half a checkpoint")
    longer = "train.total_steps=192" if command == "train" else "train.steps=30"
    assert cli(command, run, longer, resume=True) == 0
    assert not leftover.exists()


def test_tensorboard_after_resumes_has_one_point_per_step(tmp_path: Path) -> None:
    """A kill after the last checkpoint leaves later rows and events; resuming rolls both back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert cli("train", run, "train.total_steps=128") == 0  # 2 updates: steps 64, 128
    saved = (run / CHECKPOINT_NAME).read_bytes()
    assert cli("train", run, "train.total_steps=256", resume=True) == 0  # 192, 256
    (run / CHECKPOINT_NAME).write_bytes(saved)  # as if killed before the checkpoint at 256
    assert cli("train", run, "train.total_steps=256", resume=True) == 0
    assert cli("train", run, "train.total_steps=320", resume=True) == 0
    expected = [64, 128, 192, 256, 320]
    steps = [int(r.split(",")[0]) for r in (run / "progress.csv").read_text().splitlines()[1:]]
    assert steps == expected
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(run))
    events.Reload()
    assert [e.step for e in events.Scalars("time/total_timesteps")] == expected


# ============================================================================ divergence
def test_divergence_guard_counts_and_stops_after_patience() -> None:
    guard = DivergenceGuard(patience=3, start_step=100, unit="frame")
    guard.observe(164, bad=True, skipped=4)
    guard.observe(228, bad=False, skipped=1)  # a good update resets the streak
    guard.observe(292, bad=True, skipped=4)
    guard.observe(356, bad=True, skipped=4)
    assert (guard.skipped, guard.consecutive, guard.last_finite_step) == (13, 2, 228)
    with pytest.raises(TrainingDiverged, match="last finite update at frame 228; 17 skipped"):
        guard.observe(420, bad=True, skipped=4, why="non-finite loss")
    never = DivergenceGuard(patience=0)
    for step in range(1, 50):
        never.observe(step, bad=True)
    assert never.skipped == 49


@pytest.mark.parametrize(
    ("command", "overrides", "why"),
    [
        # vf_coef overflows float32: every minibatch's loss is inf from the first update
        ("train", ["agent.vf_coef=1e39", "train.total_steps=640"], "non-finite loss"),
        # a huge step size makes the loss explode past 2x the first training loss
        (
            "supervised",
            ["optim.lr=10", "optim.name=rmsprop", "optim.clip_grad_norm=null"],
            "above",
        ),
    ],
)
def test_diverged_run_stops_with_exit_3_naming_the_last_finite_step(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, overrides: list, why: str
) -> None:
    run = tmp_path / "run"
    limits = ["train.max_skipped_updates=3", "train.log_every=1"]
    if command == "supervised":
        limits.append("train.max_loss_ratio=2")
    assert cli(command, run, *overrides, *limits) == 3
    err = one_error_line(capsys, command)
    assert "training diverged: the last 3 updates were all skipped" in err and why in err
    assert "finite update" in err
    with (run / "progress.csv").open() as handle:
        skipped = [
            float(r["train/skipped_updates"])
            for r in csv.DictReader(handle)
            if r.get("train/skipped_updates")
        ]
    assert skipped and skipped == sorted(skipped) and skipped[-1] >= 3  # a running total
    assert not (run / "results.json").exists()


def test_skipped_total_survives_a_resume(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    never_stop = ["agent.vf_coef=1e39", "train.max_skipped_updates=0"]  # every minibatch skipped
    assert cli("train", run, *never_stop, "train.total_steps=128") == 0  # 2 updates x 4
    assert "8 minibatches skipped" in capsys.readouterr().out
    assert torch.load(run / CHECKPOINT_NAME, weights_only=True)["skipped_updates"] == 8
    assert cli("train", run, *never_stop, "train.total_steps=192", resume=True) == 0
    assert "12 minibatches skipped" in capsys.readouterr().out
    with (run / "progress.csv").open() as handle:
        totals = [float(r["train/skipped_updates"]) for r in csv.DictReader(handle)]
    assert totals == [4, 8, 12]


@pytest.mark.parametrize(
    ("command", "summary"), [("train", "0 minibatches skipped"), ("supervised", "skipped: 0")]
)
def test_summary_says_how_many_updates_were_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, summary: str
) -> None:
    assert cli(command, tmp_path / "run") == 0
    assert summary in capsys.readouterr().out


# ============================================================================ validation
@pytest.mark.parametrize(
    ("command", "override", "message"),
    [
        ("train", "train.seed=-1", r"train.seed must be in 0\.\.4294967295"),
        ("train", "agent.learning_rate=1e38", r"agent.learning_rate must be a number in \(0, 10\]"),
        ("train", "agent.learning_rate=1e30", "agent.learning_rate"),
        ("train", "agent.learning_rate=.nan", "agent.learning_rate"),
        ("train", "agent.learning_rate=0", "agent.learning_rate"),
        ("train", "agent.vf_coef=.inf", "agent.vf_coef must be a finite number"),
        ("train", "train.max_skipped_updates=-1", "train.max_skipped_updates must be >= 0"),
        ("supervised", "train.seed=-1", r"train.seed must be in 0\.\.4294967295"),
        ("supervised", "optim.lr=1e30", r"optim.lr must be a number in \(0, 10\]"),
        ("supervised", "optim.lr=.inf", "optim.lr"),
        ("supervised", "optim.clip_grad_norm=.nan", "optim.clip_grad_norm"),
        ("supervised", "train.max_loss_ratio=1", "train.max_loss_ratio must be > 1"),
    ],
)
def test_out_of_range_values_stop_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, override: str, message: str
) -> None:
    run = tmp_path / "run"
    assert cli(command, run, override) == 2
    assert re.search(message, one_error_line(capsys, command))
    assert not run.exists()


def _garbage(path: Path) -> Path:
    path.write_bytes(b"\x00\xff\xfe\x80 not yaml")
    return path


def _empty(path: Path) -> Path:
    path.write_text("")
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_empty, "is empty"),
        (_folder, "is a folder, not a YAML file"),
        (_garbage, r"is not a text \(UTF-8 YAML\) file"),
    ],
)
def test_unusable_config_file_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, make, message: str
) -> None:
    config = make(tmp_path / "config.yaml")
    run = tmp_path / "run"
    assert main([command, str(config), f"run.dir={run}"]) == 2
    err = one_error_line(capsys, command)
    assert str(config) in err and re.search(message, err)
    assert not run.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["evaluate", "RUN", "--seed", "-1"], "argument --seed: must be in 0..4294967295, got -1"),
        (["evaluate", "RUN", "--episodes", "0"], "argument --episodes: must be >= 1, got 0"),
        (["visualize", "RUN", "--gif", "x.gif", "--fps", "0"], "argument --fps: must be > 0"),
        (["visualize", "RUN", "--gif", "x.gif", "--episodes", "0"], "--episodes: must be >= 1"),
        (["transfer", "doorkey", "--episodes", "0"], "argument --episodes: must be >= 1"),
        (["bench", "cores", "--reps", "-1"], "argument --reps: must be >= 1, got -1"),
        (["diagnose", "RUN", "--batch", "0"], "argument --batch: must be >= 1"),
        (["visualize", "RUN", "--gif", "FILE/x.gif"], "FILE is not a folder"),
        (["diagnose", SUP_CONFIG, "--out", "FILE/p.png"], "FILE is not a folder"),
        (["visualize", "RUN", "--gif", "TMP"], "TMP is a folder, not a file"),
        (["supervised", "RUN", "--eval-only", "--json", "FILE/r.json"], "FILE is not a folder"),
    ],
)
def test_out_of_range_options_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    blocker = tmp_path / "FILE"
    if any("FILE" in a for a in args):
        blocker.write_text("")
    names = {"RUN": str(tmp_path / "run"), "FILE": str(blocker), "TMP": str(tmp_path)}
    args = [names["RUN"] if a == "RUN" else a for a in args]
    args = [a.replace("FILE", names["FILE"]).replace("TMP", names["TMP"]) for a in args]
    message = message.replace("FILE", names["FILE"]).replace("TMP", names["TMP"])
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert message in err and out == ""  # nothing printed, trained or written
    assert [p.name for p in tmp_path.iterdir()] == (["FILE"] if blocker.exists() else [])


# ============================================================================ one line, exit 2
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    ("where", "message"),
    [("file", "exists and is not a folder"), ("under_file", "cannot create run folder")],
)
def test_unusable_run_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, command: str, where: str, message: str
) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    run = target if where == "file" else target / "run"
    assert cli(command, run) == 2
    err = one_error_line(capsys, command)
    assert message in err and str(run) in err
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("command", COMMANDS)
def test_unwritable_run_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """A read-only parent folder (simulated: the tests may run as root, who may write anyway)."""
    run = tmp_path / "ro" / "run"
    real_mkdir = Path.mkdir

    def read_only(self: Path, *args, **kwargs) -> None:
        if self == run:
            raise PermissionError(13, "Permission denied", str(self))
        real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert cli(command, run) == 2
    err = one_error_line(capsys, command)
    assert f"cannot create run folder {run}: Permission denied" in err


def test_any_os_error_is_one_line_naming_its_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from memcores.experiments.commands import list_cmd

    def denied(args: argparse.Namespace) -> int:
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(list_cmd, "run", denied)
    assert main(["list", "cores"]) == 2
    assert one_error_line(capsys, "list").endswith("error: Permission denied: /some/file")


def test_corrupt_checkpoint_never_suggests_unsafe_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    foreign = tmp_path / "foreign.pt"
    torch.save({"format": "x", "obj": argparse.Namespace(a=1)}, foreign)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(foreign.read_bytes()[:100])
    for path in (foreign, truncated):
        assert main(["evaluate", str(path)]) == 2
        err = one_error_line(capsys, "evaluate")
        assert f"checkpoint {path} is corrupt or not a memcores checkpoint" in err
        assert "weights_only" not in err and "will likely succeed" not in err


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _empty(tmp_path / "empty.yaml")
    with pytest.raises(ConfigError, match="is empty"):
        main(["--debug", "train", str(config)])
    monkeypatch.setenv("MEMCORES_DEBUG", "1")
    with pytest.raises(ConfigError, match="is empty"):
        main(["supervised", str(config)])


def test_a_bug_is_not_hidden_behind_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only bad-input errors become one line; anything else keeps its traceback."""
    from memcores.experiments.commands import list_cmd

    def broken(args: argparse.Namespace) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(list_cmd, "run", broken)
    with pytest.raises(KeyError, match="a bug"):
        main(["list", "cores"])


def test_a_library_runtime_error_points_to_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from memcores.experiments.commands import list_cmd

    def failing(args: argparse.Namespace) -> int:
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(list_cmd, "run", failing)
    assert main(["list", "cores"]) == 2
    err = one_error_line(capsys, "list")
    assert err.endswith("out of memory (memcores --debug shows the traceback)")


def test_memcores_own_runtime_errors_need_no_pointer_to_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A RuntimeError of memcores' own (a busy run folder) is input, not a library's failure:
    its one line ends with its message."""
    from memcores.agents.run_lock import RunFolderBusy
    from memcores.experiments.commands import list_cmd

    def busy(args: argparse.Namespace) -> int:
        raise RunFolderBusy("runs/x is used by another run")

    monkeypatch.setattr(list_cmd, "run", busy)
    assert main(["list", "cores"]) == 2
    assert one_error_line(capsys, "list").endswith("runs/x is used by another run")


@pytest.mark.parametrize(("argv", "code"), [([], 2), (["--version"], 0), (["--help"], 0)])
def test_a_reader_that_leaves_early_gets_no_traceback(argv: list[str], code: int) -> None:
    """``memcores | head -0``: the reader closed the pipe before the usage or the version was
    written; the exit code is the command's and stderr stays empty."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "memcores", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # before the interpreter has started: its first write finds no reader
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code and err == b""
