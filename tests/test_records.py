"""Results records: written from real tiny runs, read back by the one reader, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from memcores.agents import rl_trainer, supervised
from memcores.agents.supervised_config import SupervisedConfig
from memcores.experiments.cli import main
from memcores.experiments.config import load_config
from memcores.experiments.records import (
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
    full = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert any(name.startswith("decoder.") for name in full)
    out = tmp_path / "results" / "exp" / "recon"
    record = json.loads(write_record(run, out, policy=True).read_text())
    slim = torch.load(out / record["policy"], weights_only=True)["model"]
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


def test_record_of_another_run_is_refused_unless_replaced(rl_run, sup_run, tmp_path, capsys):
    rl, _ = rl_run
    sup, _ = sup_run
    out = tmp_path / "results" / "exp" / "trial"
    assert main(["record", str(rl), "--out", str(out)]) == 0
    before = (out / "record.json").read_text()
    assert main(["record", str(sup), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "different run" in err and "--replace" in err and str(out) in err
    assert len(err.strip().splitlines()) == 1
    assert (out / "record.json").read_text() == before  # nothing rewritten
    assert not (out / "results.json").exists()
    # the same run again (e.g. after a resume) is updated without a flag
    assert main(["record", str(rl), "--out", str(out)]) == 0
    assert main(["record", str(sup), "--out", str(out), "--replace"]) == 0
    assert read_record(out).record["kind"] == "supervised"


def test_a_longer_budget_of_the_same_run_is_the_same_run(rl_run, tmp_path):
    run, _ = rl_run
    out = tmp_path / "r" / "t"
    write_record(run, out)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["total_steps"] *= 2
    config["run"]["dir"] = "elsewhere"
    other = tmp_path / "longer"
    other.mkdir()
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    (other / "progress.csv").write_text((run / "progress.csv").read_text())
    write_record(other, out)  # no error
    config["agent"]["seq_len"] = 3
    (other / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(FileExistsError, match="agent.seq_len"):
        write_record(other, out)


def test_interrupted_run_is_recorded_incomplete(rl_run, tmp_path, capsys):
    run, _ = rl_run
    assert read_record_of(run, tmp_path / "a")["incomplete"] is False
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["train"]["total_steps"] = 8192
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "config.yaml").write_text(yaml.safe_dump(config))
    (cut / "progress.csv").write_text((run / "progress.csv").read_text())
    assert main(["record", str(cut), "--out", str(tmp_path / "b")]) == 0
    assert "incomplete run: 128 of 8192 frames" in capsys.readouterr().out
    record = read_record(tmp_path / "b").record
    assert record["incomplete"] is True and record["planned"] == 8192


def read_record_of(run: Path, out: Path) -> dict:
    write_record(run, out)
    return read_record(out).record


def test_derived_numbers_come_from_the_full_curve(tmp_path):
    """The thinned curve skips the first crossing; the record keeps the full curve's."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"core": {"name": "lstm"}}))
    values = [0.1] * 1000
    values[402] = 0.93  # one row above 0.9, then back: a 300-row curve does not keep it
    values[700:] = [0.95] * 300
    lines = ["step,rollout/ep_rew_mean,time/fps"]
    lines += [f"{10 * (i + 1)},{v},100" for i, v in enumerate(values)]
    (run / "progress.csv").write_text("\n".join(lines) + "\n")
    write_record(run, tmp_path / "r" / "t")
    record = read_record(tmp_path / "r" / "t").record
    first = record["derived"]["first_at_least"]["rollout/ep_rew_mean"]
    assert first["0.9"] == 4030 and first["0.95"] == 7010 and first["0.99"] is None
    assert record["derived"]["max"]["rollout/ep_rew_mean"] == [7010, 0.95]
    assert record["derived"]["min"]["rollout/ep_rew_mean"] == [10, 0.1]
    assert "time/fps" not in record["derived"]["max"]
    thinned = read_curves(tmp_path / "r" / "t")["rollout/ep_rew_mean"]
    assert 4030 not in thinned.steps.tolist()  # why the record keeps it


def test_policy_of_a_foreign_checkpoint_is_one_line_and_writes_nothing(rl_run, tmp_path, capsys):
    import argparse

    import torch

    run, _ = rl_run
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for name in ("config.yaml", "progress.csv"):
        (foreign / name).write_text((run / name).read_text())
    (foreign / "checkpoints").mkdir()
    torch.save({"model": argparse.Namespace(layers=2)}, foreign / "checkpoints" / "last.pt")
    out = tmp_path / "results" / "exp" / "t"
    assert main(["record", str(foreign), "--out", str(out), "--policy"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not a memcores checkpoint" in err
    assert "weights_only=False" not in err and "Traceback" not in err
    assert not out.exists()
    torch.save({"format": "x", "weights": [1]}, foreign / "checkpoints" / "last.pt")
    assert main(["record", str(foreign), "--out", str(out), "--policy"]) == 2
    assert "no policy weights" in capsys.readouterr().err and not out.exists()


def test_a_run_folder_as_out_is_refused_unless_replaced(rl_run, tmp_path, capsys):
    run, _ = rl_run
    other = tmp_path / "other_run"  # another run's folder: its config beside its checkpoint
    rl_trainer.train(tiny_config("train.total_steps=64", "train.seed=1"), other)
    before = (other / "config.yaml").read_text()
    assert main(["record", str(run), "--out", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--out {other} is a run folder (it holds" in err[0]
    assert (other / "config.yaml").read_text() == before and not has_record(other)
    assert main(["record", str(run), "--out", str(other), "--replace"]) == 0
    assert has_record(other)
    own = tmp_path / "own_run"  # a run recorded into its own folder: the same config
    rl_trainer.train(tiny_config("train.total_steps=64"), own)
    assert main(["record", str(own), "--out", str(own)]) == 0 and has_record(own)


def test_the_wrote_line_names_only_the_files_written(rl_run, tmp_path, capsys):
    run, _ = rl_run
    out = tmp_path / "results" / "exp" / "trial"
    out.mkdir(parents=True)
    (out / "notes.md").write_text("mine")
    assert main(["record", str(run), "--out", str(out)]) == 0
    wrote = capsys.readouterr().out.splitlines()[0]
    assert wrote == f"wrote {out} (config.yaml, curve.csv, record.json)"
    assert main(["record", str(run), "--out", str(out), "--policy"]) == 0
    wrote = capsys.readouterr().out.splitlines()[0]
    assert wrote == f"wrote {out} (config.yaml, curve.csv, policy.pt, record.json)"


def test_a_policy_the_record_cannot_keep_is_refused(rl_run, sup_run, tmp_path, capsys, monkeypatch):
    from memcores.experiments import records

    out = tmp_path / "results" / "exp" / "t"
    monkeypatch.setattr(records, "MAX_POLICY_BYTES", 1000)  # the tiny policy is over
    assert main(["record", str(rl_run[0]), "--out", str(out), "--policy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the policy of" in err[0] and "over the 0.001 MB" in err[0]
    assert not out.exists()
    assert main(["record", str(sup_run[0]), "--out", str(out), "--policy"]) == 2
    assert "--policy keeps RL policies only" in capsys.readouterr().err and not out.exists()
    # a sweep's transfer trials keep a policy only where it fits: null, as documented
    write_record(rl_run[0], out, policy=True)
    assert json.loads((out / "record.json").read_text())["policy"] is None
