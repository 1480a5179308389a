"""experiments.engines: bad input stops with a one-line message and exit code 2."""

from __future__ import annotations

import pytest

from experiments.engines import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--engine", "torchrl", "--address", "127.0.0.1:6391"], "runs RLlib only"),
        (["run", "--engine", "rllib", "--frames", "0"], "--frames must be positive"),
        (["run", "--engine", "jax"], "invalid choice: 'jax'"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--results", str(tmp_path / "results"), "--runs", str(tmp_path / "runs")])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()
