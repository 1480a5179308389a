"""Batched POPGym card games (envs/batched_popgym.py): step-for-step parity with POPGym 1.0.7
as memcores wraps it (envs/popgym_env.py), at every difficulty."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from memcores.envs import make_env
from memcores.envs.batched import random_words
from memcores.envs.batched_popgym import (
    BATCHED_POPGYM,
    BatchedAutoencode,
    BatchedCountRecall,
    BatchedMineSweeper,
    BatchedNoisyPositionOnlyCartPole,
    BatchedRepeatPrevious,
)
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
    # the pool of next episodes may wait for exactly this long: every episode lasts it
    assert batched.min_episode_length == length


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


# --------------------------------------------------------------------------- own draws and rules
# What the parity tests above never reach: they load POPGym's state into a row, so the batched
# env's own draws, its constructors' defaults and options, and its edge cases are pinned here.
EASY_CLASSES = {
    "popgym/RepeatPreviousEasy-v0": BatchedRepeatPrevious,
    "popgym/AutoencodeEasy-v0": BatchedAutoencode,
    "popgym/CountRecallEasy-v0": BatchedCountRecall,
    "popgym/NoisyPositionOnlyCartPoleEasy-v0": BatchedNoisyPositionOnlyCartPole,
    "popgym/MineSweeperEasy-v0": BatchedMineSweeper,
}


def play(env, steps: int, seed: int = 0) -> list[torch.Tensor]:  # noqa: ANN001
    """Reset ``env`` at ``seed`` and step it with fixed random actions; returns every
    observation vector, reward, done and success, in order (cloned)."""
    n, n_actions = env.num_envs, int(env.single_action_space.n)
    generator = torch.Generator().manual_seed(seed)
    out = [env.reset(seed=seed)["vector"].clone()]
    for _ in range(steps):
        actions = torch.randint(0, n_actions, (n,), generator=generator, device="cpu")
        obs, reward, done, success = env.step(actions.to(env.device))
        out += [obs["vector"].clone(), reward.clone(), done.clone(), success.clone()]
    return out


@pytest.mark.parametrize("env_id", list(EASY_CLASSES))
def test_a_batched_popgym_class_defaults_to_the_easy_env_on_the_cpu(env_id: str) -> None:
    """Each class built with its defaults alone is POPGym's Easy env on the CPU without the
    previous reward: the same observations (of the Easy size), rewards and dones as the
    registry's Easy id, step for step over an auto-reset."""
    env = EASY_CLASSES[env_id](3)
    assert env.device == torch.device("cpu") and env.prev_reward is False
    easy = make_batched_env(env_id, 3)
    assert env.single_observation_space == easy.single_observation_space
    mine = play(env, 60)
    theirs = play(easy, 60)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_make_batched_popgym_passes_easy_options_and_refuses_the_others() -> None:
    """An Easy id takes its class's own options (as POPGym's constructor does) and
    ``prev_reward`` is off unless asked; another difficulty refuses game options, and an
    option the class does not take is refused naming the id and every option given."""
    env = make_batched_env("popgym/RepeatPreviousEasy-v0", 2, env_kwargs={"k": 2, "num_decks": 2})
    assert (env.k, env.n_cards, env.min_episode_length) == (2, 104, 103)
    plain = make_batched_env("popgym/RepeatPreviousEasy-v0", 2)
    assert plain.prev_reward is False
    assert plain.reset(seed=0)["vector"].shape == (2, 4 + 4 + 1)  # suit, action, first flag
    with pytest.raises(
        ValueError,
        match=r"^'popgym/RepeatPreviousMedium-v0' takes no options but prev_reward, got "
        r"\['k', 'num_decks'\]$",
    ):
        make_batched_env("popgym/RepeatPreviousMedium-v0", 2, env_kwargs={"num_decks": 1, "k": 3})
    with pytest.raises(
        ValueError,
        match=r"^bad options for 'popgym/CountRecallEasy-v0' \['bogus', 'prev_reward'\]: "
        r".*got an unexpected keyword argument 'bogus'$",
    ):
        make_batched_env(
            "popgym/CountRecallEasy-v0", 2, env_kwargs={"prev_reward": True, "bogus": 1}
        )


