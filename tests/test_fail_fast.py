"""The newest surfaces fail fast: a bad value stops with one line naming it and the valid
choices (exit 2, nothing written) in the sweep's dry run, the env options, the benchmarks,
the docs check and the Python APIs of the batched envs and the engine adapters."""

from __future__ import annotations

from pathlib import Path

import pytest

from memcores.experiments.cli import main

REPO = Path(__file__).parents[1]
DEMO_RL = str(REPO / "experiments" / "configs" / "demo_rl.yaml")
DEMO_COPY = str(REPO / "experiments" / "configs" / "demo_copy.yaml")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line a refused command printed on stderr (no traceback)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --------------------------------------------------------------------------- the sweep's dry run
@pytest.mark.parametrize(
    ("config", "grid", "named"),
    [
        (DEMO_RL, "train.graph_env_step=true,false", "train.graph_env_step=true cannot apply"),
        (DEMO_RL, "train.graph_update=false,true", "train.graph_update=true cannot apply"),
        (DEMO_COPY, "core.impl=triton,fused", "core.impl=triton cannot run here"),
        (DEMO_RL, "train.device=cpu,cuda", "device 'cuda' requested but no CUDA GPU"),
    ],
)
def test_the_dry_run_refuses_what_train_refuses_on_this_machine(
    tmp_path, capsys, monkeypatch, config, grid, named
):
    """Every grid point goes through train's device checks in the dry run, before Ray."""
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["sweep", config, "--grid", grid, "--out", str(tmp_path / "s"), "--backend", "local"]
    if "train.device" not in grid:
        args.append("train.device=cpu")
    assert main([*args, "--dry-run"]) == 2
    line = one_line(capsys)
    assert named in line and line.startswith("memcores sweep: error: trial ")
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- env flags
POPGYM = "popgym/RepeatPreviousEasy-v0"


def test_an_env_flag_is_parsed_like_every_bool_key(tmp_path, capsys):
    """``prev_reward=maybe`` is refused; the text ``"false"`` is false (it was a true string)."""
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config

    run = tmp_path / "run"
    args = ["train", DEMO_RL, f"env.id={POPGYM}", f"run.dir={run}"]
    assert main([*args, "env.kwargs.prev_reward=maybe"]) == 2
    line = one_line(capsys)
    assert "'env.kwargs.prev_reward' must be true or false, got 'maybe'" in line
    assert not run.exists()
    for text, value in (('"false"', False), ("no", False), ("true", True), ('"True"', True)):
        config = load_config(
            RLConfig, DEMO_RL, [f"env.id={POPGYM}", f"env.kwargs.prev_reward={text}"]
        )
        assert config.env.kwargs["prev_reward"] is value
    # MiniGrid's own flags are read from its constructors too
    with pytest.raises(ValueError, match="env.kwargs.see_through_walls"):
        load_config(RLConfig, DEMO_RL, ["env.kwargs.see_through_walls=often"])


@pytest.mark.parametrize("value", ["false", "maybe", 1, None])
def test_the_env_builders_take_only_true_or_false_for_a_flag(value):
    from memcores.envs import make_env
    from memcores.envs.batched_registry import make_batched_env

    with pytest.raises(ValueError, match=f"prev_reward of {POPGYM} is a flag: it must be true"):
        make_env(POPGYM, prev_reward=value)
    with pytest.raises(ValueError, match="prev_reward of .* is a flag: it must be true or false"):
        make_batched_env(POPGYM, 2, "cpu", {"prev_reward": value})
    with pytest.raises(ValueError, match="reveal_cue of memcores/PassiveVisualMatch-v0 is a flag"):
        make_batched_env("memcores/PassiveVisualMatch-v0", 2, "cpu", {"reveal_cue": value})
    sizes = [
        make_env(POPGYM, prev_reward=flag).observation_space["vector"].shape
        for flag in (True, False)
    ]
    assert sizes == [(10,), (9,)]  # the previous reward is one more input


