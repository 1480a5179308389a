"""memcores.experiments.engines: bad input stops with a one-line message and exit code 2."""

from __future__ import annotations

import pytest

from memcores.experiments.engines import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--engine", "torchrl", "--address", "127.0.0.1:6391"], "runs RLlib only"),
        (["run", "--engine", "rllib", "--frames", "0"], "--frames must be positive"),
        (["run", "--engine", "jax"], "invalid choice: 'jax'"),
        (["run", "--engine", "rllib", "--core", "gruu"], "unknown core 'gruu'; valid: lstm,"),
        (["cluster", "--core", "gruu"], "unknown core 'gruu'; valid: lstm,"),
        (["cluster", "--frames", "-1"], "--frames must be positive"),
    ],
)
def test_bad_arguments_exit_2(argv, message, capsys, tmp_path):
    folders = ["--results", str(tmp_path / "results"), "--runs", str(tmp_path / "runs")]
    with pytest.raises(SystemExit) as stop:
        main([*argv, *(folders if argv[0] == "run" else [])])
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results").exists() and not (tmp_path / "runs").exists()


def test_seed_statistics_mean_std_and_welch_against_memcores():
    from scipy import stats

    from memcores.experiments.engines import seed_statistics

    memcores, torchrl = [-0.2, -0.25, -0.3], [-0.31, -0.35, -0.4]
    rows = [("memcores", "gru", s, v) for s, v in enumerate(memcores)]
    rows += [("torchrl", "gru", s, v) for s, v in enumerate(torchrl)]
    rows += [("rllib", "gru", 0, -0.1), ("torchrl", "lru", 0, -0.3), ("torchrl", "lru", 1, -0.2)]
    lines = seed_statistics(rows)
    assert len(lines) == 4  # header, rule, memcores gru, torchrl gru (one-seed rllib, no lru base)
    assert lines[2] == "| gru | memcores | 0,1,2 | -0.250 | 0.050 |  |  |"
    p = stats.ttest_ind(torchrl, memcores, equal_var=False).pvalue
    assert p == pytest.approx(0.0571, abs=1e-4)
    # Two significant figures, as in every comparison table ("0.057", not "0.06").
    assert lines[3] == "| gru | torchrl | 0,1,2 | -0.353 | 0.045 | 0.057 | below |"
    assert seed_statistics([("memcores", "gru", 0, -0.2)]) == []
