"""Batched POPGym card games (envs/batched_popgym.py): step-for-step parity with POPGym 1.0.7
as memcores wraps it (envs/popgym_env.py), at every difficulty."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs import make_env
from envs.batched import make_batched_env
from envs.batched_popgym import BATCHED_POPGYM
from tests.batched_helpers import card_game_state


@pytest.mark.parametrize("env_id", list(BATCHED_POPGYM))
@pytest.mark.parametrize("prev_reward", [False, True])
def test_batched_popgym_steps_as_popgym(env_id, prev_reward):
    """From POPGym's exact deal (the shuffled decks) the batched row returns the same vector
    observations, rewards and terminations over whole episodes; at each reset the row is
    loaded with POPGym's next deal."""
    kwargs = {"prev_reward": prev_reward}
    gym_env = make_env(env_id, seed=4, **kwargs)
    batched = make_batched_env(env_id, 3, env_kwargs=kwargs)
    batched.reset(seed=9)
    n_actions = int(batched.single_action_space.n)
    assert batched.single_observation_space == gym_env.observation_space
    assert n_actions == gym_env.action_space.n
    rng = np.random.default_rng(1)
    episodes, nonzero, steps = 0, 0, 0
    while episodes < 2:
        obs, _ = gym_env.reset()
        batched.load_rows(torch.tensor([1]), card_game_state(gym_env.unwrapped))
        batched.obs = batched._observe()
        done = False
        while not done:
            np.testing.assert_array_equal(batched.obs["vector"][1].numpy(), obs["vector"])
            action = int(rng.integers(n_actions))
            obs, reward, terminated, truncated, _ = gym_env.step(action)
            actions = torch.from_numpy(rng.integers(0, n_actions, size=3))
            actions[1] = action
            _, b_reward, b_done, b_success = batched.step(actions)
            done = terminated or truncated
            assert b_reward[1].item() == np.float32(reward), (episodes, steps)
            assert b_done[1].item() == done and not b_success[1].item()
            nonzero += reward != 0
            steps += 1
        episodes += 1
    assert nonzero >= steps // 3


@pytest.mark.parametrize("env_id", list(BATCHED_POPGYM))
def test_batched_popgym_episodes_have_popgym_lengths(env_id):
    """Every env of a batched run ends its episodes after exactly POPGym's episode length
    (the batched env's own shuffles, over auto-resets)."""
    gym_env = make_env(env_id).unwrapped
    length = gym_env.max_episode_length
    batched = make_batched_env(env_id, 5)
    batched.reset(seed=0)
    done_at = []
    for t in range(1, 2 * length + 1):
        _, _, done, _ = batched.step(torch.zeros(5, dtype=torch.int64))
        if done.any():
            assert done.all()
            done_at.append(t)
    assert done_at == [length, 2 * length]