# --------------------------------------------------------------------------- search: null
def test_a_search_choice_may_hold_null_where_the_key_takes_it(tmp_path, capsys):
    """``agent.target_kl: {choice: [null, 0.01]}``: null reaches the trial as None (it was
    the text "None", refused as not a number), in a search and in PBT's member overrides."""
    import yaml

    from memcores.experiments.search import override_text
    from memcores.experiments.search_trials import seed_trials
    from memcores.experiments.sweep import make_trials, parse_grid
    from memcores.experiments.trials import trial_config

    search = REPO / "experiments" / "configs" / "search_doorkey5.yaml"
    raw = yaml.safe_load(search.read_text())
    raw["search"] = {"agent.target_kl": {"choice": [None, 0.01]}}
    config = tmp_path / "search.yaml"
    config.write_text(yaml.safe_dump(raw))
    args = ["sweep", str(config), "--search", "random", "--samples", "2", "--grid"]
    args += ["train.seed=0,1", "--out", str(tmp_path / "s"), "--backend", "ray", "--dry-run"]
    assert main(args) == 0, capsys.readouterr().err
    _, trials = make_trials(config, parse_grid(["train.seed=0"]), tmp_path / "s")
    (point,) = seed_trials(trials, {"agent.target_kl": None})
    assert "agent.target_kl=null" in point.overrides
    assert trial_config(point).agent.target_kl is None
    assert [override_text(v) for v in (None, True, 0.01, "lstm")] == [
        "null",
        "true",
        "0.01",
        "lstm",
    ]


# --------------------------------------------------------------------------- docs --check
@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"tables": {"title": "x"}}, "'tables' must be a list, got dict"),
        ({"tables": [["peak", "4.45"]]}, "table 1 of 'tables' must be"),
        ({"tables": [{"title": "t", "columns": ["a"], "rows": "4.45"}]}, "table 1 of 'tables'"),
        ({"command": None}, "'command' must be a string, got NoneType"),
        ({"machine": {"cpus": 2}}, "'machine' has no 'cpu'"),
    ],
)
def test_docs_check_names_a_record_of_the_wrong_shape(tmp_path, edit, named):
    """A record whose fields were edited into another type: the check lists it (one line
    per problem) instead of failing with a traceback inside the rendering."""
    import json

    from memcores.experiments import doc_blocks
    from tests.test_docs_tables import _bench_repo

    _, record_file, _ = _bench_repo(tmp_path)
    record = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**record, **edit}))
    problems = doc_blocks.check(repo=tmp_path)
    assert problems and all("\n" not in line for line in problems)
    assert any(named in line for line in problems), problems
    assert any(line.startswith("results/bench/toy/record.json: ") for line in problems)


# --------------------------------------------------------------------------- benchmarks
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["envs", "--batched", "--device", "cuda"], "--device: device 'cuda' requested but no"),
        (["rl", "--batched", "--device", "cuda"], "--device: device 'cuda' requested but no"),
        (["envs", "--batched", "--sizes", "0"], "--sizes must be numbers of envs >= 1"),
        (["rl", "--batched", "--sizes", "8,x"], "--sizes must be comma-separated integers"),
        (["envs", "--batched", "--threads", "-1"], "argument --threads: must be >= 0"),
        (["rl", "--batched", "--threads", "-2"], "argument --threads: must be >= 0"),
        (["rl", "--threads", "-1"], "argument --threads: must be >= 0"),
        (["memory", "lru", "--threads", "0"], "argument --threads: must be >= 1"),
        (["envs", "--envpool", "--sizes", "0"], "argument --sizes: must be >= 1, got 0"),
        (["envs", "--envpool", "--env-steps", "0"], "argument --env-steps: must be >= 1"),
    ],
)
def test_bench_options_out_of_range_stop_before_anything_runs(
    tmp_path, capsys, monkeypatch, argv, named
):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)  # a record would land in results/ here
    with pytest.raises(SystemExit) as stop:  # argparse's error of the bench's own parser
        main(["bench", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err
    assert not (tmp_path / "results").exists()


def test_bench_envpool_refuses_sizes_beyond_the_memory(tmp_path, capsys, monkeypatch):
    from memcores.envs.envpool_env import available

    if not available():
        pytest.skip("envpool is not installed")
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "envs", "--envpool", "--sizes", "64", "10000000000"]) == 2
    line = one_line(capsys)
    assert "--sizes 10,000,000,000 envs x 5 engines x" in line and "lower --sizes" in line


