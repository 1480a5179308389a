"""Tensors follow the module they enter: every trainer and command on each available device.

A GPU is not needed to see the failure class: a module on PyTorch's ``meta`` device fed CPU
tensors fails exactly as a GPU module fed CPU tensors does ("not on the expected device"), so
the policy's own forward is checked on ``meta`` too; the trainers and commands run on each
device of the ``device`` fixture (conftest.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from rl_helpers import TINY, sb3_recurrent_ppo, tiny_config

from memcores.agents.device import ACT_ON_LEARNER_FROM, acting_device, module_device, to_device
from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.rl_trainer import acting_policy, train
from memcores.experiments.cli import main

PASSIVE = "experiments/configs/passive_visual_match.yaml"


# ----------------------------------------------------------------------------- the rule
@pytest.mark.parametrize("learner", ["cuda", "cuda:1", "meta"])
def test_accelerator_learner_acts_on_cpu_with_few_envs_and_on_itself_with_many(learner):
    below, at = ACT_ON_LEARNER_FROM - 1, ACT_ON_LEARNER_FROM
    assert acting_device(learner, 1) == torch.device("cpu")
    assert acting_device(learner, below) == torch.device("cpu")
    assert acting_device(learner, at) == torch.device(learner)
    assert acting_device(learner, 10 * at) == torch.device(learner)
    assert acting_device(learner, 8, threshold=8) == torch.device(learner)


def test_cpu_learner_always_acts_on_cpu_with_the_policy_itself():
    policy = torch.nn.Linear(2, 2)
    for n in (1, ACT_ON_LEARNER_FROM, 10 * ACT_ON_LEARNER_FROM):
        assert acting_device("cpu", n) == torch.device("cpu")
        assert acting_policy(policy, torch.device("cpu"), n_envs=n) is policy
    copy = acting_policy(policy, torch.device("cpu"), separate=True, n_envs=8)
    assert copy is not policy and torch.equal(copy.weight, policy.weight)


def test_accelerator_learner_with_many_envs_acts_itself():
    policy = torch.nn.Linear(2, 2).to("meta")
    learner = torch.device("meta")
    assert acting_policy(policy, learner, n_envs=ACT_ON_LEARNER_FROM) is policy
    separate = acting_policy(policy, learner, separate=True, n_envs=ACT_ON_LEARNER_FROM)
    assert separate is not policy and module_device(separate) == learner


def test_to_device_moves_only_what_is_elsewhere():
    here = torch.zeros(2)
    moved = to_device({"a": here, "b": (here, [here]), "n": 3}, torch.device("meta"))
    assert moved["a"].is_meta and moved["b"][0].is_meta and moved["b"][1][0].is_meta
    assert moved["n"] == 3 and isinstance(moved["b"], tuple) and isinstance(moved["b"][1], list)
    assert to_device(here, torch.device("cpu")) is here  # no copy where it already is


# ----------------------------------------------------------------------------- policy
def _obs(kind: str, T: int, B: int) -> dict[str, torch.Tensor]:
    if kind == "vector":
        return {"vector": torch.zeros(T, B, 5)}
    return {
        "image": torch.zeros(T, B, 7, 7, 3, dtype=torch.uint8),
        "direction": torch.zeros(T, B, dtype=torch.long),
    }


@pytest.mark.parametrize("kind", ["image", "vector"])
@pytest.mark.parametrize("core", ["lstm", "gru", "power_rnn"])
def test_policy_on_meta_acts_on_cpu_observations_state_and_starts(kind, core):
    """The crash class of a GPU policy fed CPU tensors, reproduced on the meta device: the
    policy moves what enters it. The acting step (T = 1, no grad) is the path a command
    takes; it must not read ``starts`` on the host off the CPU either (a meta tensor has no
    values to read; a GPU one would make the host wait every step). Training chunks on each
    real device are covered by the trainer tests below."""
    shape = (5,) if kind == "vector" else (7, 7, 3)
    # (no mission encoder: it reads the token count on the host, which meta tensors lack)
    policy = RecurrentActorCritic(3, core, 16, image_shape=shape, mission="none")
    policy = policy.to("meta")
    B = 3
    state = policy.core.initial_state(B, "cpu")
    with torch.no_grad():
        out = policy(_obs(kind, 1, B), state, torch.ones(1, B, dtype=torch.bool))
    assert out.logits.is_meta and out.logits.shape == (1, B, 3) and out.values.shape == (1, B)
    assert all(s.is_meta for s in out.state)
    assert all(s.is_meta for s in policy.initial_state(B))  # on the policy's device


def test_cpu_policy_fed_meta_tensors_fails_as_a_gpu_policy_fed_cpu_tensors_did():
    """Without the move the meta device reproduces the crash: an ``nn.Linear`` (what the
    policy's encoder starts with) refuses input from another device."""
    with pytest.raises(RuntimeError, match="device"):
        torch.nn.Linear(3, 2).to("meta")(torch.zeros(1, 3))


# ----------------------------------------------------------------------------- trainers
def test_rl_training_runs_on_each_device(device, tmp_path):
    result = train(tiny_config(f"train.device={device}"), tmp_path / "run")
    assert result.global_step == 128
    payload = torch.load(tmp_path / "run/checkpoints/last.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in payload["model"].values())


def test_rl_training_with_many_envs_acts_on_the_learner_device(device, tmp_path, monkeypatch):
    """With the threshold at 2 envs, a GPU learner acts on the GPU (rollout stored there);
    the run on the CPU is the same as ever."""
    monkeypatch.setattr(
        "memcores.agents.rl_trainer.acting_device",
        lambda d, n, graphed=False: acting_device(d, n, threshold=2, graphed=graphed),
    )
    result = train(tiny_config(f"train.device={device}"), tmp_path / "run")
    assert result.global_step == 128 and np.isfinite(result.history[-1]["train/value_loss"])


def test_train_command_runs_on_each_device(device, tmp_path):

    run = tmp_path / "run"
    args = ["train", "experiments/configs/demo_rl.yaml", *TINY, f"train.device={device}"]
    assert main([*args, f"run.dir={run}", "run.tensorboard=false"]) == 0
    assert (run / "checkpoints" / "last.pt").is_file()


def test_supervised_training_and_its_diagnosis_run_on_each_device(device, tmp_path):
    run = tmp_path / "run"
    args = ["supervised", "experiments/configs/demo_copy.yaml"]
    args += [f"train.device={device}", "train.steps=4", "train.eval_every=2"]
    args += ["train.eval_size=8", "core.hidden_size=8", f"run.dir={run}"]
    args += ["train.progress=false", "run.tensorboard=false"]
    assert main(args) == 0
    assert (run / "checkpoints" / "last.pt").is_file()
    out = tmp_path / "profile.png"
    assert main(["diagnose", str(run), "--batch", "4", "--out", str(out)]) == 0
    assert out.is_file()


def test_transfer_runs_on_each_device(device, tmp_path, monkeypatch):
    from memcores.envs import suites

    suite = type(suites.SUITES["doorkey"])
    tiny = suite(pairs=(("MiniGrid-Empty-5x5-v0", "MiniGrid-Empty-6x6-v0"),), description="t")
    monkeypatch.setitem(suites.SUITES, "tiny-test", tiny)
    out = tmp_path / "transfer"
    args = ["transfer", "tiny-test", *TINY, "train.total_steps=64", f"train.device={device}"]
    assert main([*args, "--episodes", "2", "--out", str(out)]) == 0
    assert len((out / "table.csv").read_text().splitlines()) == 2


# ----------------------------------------------------------------------------- commands
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("devices") / "run"
    train(tiny_config("train.total_steps=64"), run)
    return run


def test_evaluate_runs_on_each_device(device, trained_run, capsys):
    args = ["evaluate", str(trained_run), "--episodes", "3", "--device", device, "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 3


def test_evaluate_gives_the_same_episodes_on_each_device(device, trained_run, capsys):
    """Greedy actions: the episodes depend on the weights only, not on the device."""
    results = []
    for where in ("cpu", device):
        args = ["evaluate", str(trained_run), "--episodes", "4", "--argmax", "--json"]
        assert main([*args, "--device", where]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["mean_length"] == results[1]["mean_length"]


def test_visualize_runs_on_each_device(device, trained_run, tmp_path, capsys):
    gif = tmp_path / "agent.gif"
    args = ["visualize", str(trained_run), "--gif", str(gif), "--episodes", "1"]
    assert main([*args, "--device", device]) == 0
    assert gif.stat().st_size > 0


def test_unavailable_device_is_a_one_line_error(trained_run, capsys):
    for args in (
        ["evaluate", str(trained_run), "--device", "tpu"],
        ["visualize", str(trained_run), "--gif", "x.gif", "--device", "tpu"],
        ["bench", "cores", "--quick", "--cores", "lstm", "--device", "tpu"],
    ):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "unknown device 'tpu'" in err and "cpu" in err


def test_memory_probe_runs_on_each_device(device):
    """The memory probe builds its policy as `memcores train` would (train.device) and feeds
    it observations, states and labels on that device, in both modes."""
    from memcores.experiments.bench import memory_probe

    torch.manual_seed(0)
    overrides = ["env.kwargs.distractor_steps=1", f"train.device={device}"]
    policy, env = memory_probe._policy_and_env(None, PASSIVE, overrides)
    assert policy.device.type == device
    scores = memory_probe.decode(policy, env, episodes=20)
    assert len(scores) > 2 and all(0.0 <= s <= 1.0 for s in scores)
    accuracies = memory_probe.supervised(policy, env, episodes=16, updates=1)
    assert len(accuracies) == 1


def test_sb3_policy_learns_and_acts_on_each_device(device):
    model = sb3_recurrent_ppo("gru", n_steps=16, device=device)  # packed (h, c) state
    model.learn(32)
    adapter = model.policy.lstm_actor
    assert all(p.device.type == device for p in adapter.parameters())
    actions, state = model.predict(model.get_env().reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,) and state[0].shape == (1, 2, adapter.hidden_size)
    model.get_env().close()


def test_bench_cores_runs_on_each_device(device, capsys):
    args = ["bench", "cores", "--quick", "--cores", "lstm,gru", "--device", device]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"device {device}" in out and "nn.LSTM" in out and "gru" in out
