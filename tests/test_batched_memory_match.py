"""Batched visual-match envs (envs/batched_memory_match.py): step-for-step parity with the
gymnasium envs, the layouts they draw, and their seeding rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from memcores.envs import MEMORY_MATCH_IDS, make_env
from memcores.envs.batched_memory_match import BALL, GOAL, BatchedVisualMatch
from memcores.envs.batched_registry import make_batched_env
from tests.batched_helpers import load_row

# Forward-heavy random actions, so episodes reach the reward room's balls (choices, successes)
# and eat apples; every action, pickup/drop/toggle/done included, is drawn.
ACTION_P = np.array([0.15, 0.15, 0.45, 0.1, 0.05, 0.05, 0.05])
CHOICE_P = np.array([0.1, 0.1, 0.6, 0.1, 0.04, 0.03, 0.03])  # in the reward room

VARIANTS = [(env_id, {}) for env_id in MEMORY_MATCH_IDS] + [
    ("memcores/PassiveVisualMatch-v0", {"reward_layout": "adjacent", "cue_distance": 2}),
    ("memcores/PassiveVisualMatch-v0", {"n_colors": 2, "reveal_cue": True, "apple_reward": 0.0}),
    ("memcores/ActiveVisualMatch-v0", {"distractor_steps": 3, "max_steps": 40, "n_colors": 4}),
]


@pytest.mark.parametrize(("env_id", "kwargs"), VARIANTS)
def test_batched_env_steps_as_the_gymnasium_env(env_id, kwargs):
    """From the gymnasium env's exact state (rooms, poses, cue, step count), the batched env's
    row returns the same observations, rewards, terminations and successes on every step of
    whole episodes; at each reset the row is loaded with the gymnasium env's new episode."""
    steps = 1000
    gym_env = make_env(env_id, seed=5, **kwargs)
    batched = make_batched_env(env_id, 3, env_kwargs=kwargs)
    batched.reset(seed=11)
    obs, _ = gym_env.reset()
    load_row(batched, 1, gym_env.unwrapped)
    rng = np.random.default_rng(2)
    totals = {"episodes": 0, "successes": 0, "apples": 0, "truncated": 0}
    for _ in range(steps):
        for key, value in obs.items():
            np.testing.assert_array_equal(batched.obs[key][1].numpy(), np.asarray(value), key)
        action = int(rng.choice(7, p=CHOICE_P if gym_env.unwrapped.phase == 3 else ACTION_P))
        obs, reward, terminated, truncated, info = gym_env.step(action)
        actions = torch.from_numpy(rng.integers(0, 7, size=3))
        actions[1] = action
        _, b_reward, b_done, b_success = batched.step(actions)
        assert b_reward[1].item() == np.float32(reward)
        assert batched.last_terminated[1].item() == terminated
        assert batched.last_truncated[1].item() == truncated
        assert b_done[1].item() == (terminated or truncated)
        assert b_success[1].item() == (info["success"] and (terminated or truncated))
        totals["apples"] += 0 < reward < 0.1 + 1e-9 and not terminated
        if terminated or truncated:
            totals["episodes"] += 1
            totals["successes"] += info["success"]
            totals["truncated"] += truncated
            obs, _ = gym_env.reset()
            load_row(batched, 1, gym_env.unwrapped)
    assert totals["episodes"] >= 4 and totals["successes"] >= 1
    if kwargs.get("reward_layout") != "adjacent":  # there every episode ends in a choice
        assert totals["truncated"] >= 1
    if kwargs.get("apple_reward", 0.1) > 0:
        assert totals["apples"] >= 5


@pytest.mark.parametrize("compact", [True, False])
def test_env_i_depends_only_on_seed_plus_i(compact):
    """Env i's episodes come from ``seed + i`` alone: rows 0..3 of 4 envs seeded 10 match rows
    2..5 of 6 envs seeded 8, over resets, with row-wise or every-row regeneration."""
    small = make_batched_env("memcores/ActiveVisualMatch-v0", 4, env_kwargs={"distractor_steps": 5})
    large = make_batched_env("memcores/ActiveVisualMatch-v0", 6, env_kwargs={"distractor_steps": 5})
    large.compact_resets = compact
    small.reset(seed=10)
    large.reset(seed=8)
    rng = np.random.default_rng(0)
    dones = 0
    for _ in range(200):
        for key in small.obs:
            assert torch.equal(small.obs[key], large.obs[key][2:]), key
        actions = torch.from_numpy(rng.choice(7, size=6, p=ACTION_P))
        _, r_small, d_small, s_small = small.step(actions[2:])
        _, r_large, d_large, s_large = large.step(actions)
        assert torch.equal(r_small, r_large[2:]) and torch.equal(d_small, d_large[2:])
        assert torch.equal(s_small, s_large[2:])
        dones += int(d_small.sum())
    assert dones >= 8


