"""Sweeps: grid expansion, up-front validation, trials run in-process, records and skipping.

The tests here use the no-Ray path (the same trial function, called in a loop) on real tiny
``memcores supervised`` trials; tests/test_sweep_ray.py runs the Ray Tune engine.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError
from memcores.experiments.sweep import (
    SweepError,
    expand_grid,
    infer_command,
    make_trials,
    parse_grid,
    trial_name,
)
from memcores.experiments.trials import Trial, validate_trials

REPO = Path(__file__).parents[1]
DEMO_COPY = REPO / "experiments" / "configs" / "demo_copy.yaml"
# Overrides that make the demo copy task finish in well under a second of training.
TINY_COPY = (
    "train.steps=20",
    "train.eval_every=10",
    "train.eval_size=64",
    "core.hidden_size=16",
    "train.progress=false",
    "run.tensorboard=false",
)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    return {"out": str(tmp_path / "sweep"), "results": str(tmp_path / "results")}


def sweep_cli(paths: dict[str, str], *extra: str) -> int:
    return main(
        ["sweep", str(DEMO_COPY), "--out", paths["out"], "--results", paths["results"]]
        + ["--backend", "local", *TINY_COPY, *extra]
    )


def trial_files(out: str) -> dict[str, dict]:
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


def test_transfer_trials_take_suite_and_episodes_out_of_the_config(tmp_path):
    config = tmp_path / "transfer_sweep.yaml"
    config.write_text(
        yaml.safe_dump({"suite": "memory", "episodes": 5, "env": {"n_envs": 2}, "core": {}})
    )
    out = tmp_path / "sweep"
    command, trials = make_trials(config, parse_grid(["core.name=lstm,gru"]), out)
    assert command == "transfer"
    assert trials[1].transfer == {"suite": "memory", "episodes": 5, "argmax": False}
    assert trials[1].overrides == ["core.name=gru"]  # each env pair sets its own run.dir
    assert trials[1].cli().split()[:5] == [
        "memcores",
        "transfer",
        "memory",
        "core.name=gru",
        "--config",
    ]
    assert trials[1].cli().endswith(f"--out {out.resolve() / 'name=gru'} --episodes 5")
    assert trials[1].record_dir == str(Path("results/sweep/name=gru").resolve())
    assert not out.exists()
    # transfer arguments can be overridden on the command line like config keys
    _, trials = make_trials(config, [], out, overrides=["episodes=7", "argmax=true"])
    assert trials[0].transfer == {"suite": "memory", "episodes": 7, "argmax": True}
    assert trials[0].cli().endswith("--episodes 7 --argmax") and trials[0].overrides == []
    _, trials = make_trials(config, parse_grid(["suite=memory,doorkey"]), out)
    assert [t.transfer["suite"] for t in trials] == ["memory", "doorkey"]
    with pytest.raises(SweepError, match="episodes"):
        make_trials(config, parse_grid(["episodes=1,2"]), out)
    with pytest.raises(SweepError, match="transfer sweeps"):
        make_trials(config, parse_grid(["suite=a,b"]), out, command="train")


def test_transfer_sweep_validates_suite_and_keys(tmp_path):
    config = tmp_path / "t.yaml"
    config.write_text(yaml.safe_dump({"suite": "memory", "core": {"name": "lstm"}}))
    _, trials = make_trials(config, parse_grid(["suite=memory,nosuch"]), tmp_path / "s")
    with pytest.raises(ConfigError, match="unknown suite 'nosuch'; valid: .*memory"):
        validate_trials(trials)
    _, trials = make_trials(config, parse_grid(["agent.algo=ppo,dqn"]), tmp_path / "s")
    with pytest.raises(ConfigError, match="agent.algo"):
        validate_trials(trials)
    _, trials = make_trials(config, parse_grid(["core.name=lstm,gru"]), tmp_path / "s")
    validate_trials(trials)
    assert not (tmp_path / "s").exists()


def test_transfer_sweep_pair_overrides(tmp_path):
    """A pair override reaches that pair's config only; ``@ENV`` resolves inside the trial."""
    from memcores.experiments.trials import _pair_overrides, trial_config

    active, passive = "memcores/ActiveVisualMatch-v0", "memcores/PassiveVisualMatch-v0"
    spec = {active: {"train.init_from": f"@{passive}", "agent.learning_rate": 0.0002}}
    raw = {"suite": "memory-match-delay", "pair_overrides": spec, "core": {"name": "lstm"}}
    config = tmp_path / "t.yaml"
    config.write_text(yaml.safe_dump(raw))
    _, trials = make_trials(config, parse_grid(["train.seed=0,1"]), tmp_path / "s")
    validate_trials(trials)
    trial = trials[1]
    assert trial.transfer["pair_overrides"] == spec
    per_pair = _pair_overrides(trial)
    first = trial_config(trial, tmp_path, passive, per_pair[passive])
    second = trial_config(trial, tmp_path, active, per_pair[active])
    assert first.train.init_from is None and second.agent.learning_rate == 0.0002
    assert second.train.init_from == str(Path(trial.run_dir) / "PassiveVisualMatch")
    # a wrong pair key or value is caught before anything runs, naming the trial
    raw["pair_overrides"] = {active: {"agent.learning_rate": "fast"}}
    config.write_text(yaml.safe_dump(raw))
    _, trials = make_trials(config, [], tmp_path / "s")
    with pytest.raises(ConfigError, match="agent.learning_rate"):
        validate_trials(trials)
    # an entry for another suite's row is left out; one for no suite's row is an error
    raw["pair_overrides"] = {"MiniGrid-MemoryS7-v0": {"agent.learning_rate": 0.1}}
    config.write_text(yaml.safe_dump(raw))
    _, trials = make_trials(config, [], tmp_path / "s")
    validate_trials(trials)
    assert _pair_overrides(trials[0]) == {passive: [], active: []}
    raw["pair_overrides"] = {"MiniGrid-Empty-5x5-v0": {"agent.learning_rate": 0.1}}
    config.write_text(yaml.safe_dump(raw))
    _, trials = make_trials(config, [], tmp_path / "s")
    with pytest.raises(ConfigError, match="not a train env of suite memory-match-delay"):
        validate_trials(trials)
    assert not (tmp_path / "s").exists()


