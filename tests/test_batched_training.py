"""Training and evaluation with batched envs (env.vector=batched): the on-device rollout fills
the same buffer as the host loop, a short run trains, and a committed policy evaluates on the
batched env to its record's success."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents.episodes import EpisodeStats
from memcores.agents.evaluation import evaluate_policy, load_policy
from memcores.agents.networks import build_policy
from memcores.agents.policy import observation_shape
from memcores.agents.rl_trainer import train
from memcores.agents.rollout import RolloutBuffer, collect_with_returns, obs_shapes, start_rollouts
from memcores.envs.batched import BatchedEnv
from memcores.envs.batched_registry import batched_ids, make_batched_env

ENV = "memcores/PassiveVisualMatch-v0"
SHORT = {"distractor_steps": 3, "max_steps": 20}  # episodes of 9..20 steps
RECORD = Path(__file__).parent.parent / "results/pvm_diagnosis/pvm_recon_d30_s0"


class HostView:
    """A batched env behind the vector env's numpy API: what the host rollout loop reads."""

    def __init__(self, env: BatchedEnv) -> None:
        self.env, self.num_envs, self.groups = env, env.num_envs, env.groups
        self.single_observation_space = env.single_observation_space
        self._out = None

    @property
    def obs(self) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.env.obs.items()}

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        self.env.reset(seed)
        return self.obs

    def step_async(self, group: int, actions: np.ndarray) -> None:
        self._out = self.env.step(torch.from_numpy(np.asarray(actions)))

    def step_wait(self, group: int):  # noqa: ANN201
        obs, reward, done, success = self._out
        return obs, reward.double().numpy(), done.numpy(), success.numpy()


def _collect(envs, config) -> tuple[RolloutBuffer, EpisodeStats]:  # noqa: ANN001
    torch.manual_seed(0)
    space = envs.single_observation_space
    policy = build_policy(config, 7, observation_shape(space))
    carry = start_rollouts(policy, envs, seed=3, device=torch.device("cpu"))
    agent = config.agent
    buffer = RolloutBuffer(
        obs_shapes(space), agent.n_steps, envs.num_envs, agent.seq_len,
        policy.initial_state(envs.num_envs), torch.device("cpu"),
    )  # fmt: skip
    episodes = EpisodeStats(envs.num_envs)
    for _ in range(2):
        carry = collect_with_returns(policy, envs, buffer, carry, agent, episodes)
    return buffer, episodes


def test_device_rollout_fills_the_buffer_as_the_host_loop():
    """Same policy, same envs: the on-device loop and the host (numpy) loop store the same
    observations, actions, rewards, starts and returns, and count the same episodes."""
    config = tiny_config(f"env.id={ENV}", "agent.n_steps=48", "agent.seq_len=16")
    on_device, ep_device = _collect(make_batched_env(ENV, 4, env_kwargs=SHORT), config)
    on_host, ep_host = _collect(HostView(make_batched_env(ENV, 4, env_kwargs=SHORT)), config)
    for key in on_device.obs:
        assert torch.equal(on_device.obs[key], on_host.obs[key]), key
    for name in ("starts", "actions", "rewards", "values", "advantages", "returns"):
        assert torch.equal(getattr(on_device, name), getattr(on_host, name)), name
    assert on_device.starts.sum() >= 8  # episodes ended inside the rollouts
    assert list(ep_device.returns) == list(ep_host.returns) and len(ep_device.returns) >= 8
    assert list(ep_device.successes) == list(ep_host.successes)


def test_train_with_batched_envs(tmp_path):
    """``env.vector=batched`` trains end to end on the CPU: episodes are counted, losses are
    finite, and a second run with the same seed repeats the first exactly."""
    overrides = (
        f"env.id={ENV}", "env.vector=batched", "env.n_envs=4",
        "env.kwargs.distractor_steps=3", "env.kwargs.max_steps=20",
        "agent.n_steps=32", "agent.seq_len=16", "train.total_steps=256",
    )  # fmt: skip
    first = train(tiny_config(*overrides), tmp_path / "a")
    second = train(tiny_config(*overrides), tmp_path / "b")
    assert first.global_step == 256 and first.updates == 2
    assert math.isfinite(first.ep_rew_mean) and 0.0 <= first.success_rate <= 1.0
    for a, b in zip(first.history, second.history, strict=True):
        assert math.isfinite(a["train/policy_loss"]) and a["train/loss"] == b["train/loss"]


