"""`memcores report --compare BASE,OTHER`: two cores' transfer runs side by side per pair."""

from __future__ import annotations

import math

import pytest
import yaml

from agents.logger import RunLogger
from experiments.cli import main
from experiments.core_compare import comparison_rows, parse_compare, separation, welch_p
from experiments.transfer_plot import TransferPoint


def test_separation_and_welch_p():
    assert separation([0.0, 0.1], [0.2, 0.3]) == "above"
    assert separation([0.2, 0.3], [0.0, 0.1]) == "below"
    assert separation([0.0, 0.3], [0.2, 0.4]) == "overlap"
    # Welch's t for [0, 0, 0] against [1, 2, 3]: t = 2 / sqrt(1/3), df = 2 -> p = 0.0742
    assert welch_p([0.0, 0.0, 0.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0742, abs=1e-4)
    assert welch_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert math.isnan(welch_p([0.5, 0.5], [0.5, 0.5]))  # no spread: no test
    assert math.isnan(welch_p([0.5], [0.1, 0.2]))  # one run: no test


def test_comparison_rows_pair_the_cores_per_env_and_skip_unshared_pairs():
    points = [
        TransferPoint("lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.95], test=[0.4, 0.5]),
        TransferPoint("rel_lstm", "Fetch-5x5", "Fetch-8x8", train=[0.9, 0.8], test=[0.6, 0.7]),
        TransferPoint("lstm", "DoorKey-5x5", "DoorKey-16x16", train=[1.0], test=[0.0]),
    ]
    header, rows = comparison_rows(points, "lstm", "rel_lstm", "test")
    assert header[1:3] == ["`lstm` runs", "`rel_lstm` runs"]
    assert rows == [["Fetch-8x8", "0.40 / 0.50", "0.60 / 0.70", "+0.200", "above", "0.11"]]
    _, train_rows = comparison_rows(points, "lstm", "rel_lstm", "train")
    assert train_rows[0][0] == "Fetch-5x5" and train_rows[0][3:5] == ["-0.075", "overlap"]
    with pytest.raises(ValueError, match="valid: train, test"):
        comparison_rows(points, "lstm", "rel_lstm", "eval")


@pytest.mark.parametrize("text", ["lstm", "lstm,", "lstm,lstm", "a,b,a"])
def test_parse_compare_refuses_fewer_than_two_or_repeated_cores(text):
    with pytest.raises(ValueError, match="BASE,OTHER"):
        parse_compare(text)
    assert parse_compare("lstm, ur_lstm,fast_lstm") == ("lstm", "ur_lstm", "fast_lstm")


def _transfer_records(results, tmp_path):
    """Records of `lstm` and `rel_lstm`, two seeds each, on MemoryS7 -> MemoryS13."""
    from experiments.records import write_record

    for core, seed, test in (
        ("lstm", 0, 0.30),
        ("lstm", 1, 0.40),
        ("rel_lstm", 0, 0.50),
        ("rel_lstm", 1, 0.70),
    ):
        run = tmp_path / "runs" / f"{core}{seed}"
        run.mkdir(parents=True)
        config = {"env": {"id": "MiniGrid-MemoryS7-v0"}, "core": {"name": core}}
        (run / "config.yaml").write_text(yaml.safe_dump(config | {"train": {"seed": seed}}))
        logger = RunLogger(run, tensorboard=False)
        logger.record("rollout/ep_rew_mean", 0.5)
        logger.dump(100)
        logger.close()
        evals = {
            "MiniGrid-MemoryS7-v0": {"return": 0.95, "success": 1.0, "episodes": 5},
            "MiniGrid-MemoryS13-v0": {"return": test, "success": test, "episodes": 5},
        }
        write_record(
            run,
            results / f"seed={seed},name={core}" / "MemoryS7",
            eval_results=evals,
            wall_seconds=60.0,
            extra={"test_env": "MiniGrid-MemoryS13-v0"},
        )


def test_report_compare_from_the_cli_and_its_errors(tmp_path, capsys):
    results = tmp_path / "results"
    _transfer_records(results, tmp_path)
    out = tmp_path / "report" / "r.md"
    args = ["report", str(results), "--no-plots", "--out", str(out)]
    assert main([*args, "--compare", "lstm,rel_lstm"]) == 0
    text = out.read_text()
    assert "## `rel_lstm` against `lstm`, test return per run" in text
    assert "| MemoryS13 | 0.30 / 0.40 | 0.50 / 0.70 | +0.250 | above | 0.20 |" in text
    capsys.readouterr()

    # an unknown core: one line naming the recorded cores, exit 2, nothing written
    out.unlink()
    assert main([*args, "--compare", "lstm,gru"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "recorded cores: lstm, rel_lstm" in err
    assert not out.exists()
    assert main([*args, "--compare", "lstm"]) == 2
    assert "BASE,OTHER" in capsys.readouterr().err
