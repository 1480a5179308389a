"""``experiments/algo_compare.py``: the per-seed scores, means, separation and Welch's p of
algorithms against a baseline, from records written by hand."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from memcores.experiments.algo_compare import compare_rows, main


def _records(folder, env, core, scores, metric="rollout/ep_rew_mean", walls=()):
    """One record per score (seed = its index); ``walls``: their ``frames`` (1,000) and
    ``wall_seconds``, left out when not given."""
    for seed, score in enumerate(scores):
        trial = folder / f"{env.replace('/', '-')},{core},{seed}"
        trial.mkdir(parents=True)
        record = {"env": env, "core": core, "seed": seed, "final": {metric: score}}
        if walls:
            record |= {"frames": 1000, "wall_seconds": walls[seed]}
        (trial / "record.json").write_text(json.dumps(record))


def test_rows_by_hand(tmp_path, capsys):
    base, other = tmp_path / "ppo", tmp_path / "pqn"
    _records(base, "popgym/A", "gru", [0.1, 0.2, 0.3])
    _records(base, "popgym/B", "gru", [0.0, 0.0])  # no other algorithm ran B: no row
    _records(base, "popgym/A", "lstm", [9.0, 9.0])  # another core: left out
    _records(other, "popgym/A", "gru", [0.5, 0.7, 0.6])
    rows = compare_rows([base, other], "gru")
    assert [r[:5] for r in rows] == [
        ["popgym/A", "gru", "ppo", "0.100, 0.200, 0.300", "0.200 ± 0.100"],
        ["popgym/A", "gru", "pqn", "0.500, 0.700, 0.600", "0.600 ± 0.100"],
    ]
    p = stats.ttest_ind([0.5, 0.7, 0.6], [0.1, 0.2, 0.3], equal_var=False).pvalue
    # Two significant figures, the trailing zero kept: "0.0080", not "0.008".
    assert rows[1][5:] == ["+0.400", "above", "0.0080", "-", "-"]  # records without costs
    assert p == pytest.approx(0.0080, abs=1e-4)  # t = 0.4 / sqrt(0.01 / 3 * 2) = 4.90, 4 df
    assert main([str(base), str(other), "--core", "gru"]) == 0
    assert "| popgym/A | gru | pqn | 0.500, 0.700, 0.600 |" in capsys.readouterr().out


def test_success_rate_is_compared_when_asked(tmp_path, capsys):
    """``--metric rollout/success_rate``: the records' success, the reward left out; a metric
    the table does not know is refused by argparse (exit 2)."""
    base, other = tmp_path / "ppo", tmp_path / "r2d2"
    _records(base, "memcores/P", "gru", [0.3, 0.4], "rollout/success_rate")
    _records(other, "memcores/P", "gru", [0.9, 1.0], "rollout/success_rate")
    _records(tmp_path / "x", "memcores/P", "gru", [5.0, 5.0])
    assert compare_rows([base, other], "gru") == []  # no reward recorded
    rows = compare_rows([base, other], "gru", "rollout/success_rate")
    assert [r[3:7] for r in rows] == [
        ["0.300, 0.400", "0.350 ± 0.071", "", ""],
        ["0.900, 1.000", "0.950 ± 0.071", "+0.600", "above"],
    ]
    args = [str(base), str(other), "--core", "gru", "--metric", "rollout/success_rate"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Final `rollout/success_rate`" in out and "--metric rollout/success_rate`" in out
    with pytest.raises(SystemExit) as exit_:
        main([str(base), "--core", "gru", "--metric", "rollout/ep_len_mean"])
    assert exit_.value.code == 2


def test_costs_and_a_single_seed(tmp_path, capsys):
    """The frames and wall seconds of each row's runs (one value, or a range); Welch's p is
    ``-`` when a side has one seed, where the test is undefined."""
    base, other = tmp_path / "ppo", tmp_path / "pqn"
    _records(base, "popgym/A", "gru", [0.1, 0.3], walls=[1200.4, 1500.6])
    _records(other, "popgym/A", "gru", [0.5], walls=[900.2])
    rows = compare_rows([base, other], "gru")
    assert [r[5:] for r in rows] == [
        ["", "", "", "1,000", "1,200-1,501"],
        ["+0.300", "above", "-", "1,000", "900"],
    ]
    assert main([str(base), str(other), "--core", "gru"]) == 0
    assert "| Welch p | frames | wall s |" in capsys.readouterr().out


def test_p_is_a_dash_without_spread_and_small_p_in_exponent(tmp_path):
    """Welch's p is undefined when neither side varies (``-``, not ``nan``); a p below 0.001
    is written ``6.5e-12``, never rounded to ``0.00``."""
    base, same, far = tmp_path / "ppo", tmp_path / "pqn", tmp_path / "r2d2"
    _records(base, "popgym/A", "gru", [0.5, 0.5])
    _records(same, "popgym/A", "gru", [0.9, 0.9])
    assert compare_rows([base, same], "gru")[1][5:8] == ["+0.400", "above", "-"]
    _records(base, "popgym/B", "gru", [0.100, 0.101, 0.099])
    _records(far, "popgym/B", "gru", [0.900, 0.901, 0.899])
    # t = 0.8 / sqrt(2 * 1e-6 / 3) = 979.8 with 4 df: p = 2 * sf(979.8, 4) = 6.5e-12.
    assert compare_rows([base, far], "gru")[-1][7] == "6.5e-12"