# ----------------------------------------------------------------- counts vs the machine
def test_thread_and_worker_counts_beyond_the_cores_are_refused(tmp_path, capsys, monkeypatch):
    """100,000 EnvPool threads aborted in C++ (exit 134); torch threads and env processes
    beyond the cores were never checked. One line each, before the run folder exists."""
    from memcores.envs import cpus
    from memcores.envs.envpool_env import EnvPoolVectorEnv, available

    monkeypatch.setattr(cpus, "cpu_cores", lambda: 2)
    run = tmp_path / "run"
    base = ["train", DEMO_RL, f"run.dir={run}", "train.device=cpu"]
    cases = [
        (["train.threads=3"], "train.threads=3 is more than the 2 CPU cores"),
        (["train.update_threads=4"], "train.update_threads=4 is more than the 2 CPU cores"),
        (["env.vector=async", "env.workers=100000"], "env.workers=100,000 is more than the 2"),
    ]
    if available():
        cases.append((["env.vector=envpool", "env.workers=100000"], "env.workers=100,000 is"))
    for overrides, named in cases:
        assert main([*base, *overrides]) == 2
        assert named in one_line(capsys)
        assert not run.exists()
    sup = ["supervised", DEMO_COPY, f"run.dir={run}", "train.threads=5", "train.device=cpu"]
    assert main(sup) == 2
    assert "train.threads=5 is more than the 2 CPU cores" in one_line(capsys)
    cpus.check_cpu_counts({"train.threads": 2, "env.workers": 1})  # up to the cores: fine
    if available():
        with pytest.raises(ValueError, match="threads=3 is more than the 2 CPU cores"):
            EnvPoolVectorEnv("MiniGrid-MemoryS7-v0", 4, 0, threads=3)


# ---------------------------------------------------------------- options that do nothing
@pytest.mark.parametrize("vector", ["sync", "batched"])
def test_env_workers_is_refused_where_it_does_nothing(tmp_path, capsys, vector):
    run = tmp_path / "run"
    env = "memcores/PassiveVisualMatch-v0"
    args = ["train", DEMO_RL, f"env.id={env}", f"env.vector={vector}", "env.workers=4"]
    assert main([*args, f"run.dir={run}"]) == 2
    line = one_line(capsys)
    assert f"env.workers=4 does nothing with env.vector={vector}" in line
    assert "async" in line and "envpool" in line and not run.exists()


@pytest.mark.parametrize("steps", ["0", "-5", "2.5", "many"])
def test_max_steps_below_one_is_refused(tmp_path, capsys, steps):
    """An episode limit of 0 (or less) truncated every episode at its first step."""
    from memcores.envs import make_env
    from memcores.envs.batched_registry import make_batched_env

    run = tmp_path / "run"
    assert main(["train", DEMO_RL, f"env.kwargs.max_steps={steps}", f"run.dir={run}"]) == 2
    line = one_line(capsys)
    assert "env.kwargs.max_steps of MiniGrid-DoorKey-5x5-v0 must be an integer >= 1" in line
    assert not run.exists()
    with pytest.raises(ValueError, match="max_steps of MiniGrid-MemoryS7-v0 must be an integer"):
        make_env("MiniGrid-MemoryS7-v0", max_steps=0)
    with pytest.raises(ValueError, match="max_steps of memcores/PassiveVisualMatch-v0 must be"):
        make_batched_env("memcores/PassiveVisualMatch-v0", 2, "cpu", {"max_steps": -1})