def test_transfer_trial_records_each_pair_and_trains_each_env_once(tmp_path, monkeypatch):
    """A suite that tests one train env on two envs trains it once and writes one record per
    pair; the curriculum pair starts from the earlier pair's run of the same trial."""
    from rl_helpers import TINY

    from memcores.envs import suites
    from memcores.experiments.config import parse_override, set_dotted
    from memcores.experiments.trials import record_dirs, run_trial, trial_done

    e5, e6, e8 = (f"MiniGrid-Empty-{n}x{n}-v0" for n in (5, 6, 8))
    suite = type(suites.SUITES["doorkey"])("t", ((e5, e6), (e6, e8), (e5, e8)))
    monkeypatch.setitem(suites.SUITES, "three-test", suite)
    raw: dict = {"suite": "three-test", "episodes": 2}
    raw["pair_overrides"] = {e6: {"train.init_from": f"@{e5}"}}
    for item in [*TINY, "train.total_steps=64"]:
        set_dotted(raw, *parse_override(item))
    config = tmp_path / "t.yaml"
    config.write_text(yaml.safe_dump(raw))
    _, (trial,) = make_trials(config, [], tmp_path / "s", results_dir=tmp_path / "results")
    validate_trials([trial])
    names = [d.name for d in record_dirs(trial)]
    assert names == ["Empty-5x5-to-Empty-6x6", "Empty-6x6", "Empty-5x5-to-Empty-8x8"]
    run_trial(trial, lambda metrics, checkpoint: None)
    assert trial_done(trial)
    records = [json.loads((d / "record.json").read_text()) for d in record_dirs(trial)]
    assert [r["test_env"] for r in records] == [e6, e8, e8]
    assert [sorted(r["eval"]) for r in records] == [[e5, e6], [e6, e8], [e5, e8]]
    assert all(r["frames"] == 64 and r["policy"] == "policy.pt" for r in records)
    assert records[0]["eval"][e5] == records[2]["eval"][e5]  # one run, evaluated alike
    assert sorted(p.name for p in (tmp_path / "s" / trial.name).iterdir() if p.is_dir()) == [
        "Empty-5x5",
        "Empty-6x6",
    ]
    second = yaml.safe_load((tmp_path / "s" / trial.name / "Empty-6x6" / "config.yaml").read_text())
    assert second["train"]["init_from"] == str(tmp_path.resolve() / "s" / trial.name / "Empty-5x5")
    # the report's transfer table counts the twice-tested run once among the train returns
    for source in (tmp_path / "results",):
        out = tmp_path / f"report_{source.name}.md"
        assert main(["report", str(source), "--out", str(out), "--no-plots"]) == 0
        table = out.read_text().split("## Train/test return")[1]
        train_row = next(r for r in table.splitlines() if r.startswith("| Empty-5x5 |"))
        assert "±" not in train_row and "| Empty-8x8 |" in table


