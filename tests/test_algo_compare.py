"""``experiments/algo_compare.py``: the per-seed scores, means, separation and Welch's p of
algorithms against a baseline, from records written by hand."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from memcores.experiments.algo_compare import compare_rows, main


def _records(folder, env, core, scores):
    for seed, score in enumerate(scores):
        trial = folder / f"{env.replace('/', '-')},{core},{seed}"
        trial.mkdir(parents=True)
        record = {"env": env, "core": core, "seed": seed, "final": {"rollout/ep_rew_mean": score}}
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
    assert rows[1][5:] == ["+0.400", "above", f"{p:.2g}"]
    assert p == pytest.approx(0.0080, abs=1e-4)  # t = 0.4 / sqrt(0.01 / 3 * 2) = 4.90, 4 df
    assert main([str(base), str(other), "--core", "gru"]) == 0
    assert "| popgym/A | gru | pqn | 0.500, 0.700, 0.600 |" in capsys.readouterr().out
