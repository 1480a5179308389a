"""Passive / Active Visual Match as a batched torch env (:mod:`envs.batched`).

The same rules, observations and rewards as :class:`envs.memory_match.VisualMatchEnv` (read its
docstring for the task), for ``N`` envs in ``[N, ...]`` tensors. The state of env ``n``:

- ``rooms [N, 3 * (n * n + 1)]`` int32: the cue, distractor and reward rooms, cell ``(x, y)``
  at ``x * n + y`` holding MiniGrid's encoding as bytes (object index, colour index, state 0),
  then one unseen cell (zeros). Eating an apple writes an empty cell into the distractor room.
- ``starts [N, 3, 2]``: each room's entry pose ``(cell, heading)``;
- ``pos [N]`` (cell), ``dir [N]``, ``phase [N]`` (0, 1, 2 = cue, distractor, reward room),
  ``t [N]`` (MiniGrid's ``step_count``) and ``cue [N]`` (the cue colour's index).

**Observation without the occlusion pass.** A memory-match room is a rectangle of walls whose
interior holds only balls and apples, which MiniGrid lets the agent see through; its occlusion
pass (``Grid.process_vis``) then shows exactly the cells of the room that fall in the 7x7
window (the walls included) and nothing beyond them. So the observation is one gather from the
room through a table of (agent cell, heading) -> 49 room cells, with cells outside the room
read from the unseen cell. The parity tests check it against
the gymnasium env, step for step.

**Layouts drawn in batch.** Each reset draws the same distributions as the gymnasium env, from
:func:`envs.batched.random_words` instead of numpy's generator: Passive, a uniform agent pose
with the cue cell ``cue_distance`` ahead inside the room; Active, the first of
:data:`ACTIVE_TRIES` uniform (agent, ball, heading) draws with the ball out of view (the
gymnasium env tries up to 100; in a 7x7 room 53 % of the draws see the ball, so all
:data:`ACTIVE_TRIES` fail with a chance of 2e-9, in an 11x11 room far less); the distractor
room's agent cell, heading and apples; the reward room's colour order; the cue colour.
``reward_layout`` ``row`` and ``adjacent`` are supported; ``random`` (resampled until every
ball is reachable) is not.

The words of env ``i``'s episode ``e`` (``random_words(key_i, e, ...)``) are read in a fixed
order, so that a seed names the same episodes in every version: word 0 the cue colour; then the
cue room, Passive 3 words (heading, cell along it, cell across it), Active 4 per try (agent
cell, ball cell among the others, heading, one unread); the distractor room's agent cell and
heading, then one apple word per interior cell ``c = (1 + c % inner, 1 + c // inner)``; last
one word per colour, whose argsort is the reward room's colour order.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from minigrid.core.constants import COLOR_TO_IDX, DIR_TO_VEC, OBJECT_TO_IDX
from torch import Tensor

from memcores.envs.batched import BatchedEnv, random_words, uniform_int
from memcores.envs.memory_match import MISSION, PALETTE, VisualMatchEnv, _reveal_mission
from memcores.envs.observation import tokenize

VIEW = 7
"""MiniGrid's agent view size."""
ACTIVE_TRIES = 32
"""Draws of the Active cue room per reset (the first with the ball out of view is kept)."""

EMPTY, WALL, BALL, GOAL = (OBJECT_TO_IDX[k] for k in ("empty", "wall", "ball", "goal"))
GREY, GREEN = COLOR_TO_IDX["grey"], COLOR_TO_IDX["green"]
LEFT, RIGHT, FORWARD, PICKUP = 0, 1, 2, 3

_DIR_VEC = torch.tensor(np.asarray(DIR_TO_VEC), dtype=torch.int64)  # [4, 2] (dx, dy)


def _view_offsets() -> Tensor:
    """``[4, 7, 7, 2]``: world offset from the agent of view cell ``(i, j)`` per heading.

    MiniGrid's view puts the agent at ``(3, 6)`` facing up: cell ``(i, j)`` is ``6 - j`` cells
    ahead and ``i - 3`` cells to the right (``MiniGridEnv.get_view_coords``, inverted)."""
    i = torch.arange(VIEW).view(VIEW, 1)
    j = torch.arange(VIEW).view(1, VIEW)
    ahead, right = (VIEW - 1) - j, i - VIEW // 2
    out = torch.zeros(4, VIEW, VIEW, 2, dtype=torch.int64)
    for d in range(4):
        dx, dy = (int(v) for v in DIR_TO_VEC[d])
        rx, ry = -dy, dx
        out[d, ..., 0] = ahead * dx + right * rx
        out[d, ..., 1] = ahead * dy + right * ry
    return out


