"""Sweeps on the Ray Tune engine: retries, early stopping, restore after a killed driver.

One local Ray instance serves the whole module (Ray's start-up is the slow part); the trials
are real tiny ``memcores supervised`` runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memcores.experiments.cli import main
from memcores.experiments.sweep import SweepOptions, make_trials, parse_grid, run_sweep, summarize
from memcores.experiments.trials import trainable
from tests.test_sweep import TINY_RL

ray = pytest.importorskip("ray")
# Ray's start-up alone takes 20 s to minutes on a busy 2-core machine: run with `-m slow`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[1]
DEMO_COPY = REPO / "experiments" / "configs" / "demo_copy.yaml"
TINY = [
    "train.steps=20",
    "train.eval_every=10",
    "train.eval_size=32",
    "core.hidden_size=8",
    "train.progress=false",
    "run.tensorboard=false",
]


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def flaky(config: dict) -> None:
    """A trial that fails its first attempt (seed 0) or every attempt (seed 1)."""
    trial = config["trial"]
    marker = Path(trial["run_dir"] + ".attempts")
    attempts = int(marker.read_text()) if marker.is_file() else 0
    marker.write_text(str(attempts + 1))
    if trial["assignment"]["train.seed"] == "1" or attempts == 0:
        raise RuntimeError(f"flaky trial, attempt {attempts + 1}")
    trainable(config)


def broken_member(config: dict) -> None:
    """A PBT member (seed=1) that fails for good when it continues from a checkpoint, as one
    whose restore cannot load the weights it copied; the other members are fine."""
    from ray import tune

    from memcores.experiments.pbt import pbt_trainable

    if tune.get_context().get_trial_name() == "seed=1" and tune.get_checkpoint() is not None:
        raise RuntimeError("member seed=1 cannot load its checkpoint")
    pbt_trainable(config)


def test_failed_trials_are_retried_then_reported(tmp_path):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers get `flaky`
    _, trials = make_trials(
        DEMO_COPY,
        parse_grid(["train.seed=0,1"]),
        tmp_path / "s",
        overrides=TINY,
        results_dir=tmp_path / "results",
    )
    options = SweepOptions(backend="ray", max_concurrent=2, max_failures=1)
    lines: list[str] = []
    results = run_sweep(trials, tmp_path / "s", options, echo=lines.append, trial_fn=flaky)
    assert [r.status for r in results] == ["ok", "failed"]
    assert "flaky trial, attempt 2" in results[1].message  # retried once, then reported
    assert (tmp_path / "s" / "seed=0.attempts").read_text() == "2"
    assert (tmp_path / "s" / "seed=1.attempts").read_text() == "2"
    assert (tmp_path / "results" / "seed=0" / "record.json").is_file()
    assert not (tmp_path / "results" / "seed=1").exists()
    assert "1 retries" in lines[0] and "FAILED seed=1: " in summarize(results)
    trial = json.loads((tmp_path / "s" / "seed=1" / "trial.json").read_text())
    assert trial["status"] == "failed"
    assert (tmp_path / "s" / ".tune").is_dir()  # Tune's own state stays in the sweep folder


def test_asha_stops_a_clearly_bad_trial_early(tmp_path, capsys):
    """A learning rate of 1e-6 cannot lower the loss: ASHA stops that trial at its first rung
    and lets the good one (run first) use its whole budget."""
    args = ["sweep", str(DEMO_COPY), "--grid", "optim.lr=0.01,0.000001", "--out"]
    args += [str(tmp_path / "s"), "--results", str(tmp_path / "r"), "--scheduler", "asha"]
    args += ["--metric", "eval/loss", "--mode", "min", "--grace-period", "20"]
    args += ["train.steps=80", "train.eval_every=20", "train.log_every=20"]
    args += TINY[2:]
    assert main(args) == 0
    trials = {
        p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "s").glob("*/trial.json")
    }
    assert trials["lr=0.01"]["status"] == "ok" and trials["lr=0.01"]["step"] == 80
    assert trials["lr=0.000001"]["status"] == "stopped"
    assert trials["lr=0.000001"]["step"] < 80
    # the stopped trial has a record too (so a re-run skips it), marked as stopped early
    record = json.loads((tmp_path / "r" / "lr=0.000001" / "record.json").read_text())
    assert record["stopped_early"] is True and record["updates"] < 80
    assert "summary: 1 ok, 1 stopped" in capsys.readouterr().out


def test_rerun_restores_the_sweep_of_a_killed_driver(tmp_path, ray_session, capsys):
    """The driver is SIGKILLed mid-trial; the same command restores Tune's experiment and the
    trial continues from its checkpoint (its init.pt is not rewritten)."""
    out = tmp_path / "s"
    args = ["sweep", str(DEMO_COPY), "--out", str(out), "--results", str(tmp_path / "r")]
    args += ["--address", ray_session, "train.steps=100", "train.eval_every=25"]
    args += TINY[2:]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(
        [sys.executable, "-m", "memcores", *args], env=env, stderr=subprocess.PIPE
    )
    run = out / "trial"
    deadline = time.time() + 180
    while not (run / "checkpoints/last.pt").is_file() or not list(
        (out / ".tune").glob("experiment_state*")
    ):
        assert time.time() < deadline and driver.poll() is None, driver.stderr.read()
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    init = (run / "checkpoints/init.pt").stat().st_mtime_ns
    time.sleep(2)  # Ray ends the dead driver's trial
    assert main(args) == 0
    assert "restoring the Tune experiment" in capsys.readouterr().out
    assert (run / "checkpoints/init.pt").stat().st_mtime_ns == init
    assert json.loads((run / "results.json").read_text())["step"] == 100
    assert (tmp_path / "r" / "trial" / "record.json").is_file()


def test_a_request_no_node_can_meet_stops_before_anything_is_written(tmp_path, ray_session, capsys):
    """3 CPUs per trial on a 2-CPU cluster: an error up front, not a trial pending for ever."""
    out = tmp_path / "s"
    args = ["sweep", str(DEMO_COPY), "--out", str(out), "--address", ray_session]
    assert main([*args, "--threads-per-trial", "3", *TINY]) == 2
    err = capsys.readouterr().err
    assert "no node of the Ray cluster can run a trial: it needs 3 CPU" in err
    assert err.count("\n") == 1 and not out.exists()


def test_random_search_runs_every_point_on_the_same_seeds(tmp_path, ray_session, capsys):
    import yaml

    config = tmp_path / "search_copy.yaml"
    raw = yaml.safe_load(DEMO_COPY.read_text())
    config.write_text(yaml.safe_dump({**raw, "search": {"optim.lr": {"loguniform": [1e-3, 1e-2]}}}))
    args = ["sweep", str(config), "--search", "random", "--samples", "2", "--grid"]
    args += ["train.seed=0,1", "--metric", "eval/accuracy", "--address", ray_session]
    args += ["--out", str(tmp_path / "s"), "--results", str(tmp_path / "r"), *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[1/2] lr=" in out and "[2/2] lr=" in out and "best point: lr=" in out
    records = [json.loads(p.read_text()) for p in (tmp_path / "r").glob("*/record.json")]
    points: dict[str, set] = {}
    for record in records:
        point, seed = record["trial"].rsplit(",", 1)
        points.setdefault(point, set()).add(seed)
        assert record["node"]
    assert len(points) == 2 and all(s == {"seed=0", "seed=1"} for s in points.values())
    sweep = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sweep["best"] in points and sweep["state"] == "done"


def test_pbt_members_run_and_record_their_schedules(tmp_path, ray_session):
    """Two tiny RL members, perturbed every update: both finish with a record whose
    schedule starts at frame 0, and the checkpoints PBT may clone are kept."""
    import yaml

    raw = yaml.safe_load((REPO / "experiments" / "configs" / "search_doorkey5.yaml").read_text())
    raw["search"]["agent.n_epochs"] = {"choice": [1, 2]}  # mutated within its list
    doorkey = tmp_path / "pbt.yaml"
    doorkey.write_text(yaml.safe_dump(raw))
    args = ["sweep", str(doorkey), "--scheduler", "pbt", "--grid", "train.seed=0,1"]
    args += ["--perturbation-interval", "32", "--metric", "rollout/ep_len_mean", "--mode"]
    args += ["min", "--address", ray_session, "--out", str(tmp_path / "s"), "--results"]
    args += [str(tmp_path / "r"), "env.n_envs=2", "agent.n_steps=16", "agent.seq_len=8"]
    args += ["agent.minibatch_size=16", "agent.n_epochs=1", "core.hidden_size=8"]
    args += ["train.total_steps=128", "train.checkpoint_every=1", "run.tensorboard=false"]
    assert main(args) == 0
    for seed in (0, 1):
        record = json.loads((tmp_path / "r" / f"seed={seed}" / "record.json").read_text())
        schedule = record["pbt_schedule"]
        assert schedule[0]["step"] == 0 and record["frames"] == 128
        assert set(schedule[0]["values"]) == {
            "agent.learning_rate",
            "agent.ent_coef",
            "agent.n_epochs",
        }
        assert all(entry["values"]["agent.n_epochs"] in (1, 2) for entry in schedule)
    # a checkpoint per interval is kept for PBT to clone (a grid keeps only the last)
    assert len(list((tmp_path / "s" / ".tune" / "seed=0").glob("checkpoint_*"))) >= 2


@pytest.mark.timeout(300)
def test_a_member_that_fails_ends_the_pbt_population(tmp_path, ray_session, capsys):
    """Tune's synchronous PBT waits for every member at each perturbation; one that failed
    for good would keep the others paused for ever. The population ends instead, and the
    failed member's error is named."""
    from ray import cloudpickle

    from memcores.experiments.config import read_yaml_mapping
    from memcores.experiments.search import parse_search

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers get the member
    doorkey = REPO / "experiments" / "configs" / "search_doorkey5.yaml"
    _, trials = make_trials(
        doorkey,
        parse_grid(["train.seed=0,1"]),
        tmp_path / "s",
        overrides=[*TINY_RL, "train.total_steps=128"],
        results_dir=tmp_path / "r",
    )
    space = parse_search(read_yaml_mapping(doorkey)["search"])
    options = SweepOptions(
        backend="ray",
        cpus=2,  # one member at a time on the 2-CPU instance: seed=0 waits at 64 frames
        scheduler="pbt",
        metric="rollout/ep_len_mean",
        mode="min",
        perturbation_interval=32,
    )
    lines: list[str] = []
    results = run_sweep(
        trials, tmp_path / "s", options, echo=lines.append, trial_fn=broken_member, space=space
    )
    status = {r.name: r for r in results}
    assert status["seed=1"].status == "failed"
    assert "member seed=1 cannot load its checkpoint" in status["seed=1"].message
    assert status["seed=0"].status == "cancelled"
    assert "because member seed=1 failed" in status["seed=0"].message
    assert not (tmp_path / "r" / "seed=0").exists()  # no record: a re-run resumes it
    summary = summarize(results)
    assert "FAILED seed=1: RuntimeError: member seed=1 cannot load its checkpoint" in summary
    sweep = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert sweep["state"] == "done" and sweep["results"]["seed=1"]["status"] == "failed"