def test_make_trials_validates_before_writing(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(SweepError, match="unknown trial command"):
        make_trials(DEMO_COPY, [], out, command="dance")
    with pytest.raises(SweepError, match="run.dir"):
        make_trials(DEMO_COPY, [], out, overrides=["run.dir=x"])
    with pytest.raises(SweepError, match="also appear in --grid"):
        make_trials(DEMO_COPY, parse_grid(["train.seed=0,1"]), out, overrides=["train.seed=3"])
    with pytest.raises(ValueError, match="not found"):
        make_trials(tmp_path / "missing.yaml", [], out)
    assert not out.exists()
    command, trials = make_trials(DEMO_COPY, parse_grid(["train.seed=0,1"]), out)
    assert command == "supervised"
    assert [t.name for t in trials] == ["seed=0", "seed=1"]
    assert trials[0].overrides == ["train.seed=0", f"run.dir={out.resolve() / 'seed=0'}"]
    assert trials[0].cli().startswith(f"memcores supervised {DEMO_COPY}")
    assert not out.exists()


def test_cli_errors_are_one_line_and_write_nothing(paths, tmp_path, capsys):
    assert sweep_cli(paths, "--grid", "train.seed=5", "--grid", "train.seed=6") == 2
    assert "given twice" in capsys.readouterr().err
    # every trial's full config is checked up front, core options included, even in --dry-run
    for flag in ("--dry-run", None):
        assert sweep_cli(paths, "--grid", "core.nosuch=1,2", *([flag] if flag else [])) == 2
        err = capsys.readouterr().err
        assert "nosuch" in err and len(err.strip().splitlines()) == 1
    assert sweep_cli(paths, "--grid", "core.name=lstm,nope") == 2
    assert "unknown core 'nope'; valid: lstm" in capsys.readouterr().err
    assert sweep_cli(paths, "--grid", "train.seedz=0,1") == 2
    assert "unknown config key 'train.seedz'" in capsys.readouterr().err
    assert sweep_cli(paths, "--scheduler", "asha") == 2  # ASHA needs a metric (and Ray)
    assert "--metric" in capsys.readouterr().err
    assert not Path(paths["out"]).exists() and not Path(paths["results"]).exists()
    # --out naming a file, or inside a read-only folder: one line, exit 2
    Path(paths["out"]).write_text("")
    assert sweep_cli(paths) == 2
    assert "is a file" in capsys.readouterr().err
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores permissions
            pytest.skip("running as root: a read-only folder is writable")
        assert sweep_cli({**paths, "out": str(locked / "s")}) == 2
        err = capsys.readouterr().err
        assert "cannot create" in err and len(err.strip().splitlines()) == 1
    finally:
        locked.chmod(0o700)


def test_dry_run_prints_commands(paths, capsys):
    assert sweep_cli(paths, "--grid", "core.name=lstm,ur_lstm", "--dry-run") == 0
    out = capsys.readouterr().out
    assert out.count("memcores supervised") == 2 and "name=ur_lstm: " in out
    assert not Path(paths["out"]).exists()


# --------------------------------------------------------------------------- real trials


def test_sweep_runs_trials_writes_records_reports_failures_and_skips(paths, capsys):
    grid = ["--grid", "core.name=lstm,ur_lstm", "--grid", "train.init_from=null,/nonexistent.pt"]
    assert sweep_cli(paths, *grid) == 1
    files = trial_files(paths["out"])
    status = {name: f["status"] for name, f in files.items()}
    assert status == {
        "name=lstm,init_from=null": "ok",
        "name=lstm,init_from=nonexistent.pt": "failed",
        "name=ur_lstm,init_from=null": "ok",
        "name=ur_lstm,init_from=nonexistent.pt": "failed",
    }
    assert "nonexistent.pt" in files["name=lstm,init_from=nonexistent.pt"]["message"]
    out = capsys.readouterr().out
    assert "summary: 2 ok, 2 failed" in out and "FAILED name=lstm,init_from=nonexistent.pt" in out
    run = Path(paths["out"]) / "name=ur_lstm,init_from=null"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["core"]["name"] == "ur_lstm" and saved["run"]["dir"] == str(run.resolve())
    record_dir = Path(paths["results"]) / "name=ur_lstm,init_from=null"
    record = json.loads((record_dir / "record.json").read_text())
    assert record["kind"] == "supervised" and record["core"] == "ur_lstm"
    assert record["updates"] == 20 and record["experiment"] == "results"
    assert not (Path(paths["results"]) / "name=lstm,init_from=nonexistent.pt").exists()

    # Same sweep again: trials with a record are skipped, the failed ones run (and fail) again.
    mtime = (run / "progress.csv").stat().st_mtime_ns
    assert sweep_cli(paths, *grid) == 1
    assert "2 with a record (skipped), 2 to run" in capsys.readouterr().out
    assert (run / "progress.csv").stat().st_mtime_ns == mtime

    # A fresh clone: the run folders are gone, the committed records are not.
    shutil.rmtree(paths["out"])
    assert sweep_cli(paths, *grid) == 1
    assert "2 with a record (skipped), 2 to run" in capsys.readouterr().out
    assert not run.exists() and sorted(trial_files(paths["out"])) == [
        "name=lstm,init_from=nonexistent.pt",
        "name=ur_lstm,init_from=nonexistent.pt",
    ]


def test_local_sweep_skips_a_trial_whose_record_appears_while_it_runs(monkeypatch):
    """Two processes sharing a results folder: a trial finished by the other one after this
    sweep started is skipped when its turn comes, not trained again."""
    from memcores.experiments import sweep as sweep_module

    trials = [
        Trial(f"t{i}", "supervised", "c.yaml", overrides=[], run_dir=f"r{i}", record_dir=f"d{i}")
        for i in range(2)
    ]
    done = {"t0"}  # t0's record appeared after the sweep listed its trials
    monkeypatch.setattr(sweep_module, "trial_done", lambda trial: trial.name in done)
    ran = []
    monkeypatch.setattr(sweep_module, "run_trial", lambda trial, *a: ran.append(trial.name) or {})
    lines = []
    results = sweep_module._run_local(trials, "", lines.append)
    assert ran == ["t1"]
    assert results["t0"].status == "skipped" and results["t1"].status == "ok"
    assert "t0: skipped" in lines[0]


def test_folder_of_another_sweep_or_in_use_is_refused(paths, capsys):
    from memcores.agents.run_lock import RunLock

    assert sweep_cli(paths, "--grid", "train.seed=0") == 0
    # other settings for the same folder: refuse instead of mixing two experiments
    assert (
        main(
            ["sweep", str(DEMO_COPY), "--out", paths["out"], "--results", paths["results"] + "2"]
            + ["--backend", "local", "--grid", "train.seed=0", *TINY_COPY, "core.hidden_size=8"][
                :-1
            ]
            + ["optim.lr=0.01"]
        )
        == 2
    )
    assert "holds another sweep" in capsys.readouterr().err
    with RunLock(paths["out"], "another driver"):  # one driver per sweep folder
        assert sweep_cli(paths, "--grid", "train.seed=1") == 2
    err = capsys.readouterr().err
    assert "in use by" in err and "another driver" in err


def test_comment_edit_keeps_the_folder_and_a_value_edit_does_not(paths, tmp_path, capsys):
    """The folder is tied to the config's values, not its bytes; a folder written when it was
    tied to the bytes still resumes while the file is unchanged."""
    config = tmp_path / "copy.yaml"
    config.write_text(DEMO_COPY.read_text())
    args = ["sweep", str(config), "--out", paths["out"], "--results", paths["results"]]
    args += ["--backend", "local", "--grid", "train.seed=0,1", *TINY_COPY]
    assert main(args) == 0
    config.write_text("# a comment and a blank line\n\n" + DEMO_COPY.read_text())
    assert main(args) == 0
    assert "2 with a record (skipped)" in capsys.readouterr().out
    sweep_file = Path(paths["out"]) / "sweep.json"
    saved = json.loads(sweep_file.read_text())
    spec = {k: v for k, v in saved["spec"].items() if k != "config_values_sha256"}
    legacy = {**spec, "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest()}
    sweep_file.write_text(json.dumps({**saved, "spec": legacy}))
    assert main(args) == 0
    config.write_text(DEMO_COPY.read_text().replace("lr: ", "lr: 0.5 #", 1))
    shutil.rmtree(paths["results"])  # trials to run, so the folder is checked
    assert main(args) == 2
    assert "holds another sweep" in capsys.readouterr().err


def test_sigterm_stops_the_sweep_and_a_rerun_resumes_the_trial(paths, capsys):
    """`kill SWEEP_PID` stops the driver (its folder lock goes with it); the same command
    resumes the interrupted trial from its checkpoint instead of restarting it."""
    args = ["sweep", str(DEMO_COPY), "--out", paths["out"], "--results", paths["results"]]
    args += ["--backend", "local", "train.steps=100", "train.eval_every=25"]
    args += ["train.eval_size=16", "core.hidden_size=8", "train.progress=false"]
    args += ["run.tensorboard=false"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sweep = subprocess.Popen(
        [sys.executable, "-m", "memcores", *args], env=env, stderr=subprocess.PIPE
    )
    run = Path(paths["out"]) / "trial"
    deadline = time.time() + 120
    while not (run / "checkpoints/last.pt").is_file():
        assert time.time() < deadline and sweep.poll() is None, sweep.stderr.read()
        time.sleep(0.1)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=60) != 0
    assert not (run / "results.json").exists()  # interrupted before the end
    init = (
        (run / "checkpoints/init.pt").stat().st_mtime_ns
    )  # a restart from scratch would rewrite it
    assert main(args) == 0
    assert (run / "checkpoints/init.pt").stat().st_mtime_ns == init
    assert json.loads((run / "results.json").read_text())["step"] == 100
    steps = [int(line.split(",")[0]) for line in (run / "progress.csv").read_text().split()[1:]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 100
    assert (Path(paths["results"]) / "trial" / "record.json").is_file()


def test_unreachable_ray_address_fails_fast_and_writes_nothing(paths, capsys):
    import socket

    pytest.importorskip(
        "ray",
        reason="connecting to a Ray address needs Ray (without it: "
        "test_cluster_options_without_ray_are_an_error)",
    )

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["sweep", str(DEMO_COPY), "--out", paths["out"], "--address", f"127.0.0.1:{port}"]
    assert main(args) == 2
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in capsys.readouterr().err
    assert not Path(paths["out"]).exists()


def test_changed_tune_settings_are_named_so_the_rerun_starts_a_new_tune_experiment():
    """Tuner.restore keeps the stored max_concurrent & co.; a re-run that changes them must
    not silently run with the old ones (run_tune starts afresh when this is non-empty)."""
    from memcores.experiments.sweep import SweepOptions
    from memcores.experiments.tune_engine import settings_change, tune_settings

    one, two = SweepOptions(max_concurrent=1), SweepOptions(max_concurrent=2)
    assert settings_change(tune_settings(one), tune_settings(one)) == ""
    assert settings_change(tune_settings(one), tune_settings(two)) == "max_concurrent 1 -> 2"
    assert "no record" in settings_change(None, tune_settings(two))
    stored = json.loads(json.dumps(tune_settings(SweepOptions(timeout=60.0))))
    assert settings_change(stored, tune_settings(SweepOptions(timeout=60.0))) == ""
    # an experiment stored when the trainable lived in the top-level `experiments` package
    # (releases before the memcores namespace) cannot be unpickled: it counts as changed
    before = {k: v for k, v in stored.items() if k != "trainable_module"}
    assert settings_change(before, tune_settings(SweepOptions(timeout=60.0))) == (
        "trainable_module None -> memcores.experiments.trials"
    )


# --------------------------------------------------------------------------- search spaces
def test_search_space_distributions_parse():
    from memcores.experiments.search import Dist, parse_search, space_corners

    space = parse_search(
        {
            "agent.learning_rate": {"loguniform": [0.0001, 0.003]},
            "agent.ent_coef": {"uniform": [0.0, 0.05]},
            "agent.n_epochs": {"randint": [2, 8]},
            "core.name": {"choice": ["lstm", "ur_lstm"]},
        }
    )
    assert space["agent.learning_rate"] == Dist("loguniform", (0.0001, 0.003))
    assert space["agent.n_epochs"] == Dist("randint", (2, 8))
    assert space["core.name"] == Dist("choice", ("lstm", "ur_lstm"))
    corners = space_corners(space)
    assert corners[0] == {
        "agent.learning_rate": 0.0001,
        "agent.ent_coef": 0.0,
        "agent.n_epochs": 2,
        "core.name": "lstm",
    }
    assert {c["agent.n_epochs"] for c in corners} == {2, 8}
    assert {c["core.name"] for c in corners} == {"lstm", "ur_lstm"}
    assert parse_search(None) == {}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"agent.learning_rate": {"gaussian": [0, 1]}}, "unknown distribution 'gaussian'"),
        ({"agent.learning_rate": {"loguniform": [0.0, 0.1]}}, "loguniform needs 0 < low"),
        ({"agent.learning_rate": {"uniform": [0.1, 0.01]}}, "needs low < high"),
        ({"agent.learning_rate": {"uniform": [0.1]}}, "takes [low, high]"),
        ({"agent.learning_rate": {"uniform": ["a", "b"]}}, "two finite numbers"),
        ({"agent.n_epochs": {"randint": [1.5, 4]}}, "randint takes two integers"),
        ({"core.name": {"choice": []}}, "choice takes a list"),
        ({"core.name": {"choice": ["lstm", "lstm"]}}, "distinct plain values"),
        ({"agent.learning_rate": 0.001}, "must be one distribution"),
        ({"agent.learning_rate": {"uniform": [0, 1], "choice": [1]}}, "one distribution"),
        ({"learning_rate": {"uniform": [0, 1]}}, "dotted config key"),
        ({"train.seed": {"randint": [0, 9]}}, "seeds are a grid"),
        ([1, 2], "must map dotted keys"),
    ],
)
def test_bad_search_space_is_a_one_line_error(section, message):
    from memcores.experiments.search import SearchSpaceError, parse_search

    with pytest.raises(SearchSpaceError, match=re.escape(message)) as err:
        parse_search(section)
    assert "\n" not in str(err.value)