def test_a_game_option_outside_popgyms_choices_is_refused_with_the_choices() -> None:
    """CountRecall's ``deck_type`` and MineSweeper's ``difficulty`` name the valid values."""
    with pytest.raises(
        ValueError, match=r"^deck_type must be one of colors, suits, ranks, got 'cards'$"
    ):
        BatchedCountRecall(2, deck_type="cards")
    with pytest.raises(
        ValueError, match=r"^difficulty must be one of easy, medium, hard, got 'extreme'$"
    ):
        BatchedMineSweeper(2, difficulty="extreme")


def all_tensors(env) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Every tensor ``env`` holds: state, pool of next episodes, observation, outputs."""
    named = {f"state.{k}": v for k, v in env.state.items()}
    named |= {f"next.{k}": v for k, v in env._next.items()}
    named |= {f"obs.{k}": v for k, v in env.obs.items()}
    return named | {f"out.{k}": v for k, v in env._out.items()}


@pytest.mark.parametrize("env_id", list(BATCHED_POPGYM))
def test_every_tensor_lives_on_the_envs_device_whatever_torchs_default(env_id: str) -> None:
    """A CPU env stepped while torch's default device is another one (here ``meta``, as a
    policy's ``torch.set_default_device("cuda")`` would) keeps every tensor on the CPU and
    plays exactly as without it; an env built on another device (``meta``) holds all its
    tensors there."""
    reference = play(make_batched_env(env_id, 3), 25)
    with torch.device("meta"):
        env = make_batched_env(env_id, 3, device="cpu")
        played = play(env, 25)
    assert {t.device.type for t in all_tensors(env).values()} == {"cpu"}
    for a, b in zip(played, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    meta = make_batched_env(env_id, 3, device="meta")
    assert meta.device == torch.device("meta")
    meta.reset(seed=0)
    meta.step(torch.zeros(3, dtype=torch.int64, device="meta"))
    where = {name: t.device.type for name, t in all_tensors(meta).items()}
    assert set(where.values()) == {"meta"}, where


STATE_DTYPES = {
    "first": torch.bool,
    "last_action": torch.int64,
    "last_reward": torch.float32,
    "deal": torch.int64,
    "h": torch.int64,
    "watch": torch.bool,
    "shown": torch.bool,
    "values": torch.int64,
    "queries": torch.int64,
    "counts": torch.int64,
    "phys": torch.float64,  # gymnasium's physics, bit for bit
    "t": torch.int64,
    "hidden": torch.int64,
    "neighbours": torch.int64,
}


@pytest.mark.parametrize("env_id", list(BATCHED_POPGYM))
def test_the_state_keeps_its_dtypes_and_the_observation_is_float32(env_id: str) -> None:
    """Cards, counts, boards and step counters are int64 (exact, usable as indices), the
    cart-pole's physics float64 and its noisy view float32 (POPGym's observation dtype), in
    the state and in the pool alike; the observation vector is float32 with or without the
    previous reward."""
    env = make_batched_env(env_id, 2)
    play(env, 3)
    seen = torch.float32 if "CartPole" in env_id else torch.int64
    expected = STATE_DTYPES | {"seen": seen}
    for pool in (env.state, env._next):
        assert {k: v.dtype for k, v in pool.items()} == {k: expected[k] for k in pool}
    assert env.obs["vector"].dtype == torch.float32
    assert env.single_observation_space["vector"].dtype == np.float32


def chi2_independent(table: torch.Tensor) -> float:
    """Pearson's statistic of a contingency ``table`` against independence of its axes."""
    table = table.double()
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