def test_max_concurrent_is_refused_where_it_does_nothing_or_oversubscribes(
    tmp_path, capsys, monkeypatch
):
    from memcores.envs import cpus
    from memcores.experiments import sweep

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(sweep, "connect_ray", no_ray)
    monkeypatch.setattr(cpus, "cpu_cores", lambda: 2)
    args = ["sweep", DEMO_COPY, "--grid", "train.seed=0,1", "--out", str(tmp_path / "s")]
    args += ["--results", str(tmp_path / "r"), "train.steps=2"]
    assert main([*args, "--backend", "local", "--max-concurrent", "2"]) == 2
    line = one_line(capsys)
    assert "--backend local runs trials one after the other" in line
    assert "--max-concurrent needs Ray Tune" in line
    if sweep.ray_available():
        assert main([*args, "--backend", "ray", "--max-concurrent", "64"]) == 2
        line = one_line(capsys)
        assert "--max-concurrent 64 x --threads-per-trial 1 is 64 CPUs, more than the 2" in line
        assert "give --max-concurrent 1..2" in line
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


# --------------------------------------------------------------------------- Python APIs
def test_a_batched_env_checks_what_it_is_stepped_with():
    """Before the fix: a step before reset failed inside the env with a KeyError, [N, 1]
    or float actions were taken, and action 9 of 7 was played (MiniGrid raises)."""
    import torch

    from memcores.envs.batched_registry import make_batched_env

    env = make_batched_env("memcores/PassiveVisualMatch-v0", 3, "cpu")
    with pytest.raises(RuntimeError, match=r"^call reset\(seed\) before step: the envs hold"):
        env.step(torch.zeros(3, dtype=torch.int64))
    env.reset(seed=0)
    bad = [
        (
            torch.zeros(3, 1, dtype=torch.int64),
            r"actions must be \[3\] \(one per env\), got \[3, 1\]",
        ),
        (torch.zeros(2, dtype=torch.int64), r"actions must be \[3\] \(one per env\), got \[2\]"),
        (torch.zeros(3), "actions must be integers, got torch.float32"),
        (torch.ones(3, dtype=torch.bool), "actions must be integers, got torch.bool"),
        (torch.tensor([0, 9, 1]), r"actions must be in 0..6 \(the action space\), got 9"),
        (torch.tensor([0, 7, 1]), r"actions must be in 0..6 \(the action space\), got 7"),
        (torch.tensor([0, -1, 1]), r"actions must be in 0..6 \(the action space\), got -1"),
    ]
    for actions, message in bad:
        with pytest.raises(ValueError, match=message):
            env.step(actions)
        with pytest.raises(ValueError, match=message):
            env.step_async(0, actions)
    obs, reward, done, _ = env.step([6, 0, 2])  # a list of ints is fine
    assert obs["image"].shape == (3, 7, 7, 3) and reward.shape == done.shape == (3,)


def test_the_torchrl_module_names_what_is_wrong_in_the_tensordict():
    pytest.importorskip("torchrl")
    import torch
    from tensordict import TensorDict

    from memcores.agents.torchrl_module import CoreModule
    from memcores.cores import make_core

    module = CoreModule(make_core("lstm", 5, 8), in_key="x", out_key="y")
    h, c = module.state_keys
    x, zeros = torch.randn(4, 5), torch.zeros(4, 8)
    with pytest.raises(ValueError, match="no 'x' \\(in_key\\); its keys: embed"):
        module(TensorDict({"embed": x}, [4]))
    with pytest.raises(
        ValueError, match=r"'x' \(in_key\) must be \[\.\.\., 5\] .* got \[\.\.\., 6\]"
    ):
        module(TensorDict({"x": torch.randn(4, 6)}, [4]))
    with pytest.raises(
        ValueError, match=rf"state entry '{h}' must be \[\.\.\., 8\] .* got \[\.\.\., 3\]"
    ):
        module(
            TensorDict(
                {
                    "x": x,
                    h: torch.zeros(4, 3),
                    c: zeros,
                    "is_init": torch.zeros(4, 1, dtype=torch.bool),
                },
                [4],
            )
        )
    # a state without is_init (a collector without InitTracker): it would be reset every step
    with pytest.raises(ValueError, match="carries the state but no 'is_init'.*InitTracker"):
        module(TensorDict({"x": x, h: zeros, c: zeros}, [4]))
    # with is_init false the state is carried: the output differs from a fresh start's
    carried = TensorDict(
        {"x": x, h: zeros + 1, c: zeros + 1, "is_init": torch.zeros(4, 1, dtype=torch.bool)}, [4]
    )
    fresh = TensorDict({"x": x}, [4])
    with torch.no_grad():
        assert not torch.allclose(module(carried)["y"], module(fresh)["y"])


