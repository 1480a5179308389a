"""The batched visual-match envs' own layouts (envs/batched_memory_match.py) against values
written out by hand, MiniGrid's own view rule and statistical tests. The parity tests load the
gymnasium env's layouts into a row, so they never reach what the batched env draws itself.

MiniGrid's codes, written out: objects unseen 0, empty 1, wall 2, ball 6, goal (an apple) 8;
colours red 0, green 1, blue 2, grey 5; headings 0 right, 1 down, 2 left, 3 up. Every check is
deterministic (fixed seeds); the statistical bounds are p = 0.001 tails.
"""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
from minigrid.core.world_object import Ball
from scipy import stats

from memcores.envs import make_env
from memcores.envs.batched import env_keys, random_words, uniform_int
from memcores.envs.batched_memory_match import ACTIVE_TRIES, BatchedVisualMatch
from memcores.envs.batched_registry import make_batched_env
from memcores.envs.memory_match import PHASE_REWARD, VisualMatchEnv
from memcores.envs.observation import MAX_MISSION_LEN, VOCAB_SIZE

PASSIVE, ACTIVE = "memcores/PassiveVisualMatch-v0", "memcores/ActiveVisualMatch-v0"
EMPTY, WALL, BALL, APPLE = 1, 2, 6, 8
WALL_CODE = WALL | 5 << 8  # grey
DIRS = [(1, 0), (0, 1), (-1, 0), (0, -1)]
LEFT, FORWARD = 0, 2
P_MIN = 0.001


def _rooms(env: BatchedVisualMatch) -> torch.Tensor:
    """``[N, 3, n, n]`` int64 cell codes of the cue, distractor and reward rooms, ``[.., x, y]``."""
    n = env.room_size
    rooms = env.state["rooms"].view(env.num_envs, 3, env.cells).long()
    return rooms[..., : n * n].view(env.num_envs, 3, n, n)


def _words(seed: int, n_envs: int, count: int) -> torch.Tensor:
    """``[n_envs, count]``: the words of every env's first episode."""
    return random_words(env_keys(seed, n_envs), torch.zeros(n_envs, dtype=torch.int64), count)


def _draw(word: torch.Tensor, n: int) -> int:
    return int(uniform_int(word.view(1), n))


def _in_view(env: VisualMatchEnv, agent: tuple[int, int], heading: int, ball: tuple[int, int]):
    """MiniGrid's own rule: is ``ball`` in the 7x7 view of ``agent`` facing ``heading``?"""
    env.agent_pos, env.agent_dir = agent, heading
    return env.in_view(*ball)


# --------------------------------------------------------------------------- the env itself
@pytest.mark.parametrize("env_id", [PASSIVE, "memcores/ActiveVisualMatch-Large-v0"])
def test_spaces_are_written_out_and_hold_every_observation(env_id):
    env = make_batched_env(env_id, 4)
    space = env.single_observation_space
    assert space == make_env(env_id).observation_space
    assert set(space.spaces) == {"image", "direction", "mission"}
    assert space["image"].shape == (7, 7, 3) and space["image"].dtype == np.uint8
    assert space["direction"] == gym.spaces.Discrete(4)
    mission = space["mission"]
    assert mission.shape == (MAX_MISSION_LEN,) and mission.dtype == np.int64
    assert (mission.low == 0).all() and (mission.high == VOCAB_SIZE - 1).all()
    assert env.single_action_space == gym.spaces.Discrete(7)
    env.reset(seed=0)
    for i in range(4):
        assert space.contains({key: value[i].numpy() for key, value in env.obs.items()})


def test_built_with_its_defaults_it_is_passive_on_the_cpu():
    env = BatchedVisualMatch(3)
    assert env.device == torch.device("cpu") and not env.active
    env.reset(seed=0)
    assert {value.device.type for value in env.obs.values()} == {"cpu"}


def test_the_random_reward_layout_is_refused_naming_the_alternatives():
    with pytest.raises(ValueError) as error:
        BatchedVisualMatch(2, reward_layout="random")
    assert str(error.value) == (
        "reward_layout 'random' has no batched version; use 'row' or 'adjacent' "
        "(or env.vector=sync)"
    )