def test_count_recall_deals_values_and_queries_from_two_independent_decks() -> None:
    """CountRecallEasy's first dealt colour and first queried colour, over 4,000 own
    resets: each colour about half the time, and the two independent (chi-square, 1 degree
    of freedom, p = 0.001), not one deck read twice."""
    n = 4000
    obs = make_batched_env("popgym/CountRecallEasy-v0", n).reset(seed=0)["vector"]
    value, query = obs[:, 0:2].argmax(1), obs[:, 2:4].argmax(1)
    table = torch.bincount(value * 2 + query, minlength=4).view(2, 2)
    assert chi2_independent(table) < 10.83
    assert abs(value.double().mean().item() - 0.5) < 0.03
    assert abs(query.double().mean().item() - 0.5) < 0.03


def test_count_recall_ranks_counted_by_hand_pay_exactly_plus_and_minus_one() -> None:
    """CountRecallHard (4 decks, 13 ranks, 207 steps) from its own deals: each rank is dealt
    and queried 16 times per episode (the last card's 15 times before the next episode's
    first observation); answering each query with the count of that rank among the ranks
    shown so far (counted from the observations) earns 207 x 1/207 = 1, and answering
    another count earns -1; both episodes end at step 207."""
    n = 3
    env = make_batched_env("popgym/CountRecallHard-v0", n)
    obs = env.reset(seed=4)["vector"]
    for offset, total in ((0, 1.0), (1, -1.0)):
        counts = torch.zeros(n, 13, dtype=torch.int64)
        queried = torch.zeros(n, 13, dtype=torch.int64)
        returns = torch.zeros(n, dtype=torch.float64)
        for step in range(1, 208):
            value, query = obs[:, :13].argmax(1), obs[:, 13:26].argmax(1)
            counts[torch.arange(n), value] += 1
            queried[torch.arange(n), query] += 1
            answer = (counts[torch.arange(n), query] + offset) % 17  # 17 actions
            obs, reward, done, success = env.step(answer)
            obs = obs["vector"]
            returns += reward.double()
            assert done.tolist() == [step == 207] * n, step
            assert not success.any()
        # 207 of the 208 cards are shown (the last step shows the next deal's first)
        assert counts.sort(1).values.tolist() == [[15] + [16] * 12] * n
        assert queried.sort(1).values.tolist() == [[15] + [16] * 12] * n
        assert returns.tolist() == pytest.approx([total] * n, abs=1e-4)


POLE = "popgym/NoisyPositionOnlyCartPoleEasy-v0"
THETA = 12 * 2 * math.pi / 360
"""The pole angle past which an episode ends: 12 degrees, in radians (gymnasium's)."""


def box_muller(env, t: torch.Tensor) -> np.ndarray:  # noqa: ANN001
    """The documented noise of step ``t`` (0: the reset) of every env, by hand in numpy:
    Box-Muller of the random words of slots ``8 + 4t .. 8 + 4t + 3``, times sigma."""
    u = random_words(env.keys, env.episodes, 4, 8 + 4 * t).double().numpy()
    normal = np.sqrt(-2.0 * np.log1p(-u[:, :2])) * np.cos(2 * np.pi * u[:, 2:])
    return (normal * env.noise_sigma).astype(np.float32)


def test_cart_pole_noise_is_drawn_fresh_at_every_step_from_its_own_slots() -> None:
    """Over 2,000 own episodes: the observation at each of the first steps is the float32
    cart position and pole angle plus that step's Box-Muller noise (by hand), clipped; the
    noise has sigma 0.1, and is uncorrelated between the two components and between
    successive steps (|r| < 0.09, 4 standard errors)."""
    n = 2000
    env = make_batched_env(POLE, n)
    env.reset(seed=6)
    high = np.array([4.8, 2 * THETA], np.float32)
    noises = []
    actions = torch.arange(n) % 2
    for step in range(5):
        if step:
            env.step(actions)
        assert env.state["t"].eq(step).sum() > n - 50  # a few episodes may have ended
        noise = box_muller(env, env.state["t"])
        seen = env.state["phys"][:, 0::2].float().numpy() + noise
        expected = np.clip(seen, -high, high)
        np.testing.assert_allclose(env.obs["vector"][:, :2].numpy(), expected, rtol=0, atol=1e-6)
        noises.append(torch.from_numpy(noise).double())
    both = torch.cat(noises)
    assert abs(both.std().item() - 0.1) < 0.005 and abs(both.mean().item()) < 0.005
    pairs = [(a[:, 0], a[:, 1]) for a in noises]
    pairs += [
        (a[:, c], b[:, c]) for a, b in zip(noises[:-1], noises[1:], strict=True) for c in (0, 1)
    ]
    for a, b in pairs:
        assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.09