def test_batched_vector_refuses_envs_without_a_batched_version():
    with pytest.raises(ValueError, match="no batched version; batched ids: memcores/"):
        tiny_config("env.vector=batched")  # MiniGrid-Empty-5x5-v0


def test_committed_policy_scores_its_record_on_the_batched_env():
    """The committed Passive Visual Match policy's success on the batched env lies within
    three standard errors of the success its record reports on the gymnasium env."""
    record = json.loads((RECORD / "record.json").read_text())["eval"][ENV]
    policy, _ = load_policy(RECORD / "policy.pt")
    result = evaluate_policy(policy, ENV, episodes=400, n_envs=100, vector="batched")
    p = record["success"]
    se = math.sqrt(p * (1 - p) * (1 / record["episodes"] + 1 / result.episodes))
    assert result.episodes == 400
    assert abs(result.success_rate - p) <= 3 * se, (result.success_rate, p)


@pytest.mark.parametrize("env_id", batched_ids())
def test_batched_env_steps_on_another_device_without_the_host(env_id):
    """Every batched env, built on the CPU and moved to PyTorch's ``meta`` device (tensors
    without data: any op that mixes in a CPU tensor or needs the host fails), resets, steps,
    auto-resets and refills there with every row computed and masked, as on a GPU; nothing
    it returns or keeps is left on the CPU."""
    env = make_batched_env(env_id, 8).to("meta")
    assert not env.compact_resets
    env.reset(seed=0)
    for _ in range(2):
        obs, reward, done, success = env.step(torch.zeros(8, dtype=torch.int64, device="meta"))
    env._refill()
    kept = {**env.state, **env._next, **obs, "reward": reward, "done": done, "success": success}
    assert {k for k, v in kept.items() if v.device.type != "meta"} == set()


def test_evaluate_plays_a_batched_run_on_the_batched_env_by_default(tmp_path, monkeypatch, capsys):
    """``memcores evaluate`` steps a run's env as it trained (``env.vector=batched``), the
    gymnasium env for an id without a batched version, and ``--vector`` picks either; an id
    without a batched version under ``--vector batched`` is one line and exit code 2."""
    from memcores.agents import evaluation
    from memcores.experiments.cli import main

    overrides = (
        f"env.id={ENV}", "env.vector=batched", "env.n_envs=2", "env.kwargs.distractor_steps=3",
        "env.kwargs.max_steps=20", "agent.n_steps=32", "agent.seq_len=16",
        "train.total_steps=64",
    )  # fmt: skip
    run = str(train(tiny_config(*overrides), tmp_path / "run").run_dir)
    played = []
    real = evaluation.evaluate_policy
    monkeypatch.setattr(
        evaluation,
        "evaluate_policy",
        lambda *args, **kwargs: played.append((args[1], kwargs["vector"])) or real(*args, **kwargs),
    )
    assert main(["evaluate", run, "--episodes", "2", "--json"]) == 0
    assert main(["evaluate", run, "--episodes", "2", "--vector", "sync", "--json"]) == 0
    other = "MiniGrid-MemoryS7-v0"
    assert main(["evaluate", run, "--episodes", "1", "--env", other, "--json"]) == 0
    assert played == [(ENV, "batched"), (ENV, "sync"), (other, "sync")]
    capsys.readouterr()
    assert main(["evaluate", run, "--vector", "batched", "--env", other]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and other in err and "batched" in err, err


BATCHED_RECORDS = RECORD.parent.parent / "batched_envs"


@pytest.mark.parametrize("vector", ["sync", "batched"])
@pytest.mark.parametrize(
    "trial",
    [
        "pvm_recon_d30_batched_s0",
        "pvm_recon_d30_batched_n64_s0",
        "pvm_recon_d30_batched_n64_mb256_s0",
    ],
)
def test_the_policy_trained_on_batched_envs_re_evaluates_to_its_record(trial, vector):
    """The committed policies trained with ``env.vector=batched`` score exactly what their
    records say on the gymnasium env (``eval``) and on the batched env (``eval_batched``)."""
    from memcores.agents.evaluation import evaluate_run

    record = json.loads((BATCHED_RECORDS / trial / "record.json").read_text())
    expected = record["eval" if vector == "sync" else "eval_batched"][ENV]
    result = evaluate_run(BATCHED_RECORDS / trial / "policy.pt", ENV, 200, vector=vector)
    assert (result.episodes, result.success_rate) == (200, expected["success"])
    assert result.mean_return == pytest.approx(expected["return"], abs=1e-9)
