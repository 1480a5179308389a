"""Sweeps: grid expansion, local and Ray backends, failure reporting, skipping finished trials.

Most tests run a tiny stand-in trial (a Python script written below, started through
``--command-template``) so they take a fraction of a second per trial; one test runs real
``memcores supervised`` trials when that command exists.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from experiments.cli import main
from experiments.sweep import (
    DEFAULT_TEMPLATE,
    SweepError,
    build_argv,
    expand_grid,
    infer_command,
    make_trials,
    parse_grid,
    run_sweep,
    trial_name,
)

# A stand-in for `memcores train`: writes config.yaml and progress.csv into run.dir like a real
# run, and misbehaves on request (fake.fail=1 exits 3, fake.kill=1 SIGKILLs itself).
FAKE_TRIAL = textwrap.dedent(
    """
    import os, signal, sys, time, yaml
    resume = "--resume" in sys.argv
    argv = [a for a in sys.argv if a != "--resume"]
    command, config_path, overrides = argv[1], argv[2], argv[3:]
    config = yaml.safe_load(open(config_path)) or {}
    for item in overrides:
        key, _, value = item.partition("=")
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    run_dir = config["run"]["dir"]
    os.makedirs(run_dir, exist_ok=True)
    fake = config.get("fake", {})
    with open(os.path.join(run_dir, "calls.txt"), "a") as handle:
        handle.write(command + (" resumed" if resume else "") + "\\n")
    if fake.get("checkpoint") and not resume:
        open(os.path.join(run_dir, "last.pt"), "w").close()
        sys.exit(4)  # dies after its first checkpoint
    print("starting", command, run_dir, flush=True)
    with open(os.path.join(run_dir, "pid"), "w") as handle:
        handle.write(str(os.getpid()))
    if fake.get("sleep"):
        time.sleep(float(fake["sleep"]))
    if fake.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fake.get("fail"):
        print("boom: the trial failed on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    with open(os.path.join(run_dir, "config.yaml"), "w") as handle:
        yaml.safe_dump(config, handle)
    seed = int(config.get("train", {}).get("seed", 0))
    with open(os.path.join(run_dir, "progress.csv"), "w") as handle:
        handle.write("step,eval/accuracy\\n")
        for step in range(1, 4):
            handle.write(f"{step * 10},{0.2 * step + 0.01 * seed}\\n")
    """
)


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "fake_trial.py"
    script.write_text(FAKE_TRIAL)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"task": {"name": "copy"}, "core": {"name": "lstm"}}))
    template = f"{{python}} {script} {{command}} {{config}} {{overrides}}"
    return {"config": str(config), "template": template, "out": str(tmp_path / "sweep")}


def sweep_cli(fake: dict[str, str], *extra: str) -> int:
    return main(
        [
            "sweep",
            fake["config"],
            "--grid",
            "core.name=lstm,ur_lstm",
            "--grid",
            "train.seed=0,1",
            "--out",
            fake["out"],
            "--command-template",
            fake["template"],
            *extra,
        ]
    )


def trial_records(out: str) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text()) for p in sorted(Path(out).glob("*/trial.json"))
    }


# --------------------------------------------------------------------------- pure functions


def test_grid_expands_to_cartesian_product_in_order():
    grid = parse_grid(["core.name=lstm,ur_lstm,fast_lstm", "train.seed=0,1"])
    points = expand_grid(grid)
    assert len(points) == 6
    assert points[0] == {"core.name": "lstm", "train.seed": "0"}
    assert points[1] == {"core.name": "lstm", "train.seed": "1"}
    assert points[-1] == {"core.name": "fast_lstm", "train.seed": "1"}
    assert trial_name(points[1]) == "name=lstm,seed=1"
    # keys sharing their last part keep the full key so names stay distinct
    assert trial_name({"a.x": "1", "b.x": "2"}) == "a.x=1,b.x=2"
    assert trial_name({"env.id": "MiniGrid/Door Key"}) == "id=MiniGrid-Door-Key"


@pytest.mark.parametrize(
    "bad",
    ["core.name", "=lstm", "core.name=", "core.name=lstm,,gru", "run.dir=a,b", "core name=a"],
)
def test_bad_grid_is_rejected(bad):
    with pytest.raises(SweepError):
        parse_grid([bad])


def test_duplicate_grid_key_is_rejected():
    with pytest.raises(SweepError, match="twice"):
        parse_grid(["train.seed=0", "train.seed=1"])


def test_command_is_inferred_from_config_sections():
    assert infer_command({"task": {"name": "copy"}}) == "supervised"
    assert infer_command({"suite": "doorkey"}) == "transfer"
    assert infer_command({"env": {"id": "x"}, "core": {}}) == "train"


def test_build_argv_expands_lists_and_checks_placeholders():
    words = {"python": "py", "command": "train", "config": "c.yaml"}
    argv = build_argv(DEFAULT_TEMPLATE, {"overrides": ["a=1", "b=2"]}, words)
    assert argv == ["py", "-m", "experiments.cli", "train", "c.yaml", "a=1", "b=2"]
    with pytest.raises(SweepError, match="placeholder"):
        build_argv("{python} {nope} {overrides}", {"overrides": []}, words)
    with pytest.raises(SweepError, match="overrides"):
        build_argv("{python} {config}", {"overrides": []}, words)


def test_transfer_trials_take_suite_and_episodes_out_of_the_config(tmp_path):
    config = tmp_path / "transfer_sweep.yaml"
    config.write_text(
        yaml.safe_dump({"suite": "memory", "episodes": 5, "env": {"n_envs": 2}, "core": {}})
    )
    out = tmp_path / "sweep"
    command, trials = make_trials(config, parse_grid(["core.name=lstm,gru"]), out)
    assert command == "transfer"
    rl_config = str(out.resolve() / "transfer_config.yaml")
    assert trials[1].argv[1:] == [
        "-m",
        "experiments.cli",
        "transfer",
        "memory",
        "core.name=gru",
        "--config",
        rl_config,
        "--out",
        str(out.resolve() / "name=gru"),
        "--episodes",
        "5",
    ]
    # the RL config handed to --config is the sweep config minus the transfer arguments
    assert yaml.safe_load(trials[0].files[rl_config]) == {"env": {"n_envs": 2}, "core": {}}
    assert not out.exists()
    # transfer arguments can be overridden on the command line like config keys
    _, trials = make_trials(config, [], out, overrides=["episodes=7", "argmax=true"])
    assert trials[0].argv[-3:] == ["--episodes", "7", "--argmax"]
    assert not any(a.startswith("episodes=") for a in trials[0].argv)
    _, trials = make_trials(config, parse_grid(["suite=memory,doorkey"]), out)
    assert [t.suite for t in trials] == ["memory", "doorkey"]
    with pytest.raises(SweepError, match="episodes"):
        make_trials(config, parse_grid(["episodes=1,2"]), out)
    with pytest.raises(SweepError, match="transfer sweeps"):
        make_trials(config, parse_grid(["suite=a,b"]), out, command="train")


def test_transfer_sweep_validates_suite_and_keys(tmp_path):
    from experiments.config import ConfigError
    from experiments.sweep import validate_trials

    config = tmp_path / "t.yaml"
    config.write_text(yaml.safe_dump({"suite": "memory", "core": {"name": "lstm"}}))
    _, trials = make_trials(config, parse_grid(["suite=memory,nosuch"]), tmp_path / "s")
    with pytest.raises(ConfigError, match="unknown suite 'nosuch'; valid: .*memory"):
        validate_trials("transfer", trials)
    _, trials = make_trials(config, parse_grid(["agent.algo=ppo,dqn"]), tmp_path / "s")
    with pytest.raises(ConfigError, match="agent.algo"):
        validate_trials("transfer", trials)
    _, trials = make_trials(config, parse_grid(["core.name=lstm,gru"]), tmp_path / "s")
    assert validate_trials("transfer", trials)
    assert not (tmp_path / "s").exists()


def test_make_trials_validates_before_writing(tmp_path, fake):
    out = tmp_path / "never"
    with pytest.raises(SweepError, match="unknown trial command"):
        make_trials(fake["config"], [], out, command="dance")
    with pytest.raises(SweepError, match="run.dir"):
        make_trials(fake["config"], [], out, overrides=["run.dir=x"])
    with pytest.raises(SweepError, match="also appear in --grid"):
        make_trials(fake["config"], parse_grid(["train.seed=0,1"]), out, overrides=["train.seed=3"])
    with pytest.raises(ValueError, match="not found"):
        make_trials(tmp_path / "missing.yaml", [], out)
    assert not out.exists()
    command, trials = make_trials(fake["config"], parse_grid(["train.seed=0,1"]), out)
    assert command == "supervised"
    assert [t.name for t in trials] == ["seed=0", "seed=1"]
    assert trials[0].argv[-2:] == ["train.seed=0", f"run.dir={out.resolve() / 'seed=0'}"]
    assert trials[0].argv[1:4] == ["-m", "experiments.cli", "supervised"]
    _, trials = make_trials(fake["config"], [], out, threads_per_trial=3, gpus_per_trial=0.5)
    assert (trials[0].cpus, trials[0].gpus) == (3, 0.5)  # what Ray reserves per trial
    assert all(v == "3" for v in trials[0].env.values())  # OMP/MKL threads unless set already
    assert not out.exists()


def test_cli_errors_are_one_line_and_write_nothing(fake, capsys):
    assert sweep_cli(fake, "--grid", "train.seed=5") == 2
    assert "given twice" in capsys.readouterr().err
    assert not Path(fake["out"]).exists()


def test_dry_run_prints_commands(fake, capsys):
    assert sweep_cli(fake, "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.count("fake_trial.py supervised") == 4
    assert not Path(fake["out"]).exists()


# --------------------------------------------------------------------------- local backend


def test_local_sweep_runs_grid_reports_failures_and_skips_finished(fake, capsys):
    # One trial is SIGKILLed and one exits with an error: both are reported, the rest finish.
    assert sweep_cli(fake, "--backend", "local", "--max-concurrent", "2") == 0
    records = trial_records(fake["out"])
    assert sorted(records) == [
        "name=lstm,seed=0",
        "name=lstm,seed=1",
        "name=ur_lstm,seed=0",
        "name=ur_lstm,seed=1",
    ]
    assert all(r["status"] == "ok" for r in records.values())
    run = Path(fake["out"]) / "name=ur_lstm,seed=1"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["core"]["name"] == "ur_lstm" and saved["train"]["seed"] == 1
    assert saved["run"]["dir"] == str(run.resolve())
    out = capsys.readouterr().out
    assert "local processes, 2 at a time" in out and "summary: 4 ok" in out

    # Same sweep again: everything is skipped, no trial process starts.
    assert sweep_cli(fake, "--backend", "local") == 0
    assert "4 finished earlier (skipped), 0 to run" in capsys.readouterr().out
    assert (run / "calls.txt").read_text().count("supervised") == 1


def test_failed_and_killed_trials_are_reported_and_rerun(fake, tmp_path, capsys):
    config = Path(fake["config"])
    data = yaml.safe_load(config.read_text())
    args = ["--grid", "fake.kill=0,1", "--grid", "fake.fail=0,1"]
    code = main(
        ["sweep", str(config), *args, "--out", fake["out"], "--command-template", fake["template"]]
        + ["--backend", "local"]
    )
    assert code == 1
    records = trial_records(fake["out"])
    assert records["kill=0,fail=0"]["status"] == "ok"
    assert records["kill=0,fail=1"]["status"] == "failed"
    assert records["kill=0,fail=1"]["returncode"] == 3
    assert "boom: the trial failed on purpose" in records["kill=0,fail=1"]["message"]
    assert records["kill=1,fail=0"]["status"] == "killed"
    assert "SIGKILL" in records["kill=1,fail=0"]["message"]
    out = capsys.readouterr().out
    assert "FAILED kill=0,fail=1: exit code 3" in out
    assert "FAILED kill=1,fail=0: killed by SIGKILL" in out
    assert "summary: 1 ok, 1 failed, 2 killed" in out

    # A re-run retries only the three unfinished trials (and they fail the same way).
    assert data  # the config itself is unchanged
    code = main(
        ["sweep", str(config), *args, "--out", fake["out"], "--command-template", fake["template"]]
        + ["--backend", "local"]
    )
    assert code == 1
    assert "1 finished earlier (skipped), 3 to run" in capsys.readouterr().out
    calls = Path(fake["out"]) / "kill=0,fail=0" / "calls.txt"
    assert calls.read_text().count("supervised") == 1


def test_resume_continues_unfinished_trials_instead_of_restarting(fake, capsys):
    args = ["sweep", fake["config"], "--grid", "fake.checkpoint=0,1", "--out", fake["out"]]
    args += ["--command-template", fake["template"], "--backend", "local"]
    assert main(args) == 1  # checkpoint=1 dies after writing a checkpoint
    crashed = Path(fake["out"]) / "checkpoint=1"
    assert (crashed / "last.pt").is_file()
    # without --resume the folder would be wiped; with it the trial continues in place
    assert main([*args, "--resume"]) == 0
    assert (crashed / "calls.txt").read_text().splitlines() == ["supervised", "supervised resumed"]
    record = json.loads((crashed / "trial.json").read_text())
    assert record["status"] == "ok" and record["resumed"] is True
    log = (Path(fake["out"]) / "logs" / "checkpoint=1.log").read_text()
    commands = [line for line in log.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2 and commands[1].endswith("--resume")  # both attempts logged
    # the finished trial is skipped afterwards, with or without --resume
    assert main([*args, "--resume"]) == 0
    assert "2 finished earlier (skipped), 0 to run" in capsys.readouterr().out


def test_timeout_kills_a_hanging_trial(fake, capsys):
    code = main(
        ["sweep", fake["config"], "--grid", "fake.sleep=0,30", "--out", fake["out"]]
        + ["--command-template", fake["template"], "--backend", "local", "--trial-timeout", "3"]
    )
    assert code == 1
    records = trial_records(fake["out"])
    assert records["sleep=0"]["status"] == "ok"
    assert records["sleep=30"]["status"] == "timeout"


def test_sigterm_stops_the_sweep_and_its_running_trials(fake):
    """`kill SWEEP_PID` must not leave trials running as orphans."""
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "experiments.cli", "sweep", fake["config"]]
    argv += ["--grid", "fake.sleep=60", "--out", fake["out"], "--backend", "local"]
    argv += ["--command-template", fake["template"]]
    sweep = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = Path(fake["out"]) / "sleep=60" / "pid"
    deadline = time.time() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.time() < deadline and sweep.poll() is None
        time.sleep(0.1)
    trial_pid = int(pid_file.read_text())
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=30) != 0
    with pytest.raises(ProcessLookupError):  # the trial is gone (killed and reaped)
        os.kill(trial_pid, 0)


def test_finished_trial_with_other_settings_is_not_silently_reused(fake, capsys):
    assert sweep_cli(fake, "--backend", "local") == 0
    # same trial names, different base override: refuse instead of mixing two experiments
    assert sweep_cli(fake, "--backend", "local", "fake.extra=1") == 2
    records = trial_records(fake["out"])
    assert all(
        r["status"] == "ok" and "fake.extra=1" not in r["overrides"] for r in records.values()
    )


def test_without_ray_auto_falls_back_to_local_and_says_so(fake, monkeypatch, capsys):
    import experiments.sweep as sweep

    monkeypatch.setattr(sweep, "ray_available", lambda: False)
    _, trials = make_trials(
        fake["config"], parse_grid(["train.seed=0,1"]), fake["out"], template=fake["template"]
    )
    results = run_sweep(trials, fake["out"], backend="auto")
    assert [r.status for r in results] == ["ok", "ok"]
    assert "Ray not installed" in capsys.readouterr().out
    with pytest.raises(SweepError, match="memcores\\[ray\\]"):
        run_sweep(trials, fake["out"], backend="ray")


# --------------------------------------------------------------------------- Ray backend


def test_ray_sweep_runs_grid_locally_and_reports_killed_trial(fake, capsys):
    pytest.importorskip("ray.tune")
    # 2x2 grid under Ray Tune (a private local Ray with 2 CPUs); one trial is SIGKILLed.
    code = main(
        ["sweep", fake["config"], "--grid", "core.name=lstm,ur_lstm", "--grid", "fake.kill=0,1"]
        + ["--out", fake["out"], "--command-template", fake["template"]]
        + ["--backend", "ray", "--max-concurrent", "2"]
    )
    assert code == 1
    records = trial_records(fake["out"])
    assert {k: r["status"] for k, r in records.items()} == {
        "name=lstm,kill=0": "ok",
        "name=lstm,kill=1": "killed",
        "name=ur_lstm,kill=0": "ok",
        "name=ur_lstm,kill=1": "killed",
    }
    out = capsys.readouterr().out
    assert "Ray Tune (2 at a time)" in out
    assert "FAILED name=lstm,kill=1: killed by SIGKILL" in out
    # Tune's own state stays in the sweep folder, not in the working directory
    assert (Path(fake["out"]) / ".ray").is_dir()


def test_unreachable_ray_address_fails_fast_and_writes_nothing(fake, capsys):
    pytest.importorskip("ray")
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert sweep_cli(fake, "--address", f"127.0.0.1:{port}") == 2
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert not Path(fake["out"]).exists()


# --------------------------------------------------------------------------- real trials


REPO = Path(__file__).parents[1]
DEMO_COPY = REPO / "experiments" / "configs" / "demo_copy.yaml"
# Overrides that make the demo copy task finish in well under a second of training.
TINY_COPY = (
    "train.steps=20",
    "train.eval_every=10",
    "train.eval_size=64",
    "core.hidden_size=16",
    "run.progress_bar=false",
)


def _needs_supervised() -> None:
    assert (REPO / "experiments" / "commands" / "supervised.py").is_file()
    assert DEMO_COPY.is_file()


def test_real_config_is_validated_before_anything_is_written(tmp_path, capsys):
    _needs_supervised()
    out = tmp_path / "sweep"
    args = ["sweep", str(DEMO_COPY), "--out", str(out), "--backend", "local"]
    assert main([*args, "--grid", "core.name=lstm,nope"]) == 2
    assert "unknown core 'nope'; valid: lstm" in capsys.readouterr().err
    assert main([*args, "--grid", "train.seedz=0,1"]) == 2
    assert "unknown config key 'train.seedz'" in capsys.readouterr().err
    assert not out.exists()


def test_real_supervised_sweep_then_plot_and_report(tmp_path, capsys):
    """End to end on a real `memcores supervised` trial: sweep, plot the curves, report.
    (One trial: each real one costs a torch start-up; aggregation over seeds and cores is
    tested on real event files in test_plot.py and test_report.py.)"""
    _needs_supervised()
    out = tmp_path / "sweep"
    code = main(
        ["sweep", str(DEMO_COPY), "--grid", "core.name=ur_lstm", "--out", str(out)]
        + ["--backend", "local", *TINY_COPY]
    )
    assert code == 0, capsys.readouterr()
    for core in ("ur_lstm",):
        run = out / f"name={core}"
        assert json.loads((run / "trial.json").read_text())["status"] == "ok"
        saved = yaml.safe_load((run / "config.yaml").read_text())
        assert saved["core"]["name"] == core and saved["train"]["steps"] == 20
        assert list(run.glob("events.out.tfevents.*")) and (run / "progress.csv").is_file()
    png = tmp_path / "curves.png"
    assert main(["plot", str(out), "--metric", "eval/accuracy", "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    report = tmp_path / "report.md"
    assert main(["report", str(out), "--out", str(report)]) == 0
    text = report.read_text()
    assert "## eval/accuracy" in text and "| copy | ur_lstm | 1 |" in text
    assert (tmp_path / "report_eval_accuracy.png").is_file()