def test_cart_pole_observations_clip_at_twice_the_thresholds() -> None:
    """With noise far larger than the box (sigma 5 through the Easy id's own option), the
    observed cart position clips at exactly +-4.8 and the pole angle at +-24 degrees (as
    float32), each reached on both sides."""
    env = make_batched_env(POLE, 500, env_kwargs={"noise_sigma": 5.0})
    seen = [env.reset(seed=0)["vector"][:, :2].clone()]
    for _ in range(3):
        seen.append(env.step(torch.zeros(500, dtype=torch.int64))[0]["vector"][:, :2].clone())
    seen = torch.cat(seen)
    high = torch.tensor([4.8, 2 * THETA], dtype=torch.float32)
    assert torch.equal(seen.max(0).values, high) and torch.equal(seen.min(0).values, -high)
    inside = (seen.abs() < high).double().mean(0)
    assert (inside > 0.03).all() and (inside < 0.9).all()  # many clipped, not all


def test_cart_pole_ends_only_past_its_thresholds_and_times_out_at_200() -> None:
    """Hand cases loaded into rows: a cart exactly at x = +-2.4 or a pole exactly at 12
    degrees (moving nowhere) is still up after a step, as in gymnasium (ends when
    |x| > 2.4 or |theta| > 12 degrees); a cart a hair past 2.4 ends; a cart pushed on from
    2.4 ends the step after. Step 200 times out (not terminated), step 199 does not; every
    step pays 1/200; an ended row starts its next episode in the same step."""
    theta = THETA
    env = make_batched_env(POLE, 6)
    env.reset(seed=0)
    phys = torch.zeros(6, 4, dtype=torch.float64)
    phys[0, 0], phys[1, 0], phys[2, 2], phys[3, 2] = 2.4, -2.4, theta, -theta
    phys[4, 0], phys[4, 1] = 2.4, 1e-9  # x = 2.4 + 2e-11 after the step
    steps = torch.tensor([0, 0, 0, 0, 0, 198])
    env.load_rows(torch.arange(6), {"phys": phys, "t": steps})
    _, reward, done, success = env.step(torch.tensor([1, 0, 0, 0, 0, 0]))
    assert env.last_terminated.tolist() == [False, False, False, False, True, False]
    assert env.last_truncated.tolist() == [False] * 6
    assert reward.tolist() == [np.float32(1 / 200)] * 6 and not success.any()
    assert env.state["phys"][:4, 0::2].abs().tolist() == [[2.4, 0], [2.4, 0], [0, theta]] + [
        [0, theta]
    ]
    assert env.obs["vector"][:, 4].tolist() == [0, 0, 0, 0, 1, 0]  # the first-step flag
    assert env.state["t"].tolist() == [1, 1, 1, 1, 0, 199]
    _, reward, done, _ = env.step(torch.tensor([1, 0, 0, 0, 0, 0]))
    # pushed on past +-2.4 (rows 0, 1); the 12-degree pole falls on (row 2), the other is
    # pushed back up (row 3)
    assert env.last_terminated.tolist() == [True, True, True, False, False, False]
    assert env.last_truncated.tolist() == [False] * 5 + [True]
    assert done.tolist() == [True, True, True, False, False, True]
    assert reward.tolist() == [np.float32(1 / 200)] * 6
