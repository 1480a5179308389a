"""Batched POPGym card games (envs/batched_popgym.py): step-for-step parity with POPGym 1.0.7
as memcores wraps it (envs/popgym_env.py), at every difficulty."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from memcores.envs import make_env
from memcores.envs.batched_popgym import BATCHED_POPGYM
from memcores.envs.batched_registry import make_batched_env
from tests.batched_helpers import card_game_state, cart_pole_state, mine_sweeper_state

CARD_GAMES = [i for i in BATCHED_POPGYM if "CartPole" not in i and "MineSweeper" not in i]
CART_POLES = [i for i in BATCHED_POPGYM if "CartPole" in i]


def step_both(gym_env, batched, action: int, others: torch.Tensor) -> tuple:  # noqa: ANN001
    """Step ``gym_env`` and row 1 of ``batched`` (rows 0 and 2 take ``others``) with
    ``action``; assert equal rewards, terminations, time-outs and no success; returns
    ``(obs, reward, terminated, truncated)`` of ``gym_env``."""
    obs, reward, terminated, truncated, _ = gym_env.step(action)
    actions = torch.stack([others[0], torch.tensor(action), others[1]])
    _, b_reward, b_done, b_success = batched.step(actions)
    assert b_reward[1].item() == np.float32(reward)
    assert batched.last_terminated[1].item() == terminated
    assert batched.last_truncated[1].item() == truncated
    assert b_done[1].item() == (terminated or truncated) and not b_success[1].item()
    return obs, reward, terminated, truncated


@pytest.mark.parametrize("env_id", CARD_GAMES)
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
            others = torch.from_numpy(rng.integers(0, n_actions, size=2))
            obs, reward, terminated, truncated = step_both(gym_env, batched, action, others)
            done = terminated or truncated
            nonzero += reward != 0
            steps += 1
        episodes += 1
    assert nonzero >= steps // 3


@pytest.mark.parametrize("env_id", CARD_GAMES)
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


@pytest.mark.parametrize("env_id", CART_POLES)
@pytest.mark.parametrize("prev_reward", [False, True])
def test_batched_cart_pole_steps_as_popgym(env_id, prev_reward):
    """From POPGym's exact physical state, with the Gaussian noise POPGym draws on each step
    fed to the batched row, the float64 physics, clipping, rewards, terminations and
    time-outs agree exactly over whole episodes."""
    kwargs = {"prev_reward": prev_reward}
    gym_env = make_env(env_id, seed=7, **kwargs)
    inner = gym_env.unwrapped
    batched = make_batched_env(env_id, 3, env_kwargs=kwargs)
    batched.reset(seed=1)
    assert batched.single_observation_space == gym_env.observation_space
    rng = np.random.default_rng(3)
    lengths = []
    noise = torch.zeros(3, 2)
    batched._noise = lambda keys, episodes, t: noise[: keys.shape[0]]  # noqa: ARG005
    while len(lengths) < 4:
        obs, _ = gym_env.reset()
        batched.load_rows(torch.tensor([1]), cart_pole_state(inner, obs["vector"][:2]))
        batched.obs = batched._observe()
        done, steps = False, 0
        while not done:
            np.testing.assert_array_equal(batched.obs["vector"][1].numpy(), obs["vector"])
            # Balance the pole (episodes time out) or push at random (episodes end in a fall).
            _, _, theta, theta_dot = inner.state
            balance = int(theta + 0.5 * theta_dot > 0)
            action = balance if len(lengths) % 2 == 0 else int(rng.integers(2))
            draw = copy.deepcopy(inner.np_random).normal(0, inner.noise_sigma)
            noise[1] = torch.from_numpy(draw.astype(np.float32))
            obs, _, terminated, truncated = step_both(
                gym_env, batched, action, torch.tensor([0, 1])
            )
            done = terminated or truncated
            steps += 1
        lengths.append(steps)
    assert min(lengths) < 200 and max(lengths) == 200, lengths


MINE_SWEEPERS = [i for i in BATCHED_POPGYM if "MineSweeper" in i]


@pytest.mark.parametrize("env_id", MINE_SWEEPERS)
@pytest.mark.parametrize("prev_reward", [False, True])
def test_batched_mine_sweeper_steps_as_popgym(env_id, prev_reward):
    """From POPGym's exact board, the batched row gives the same observations (neighbour
    counts, the clicked row and column), rewards, terminations and time-outs over whole
    episodes that are won, lost on a mine and spent on tiles already seen."""
    kwargs = {"prev_reward": prev_reward}
    gym_env = make_env(env_id, seed=2, **kwargs)
    inner = gym_env.unwrapped
    batched = make_batched_env(env_id, 3, env_kwargs=kwargs)
    batched.reset(seed=5)
    assert batched.single_observation_space == gym_env.observation_space
    n_actions = int(batched.single_action_space.n)
    assert n_actions == gym_env.action_space.n
    rng = np.random.default_rng(0)
    outcomes = {"won": 0, "lost": 0, "repeats": 0}
    for episode in range(12):
        obs, _ = gym_env.reset()
        batched.load_rows(torch.tensor([1]), mine_sweeper_state(inner))
        batched.obs = batched._observe()
        done = False
        while not done:
            np.testing.assert_array_equal(batched.obs["vector"][1].numpy(), obs["vector"])
            clear = np.flatnonzero(inner.hidden_grid.reshape(-1) == 0)
            # Clear tiles only (won), mostly clear tiles, or any tile (mines, repeats).
            careful = rng.random() < (0.0, 1.0, 0.8)[episode % 3]
            action = int(rng.choice(clear)) if careful else int(rng.integers(n_actions))
            others = torch.tensor([0, n_actions - 1])
            obs, reward, terminated, truncated = step_both(gym_env, batched, action, others)
            done = terminated or truncated
            outcomes["repeats"] += reward < 0 and not terminated
        won = terminated and reward > 0
        outcomes["won" if won else "lost"] += terminated
    assert min(outcomes.values()) >= 1, outcomes


def test_batched_boards_and_poles_are_drawn_as_popgym_draws_them():
    """The batched envs' own resets: MineSweeper boards hold exactly the mines of their
    difficulty on distinct tiles, with neighbour counts as POPGym computes them; cart-poles
    start uniform in [-0.05, 0.05) with observation noise of the difficulty's sigma."""
    env = make_batched_env("popgym/MineSweeperMedium-v0", 500)
    env.reset(seed=0)
    hidden = env.state["hidden"].view(500, 6, 6).numpy()
    assert (hidden.sum((1, 2)) == 6).all()
    padded = np.pad(hidden, [(0, 0), (1, 1), (1, 1)])
    counts = sum(padded[:, 1 + i : 7 + i, 1 + j : 7 + j] for i in (-1, 0, 1) for j in (-1, 0, 1))
    np.testing.assert_array_equal(env.state["neighbours"].view(500, 6, 6).numpy(), counts)
    # Every tile is mined about as often (6 / 36 of the boards).
    assert abs(hidden.mean(0) - 1 / 6).max() < 0.06

    pole = make_batched_env("popgym/NoisyPositionOnlyCartPoleHard-v0", 4000)
    pole.reset(seed=0)
    phys = pole.state["phys"]
    assert phys.min() >= -0.05 and phys.max() < 0.05 and abs(phys.mean()) < 0.002
    noise = pole.state["seen"][:, 0] - phys[:, 0].float()  # the cart position is not clipped
    assert abs(noise.std().item() - 0.3) < 0.015 and abs(noise.mean().item()) < 0.015
