"""POPGym as an RL env family: ids, vector observations, the policy's vector path, training,
evaluation and clean errors for what the agent cannot handle."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from rl_helpers import TINY, tiny_config

from memcores.agents.evaluation import evaluate_run
from memcores.agents.policy import RecurrentActorCritic, observation_shape
from memcores.agents.rl_trainer import CHECKPOINT_NAME, train
from memcores.envs import make_env
from memcores.envs.popgym_env import POPGYM_IDS, unsupported_reason
from memcores.envs.suites import SUITES, list_envs
from memcores.experiments.cli import main

DISCRETE = [i for i in POPGYM_IDS if unsupported_reason(i) is None]


def test_every_popgym_env_is_registered_and_listed() -> None:
    from popgym import envs as popgym_envs

    assert len(POPGYM_IDS) == len(popgym_envs.ALL) >= 42
    listed = dict(list_envs())
    for env_id in POPGYM_IDS:
        assert env_id in gym.registry and env_id in listed
    assert "unsupported: continuous actions" in listed["popgym/PositionOnlyPendulumEasy-v0"]
    assert "[suite: popgym]" in listed["popgym/RepeatPreviousEasy-v0"]
    assert len(DISCRETE) == len(POPGYM_IDS) - 6  # the six Pendulum envs


@pytest.mark.parametrize("env_id", DISCRETE)
def test_discrete_envs_give_vector_observations(env_id: str) -> None:
    env = make_env(env_id, seed=0)
    obs, _ = env.reset()
    assert set(obs) == {"vector"} and obs["vector"].dtype == np.float32
    assert env.observation_space.contains(obs)
    assert isinstance(env.action_space, gym.spaces.Discrete)
    for _ in range(3):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and np.isfinite(reward)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()


def test_vector_holds_previous_action_and_first_step_flag() -> None:
    """RepeatPreviousEasy: Discrete(4) card, Discrete(4) action, then the flag (and reward)."""
    env = make_env("popgym/RepeatPreviousEasy-v0", seed=0, prev_reward=True)
    first, _ = env.reset()
    vector = first["vector"]
    assert vector.shape == (4 + 4 + 1 + 1,)
    assert vector[:4].sum() == 1 and vector[4:8].sum() == 0 and vector[8] == 1
    obs, reward, *_ = env.step(2)
    vector = obs["vector"]
    assert vector[4:8].tolist() == [0, 0, 1, 0] and vector[8] == 0
    assert vector[9] == pytest.approx(reward)


def test_multidiscrete_actions_become_one_discrete() -> None:
    env = make_env("popgym/BattleshipEasy-v0", seed=0)
    env.reset()
    inner = env.unwrapped.action_space
    assert env.action_space.n == int(np.prod(inner.nvec))
    obs, *_ = env.step(int(env.action_space.n) - 1)  # the last cell: (n-1, n-1)
    size = int(np.sum(inner.nvec))  # one-hot per component, then the first-step flag
    prev_action = obs["vector"][-1 - size : -1]
    assert prev_action[inner.nvec[0] - 1] == 1 and prev_action[-1] == 1


def test_continuous_action_env_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="continuous action space") as info:
        make_env("popgym/PositionOnlyPendulumEasy-v0")
    assert "\n" not in str(info.value)


def test_unknown_popgym_id_suggests_close_ids() -> None:
    with pytest.raises(ValueError, match="popgym/RepeatPreviousEasy-v0"):
        make_env("popgym/RepeatPrevousEasy-v0")


def test_unsupported_observation_space_is_a_clear_error() -> None:
    space = gym.spaces.Dict({"pixels": gym.spaces.Box(0, 1, (3, 4))})
    with pytest.raises(ValueError, match="unsupported observation space"):
        observation_shape(space)
    assert observation_shape(gym.spaces.Dict({"vector": gym.spaces.Box(0, 1, (5,))})) == (5,)


def test_policy_reads_vector_observations() -> None:
    policy = RecurrentActorCritic(n_actions=3, core_name="min_gru", hidden_size=8, image_shape=(5,))
    assert policy.input_shape == (5,) and policy.image is None
    obs = {"vector": torch.randn(4, 2, 5)}
    starts = torch.zeros(4, 2, dtype=torch.bool)
    out = policy(obs, policy.initial_state(2), starts)
    assert out.logits.shape == (4, 2, 3) and out.values.shape == (4, 2)
    out.values.sum().backward()
    assert policy.vector.net[0].weight.grad.abs().sum() > 0


POPGYM_TINY = [
    "env.id=popgym/RepeatPreviousEasy-v0",
    "env.kwargs={}",
    "core.name=min_gru",
]


def test_popgym_env_trains_and_evaluates(tmp_path) -> None:
    run = tmp_path / "run"
    result = train(tiny_config(*POPGYM_TINY), run)
    assert result is not None
    payload = torch.load(run / CHECKPOINT_NAME, weights_only=True)
    assert payload["updates"] == 2 and payload["image_shape"] == [9]
    evaluated = evaluate_run(run, episodes=2)
    assert len(evaluated.returns) == 2 and all(-1.0 <= r <= 1.0 for r in evaluated.returns)


def test_visualize_says_popgym_envs_cannot_be_rendered(tmp_path, capsys) -> None:
    run, gif = tmp_path / "run", tmp_path / "agent.gif"
    train(tiny_config(*POPGYM_TINY, "train.total_steps=64"), run)
    assert main(["visualize", str(run), "--gif", str(gif), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "memcores visualize: error: env 'popgym/RepeatPreviousEasy-v0' cannot be rendered: "
        "POPGym envs draw no pictures; visualize records MiniGrid, BabyAI and memcores/* envs "
        "(evaluate scores any env)"
    ]
    assert not gif.exists()


def test_cli_refuses_continuous_actions_before_writing(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "experiments/configs/demo_rl.yaml", *TINY, f"run.dir={run}", "env.kwargs={}"]
    assert main([*args, "env.id=popgym/PositionOnlyPendulumEasy-v0"]) == 2
    err = capsys.readouterr().err
    assert "continuous action space" in err and "Traceback" not in err
    assert not run.exists()


def test_popgym_suite_pairs_are_trainable_ids() -> None:
    pairs = SUITES["popgym"].pairs
    assert {a for a, _ in pairs} >= {
        "popgym/RepeatPreviousEasy-v0",
        "popgym/AutoencodeEasy-v0",
        "popgym/CountRecallEasy-v0",
        "popgym/NoisyPositionOnlyCartPoleEasy-v0",
        "popgym/MineSweeperEasy-v0",
    }
    for a, b in pairs:
        assert a == b and unsupported_reason(a) is None


def test_cpu_sized_popgym_sweep_expands_into_valid_trainable_trials(tmp_path) -> None:
    """sweep_popgym_150k.yaml with the grid its header documents: 5 envs x 8 cores x 3 seeds,
    every trial a valid config on a trainable POPGym id, and its own run folder."""
    from memcores.agents.rl_config import RLConfig
    from memcores.experiments.config import load_config
    from memcores.experiments.sweep import make_trials
    from tests.rl_helpers import documented_grid

    config = "experiments/configs/sweep_popgym_150k.yaml"
    grid = documented_grid(config)
    assert [k for k, _ in grid] == ["env.id", "core.name", "train.seed"]
    command, trials = make_trials(config, grid, tmp_path / "sweep", results_dir=tmp_path / "res")
    assert command == "train" and len(trials) == 5 * 8 * 3
    assert len({t.run_dir for t in trials}) == len(trials)
    for trial in trials[::7]:
        rl = load_config(RLConfig, config, trial.overrides)
        assert unsupported_reason(rl.env.id) is None and rl.train.total_steps == 150_000