@pytest.mark.parametrize(
    ("env_id", "kwargs", "horizon"),
    [
        (PASSIVE, {"distractor_steps": 4}, 6),  # distractor_steps + 2
        (ACTIVE, {"distractor_steps": 4}, 15 + 4),  # cue_steps (2 * 7 + 1) + distractor_steps
        ("memcores/PassiveVisualMatch-LongDelay-v0", {}, 122),
    ],
)
def test_memory_horizon_is_the_gymnasium_envs(env_id, kwargs, horizon):
    assert make_batched_env(env_id, 2, env_kwargs=kwargs).memory_horizon == horizon


def test_the_shortest_episode_is_min_episode_length_steps():
    """Adjacent layout: turning through the cue (5 steps) and distractor (4) rooms, then a step
    into the ball ahead ends every episode on step 10, paying 1 - 0.9 * 1 / 35 if right."""
    n_envs = 64
    env = make_batched_env(
        PASSIVE, n_envs, env_kwargs={"reward_layout": "adjacent", "distractor_steps": 4}
    )
    assert env.min_episode_length == 5 + 4 + 1
    env.reset(seed=0)
    cue = env.state["cue"].clone()
    front = (_rooms(env)[:, 2, 3, 2] >> 8).clone()  # the colour of the ball at (3, 2)
    for _ in range(9):
        _, _, done, _ = env.step(torch.full((n_envs,), LEFT))
        assert not done.any()
    _, reward, done, success = env.step(torch.full((n_envs,), FORWARD))
    assert done.all() and torch.equal(success, front == cue) and 0 < success.sum() < n_envs
    paid = torch.tensor(1 - 0.9 / 35, dtype=torch.float32)
    assert torch.equal(reward, torch.where(success, paid, torch.tensor(0.0)))


# --------------------------------------------------------------------------- rooms
@pytest.mark.parametrize(
    ("kwargs", "balls", "start"),
    [
        ({}, [(1, 1), (3, 1), (5, 1)], (3, 5)),  # x = 1 + round(i * 4 / 2)
        ({"n_colors": 4}, [(1, 1), (2, 1), (4, 1), (5, 1)], (3, 5)),  # 1 + round(i * 4 / 3)
        ({"room_size": 11}, [(1, 1), (5, 1), (9, 1)], (5, 9)),
        ({"reward_layout": "adjacent"}, [(2, 3), (3, 2), (4, 3)], (3, 3)),
        ({"reward_layout": "adjacent", "n_colors": 2}, [(2, 3), (4, 3)], (3, 3)),
        ({"reward_layout": "adjacent", "room_size": 9}, [(3, 4), (4, 3), (5, 4)], (4, 4)),
    ],
)
def test_rooms_are_walled_and_the_reward_room_is_laid_out_as_written(kwargs, balls, start):
    n_envs, n = 200, kwargs.get("room_size", 7)
    env = make_batched_env(PASSIVE, n_envs, env_kwargs=kwargs)
    env.reset(seed=1)
    rooms = _rooms(env)
    border = torch.ones(n, n, dtype=torch.bool)
    border[1:-1, 1:-1] = False
    assert (rooms[:, :, border] == WALL_CODE).all()
    assert (env.state["rooms"].view(n_envs, 3, env.cells)[..., -1] == 0).all()  # unseen cell
    inside = rooms[:, :, 1:-1, 1:-1]
    cue, distractor, reward = inside[:, 0], inside[:, 1], inside[:, 2]
    assert ((cue == EMPTY).sum((1, 2)) == (n - 2) ** 2 - 1).all()  # and the cue ball
    assert ((distractor == EMPTY) | (distractor == APPLE | 1 << 8)).all()  # green apples
    ball_cells = {(x, y) for x in range(n) for y in range(n) if (rooms[0, 2, x, y] & 0xFF) == BALL}
    assert ball_cells == set(balls)
    colours = torch.stack([rooms[:, 2, x, y] for x, y in balls], 1)
    assert ((colours & 0xFF) == BALL).all()
    assert torch.equal((colours >> 8).sort(1).values, torch.arange(len(balls)).expand_as(colours))
    assert ((reward == EMPTY).sum((1, 2)) == (n - 2) ** 2 - len(balls)).all()
    assert env.state["starts"][:, 2].tolist() == [[start[0] * n + start[1], 3]] * n_envs
    # the gymnasium env lays out the same cells and start pose
    gym_env = make_env(PASSIVE, seed=0, **kwargs).unwrapped
    gym_env.reset(seed=0)
    grid, pos, heading = gym_env._rooms[PHASE_REWARD]
    gym_balls = {(x, y) for x in range(n) for y in range(n) if isinstance(grid.get(x, y), Ball)}
    assert gym_balls == set(balls) and tuple(pos) == start and heading == 3