def write_search_config(tmp_path: Path, search: object) -> Path:
    raw = yaml.safe_load(DEMO_COPY.read_text())
    path = tmp_path / "search_copy.yaml"
    path.write_text(yaml.safe_dump({**raw, "search": search}))
    return path


@pytest.mark.parametrize(
    ("search", "extra", "message"),
    [
        ({"optim.lr": {"beta": [0, 1]}}, [], "unknown distribution 'beta'; valid: uniform"),
        ({"optim.lr": {"loguniform": [-1, 1]}}, [], "loguniform needs 0 < low"),
        ({"optim.nonsense": {"uniform": [0.1, 1]}}, [], "unknown config key"),
        ({"optim.lr": {"uniform": [-1.0, 1.0]}}, [], "optim.lr"),  # a sampled value is checked
        ({"optim.lr": {"uniform": [0.1, 1]}}, ["--grid", "core.name=lstm,gru"], "only train.seed"),
    ],
)
def test_cli_bad_search_exits_2_with_one_line_and_writes_nothing(
    tmp_path, capsys, search, extra, message
):
    config = write_search_config(tmp_path, search)
    out = tmp_path / "sweep"
    args = ["sweep", str(config), "--search", "random", "--samples", "2", "--out", str(out)]
    assert main([*args, *extra, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_search_needs_a_search_section_and_a_section_needs_a_search(tmp_path, capsys):
    args = ["sweep", str(DEMO_COPY), "--search", "random", "--out", str(tmp_path / "s")]
    assert main([*args, "--dry-run"]) == 2
    assert "lacks" in capsys.readouterr().err
    config = write_search_config(tmp_path, {"optim.lr": {"loguniform": [0.001, 0.01]}})
    assert main(["sweep", str(config), "--out", str(tmp_path / "s"), "--dry-run"]) == 2
    assert "--search random|optuna" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_search_config_still_trains_on_its_own(tmp_path):
    """The `search:` section belongs to sweeps: `memcores train CONFIG` ignores it."""
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config

    config = load_config(RLConfig, REPO / "experiments" / "configs" / "search_doorkey5.yaml")
    assert config.agent.learning_rate == 0.001 and config.agent.ent_coef == 0.01


def test_sampled_points_run_on_the_same_seeds_and_report_their_mean(tmp_path):
    """Two points of a search: each runs every seed of the grid (the same seeds), each seed
    with the point's sampled value; the point's value is the mean over its seeds, and a
    re-run reads the seeds' values back from their records."""
    from memcores.experiments.report import records_grid
    from memcores.experiments.search_trials import run_point, seed_trials

    config = write_search_config(tmp_path, {"optim.lr": {"loguniform": [0.0001, 0.1]}})
    line = f"memcores sweep {config} --search random --samples 2 --grid train.seed=0,1"
    _, templates = make_trials(
        config,
        parse_grid(["train.seed=0,1"]),
        tmp_path / "s",
        overrides=TINY_COPY,
        results_dir=tmp_path / "r",
    )
    points = [{"optim.lr": 0.012345678}, {"optim.lr": 0.0005}]
    seeds_of = {}
    for params in points:
        rows: list[dict] = []
        result = run_point(templates, params, "eval/accuracy", rows.append, line)
        trials = seed_trials(templates, {"optim.lr": round(params["optim.lr"], 6)})
        records = [json.loads((Path(t.record_dir) / "record.json").read_text()) for t in trials]
        seeds_of[trials[0].name.rsplit(",", 1)[0]] = sorted(r["seed"] for r in records)
        finals = [r["final"]["eval/accuracy"] for r in records]
        assert all(r["node"] for r in records)  # which machine ran each trial
        assert result["eval/accuracy"] == pytest.approx(sum(finals) / 2)
        assert json.loads(result["memcores_seed_values"]) == pytest.approx(finals)
        lrs = {
            yaml.safe_load((Path(t.record_dir) / "config.yaml").read_text())["optim"]["lr"]
            for t in trials
        }
        assert lrs == {float(f"{params['optim.lr']:.4g}")}  # sampled floats: 4 digits
        assert rows and all("eval/accuracy" in r for r in rows)
        # a re-run runs nothing and reports the same value from the records
        again = run_point(templates, params, "eval/accuracy", rows.append)
        assert again["memcores_skipped"] == 1
        assert again["eval/accuracy"] == result["eval/accuracy"]
    assert seeds_of == {"lr=0.01235": [0, 1], "lr=0.0005": [0, 1]}
    # the report makes one row per point: the sampled key is a grid key of the records
    assert records_grid(tmp_path / "r") == {
        "train.seed": ["0", "1"],
        "optim.lr": ["0.0005", "0.01235"],
    }


# --------------------------------------------------------------------------- PBT
TINY_RL = [
    "env.n_envs=2",
    "agent.n_steps=16",
    "agent.seq_len=8",
    "agent.minibatch_size=16",
    "agent.n_epochs=1",
    "agent.anneal_lr=false",
    "core.hidden_size=8",
    "train.checkpoint_every=1",
    "train.progress=false",
    "run.tensorboard=false",
]


def test_pbt_restore_takes_the_donors_weights_and_applies_the_mutation(tmp_path, monkeypatch):
    """Member b continues member a's saved run with a mutated learning rate: its run starts
    at a's step with a's curve, trains on with the new rate, and its record's schedule lists
    both values with the frame at which each applied."""
    import types

    import memcores.experiments.pbt as pbt
    from memcores.experiments.pbt import checkpoint_step, run_member

    doorkey = REPO / "experiments" / "configs" / "doorkey5.yaml"
    _, (a, b) = make_trials(
        doorkey,
        parse_grid(["train.seed=0,1"]),
        tmp_path / "s",
        overrides=[*TINY_RL, "train.total_steps=96"],
        results_dir=tmp_path / "r",
    )
    saved: list[Path] = []

    def keep(metrics: dict, folder: Path | None) -> None:
        if folder is not None:
            saved.append(Path(shutil.copytree(folder, tmp_path / f"saved{len(saved)}")))

    run_member(a, {"agent.learning_rate": 0.001}, None, keep)
    donor = saved[-1]  # a's checkpoint one update before its end
    donor_step = checkpoint_step(donor / "last.pt")
    assert 0 < donor_step < 96
    # b's one update timed by a clock that advances 10 ms per reading: a fast CPU's time
    clock = iter(range(10**6))
    monkeypatch.setattr(pbt, "time", types.SimpleNamespace(perf_counter=lambda: next(clock) / 100))
    run_member(b, {"agent.learning_rate": 0.0004}, donor, lambda *_: None)

    rows = list(csv.DictReader((Path(b.run_dir) / "progress.csv").open()))
    lr = {int(r["step"]): float(r["train/learning_rate"]) for r in rows}
    assert sorted(lr) == [32, 64, 96]
    assert all(v == 0.001 for s, v in lr.items() if s <= donor_step)  # a's curve
    assert all(v == 0.0004 for s, v in lr.items() if s > donor_step)  # the mutation
    record = json.loads((Path(b.record_dir) / "record.json").read_text())
    assert record["pbt_schedule"] == [
        {"step": 0, "values": {"agent.learning_rate": 0.001}},
        {"step": donor_step, "values": {"agent.learning_rate": 0.0004}},
    ]
    assert (
        yaml.safe_load((Path(b.record_dir) / "config.yaml").read_text())["agent"]["learning_rate"]
        == 0.0004
    )
    # its wall time is its own training time (kept across its segments), not the donor's;
    # unrounded, so one short update does not read 0 (the record keeps milliseconds)
    own = float((Path(b.run_dir) / "pbt_seconds.txt").read_text())
    assert 0 < own < 0.1 and own <= record["wall_seconds"] < own + 1


def test_pbt_needs_a_search_section_and_rl_trials(tmp_path, capsys):
    args = ["sweep", str(DEMO_COPY), "--scheduler", "pbt", "--metric", "eval/loss"]
    args += ["--perturbation-interval", "10", "--out", str(tmp_path / "s"), "--dry-run"]
    assert main(args) == 2
    assert "lacks" in capsys.readouterr().err
    config = write_search_config(tmp_path, {"optim.lr": {"loguniform": [0.001, 0.01]}})
    args[1] = str(config)
    assert main(args) == 2
    assert "RL runs" in capsys.readouterr().err
    args = ["sweep", str(config), "--scheduler", "pbt", "--metric", "eval/loss", "--dry-run"]
    assert main(args) == 2
    assert "--perturbation-interval" in capsys.readouterr().err


# --------------------------------------------------------------------------- resources
def test_a_request_no_node_can_meet_is_an_error():
    from memcores.experiments.sweep import SweepOptions
    from memcores.experiments.tune_engine import GB, check_resources, trial_resources

    nodes = [{"CPU": 1.0, "memory": 4 * GB}, {"CPU": 4.0, "memory": 2 * GB}]
    check_resources(nodes, trial_resources(SweepOptions(cpus=4)))
    check_resources(nodes, trial_resources(SweepOptions(memory_gb=3.5)))
    with pytest.raises(ValueError, match=r"needs 2 CPU \(--threads-per-trial\), 3 GB memory") as e:
        check_resources(nodes, trial_resources(SweepOptions(cpus=2, memory_gb=3)))
    assert "the most any of its 2 node(s) has: 4 CPU, 4 GB memory" in str(e.value)
    with pytest.raises(ValueError, match=r"0.5 GPU \(--gpus-per-trial\)"):
        check_resources(nodes, trial_resources(SweepOptions(gpus=0.5)))


@pytest.mark.parametrize(
    "option",
    [
        ["--address", "127.0.0.1:6379"],
        ["--max-failures", "2"],
        ["--trial-timeout", "60"],
        ["--gpus-per-trial", "0.5"],
        ["--memory-per-trial", "2"],
    ],
)
def test_cluster_options_without_ray_are_an_error(paths, capsys, monkeypatch, option):
    """Asking for a cluster (or what only Ray Tune does) and not getting it is an error, not
    a silent local run."""
    import memcores.experiments.sweep as sweep

    monkeypatch.setattr(sweep, "ray_available", lambda: False)
    args = ["sweep", str(DEMO_COPY), "--out", paths["out"], "--results", paths["results"]]
    assert main([*args, *TINY_COPY, *option]) == 2
    err = capsys.readouterr().err
    assert f"{option[0]} needs Ray Tune, which is not installed" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not Path(paths["out"]).exists()


def test_max_failures_defaults_to_retries_on_a_cluster(capsys):
    from memcores.experiments.sweep_options import CLUSTER_RETRIES, SweepOptions

    assert SweepOptions().retries == 0
    assert SweepOptions(address="auto").retries == CLUSTER_RETRIES > 0
    assert SweepOptions(address="auto", max_failures=0).retries == 0
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {CLUSTER_RETRIES} with --address" in text


def test_a_refused_cluster_connection_names_the_token_setting_when_a_token_exists(
    tmp_path, monkeypatch
):
    from memcores.experiments import tune_engine

    token = tmp_path / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    assert tune_engine._auth_hint() == ""  # no token here: nothing to suggest
    token.write_text("x" * 64)
    assert "RAY_AUTH_MODE=token" in tune_engine._auth_hint()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    assert tune_engine._auth_hint() == ""  # already sending it: the cause is elsewhere


# --------------------------------------------------------------------------- fail fast
DOORKEY_SEARCH = REPO / "experiments" / "configs" / "search_doorkey5.yaml"


def rl_search_config(tmp_path: Path, search: dict) -> Path:
    raw = yaml.safe_load(DOORKEY_SEARCH.read_text())
    path = tmp_path / "rl_search.yaml"
    path.write_text(yaml.safe_dump({**raw, "search": search}))
    return path


def pbt_args(config: Path, tmp_path: Path, *extra: str) -> list[str]:
    args = ["sweep", str(config), "--scheduler", "pbt", "--grid", "train.seed=0,1"]
    args += ["--perturbation-interval", "32", "--metric", "rollout/ep_len_mean", "--mode", "min"]
    args += ["--out", str(tmp_path / "s"), "--results", str(tmp_path / "r"), *TINY_RL]
    return [*args, "train.total_steps=128", *extra]


@pytest.fixture
def no_ray_start(monkeypatch):
    """Fails a test that would start (or connect to) Ray."""
    import memcores.experiments.sweep as sweep

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(sweep, "connect_ray", refuse)


@pytest.mark.parametrize(
    ("search", "key"),
    [
        ({"core.hidden_size": {"choice": [16, 32]}}, "core.hidden_size"),
        ({"core.name": {"choice": ["lstm", "gru"]}}, "core.name"),
        ({"agent.learning_rate": {"loguniform": [1e-4, 1e-3]}, "env.n_envs": {"randint": [2, 4]}},
         "env.n_envs"),
    ],
)  # fmt: skip
def test_pbt_refuses_a_key_a_restored_member_cannot_change(
    tmp_path, capsys, no_ray_start, search, key
):
    """A key that shapes the network (or the env, the rollout) would crash the member that
    copies another's checkpoint: refused before anything starts, naming the key."""
    config = rl_search_config(tmp_path, search)
    for dry in ([], ["--dry-run"]):
        assert main(pbt_args(config, tmp_path, *dry)) == 2
        err = capsys.readouterr().err
        assert f"--scheduler pbt cannot mutate {key}:" in err and "agent.learning_rate" in err
        assert err.count("\n") == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("grid", "key"),
    [
        (["--grid", "core.name=lstm,gru"], "core.name"),
        (["--grid", "core.hidden_size=16,32"], "core.hidden_size"),
        (["--grid", "agent.gamma=0.9,0.99"], "agent.gamma"),
        (["--grid", "agent.ent_coef=0.0,0.01"], "agent.ent_coef"),
    ],
)
def test_pbt_refuses_a_grid_whose_members_cannot_copy_each_other(
    tmp_path, capsys, no_ray_start, grid, key
):
    """Members that differ in a grid key cannot resume from each other's checkpoints (a
    network shape, a rollout size, a hyperparameter PBT does not sample): the first exploit
    would fail, so the sweep is refused before anything runs, naming the key."""
    config = rl_search_config(tmp_path, {"agent.learning_rate": {"loguniform": [1e-4, 1e-3]}})
    for dry in ([], ["--dry-run"]):
        args = [a for a in pbt_args(config, tmp_path, *dry) if not a.startswith(f"{key}=")]
        assert main([*args[:6], *grid, *args[6:]]) == 2
        err = capsys.readouterr().err
        assert f"--scheduler pbt: --grid {key} gives members different" in err
        assert "train.seed" in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


def test_pbt_mutates_a_choice_within_its_list_and_keeps_values_in_their_range():
    """Tune's explore step, run as PBT runs it: a choice's new value comes from its list (a
    tune.choice domain would be multiplied by 1.2), a number stays within its range."""
    import random

    from ray.tune.schedulers.pbt import _explore

    from memcores.experiments.search import parse_search
    from memcores.experiments.tune_engine import KeepInRange, pbt_mutations

    space = parse_search(
        {
            "agent.n_epochs": {"choice": [1, 3, 4]},
            "agent.gae_lambda": {"uniform": [0.9, 1.0]},
            "agent.learning_rate": {"loguniform": [0.0001, 0.001]},
        }
    )
    mutations = {"params": pbt_mutations(space)}
    random.seed(0)
    seen: dict[str, set] = {key: set() for key in space}
    for _ in range(200):
        config = {"params": {"agent.n_epochs": 3, "agent.gae_lambda": 0.99}}
        config["params"]["agent.learning_rate"] = 0.001
        new, _ = _explore(config, mutations, 0.25, (1.2, 0.8), KeepInRange(space))
        for key, value in new["params"].items():
            seen[key].add(value)
    assert seen["agent.n_epochs"] == {1, 3, 4}  # resampled or moved along the list
    assert all(isinstance(v, int) for v in seen["agent.n_epochs"])
    assert min(seen["agent.gae_lambda"]) >= 0.9 and max(seen["agent.gae_lambda"]) == 1.0
    assert max(seen["agent.learning_rate"]) == 0.001 < 0.0012  # x1.2 put back at the end
    assert min(seen["agent.learning_rate"]) < 0.001


def test_every_key_pbt_may_mutate_can_change_on_a_resume(tmp_path):
    """The keys PBT mutates are the ones the trainer resumes with under new values."""
    from memcores.agents.rl_config import MUTABLE_HYPERPARAMETERS
    from memcores.agents.rl_trainer import train
    from tests.rl_helpers import tiny_config

    run = tmp_path / "run"
    train(tiny_config("train.total_steps=64", "run.tensorboard=false"), run)
    changed = {
        "agent.learning_rate": 0.001,
        "agent.ent_coef": 0.02,
        "agent.vf_coef": 0.4,
        "agent.clip_range": 0.3,
        "agent.clip_range_vf": 0.5,
        "agent.target_kl": 0.05,
        "agent.max_grad_norm": 0.7,
        "agent.gamma": 0.95,
        "agent.gae_lambda": 0.9,
        "agent.n_epochs": 1,
        "agent.epsilon_start": 0.9,
        "agent.epsilon_end": 0.1,
        "agent.apex_epsilon": 0.3,
        "agent.priority_alpha": 0.5,
        "agent.priority_beta": 0.5,
    }
    assert set(changed) == set(MUTABLE_HYPERPARAMETERS)
    new = tiny_config("run.tensorboard=false", *(f"{k}={v}" for k, v in changed.items()))
    result = train(new, run, resume=True, allow_changes=MUTABLE_HYPERPARAMETERS)
    assert result.global_step == 128
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["agent"]["clip_range"] == 0.3 and saved["agent"]["n_epochs"] == 1


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--threads-per-trial", "999"], "it needs 999 CPU (--threads-per-trial); it has"),
        (["--memory-per-trial", "1000000"], "(--memory-per-trial); it has"),
        (["--gpus-per-trial", "64"], "it needs 64 GPU (--gpus-per-trial); it has"),
    ],
)
def test_a_request_this_machine_cannot_meet_stops_before_ray_starts(
    paths, capsys, no_ray_start, option, message
):
    args = ["sweep", str(DEMO_COPY), "--out", paths["out"], "--results", paths["results"]]
    assert main([*args, *TINY_COPY, *option]) == 2
    err = capsys.readouterr().err
    assert "the local computer cannot run a trial" in err and message in err
    assert err.count("\n") == 1
    assert not Path(paths["out"]).exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--search-seed", "-3"], "--search-seed: must be in 0..4294967295, got -3"),
        (["--trial-timeout", "-5"], "--trial-timeout: must be > 0, got -5"),
        (["--trial-timeout", "nan"], "--trial-timeout: must be > 0, got nan"),
        (["--memory-per-trial", "nan"], "--memory-per-trial: must be >= 0, got nan"),
        (["--gpus-per-trial", "nan"], "--gpus-per-trial: must be >= 0, got nan"),
        (["--gpus-per-trial", "-1"], "--gpus-per-trial: must be >= 0, got -1"),
        (["--max-failures", "-1"], "--max-failures: must be >= 0, got -1"),
        (["--threads-per-trial", "0"], "--threads-per-trial: must be >= 1, got 0"),
        (["--samples", "0"], "--samples: must be >= 1, got 0"),
        (["--grace-period", "0"], "--grace-period: must be >= 1, got 0"),
    ],
)
def test_bad_numbers_stop_the_command_line_before_anything_runs(paths, capsys, option, message):
    with pytest.raises(SystemExit) as caught:
        sweep_cli(paths, *option, "--dry-run")
    assert caught.value.code == 2 and message in capsys.readouterr().err
    assert not Path(paths["out"]).exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("search_seed", -3, "--search-seed must be in 0..4294967295, got -3"),
        ("timeout", -5.0, "--trial-timeout must be a number of seconds > 0, got -5.0"),
        ("timeout", float("nan"), "--trial-timeout must be a number of seconds > 0, got nan"),
        ("memory_gb", float("nan"), "--memory-per-trial must be a finite number >= 0, got nan"),
        ("gpus", float("nan"), "--gpus-per-trial must be a finite number >= 0, got nan"),
    ],
)
def test_sweep_options_refuse_bad_numbers_from_the_api(field, value, message):
    from memcores.experiments.sweep import SweepOptions

    search = {"search": "random"} if field == "search_seed" else {}
    with pytest.raises(SweepError, match=re.escape(message)):
        SweepOptions(**{field: value, **search}).check()