def _fresh_states(env_id: str, n: int, **kwargs) -> tuple[BatchedVisualMatch, dict]:
    env = make_batched_env(env_id, n, env_kwargs=kwargs)
    env.reset(seed=0)
    return env, env.state


def test_passive_cue_room_faces_the_ball_at_the_cue_distance():
    for distance in (1, 2):
        env, s = _fresh_states("memcores/PassiveVisualMatch-v0", 400, cue_distance=distance)
        ahead = s["pos"] + distance * env._step_of[s["dir"]]
        cell = s["rooms"].gather(1, ahead.unsqueeze(1)).squeeze(1)  # the cue room's cells
        assert ((cell & 0xFF) == BALL).all() and torch.equal((cell >> 8).long(), s["cue"])
        # Every heading and every cue colour occurs.
        assert set(s["dir"].tolist()) == {0, 1, 2, 3} and set(s["cue"].tolist()) == {0, 1, 2}


def test_active_cue_ball_starts_out_of_view():
    env, _ = _fresh_states("memcores/ActiveVisualMatch-Large-v0", 500)
    assert not (env.obs["image"][..., 0] == BALL).any()
    cue_rooms = env.state["rooms"][:, : env.cells]
    assert ((cue_rooms & 0xFF) == BALL).sum() == 500  # one ball in each room


def test_distractor_apples_and_reward_row_follow_the_gymnasium_distributions():
    env, s = _fresh_states("memcores/PassiveVisualMatch-v0", 2000)
    rooms = s["rooms"].view(2000, 3, env.cells)
    apples = ((rooms[:, 1] & 0xFF) == GOAL).float()
    pos = s["starts"][:, 1, 0]
    assert (apples[torch.arange(2000), pos] == 0).all()  # none under the agent
    density = apples.sum(1) / 24  # 25 interior cells, one is the agent's
    assert abs(density.mean().item() - 0.3) < 0.01
    colors = (rooms[:, 2, [1 * 7 + 1, 3 * 7 + 1, 5 * 7 + 1]] >> 8).long()  # the far row's balls
    assert (colors.sort(1).values == torch.tensor([0, 1, 2])).all()
    # Each colour stands in each slot about a third of the time (uniform permutations).
    share = torch.stack([(colors == c).float().mean(0) for c in range(3)])
    assert (share - 1 / 3).abs().max() < 0.05


def test_bad_batched_options_are_clear():
    with pytest.raises(ValueError, match="no batched version.*batched ids") as error:
        make_batched_env("MiniGrid-MemoryS7-v0", 2)
    assert "batched ids: memcores/PassiveVisualMatch-v0, memcores/ActiveVisualMatch-v0, " in str(
        error.value
    )
    with pytest.raises(ValueError, match="reward_layout 'random'"):
        make_batched_env(
            "memcores/PassiveVisualMatch-v0", 2, env_kwargs={"reward_layout": "random"}
        )
    with pytest.raises(ValueError, match="bad options"):
        make_batched_env("memcores/PassiveVisualMatch-v0", 2, env_kwargs={"active": True})


def _random_policy_episodes(env, batched: bool, n_episodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns and successes of ``n_episodes`` episodes of forward-heavy random actions."""
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    running = np.zeros(env.num_envs)
    returns, successes = [], []
    while len(returns) < n_episodes:
        actions = rng.choice(7, size=env.num_envs, p=ACTION_P)
        _, reward, done, success = env.step(torch.from_numpy(actions) if batched else actions)
        reward, done, success = (np.asarray(x) for x in (reward, done, success))
        running += reward
        for i in np.flatnonzero(done):
            returns.append(running[i])
            successes.append(success[i])
            running[i] = 0.0
    return np.array(returns), np.array(successes, dtype=float)


@pytest.mark.parametrize(
    "env_id", ["memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0"]
)
def test_batched_layouts_score_as_the_gymnasium_layouts(env_id):
    """On their own layouts (not loaded ones) the batched envs give a random policy the same
    mean return (apples and choices) and success as the gymnasium envs, within 4 standard
    errors over 400 episodes each."""
    from memcores.envs.vector import VectorEnv

    gym_ret, gym_succ = _random_policy_episodes(VectorEnv(env_id, 32, seed=0), False, 400)
    b_ret, b_succ = _random_policy_episodes(make_batched_env(env_id, 32), True, 400)
    for a, b in ((gym_ret, b_ret), (gym_succ, b_succ)):
        se = np.sqrt(a.var() / a.size + b.var() / b.size)
        assert abs(a.mean() - b.mean()) <= 4 * se, (a.mean(), b.mean(), se)
