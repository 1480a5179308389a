"""Results records: written from real tiny runs, read back by the one reader, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from agents import rl_trainer, supervised
from agents.supervised_config import SupervisedConfig
from experiments.cli import main
from experiments.config import load_config
from experiments.records import (
    FORMAT,
    MAX_CURVE_ROWS,
    downsample,
    find_runs,
    has_record,
    read_curves,
    read_record,
    write_record,
)
from tests.rl_helpers import tiny_config


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A 2-update Empty-5x5 run through the trainer API, with the rows ``on_log`` saw."""
    run = tmp_path_factory.mktemp("rl") / "run"
    rows: list[dict] = []
    rl_trainer.train(
        tiny_config("train.total_steps=128", "run.tensorboard=false"), run, on_log=rows.append
    )
    return run, rows


@pytest.fixture(scope="module")
def sup_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    run = tmp_path_factory.mktemp("sup") / "run"
    config = load_config(
        SupervisedConfig,
        None,
        [
            "task.name=copy",
            "task.length=5",
            "core.hidden_size=8",
            "train.steps=4",
            "train.log_every=1",
            "train.eval_every=2",
            "train.eval_size=20",
            "train.progress=false",
            "run.tensorboard=false",
            f"run.dir={run}",
        ],
    )
    rows: list[dict] = []
    supervised.train(config, on_log=rows.append)
    return run, rows


def test_on_log_sees_every_logged_row(rl_run, sup_run):
    run, rows = rl_run
    assert [r["step"] for r in rows] == [64, 128]
    assert "rollout/ep_rew_mean" in rows[-1] and "time/fps" in rows[-1]
    run, rows = sup_run
    assert [r["step"] for r in rows][-1] == 4 and "eval/accuracy" in rows[-1]


def test_rl_record_round_trip(rl_run, tmp_path):
    run, rows = rl_run
    out = tmp_path / "results" / "doorkey" / "core=lstm,seed=0"
    evals = {"MiniGrid-Empty-8x8-v0": {"return": 0.25, "success": 0.5, "episodes": 4}}
    path = write_record(run, out, command="memcores train X", eval_results=evals, policy=True)
    record = json.loads(path.read_text())
    assert record["format"] == FORMAT and record["kind"] == "rl"
    assert (record["experiment"], record["trial"]) == ("doorkey", "core=lstm,seed=0")
    assert record["frames"] == 128 and record["seed"] == 0 and record["core"] == "lstm"
    assert record["env"] == "MiniGrid-Empty-5x5-v0" and record["eval"] == evals
    assert record["final"]["rollout/ep_rew_mean"] == pytest.approx(rows[-1]["rollout/ep_rew_mean"])
    assert record["wall_seconds"] > 0 and "CPU" in record["hardware"]
    assert record["command"] == "memcores train X"
    assert yaml.safe_load((out / "config.yaml").read_text()) == yaml.safe_load(
        (run / "config.yaml").read_text()
    )
    # the policy is small here, so it is kept, and it evaluates like the run's checkpoint
    assert record["policy"] == "policy.pt" and (out / "policy.pt").stat().st_size < 1_000_000
    assert main(["evaluate", str(out / "policy.pt"), "--episodes", "1"]) == 0
    assert not list(out.glob("*.tmp")) and has_record(out)

    back = read_record(out)
    assert back.is_record and back.get("core.name") == "lstm" and back.evals == evals
    curves, source = back.curves(), read_curves(run)
    assert set(curves) == set(source)
    np.testing.assert_array_equal(curves["rollout/ep_len_mean"].steps, [64, 128])
    np.testing.assert_allclose(
        curves["rollout/ep_len_mean"].values, source["rollout/ep_len_mean"].values, rtol=1e-5
    )
    # one reader for run folders and records alike
    runs = find_runs([run, tmp_path / "results"])
    assert [r.is_record for r in runs] == [False, True] or [r.is_record for r in runs] == [
        True,
        False,
    ]


def test_record_policy_drops_the_reconstruction_decoder(tmp_path, capsys):
    """The decoder only trains the core: the record's policy.pt leaves it out, and acts exactly
    as the full checkpoint does."""
    import torch

    run = tmp_path / "run"
    config = tiny_config(
        "train.total_steps=64",
        "run.tensorboard=false",
        "agent.recon_coef=0.1",
        "agent.recon_lags=[0,2]",
    )
    rl_trainer.train(config, run)
    full = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["policy"]
    assert any(name.startswith("decoder.") for name in full)
    out = tmp_path / "results" / "exp" / "recon"
    record = json.loads(write_record(run, out, policy=True).read_text())
    slim = torch.load(out / record["policy"], weights_only=True)["policy"]
    assert set(slim) == {name for name in full if not name.startswith("decoder.")}
    results = []
    for source in (run, out / "policy.pt"):
        assert main(["evaluate", str(source), "--episodes", "3", "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0] == results[1]


def test_supervised_record_takes_results_json(sup_run, tmp_path):
    run, rows = sup_run
    out = tmp_path / "copy" / "lstm"
    record = json.loads(write_record(run, out).read_text())
    results = json.loads((run / "results.json").read_text())
    assert record["kind"] == "supervised" and record["updates"] == 4
    assert record["task"] == "copy" and "frames" not in record
    assert record["wall_seconds"] == pytest.approx(results["wall_s"], abs=0.1)
    assert record["eval"]["eval"]["accuracy"] == results["final"]["eval/accuracy"]
    assert not (out / "policy.pt").exists()


def test_curve_is_downsampled_keeping_first_and_last(tmp_path):
    rows = [{"step": float(i), "x": float(i) / 7} for i in range(1000)]
    kept = downsample(rows)
    assert len(kept) <= MAX_CURVE_ROWS and kept[0] is rows[0] and kept[-1] is rows[-1]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"core": {"name": "lstm"}}))
    lines = ["step,rollout/ep_rew_mean,time/fps"]
    lines += [f"{10 * i},{i / 1000},{100.0}" for i in range(1, 1001)]
    (run / "progress.csv").write_text("\n".join(lines) + "\n")
    write_record(run, tmp_path / "r" / "t")
    curve = (tmp_path / "r" / "t" / "curve.csv").read_text().splitlines()
    assert curve[0].startswith("step,") and len(curve) - 1 <= MAX_CURVE_ROWS
    assert curve[-1].startswith("10000,")
    assert json.loads((tmp_path / "r" / "t" / "record.json").read_text())["wall_seconds"] == 100


def test_record_cli_and_its_errors(rl_run, tmp_path, capsys):
    run, _ = rl_run
    out = tmp_path / "results" / "exp" / "trial"
    assert main(["record", str(run), "--out", str(out), "--command", "memcores train c"]) == 0
    assert has_record(out) and not (out / "policy.pt").exists()
    assert main(["record", str(tmp_path / "nope"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "not a run folder" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("")
    assert main(["record", str(run), "--out", str(tmp_path / "file")]) == 2
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "record.json").write_text("{}")
    with pytest.raises(ValueError, match="not a memcores record"):
        find_runs([bad])