def test_results_or_out_pointing_at_a_file_trains_nothing(paths, tmp_path, capsys):
    Path(paths["results"]).write_text("")
    for dry in ([], ["--dry-run"]):
        assert sweep_cli(paths, *dry) == 2
        err = capsys.readouterr().err
        assert f"--results {paths['results']} is a file; give a folder" in err
        assert err.count("\n") == 1
    assert not Path(paths["out"]).exists()
    inside = {**paths, "results": str(tmp_path / "results" / "r")}
    assert sweep_cli(inside) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert not Path(paths["out"]).exists()


def test_a_sweep_that_ends_in_an_error_does_not_stay_running(paths, monkeypatch, capsys):
    import memcores.experiments.sweep as sweep

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(sweep, "_run_local", broken)
    assert sweep_cli(paths) == 2
    assert "disk full" in capsys.readouterr().err
    state = json.loads((Path(paths["out"]) / "sweep.json").read_text())
    assert state["state"] == "failed" and state["error"] == "disk full"


@pytest.mark.parametrize(
    ("config", "metric", "valid"),
    [
        (DEMO_COPY, "rollout/nope", "eval/accuracy"),
        (DEMO_COPY, "rollout/ep_rew_mean", "eval/accuracy"),  # an RL tag, supervised trials
        (DOORKEY_SEARCH, "eval/loss", "rollout/ep_rew_mean"),
    ],
)
def test_a_metric_no_trial_logs_is_refused_before_anything_runs(
    tmp_path, capsys, no_ray_start, config, metric, valid
):
    if config == DEMO_COPY:
        config = write_search_config(tmp_path, {"optim.lr": {"loguniform": [0.001, 0.01]}})
    args = ["sweep", str(config), "--search", "optuna", "--metric", metric]
    args += ["--out", str(tmp_path / "s"), "--results", str(tmp_path / "r")]
    for dry in ([], ["--dry-run"]):
        assert main([*args, *dry]) == 2
        err = capsys.readouterr().err
        assert f"--metric {metric!r} is not logged by" in err and valid in err
        assert err.count("\n") == 1
    assert not (tmp_path / "s").exists()


