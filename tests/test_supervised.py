"""The supervised trainer and the ``memcores supervised`` command."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import torch

from memcores.agents import supervised
from memcores.agents.checkpoint import load_checkpoint
from memcores.agents.supervised_config import SupervisedConfig
from memcores.cores import make_core
from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError, load_config

# A copy task small enough to learn in a few hundred updates: 3 symbols from {1, 2, 3}
# recalled after a delay of 5 steps.
SHORT_COPY = [
    "task.name=copy",
    "task.length=5",
    "task.n_tokens=3",
    "task.alphabet=3",
    "core.name=lstm",
    "core.hidden_size=32",
    "optim.lr=0.02",
    "train.batch_size=64",
    "train.eval_size=200",
    "train.threads=1",
    "train.progress=false",
    "run.tensorboard=false",
]


def _config(tmp_path: Path, *overrides: str) -> SupervisedConfig:
    return load_config(SupervisedConfig, None, [*SHORT_COPY, f"run.dir={tmp_path}", *overrides])


def test_learns_short_copy_to_100_percent(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = _config(run, "train.steps=800", "train.eval_every=25", "train.target_accuracy=1.0")
    results = supervised.train(config)
    assert results["final"]["eval/accuracy"] == 1.0
    assert results["stopped_early"] and results["step"] < 800
    assert results["final"]["eval/loss"] < 0.2 * results["baseline_loss"]
    for name in (
        "config.yaml",
        "progress.csv",
        "checkpoints/last.pt",
        "checkpoints/init.pt",
        "results.json",
    ):
        assert (run / name).is_file(), name
    rows = list(csv.DictReader((run / "progress.csv").open()))
    assert {"train/loss", "train/grad_norm", "eval/accuracy"} <= set(rows[0])
    # the LSTM has a forget gate, so its time scales are logged
    assert any(r.get("train/timescale_median") for r in rows)
    assert any(r.get("train/log10_timescale_mean") for r in rows)


def test_timescale_stats_average_logs_and_skip_cores_without_a_gate() -> None:
    constant = math.log10(-1.0 / math.log(1.0 / (1.0 + math.exp(-1.0))))  # 3.19 steps
    lstm = make_core("lstm", 3, 8)  # constant init: every unit at -1/log sigma(1)
    stats = supervised.timescale_stats(supervised.forget_log_timescales(lstm))
    assert stats["log10_timescale_mean"] == pytest.approx(constant, abs=1e-9)
    assert stats["log10_timescale_std"] == pytest.approx(0.0, abs=1e-9)
    assert stats["timescale_median"] == stats["timescale_max"] == pytest.approx(10**constant)
    fast = make_core("fast_lstm", 3, 2)
    with torch.no_grad():  # units at tau = e^11013 (beyond float64) and ~3.19: the mean of
        fast.bias[fast._block("f")] = torch.tensor([10.0, math.asinh(1.0)])  # logs stays finite
    stats = supervised.timescale_stats(supervised.forget_log_timescales(fast))
    expected = (math.sinh(10.0) / math.log(10.0) + constant) / 2
    assert stats["log10_timescale_mean"] == pytest.approx(expected, rel=1e-6)
    assert stats["timescale_max"] == pytest.approx(10**constant)  # only the finite unit
    assert supervised.forget_log_timescales(make_core("power_rnn", 3, 8)) is None


def _run_steps(run: Path, steps: int, resume: bool = False) -> dict:
    config = _config(run, f"train.steps={steps}", "train.eval_every=3", "train.log_every=1")
    supervised.train(config, resume=resume)
    return load_checkpoint(run / "checkpoints/last.pt")


def test_resume_continues_same_step_and_optimizer_state(tmp_path: Path) -> None:
    straight = _run_steps(tmp_path / "a", 6)
    first = _run_steps(tmp_path / "b", 3)
    assert first["step"] == 3
    state3 = first["optimizer"]["state"][0]["step"]
    resumed = _run_steps(tmp_path / "b", 6, resume=True)
    assert resumed["step"] == 6
    assert float(resumed["optimizer"]["state"][0]["step"]) == float(state3) + 3
    # same data, same optimiser moments: identical weights to the uninterrupted run
    for key, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, msg=key)
    for k, v in straight["optimizer"]["state"].items():
        torch.testing.assert_close(resumed["optimizer"]["state"][k]["exp_avg"], v["exp_avg"])
    steps = [int(r["step"]) for r in csv.DictReader((tmp_path / "b" / "progress.csv").open())]
    assert steps == sorted(set(steps)) and steps[-1] == 6


def test_existing_run_needs_resume(tmp_path: Path) -> None:
    _run_steps(tmp_path, 2)
    with pytest.raises(ValueError, match="--resume"):
        _run_steps(tmp_path, 4)


def test_overwrite_starts_afresh(tmp_path: Path) -> None:
    _run_steps(tmp_path, 4)
    config = _config(tmp_path, "train.steps=2", "train.eval_every=2", "run.overwrite=true")
    supervised.train(config)
    assert load_checkpoint(tmp_path / "checkpoints/last.pt")["step"] == 2
    steps = [int(r["step"]) for r in csv.DictReader((tmp_path / "progress.csv").open())]
    assert max(steps) == 2


def test_resume_rejects_a_different_core(tmp_path: Path) -> None:
    _run_steps(tmp_path, 2)
    config = _config(tmp_path, "train.steps=4", "train.eval_every=3", "core.name=gru")
    with pytest.raises(ValueError, match="core.name is 'gru'"):
        supervised.train(config, resume=True)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.stepz=5", "unknown config key 'train.stepz'; valid keys.*steps"),
        ("optim.name=sgd", "invalid value 'sgd' for 'optim.name'; allowed: 'adam'"),
        ("task.name=coppy", "unknown task 'coppy'; valid tasks: .*copy"),
        ("task.lenght=4", "unknown option 'lenght' for task 'copy'; valid options: .*length"),
        ("train.batch_size=0", "train.batch_size must be positive"),
        ("core.name=lsmt", "unknown core 'lsmt'; valid cores: .*lstm"),
        ("core.q=0.5", "unknown option 'q' for core 'fast_lstm'; valid options: "),
        ("task.loss=first10", "copy loss must be 'all' or 'last10'"),
    ],
)
def test_bad_config_is_a_clear_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, override: str, message: str
) -> None:
    run = tmp_path / "run"
    code = main(["supervised", "experiments/configs/demo_copy.yaml", f"run.dir={run}", override])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("memcores supervised: error:")
    assert re.search(message, err), err
    assert not run.exists()


def test_missing_data_file_is_named_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tmp_path / "har.yaml"
    config.write_text(f"task:\n  name: har\n  data_dir: {tmp_path / 'nowhere'}\n")
    run = tmp_path / "run"
    assert main(["supervised", str(config), f"run.dir={run}"]) == 2
    err = capsys.readouterr().err
    assert "UCI HAR" in err and "body_acc_x_train.txt" in err and "archive.ics.uci.edu" in err
    assert not run.exists()


def test_config_errors_raise_config_error() -> None:
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(SupervisedConfig, None, ["optim.lr=fast"])


def test_eval_only_at_other_lengths(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    supervised.train(_config(run, "train.steps=3", "train.eval_every=3"))
    capsys.readouterr()
    out_json = tmp_path / "transfer.json"
    code = main(
        [
            "supervised",
            str(run),
            "train.eval_size=50",
            "--eval-only",
            "--eval-lengths",
            "10,40",
            "--json",
            str(out_json),
        ]
    )
    assert code == 0
    results = json.loads(out_json.read_text())
    assert set(results) == {"T=10", "T=40"}
    assert all(0.0 <= m["accuracy"] <= 1.0 for m in results.values())
    assert "T=40" in capsys.readouterr().out
    # evaluation is deterministic: the same checkpoint on the same fixed sets, the same numbers
    again = tmp_path / "again.json"
    args = ["supervised", str(run), "train.eval_size=50", "--eval-only", "--eval-lengths"]
    assert main([*args, "10,40", "--json", str(again)]) == 0
    assert json.loads(again.read_text()) == results
    # a task that no longer fits the model is refused
    assert main(["supervised", str(run), "task.alphabet=5", "--eval-only"]) == 2


@pytest.mark.parametrize(
    ("task", "metric"),
    [("adding", "eval/mse"), ("pattern_copy", "eval/accuracy"), ("denoise", "eval/accuracy")],
)
def test_every_loss_kind_trains(tmp_path: Path, task: str, metric: str) -> None:
    overrides = [f"task.name={task}", "train.steps=2", "train.eval_every=2", "train.eval_size=20"]
    if task != "pattern_copy":
        overrides.append("task.length=12")
    config = load_config(
        SupervisedConfig,
        None,
        [*overrides, "core.hidden_size=8", "train.progress=false", "run.tensorboard=false"]
        + [f"run.dir={tmp_path}"],
    )
    results = supervised.train(config)
    assert metric in results["final"]
    assert torch.isfinite(torch.tensor(results["final"]["eval/loss"]))


def test_digits_reports_test_split(tmp_path: Path) -> None:
    config = load_config(
        SupervisedConfig,
        "experiments/configs/digits.yaml",
        ["train.steps=2", "train.eval_every=2", "core.hidden_size=8", "core.name=power_rnn"]
        + ["train.progress=false", "run.tensorboard=false", f"run.dir={tmp_path}"],
    )
    results = supervised.train(config)
    accuracy = results["final"]["test/accuracy"]
    # a fraction of the 359 held-out test images (20 % of scikit-learn's 1797 digits)
    assert 0.0 <= accuracy <= 1.0
    assert abs(accuracy * 359 - round(accuracy * 359)) < 1e-6
    rows = list(csv.DictReader((tmp_path / "progress.csv").open()))
    # power_rnn has no forget gate: no time-scale columns, and no crash
    assert not any(r.get("train/timescale_median") for r in rows)


@pytest.mark.parametrize("fraction", ["0", "0.0001"])
def test_a_valid_fraction_that_holds_out_nothing_trains_on_every_example(
    tmp_path: Path, capsys: pytest.CaptureFixture, fraction: str
) -> None:
    args = ["supervised", "experiments/configs/digits.yaml", f"task.valid_fraction={fraction}"]
    args += ["train.steps=2", "train.eval_every=1", "core.hidden_size=8", f"run.dir={tmp_path}"]
    assert main([*args, "train.progress=false", "run.tensorboard=false"]) == 0
    final = json.loads((tmp_path / "results.json").read_text())["final"]
    assert set(final) == {"test/loss", "test/accuracy"}  # no validation split to score
    assert "test/accuracy" in capsys.readouterr().out
    assert supervised.make_task("digits", valid_fraction=float(fraction)).size("valid") == 0


def test_diagnose_config_and_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "lag.png"
    code = main(
        ["diagnose", "experiments/configs/lag_profile.yaml"]
        + ["--cores", "leaky_rnn,power_rnn,lstm", "--batch", "16", "--out", str(out)]
    )
    assert code == 0 and out.is_file()
    rows = list(csv.DictReader(out.with_suffix(".csv").open()))
    grads = {}
    for r in rows:
        grads.setdefault(r["label"], {})[int(r["lag"])] = float(r["grad_norm"])
    assert set(grads) == {"leaky_rnn (init)", "power_rnn (init)", "lstm (init)"}
    assert len(grads["lstm (init)"]) == 64
    # exponential (leaky) vs polynomial (power-law) memory decay at initialisation
    leaky, power = grads["leaky_rnn (init)"], grads["power_rnn (init)"]
    assert leaky[63] / leaky[0] < 1e-8 < 1e-3 < power[63] / power[0]
    summary = capsys.readouterr().out.splitlines()
    lstm_line = next(line for line in summary if line.startswith("lstm (init)"))
    assert lstm_line.split()[-2:] == ["3.19", "3.19"]  # time-scale median and max at init
    # a trained run, before and after
    run = tmp_path / "run"
    supervised.train(_config(run, "train.steps=2", "train.eval_every=2"))
    out2 = tmp_path / "run.png"
    assert main(["diagnose", str(run), "--before-after", "--out", str(out2)]) == 0
    text = capsys.readouterr().out
    assert "lstm (init)" in text and "lstm (step 2)" in text and out2.is_file()
    assert main(["diagnose", str(tmp_path / "missing"), "--out", str(out2)]) == 2


def test_diagnose_train_mode_shows_h_detach(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # eval mode: h-detach is the LSTM; training mode with p = 1 cuts every h path into the
    # gates, so less gradient reaches the early inputs, and the mean over draws is reported
    out = tmp_path / "hd.png"
    args = ["diagnose", "experiments/configs/lag_profile.yaml", "--batch", "8", "--out", str(out)]
    profiles = {}
    for extra in ([], ["--train-draws", "2"]):
        assert main([*args, "--cores", "lstm,hdetach_lstm", "core.p=1.0", *extra]) == 0
        for r in csv.DictReader(out.with_suffix(".csv").open()):
            profiles.setdefault(r["label"], {})[int(r["lag"])] = float(r["grad_norm"])
    eval_lstm, eval_hd = profiles["lstm (init)"], profiles["hdetach_lstm (init)"]
    train_lstm = profiles["lstm (init), train mode x2"]
    train_hd = profiles["hdetach_lstm (init), train mode x2"]
    assert eval_hd == pytest.approx(eval_lstm) and train_lstm == pytest.approx(eval_lstm)
    assert train_hd[63] < 0.5 * eval_hd[63]
    assert main([*args, "--train-draws", "-1"]) == 2
    capsys.readouterr()


def test_init_from_starts_from_another_runs_weights(tmp_path: Path) -> None:
    source = tmp_path / "short"
    supervised.train(_config(source, "train.steps=4", "train.eval_every=4"))
    trained = load_checkpoint(source / "checkpoints/last.pt")["model"]
    # a longer task (a curriculum step) from those weights: init.pt holds them exactly
    run = tmp_path / "long"
    config = _config(run, "train.steps=2", "task.length=12", f"train.init_from={source}")
    supervised.train(config)
    start = load_checkpoint(run / "checkpoints/init.pt")["model"]
    for key, value in trained.items():
        torch.testing.assert_close(start[key], value, msg=key)
    assert load_checkpoint(run / "checkpoints/last.pt")["step"] == 2  # fresh step count


def test_init_from_errors_write_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="init_from.*not found"):
        supervised.train(_config(run, f"train.init_from={tmp_path / 'missing'}"))
    assert not run.exists()
    source = tmp_path / "small"
    supervised.train(_config(source, "train.steps=2", "train.eval_every=2"))
    with pytest.raises(ValueError, match="section 'core' differs"):
        supervised.train(_config(run, "core.hidden_size=9", f"train.init_from={source}"))
    assert not run.exists()
    with pytest.raises(ValueError, match="parameters of core 'lstm' do not fit core 'gru'"):
        supervised.train(_config(run, "core.name=gru", f"train.init_from={source}"))
    assert not run.exists()


def test_init_from_another_core_with_the_same_parameters(tmp_path: Path) -> None:
    # an LSTM's weights continued with h-detach: the same GatedLSTM parameters
    source = tmp_path / "lstm"
    supervised.train(_config(source, "core.name=lstm", "train.steps=2", "train.eval_every=2"))
    run = tmp_path / "hdetach"
    supervised.train(
        _config(run, "core.name=hdetach_lstm", "train.steps=2", f"train.init_from={source}")
    )
    start = load_checkpoint(run / "checkpoints/init.pt")["model"]
    for key, value in load_checkpoint(source / "checkpoints/last.pt")["model"].items():
        torch.testing.assert_close(start[key], value, msg=key)


def test_diagnose_prints_saturated_time_scales_as_powers_of_ten() -> None:
    from memcores.experiments.commands.diagnose import _power_of_ten

    assert _power_of_ten(math.log10(3.19)) == "3.19"
    assert _power_of_ten(4783.2) == "1e+4783"  # a fast-gate unit at the clamp: beyond float64
