"""The memcores command line: help, unknown commands, listing cores, clean errors."""

from __future__ import annotations

import subprocess
import sys

from memcores.cores import CORES
from memcores.experiments.cli import main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "supervised", "bench", "sweep", "list"):
        assert command in out


def test_unknown_command_names_valid_ones(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_list_cores_prints_every_registered_core(capsys):
    assert main(["list", "cores"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split()[0] for line in lines) == sorted(CORES)


def test_console_script_runs_as_module():
    result = subprocess.run(
        [sys.executable, "-m", "memcores", "list", "cores"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ur_lstm" in result.stdout


def test_options_may_follow_the_overrides(tmp_path, capsys) -> None:
    # `memcores supervised RUN --resume train.steps=N` (as the docs write it) must parse
    from memcores.experiments.cli import main

    missing = tmp_path / "missing.yaml"
    assert main(["supervised", str(missing), "--resume", "train.steps=5"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" not in err
    assert "missing.yaml" in err