def memory_match_kwargs(env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The :class:`BatchedVisualMatch` options of registered id ``env_id`` plus ``env_kwargs``
    (validated by building the gymnasium env with them)."""
    from memcores.envs import MEMORY_MATCH_IDS

    entry, registered = MEMORY_MATCH_IDS[env_id]
    options = {**registered, **env_kwargs}
    try:
        probe = gym.make(env_id, **env_kwargs).unwrapped
    except TypeError as exc:
        raise ValueError(f"bad options for {env_id!r} {sorted(env_kwargs)}: {exc}") from exc
    options["active"] = probe.active  # the registered class's; the defaults follow from it
    probe.close()
    return options


class BatchedVisualMatch(BatchedEnv):
    """``N`` visual-match envs; options as :class:`envs.memory_match.VisualMatchEnv`.

    :raises ValueError: an invalid option (the gymnasium env's checks) or
        ``reward_layout="random"``.
    """

    def __init__(self, n_envs: int, device: torch.device | str = "cpu", **options: Any) -> None:
        super().__init__(n_envs, device)
        ref = VisualMatchEnv(**options)  # validates the options and fills the defaults
        if ref.reward_layout == "random":
            raise ValueError(
                "reward_layout 'random' has no batched version; use 'row' or 'adjacent' "
                "(or env.vector=sync)"
            )
        self.room_size, self.n_colors = ref.room_size, ref.n_colors
        self.cue_steps, self.distractor_steps = ref.cue_steps, ref.distractor_steps
        self.max_steps, self.active = ref.max_steps, ref.active
        self.apple_reward, self.apple_density = ref.apple_reward, ref.apple_density
        self.cue_distance, self.reward_layout = ref.cue_distance, ref.reward_layout
        self.reveal_cue = ref.reveal_cue
        self.memory_horizon = ref.memory_horizon
        self.min_episode_length = self.cue_steps + self.distractor_steps + 1
        self.single_observation_space = _space_of(ref)
        self.single_action_space = gym.spaces.Discrete(7)
        ref.close()
        n, dev = self.room_size, self.device
        self.cells = n * n + 1  # a room's cells, x * n + y, then one unseen cell
        self._dir_vec = _DIR_VEC.to(dev)
        self._step_of = (_DIR_VEC[:, 0] * n + _DIR_VEC[:, 1]).to(dev)  # [4] flat forward step
        self._view = _view_table(n).to(dev)  # [n * n * 4, 49]
        budget = self.max_steps - self.cue_steps - self.distractor_steps
        # Success reward by phase-3 action count k, computed in float64 as the gymnasium env.
        self._success_reward = torch.tensor(
            [1.0 - 0.9 * k / budget for k in range(budget + 2)], dtype=torch.float32, device=dev
        )
        missions = [_reveal_mission(c) if self.reveal_cue else MISSION for c in PALETTE]
        self._missions = torch.from_numpy(np.stack([tokenize(m) for m in missions])).to(dev)
        self._template = self._room_template(dev, with_balls=False)
        self._reward_room = self._room_template(dev, with_balls=True)
        self._empty_code = torch.tensor(EMPTY, dtype=torch.int32, device=dev)
        (rx, ry) = self._ball_cells()[1]
        self._reward_start = torch.tensor([rx * n + ry, 3], device=dev)  # (cell, heading up)

    # ------------------------------------------------------------------ layouts
    def _ball_cells(self) -> tuple[list[tuple[int, int]], tuple[int, int]]:
        """The reward room's ball cells (in colour-order slots) and the agent cell."""
        n, k = self.room_size, self.n_colors
        if self.reward_layout == "row":
            inner = n - 2
            xs = [1 + round(i * (inner - 1) / (k - 1)) for i in range(k)]
            return [(x, 1) for x in xs], (n // 2, n - 2)
        c = n // 2
        cells = [(c - 1, c), (c + 1, c)] if k == 2 else [(c - 1, c), (c, c - 1), (c + 1, c)]
        return cells, (c, c)

    def _room_template(self, dev: torch.device, with_balls: bool) -> Tensor:
        """``[cells]`` int32 codes of a walled room (the reward room's balls, colour 0)."""
        n = self.room_size
        room = torch.full((n, n), code(WALL, GREY), dtype=torch.int32)
        room[1:-1, 1:-1] = code(EMPTY, 0)
        if with_balls:
            for x, y in self._ball_cells()[0]:
                room[x, y] = code(BALL, 0)
        return torch.cat([room.flatten(), torch.zeros(1, dtype=torch.int32)]).to(dev)

    def _fresh(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        n, k, dev = self.room_size, self.n_colors, keys.device
        inner = n - 2
        n_cells = inner * inner
        m = keys.shape[0]
        cue_slots = 4 * ACTIVE_TRIES if self.active else 3
        u = random_words(keys, episodes, 1 + cue_slots + 2 + n_cells + k)
        u_cue, u_room = u[:, 0], u[:, 1 : 1 + cue_slots]
        u_dis = u[:, 1 + cue_slots : 3 + cue_slots + n_cells]
        u_order = u[:, 3 + cue_slots + n_cells :]
        rows = torch.arange(m, device=dev)

        # Cue room.
        cue = uniform_int(u_cue, k)
        agent, d, ball = self._cue_pose(u_room)
        cue_room = self._template.expand(m, -1).clone()
        cue_room[rows, ball[:, 0] * n + ball[:, 1]] = BALL + (cue.to(torch.int32) << 8)

        # Distractor room: agent cell and heading; apples on the other cells.
        cell = uniform_int(u_dis[:, 0], n_cells)
        d_agent = (1 + cell % inner) * n + 1 + cell // inner
        apples = u_dis[:, 2:] < self.apple_density  # [M, cells]: cell c = (1 + c % in, 1 + c // in)
        apples[rows, cell] = False
        distractor = self._template.expand(m, -1).clone()
        inside = distractor[:, : n * n].view(m, n, n)[:, 1:-1, 1:-1]  # [M, x, y]
        inside.copy_(torch.where(apples.view(m, inner, inner).transpose(1, 2), APPLE, EMPTY))

        # Reward room: the colours in shuffled order on the layout's ball cells.
        order = torch.argsort(u_order, dim=1).to(torch.int32)  # a uniform permutation per env
        reward_room = self._reward_room.expand(m, -1).clone()
        for slot, (x, y) in enumerate(self._ball_cells()[0]):
            reward_room[:, x * n + y] += order[:, slot] << 8

        starts = torch.stack(
            [
                torch.stack([agent[:, 0] * n + agent[:, 1], d], 1),
                torch.stack([d_agent, uniform_int(u_dis[:, 1], 4)], 1),
                self._reward_start.expand(m, 2),
            ],
            1,
        )  # [M, 3 rooms, (cell, heading)]
        zero = torch.zeros(m, dtype=torch.int64, device=dev)
        return {
            "rooms": torch.cat([cue_room, distractor, reward_room], 1),  # [M, 3 * cells]
            "starts": starts,
            "pos": starts[:, 0, 0].clone(),
            "dir": d,
            "phase": zero,
            "t": zero.clone(),
            "cue": cue,
        }

    def _cue_pose(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Agent cell ``[M, 2]``, heading ``[M]`` and ball cell ``[M, 2]`` of the cue room."""
        inner = self.room_size - 2
        if not self.active:
            # Uniform over (cell, heading) pairs with the cue cell inside: by symmetry each
            # heading has as many, so a uniform heading, then a uniform cell among its valid.
            c = self.cue_distance
            d = uniform_int(u[:, 0], 4)
            vec = self._dir_vec[d]  # [M, 2]
            along = 1 + uniform_int(u[:, 1], inner - c)
            across = 1 + uniform_int(u[:, 2], inner)
            on_x = vec[:, 0] != 0
            shift = (vec.sum(1) < 0).to(torch.int64) * c  # heading left/up: start c further
            ax = torch.where(on_x, along + shift, across)
            ay = torch.where(on_x, across, along + shift)
            agent = torch.stack([ax, ay], 1)
            return agent, d, agent + c * vec
        # Active: ACTIVE_TRIES draws of (agent cell, another cell for the ball, heading).
        n_cells = inner * inner
        u = u.view(-1, ACTIVE_TRIES, 4)
        a = uniform_int(u[..., 0], n_cells)
        b = uniform_int(u[..., 1], n_cells - 1)
        b = b + (b >= a).to(torch.int64)
        d = uniform_int(u[..., 2], 4)
        agent = torch.stack([1 + a % inner, 1 + a // inner], -1)  # [M, tries, 2]
        ball = torch.stack([1 + b % inner, 1 + b // inner], -1)
        rel = ball - agent
        vec = self._dir_vec[d]
        ahead = (rel * vec).sum(-1)
        right = rel[..., 0] * -vec[..., 1] + rel[..., 1] * vec[..., 0]
        seen = (ahead >= 0) & (ahead < VIEW) & (right.abs() <= VIEW // 2)
        # The first unseen try (the last try if all are seen, as the gymnasium env's last).
        tries = torch.arange(ACTIVE_TRIES, 0, -1, device=u.device)
        score = (~seen).to(torch.int64) * tries
        pick = torch.where(score.amax(1) > 0, score.argmax(1), ACTIVE_TRIES - 1)
        rows = torch.arange(u.shape[0], device=u.device)
        return agent[rows, pick], d[rows, pick], ball[rows, pick]

    # ------------------------------------------------------------------ dynamics
    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        s = self.state  # written in place (a recorded step replays on the same storage)
        phase, pos, d, rooms = s["phase"], s["pos"], s["dir"], s["rooms"]
        fwd = pos + self._step_of[d]
        at = (phase * self.cells + fwd).unsqueeze(1)  # [N, 1] into rooms
        fwd_code = rooms.gather(1, at).squeeze(1)
        fwd_obj = fwd_code & 0xFF
        touches = (actions == FORWARD) | (actions == PICKUP)
        eat = touches & (fwd_obj == GOAL) & (phase == 1)
        choice = touches & (fwd_obj == BALL) & (phase == 2)
        # An eaten apple's cell becomes empty (a forward move then enters it).
        rooms.scatter_(1, at, torch.where(eat, self._empty_code, fwd_code).unsqueeze(1))
        acts = ~choice if self.active else ~choice & (phase != 0)  # Passive cue: frozen
        move = acts & (actions == FORWARD) & ((fwd_obj == EMPTY) | eat)
        turn = (actions == RIGHT).to(torch.int64) - (actions == LEFT).to(torch.int64)
        d = (d + turn * acts) % 4
        pos = torch.where(move, fwd, pos)
        t = s["t"].add_(1)
        truncated = (t >= self.max_steps) & ~choice
        success = choice & ((fwd_code >> 8) == s["cue"])
        k = (t - (self.cue_steps + self.distractor_steps)).clamp_(
            0, self._success_reward.numel() - 1
        )
        reward = self._success_reward[k] * success + eat * self.apple_reward
        # Phase changes: enter the next room at its start pose.
        enter = ((phase == 0) & (t == self.cue_steps)) | (
            (phase == 1) & (t == self.cue_steps + self.distractor_steps)
        )
        phase = phase + enter
        start = s["starts"].gather(1, phase.view(-1, 1, 1).expand(-1, 1, 2)).squeeze(1)
        s["pos"].copy_(torch.where(enter, start[:, 0], pos))
        s["dir"].copy_(torch.where(enter, start[:, 1], d))
        s["phase"].copy_(phase)
        return reward, choice, truncated, success

    def _observe(self) -> dict[str, Tensor]:
        s = self.state
        view = self._view.index_select(0, s["pos"] * 4 + s["dir"])
        view += (s["phase"] * self.cells).unsqueeze(1)
        codes = s["rooms"].gather(1, view)  # [N, 49] int32: object | colour << 8
        image = codes.view(torch.uint8).view(-1, VIEW, VIEW, 4)[..., :3].contiguous()
        if self.reveal_cue:
            mission = self._missions.index_select(0, s["cue"])
        else:  # one mission for every env: a broadcast view, no copy
            mission = self._missions[0].expand(self.num_envs, -1)
        return {"image": image, "direction": s["dir"].clone(), "mission": mission}


def code(obj: int, color: int) -> int:
    """A cell's int32 code: MiniGrid's (object, colour, state 0) bytes, little-endian."""
    return obj | color << 8


APPLE = code(GOAL, GREEN)


def _view_table(n: int) -> Tensor:
    """``[n * n * 4, 49]`` int64: for agent cell ``x * n + y`` and heading ``d`` (row
    ``cell * 4 + d``), the room cell each view cell shows, or the unseen cell ``n * n`` where
    the view leaves the room."""
    offsets = _view_offsets()  # [4, 7, 7, 2]
    xy = torch.cartesian_prod(torch.arange(n), torch.arange(n))  # [n * n, 2]: cell x * n + y
    cells = xy.view(n * n, 1, 1, 1, 2) + offsets.unsqueeze(0)  # [n*n, 4, 7, 7, 2]
    x, y = cells[..., 0], cells[..., 1]
    inside = (x >= 0) & (x < n) & (y >= 0) & (y < n)
    return torch.where(inside, x * n + y, n * n).view(n * n * 4, VIEW * VIEW)


def _space_of(env: VisualMatchEnv) -> gym.spaces.Dict:
    """The observation space :func:`envs.make_env` gives ``env`` (image, direction, mission)."""
    from memcores.envs.observation import MAX_MISSION_LEN, VOCAB_SIZE

    return gym.spaces.Dict(
        {
            "image": env.observation_space["image"],
            "direction": gym.spaces.Discrete(4),
            "mission": gym.spaces.Box(0, VOCAB_SIZE - 1, shape=(MAX_MISSION_LEN,), dtype=np.int64),
        }
    )