def test_the_reward_room_looks_as_written_from_its_entry_pose():
    """The row layout seen on entering (agent at (3, 5) facing up): view cell (i, j) shows room
    cell (i, j - 1); row j = 0 lies beyond the wall (unseen)."""
    env = make_batched_env(PASSIVE, 6)
    env.reset(seed=2)
    for _ in range(5 + env.distractor_steps):
        env.step(torch.full((6,), LEFT))
    colours = (_rooms(env)[:, 2, [1, 3, 5], 1] >> 8).tolist()
    for row in range(6):
        expected = np.zeros((7, 7, 3), np.uint8)
        for i, j in itertools.product(range(7), range(1, 7)):
            wall = i in (0, 6) or j == 1
            expected[i, j] = (WALL, 5, 0) if wall else (EMPTY, 0, 0)
        for x, colour in zip((1, 3, 5), colours[row], strict=True):
            expected[x, 2] = (BALL, colour, 0)
        np.testing.assert_array_equal(env.obs["image"][row].numpy(), expected)
        assert env.obs["direction"][row] == 3


# --------------------------------------------------------------------------- draws
@pytest.mark.parametrize("distance", [1, 2])
def test_passive_cue_poses_are_uniform_over_every_pose_facing_an_inside_cell(distance):
    n_envs = 16000
    env = make_batched_env(PASSIVE, n_envs, env_kwargs={"cue_distance": distance})
    env.reset(seed=3)
    cell, heading = env.state["starts"][:, 0, 0], env.state["starts"][:, 0, 1]
    poses = list(zip((cell // 7).tolist(), (cell % 7).tolist(), heading.tolist(), strict=True))
    valid = [
        (x, y, d)
        for x, y, (d, (dx, dy)) in itertools.product(range(1, 6), range(1, 6), enumerate(DIRS))
        if 1 <= x + distance * dx <= 5 and 1 <= y + distance * dy <= 5
    ]
    assert len(valid) == 4 * 5 * (5 - distance)
    assert set(poses) <= set(valid)
    index = {pose: k for k, pose in enumerate(valid)}
    counts = np.bincount([index[p] for p in poses], minlength=len(valid))
    assert stats.chisquare(counts).pvalue > P_MIN


def _active_picks(env: BatchedVisualMatch) -> list[tuple[int, int, int, int, int]]:
    """Each env's cue-room (agent x, agent y, heading, ball x, ball y)."""
    n = env.room_size
    cell, heading = env.state["starts"][:, 0, 0], env.state["starts"][:, 0, 1]
    cue_room = _rooms(env)[:, 0]
    ball = ((cue_room & 0xFF) == BALL).view(env.num_envs, -1).long().argmax(1)
    rows = [cell // n, cell % n, heading, ball // n, ball % n]
    return list(zip(*(r.tolist() for r in rows), strict=True))


def _unseen_triples(room_size: int) -> list[tuple[int, int, int, int, int]]:
    """Every (agent, heading, ball) of distinct inside cells whose ball MiniGrid does not show."""
    env = VisualMatchEnv(room_size=room_size, active=True)
    env.reset(seed=0)
    inside = range(1, room_size - 1)
    return [
        (ax, ay, d, bx, by)
        for ax, ay, bx, by in itertools.product(inside, repeat=4)
        if (ax, ay) != (bx, by)
        for d in range(4)
        if not _in_view(env, (ax, ay), d, (bx, by))
    ]


def test_active_cue_rooms_are_uniform_over_the_poses_that_hide_the_ball():
    n_envs = 30000
    env = make_batched_env(ACTIVE, n_envs)
    env.reset(seed=4)
    unseen = _unseen_triples(7)
    index = {triple: k for k, triple in enumerate(unseen)}
    picks = _active_picks(env)
    assert set(picks) <= set(index)
    counts = np.bincount([index[p] for p in picks], minlength=len(unseen))
    assert counts.min() > 0 and stats.chisquare(counts).pvalue > P_MIN


def test_active_cue_rooms_in_a_large_room_reach_balls_beyond_the_view():
    """An 11x11 room has balls 7 and 8 cells ahead, past the view's far edge: they are hidden and
    drawn as often as MiniGrid's rule says, binned by (cells ahead, within the view's width)."""
    n_envs = 12000
    env = make_batched_env("memcores/ActiveVisualMatch-Large-v0", n_envs)
    env.reset(seed=5)

    def band(triple: tuple[int, int, int, int, int]) -> tuple[int, bool]:
        ax, ay, d, bx, by = triple
        dx, dy = DIRS[d]
        ahead, right = (bx - ax) * dx + (by - ay) * dy, (bx - ax) * -dy + (by - ay) * dx
        return ahead, abs(right) <= 3

    unseen = _unseen_triples(11)
    bands = sorted({band(t) for t in unseen})
    expected = np.bincount([bands.index(band(t)) for t in unseen], minlength=len(bands))
    picks = _active_picks(env)
    assert set(picks) <= set(unseen)
    counts = np.bincount([bands.index(band(p)) for p in picks], minlength=len(bands))
    assert counts[bands.index((7, True))] > 0 and counts[bands.index((8, True))] > 0
    assert stats.chisquare(counts, expected * n_envs / expected.sum()).pvalue > P_MIN


def test_active_keeps_the_first_hidden_try_or_else_the_last_try():
    """Words written by hand: agent at (3, 3) and the ball at (3, 2), right ahead when facing up
    (seen) and behind when facing down (hidden). Row 0 hides it first on try 3 (then on 4 too);
    every try of row 1 sees it, the last with the ball at (3, 1)."""
    env = BatchedVisualMatch(2, active=True)  # 7x7: 25 inside cells, cell c = (1 + c % 5, ..)

    def word(k: int, n: int) -> float:
        return (k + 0.5) / n

    def attempt(ball: int, heading: int) -> list[float]:
        return [word(12, 25), word(ball, 24), word(heading, 4), 0.0]  # agent cell 12 = (3, 3)

    seen, hidden = attempt(7, 3), attempt(7, 1)  # cell 7 = (3, 2)
    row0 = [*seen * 3, *hidden, *attempt(0, 1), *seen * (ACTIVE_TRIES - 5)]
    row1 = [*seen * (ACTIVE_TRIES - 1), *attempt(2, 3)]  # cell 2 = (3, 1)
    agent, heading, ball = env._cue_pose(torch.tensor([row0, row1]))
    assert agent.tolist() == [[3, 3], [3, 3]]
    assert heading.tolist() == [1, 3] and ball.tolist() == [[3, 2], [3, 1]]


def test_a_resets_draws_are_independent_of_each_other():
    """Cue colour, cue heading, distractor cell and heading, an apple and the colour order come
    from their own words: uniform where they should be, and pairwise independent."""
    n_envs = 20000
    env = make_batched_env(PASSIVE, n_envs)
    env.reset(seed=6)
    s = env.state
    cue, cue_heading = s["cue"], s["starts"][:, 0, 1]
    cell, heading = s["starts"][:, 1, 0], s["starts"][:, 1, 1]
    inside = (cell // 7 - 1) + 5 * (cell % 7 - 1)  # the interior cell index c
    apple = (_rooms(env)[:, 1, 1, 1] & 0xFF) == APPLE  # cell (1, 1), c = 0
    first_colour = _rooms(env)[:, 2, 1, 1] >> 8
    assert stats.chisquare(torch.bincount(inside, minlength=25).numpy()).pvalue > P_MIN
    assert stats.chisquare(torch.bincount(heading, minlength=4).numpy()).pvalue > P_MIN
    free = inside != 0
    pairs = [
        (cue, cue_heading),
        (inside, heading),
        (heading[free], apple[free].long()),
        (cue, first_colour),
        (cue_heading, heading),
    ]
    for a, b in pairs:
        table = torch.zeros(int(a.max()) + 1, int(b.max()) + 1)
        table.index_put_((a, b), torch.ones(a.shape[0]), accumulate=True)
        assert stats.chi2_contingency(table.numpy()).pvalue > P_MIN


# --------------------------------------------------------------------------- the word order
def test_passive_layouts_are_read_from_their_words_in_the_documented_order():
    n_envs, seed, inner, c = 40, 7, 5, 2
    env = make_batched_env(PASSIVE, n_envs, env_kwargs={"cue_distance": c})
    env.reset(seed=seed)
    u = _words(seed, n_envs, 1 + 3 + 2 + 25 + 3)
    rooms = _rooms(env)
    for i in range(n_envs):
        w = u[i]
        d = _draw(w[1], 4)
        dx, dy = DIRS[d]
        along = 1 + _draw(w[2], inner - c) + (c if dx + dy < 0 else 0)
        across = 1 + _draw(w[3], inner)
        ax, ay = (along, across) if dx else (across, along)
        assert env.state["starts"][i, 0].tolist() == [ax * 7 + ay, d]
        assert rooms[i, 0, ax + c * dx, ay + c * dy] == BALL | _draw(w[0], 3) << 8
        _check_distractor_and_reward_room(env, i, w[4:])


def test_active_layouts_are_read_from_their_words_in_the_documented_order():
    n_envs, seed, inner = 40, 8, 5
    env = make_batched_env(ACTIVE, n_envs)
    env.reset(seed=seed)
    cue_words = 4 * ACTIVE_TRIES
    u = _words(seed, n_envs, 1 + cue_words + 2 + 25 + 3)
    ref = VisualMatchEnv(active=True)
    ref.reset(seed=0)
    picks = _active_picks(env)
    for i in range(n_envs):
        for attempt in u[i, 1 : 1 + cue_words].view(ACTIVE_TRIES, 4):
            a, b, d = _draw(attempt[0], 25), _draw(attempt[1], 24), _draw(attempt[2], 4)
            b += b >= a
            agent, ball = (1 + a % inner, 1 + a // inner), (1 + b % inner, 1 + b // inner)
            if not _in_view(ref, agent, d, ball):
                break
        assert picks[i] == (*agent, d, *ball)
        assert env.state["cue"][i] == _draw(u[i, 0], 3)
        _check_distractor_and_reward_room(env, i, u[i, 1 + cue_words :])


def _check_distractor_and_reward_room(env: BatchedVisualMatch, i: int, w: torch.Tensor) -> None:
    """Env ``i``'s distractor and reward rooms from their words ``w`` (agent cell, heading,
    25 apples, 3 colours), for a 7x7 room of density 0.3."""
    cell = _draw(w[0], 25)
    ax, ay = 1 + cell % 5, 1 + cell // 5
    assert env.state["starts"][i, 1].tolist() == [ax * 7 + ay, _draw(w[1], 4)]
    rooms = _rooms(env)
    for c in range(25):
        apple = c != cell and w[2 + c] < 0.3
        assert rooms[i, 1, 1 + c % 5, 1 + c // 5] == (APPLE | 1 << 8 if apple else EMPTY)
    order = sorted(range(3), key=lambda k: float(w[27 + k]))
    assert (rooms[i, 2, [1, 3, 5], 1] >> 8).tolist() == order