def test_the_rllib_module_names_what_is_wrong_in_the_batch():
    pytest.importorskip("ray.rllib")
    import gymnasium as gym
    import numpy as np
    import torch
    from ray.rllib.core.columns import Columns

    from memcores.agents.rllib_module import CoreRLModule, core_ppo_config, state_batch

    module = CoreRLModule(
        observation_space=gym.spaces.Box(-1, 1, (7,), np.float32),
        action_space=gym.spaces.Discrete(4),
        model_config={"core": "lstm", "hidden_size": 8, "max_seq_len": 4},
    )
    state = state_batch(module, 2)
    cases = [
        (
            {Columns.OBS: torch.zeros(2, 3, 6), Columns.STATE_IN: state},
            r"must be \[B, T, 7\] sequences .* got \[2, 3, 6\]",
        ),
        (
            {Columns.OBS: torch.zeros(2, 7), Columns.STATE_IN: state},
            r"obs\[:, None\]\), got \[2, 7\]",
        ),
        (
            {Columns.OBS: torch.zeros(2, 1, 7)},
            r"STATE_IN\] must hold the core's state \['s0', 's1'\]",
        ),
        (
            {Columns.OBS: torch.zeros(2, 1, 7), Columns.STATE_IN: {"s0": state["s0"]}},
            r"got \['s0'\]",
        ),
        (
            {
                Columns.OBS: torch.zeros(2, 1, 7),
                Columns.STATE_IN: {"s0": torch.zeros(2, 5), "s1": state["s1"]},
            },
            r"STATE_IN\['s0'\] must be \[2, 8\]",
        ),
    ]
    for batch, message in cases:
        with pytest.raises(ValueError, match=message):
            module.forward_inference(batch)
    with pytest.raises(ValueError, match=r"num_envs_per_env_runner must be in 1\.\.512 .* got 0"):
        core_ppo_config(num_envs_per_env_runner=0)
    with pytest.raises(
        ValueError, match=r"num_envs_per_env_runner must be in 1\.\.512 .* got 2000"
    ):
        core_ppo_config(num_envs_per_env_runner=2000)
    with pytest.raises(ValueError, match="num_env_runners must be >= 0"):
        core_ppo_config(num_env_runners=-1)


# --------------------------------------------------------------------------- Ctrl-C, local backend
def test_ctrl_c_in_a_local_sweep_leaves_the_trial_to_resume(tmp_path, capsys, monkeypatch):
    """The local backend's half of the rule the Ray test checks (test_sweep_ray_quick): an
    interrupted trial gets no record, and the same command trains it to its whole budget."""
    import json

    from memcores.experiments import sweep

    real = sweep.run_trial

    def interrupted(trial, report, command_line=""):
        def stop(metrics, ckpt):
            if metrics.get("step", 0) >= 40:
                raise KeyboardInterrupt

        return real(trial, stop, command_line)

    out, results = tmp_path / "s", tmp_path / "r"
    args = ["sweep", DEMO_COPY, "--grid", "train.seed=0", "--backend", "local", "--out", str(out)]
    args += ["--results", str(results), "train.steps=60", "train.eval_every=20"]
    args += ["train.eval_size=32", "core.hidden_size=8", "train.progress=false"]
    args += ["run.tensorboard=false"]
    monkeypatch.setattr(sweep, "run_trial", interrupted)
    assert main(args) == 130
    assert not (results / "seed=0").exists()
    assert (out / "seed=0" / "checkpoints" / "last.pt").is_file()
    monkeypatch.setattr(sweep, "run_trial", real)
    capsys.readouterr()
    assert main(args) == 0
    record = json.loads((results / "seed=0" / "record.json").read_text())
    assert record["updates"] == 60 and not record.get("stopped_early")