def test_the_metric_tags_are_what_the_trainers_log(tmp_path):
    """The tags a sweep accepts for --metric are the columns the trainers write."""
    from memcores.agents.rl_trainer import RECON_TAG, ROW_TAGS, train
    from memcores.agents.supervised import LOGGED_TAGS
    from memcores.experiments.trials import check_metric
    from tests.rl_helpers import tiny_config

    train(tiny_config("train.total_steps=64", "agent.recon_coef=0.1"), tmp_path / "rl")
    header = (tmp_path / "rl" / "progress.csv").read_text().splitlines()[0].split(",")
    assert header == ["step", *ROW_TAGS, RECON_TAG]
    run = tmp_path / "sup"
    args = ["supervised", str(DEMO_COPY), *TINY_COPY, f"run.dir={run}", "train.log_every=10"]
    assert main(args) == 0
    columns = (run / "progress.csv").read_text().splitlines()[0].split(",")[1:]
    assert "eval/accuracy" in columns and "train/loss" in columns
    assert set(columns) <= set(LOGGED_TAGS)
    for tag in columns:
        check_metric(tag, "supervised")
    check_metric("transfer/T=40/accuracy", "supervised")


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--perturbation-interval", "32"], "--perturbation-interval is only used by --scheduler"),
        (["--grace-period", "5"], "--grace-period is only used by --scheduler asha"),
        (["--samples", "4"], "--samples is only used by --search random|optuna"),
        (["--search-seed", "4"], "--search-seed is only used by --search random|optuna or"),
    ],
)  # fmt: skip
def test_an_option_that_does_nothing_in_the_chosen_mode_is_refused(paths, capsys, option, message):
    assert sweep_cli(paths, *option, "--dry-run") == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_pbt_needs_two_members_and_an_interval_shorter_than_the_budget(
    tmp_path, capsys, no_ray_start
):
    config = rl_search_config(tmp_path, {"agent.learning_rate": {"loguniform": [1e-4, 1e-3]}})
    args = pbt_args(config, tmp_path)
    one = [a if a != "train.seed=0,1" else "train.seed=0" for a in args]
    assert main(one) == 2
    assert "a population of 2 or more members" in capsys.readouterr().err
    long = [a if a != "32" else "128" for a in args]
    assert main(long) == 2
    err = capsys.readouterr().err
    assert "--perturbation-interval 128 is not shorter than the members' budget" in err
    assert "(train.total_steps=128)" in err
    assert main([*args, "--dry-run"]) == 0  # 2 members, 32 < 128
    assert not (tmp_path / "s").exists()
