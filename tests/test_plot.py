"""``memcores plot``: curves from real run folders (written with RunLogger) and records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from memcores.agents.logger import RunLogger
from memcores.experiments.cli import main
from memcores.experiments.plotting import aggregate, collect_bands, smooth
from memcores.experiments.records import Curve, find_runs, get_dotted, read_curves, write_record


def write_run(run_dir: Path, core: str, seed: int, env: str = "Env-A", steps=range(0, 50, 10)):
    """A run folder like `memcores train` writes: config.yaml + events + progress.csv.
    The reward is ``step/100 + seed/10`` (+0.5 for ur_lstm) so means are known exactly."""
    run_dir.mkdir(parents=True)
    config = {"env": {"id": env}, "core": {"name": core, "options": {}}, "train": {"seed": seed}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    logger = RunLogger(run_dir)
    for step in steps:
        logger.record(
            "rollout/ep_rew_mean", step / 100 + seed / 10 + (0.5 if core == "ur_lstm" else 0)
        )
        logger.record("train/value_loss", 1.0 / (1 + step))
        logger.dump(step)
    logger.close()


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for core in ("lstm", "ur_lstm"):
        for seed in (0, 1):
            write_run(root / f"name={core},seed={seed}", core, seed)
    write_run(root / ".tune" / "x", "gru", 0)  # tool folders (Tune's) are ignored
    return root


def test_read_scalars_and_find_runs(sweep):
    runs = find_runs([sweep])
    assert [r.path.name for r in runs] == [
        "name=lstm,seed=0",
        "name=lstm,seed=1",
        "name=ur_lstm,seed=0",
        "name=ur_lstm,seed=1",
    ]
    assert runs[2].get("core.name") == "ur_lstm"
    curves = read_curves(runs[1].path)
    assert set(curves) == {"rollout/ep_rew_mean", "train/value_loss"}
    np.testing.assert_array_equal(curves["rollout/ep_rew_mean"].steps, [0, 10, 20, 30, 40])
    np.testing.assert_allclose(curves["rollout/ep_rew_mean"].values, [0.1, 0.2, 0.3, 0.4, 0.5])


def test_mean_and_spread_over_seeds_one_band_per_core(sweep):
    panels = collect_bands(find_runs([sweep]), "rollout/ep_rew_mean", spread="minmax")
    assert list(panels) == [""]
    bands = {b.label: b for b in panels[""]}
    assert set(bands) == {"lstm", "ur_lstm"} and all(b.n == 2 for b in bands.values())
    lstm = bands["lstm"]
    np.testing.assert_allclose(lstm.mean, lstm.steps / 100 + 0.05)
    np.testing.assert_allclose(lstm.low, lstm.steps / 100)
    np.testing.assert_allclose(lstm.high, lstm.steps / 100 + 0.1)
    np.testing.assert_allclose(bands["ur_lstm"].mean, lstm.mean + 0.5)
    std = collect_bands(find_runs([sweep]), "rollout/ep_rew_mean", spread="std")[""][0]
    np.testing.assert_allclose(std.high - std.mean, 0.05)


def test_aggregate_uses_common_step_range_and_interpolates():
    a = Curve(np.array([0, 10, 20, 30]), np.array([0.0, 1.0, 2.0, 3.0]))
    b = Curve(np.array([5, 15, 25]), np.array([10.0, 10.0, 10.0]))
    band = aggregate([a, b], "x")
    np.testing.assert_array_equal(band.steps, [5, 10, 15, 20, 25])
    np.testing.assert_allclose(band.mean, (np.array([0.5, 1, 1.5, 2, 2.5]) + 10) / 2)
    with pytest.raises(ValueError, match="spread"):
        aggregate([a], "x", spread="iqr")


def test_smooth_matches_tensorboard_ema():
    values = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(smooth(values, 0.0), values)
    # debiased EMA: first value unchanged, then weighted toward history
    out = smooth(values, 0.5)
    assert out[0] == pytest.approx(1.0)
    assert out[1] == pytest.approx(0.5 * 0.5 / 0.75)


def test_get_dotted_finds_options_keys():
    tree = {"task": {"name": "copy", "options": {"length": 200}}}
    assert get_dotted(tree, "task.length") == 200
    assert get_dotted(tree, "task.name") == "copy"
    assert get_dotted(tree, "task.nope", "d") == "d"


def test_plot_cli_writes_png_with_panels_per_env(sweep, tmp_path, capsys):
    write_run(sweep / "other-env", "lstm", 0, env="Env-B")
    out = tmp_path / "plots" / "curves.png"
    assert main(["plot", str(sweep), "--metric", "rollout/ep_rew_mean", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = capsys.readouterr().out
    assert "Env-A: lstm (seeds=2" in text and "Env-B: lstm (seeds=1" in text
    assert "ur_lstm (seeds=2, last mean 0.95)" in text


def test_plot_cli_errors_name_the_problem(sweep, tmp_path, capsys):
    out = tmp_path / "x.png"
    assert main(["plot", str(sweep), "--metric", "eval/accuracy", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "eval/accuracy" in err and "rollout/ep_rew_mean" in err
    assert main(["plot", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such run" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "option", "key", "close"),
    [([], "--group-by", "bogus.key", ""), ([], "--group-by", "core.nme", "; close: core.name"),
     ([], "--panel-by", "env.idd", "; close: env.id"),
     (["--against", "train.seed"], "--group-by", "bogus.key", "")],
)  # fmt: skip
def test_a_key_no_run_has_is_refused_not_drawn_one_line_per_run(
    sweep, tmp_path, capsys, extra, option, key, close
):
    out = tmp_path / "curves.png"
    assert main(["plot", str(sweep), "--out", str(out), *extra, option, key]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"memcores plot: error: {option} {key}: no run's config has this key "
        f"(e.g. core.name, env.id, task.name, train.seed){close}"
    ]
    assert not out.exists()


def test_plot_cli_log_y_needs_positive_values(sweep, tmp_path, capsys):
    out = tmp_path / "log.png"
    # the lstm's reward starts at exactly 0 (step 0, seed 0): no log axis for it
    args = ["plot", str(sweep), "--out", str(out), "--log-y", "--panel-by", "none"]
    assert main([*args, "--metric", "rollout/ep_rew_mean"]) == 2
    err = capsys.readouterr().err
    assert "--log-y needs positive values" in err and "lstm" in err
    assert not out.exists()
    assert main([*args, "--metric", "train/value_loss"]) == 0 and out.is_file()


def test_records_and_run_folders_plot_together(sweep, tmp_path):
    """A committed record (curve.csv, <= 300 rows) stands in for its run folder."""
    run = sweep / "name=ur_lstm,seed=1"
    write_record(run, tmp_path / "results" / "exp" / "name=ur_lstm,seed=1")
    import shutil

    shutil.rmtree(run)
    runs = find_runs([sweep, tmp_path / "results"])
    assert [r.is_record for r in runs].count(True) == 1 and len(runs) == 4
    bands = {b.label: b for b in collect_bands(runs, "rollout/ep_rew_mean")[""]}
    assert bands["ur_lstm"].n == 2
    np.testing.assert_allclose(bands["ur_lstm"].mean, bands["ur_lstm"].steps / 100 + 0.55)
