"""Passive / Active Visual Match: three-phase memory gridworlds on MiniGrid's API.

Gridworld versions of the DeepMind Lab "visual match" levels of Hung et al., "Optimizing
agent behavior over long time scales by transporting value" (Nature Communications 2019,
arXiv:1810.06721), which Gu et al., "Improving the Gating Mechanism of Recurrent Neural
Networks" (ICML 2020, arXiv:1910.09890) use for their RL experiments. One episode has three phases,
each in its own ``room_size`` x ``room_size`` walled room (the grid is swapped at a phase
change, like a teleport):

1. **Cue** (``cue_steps`` actions). A ball of the target colour (one of the first
   ``n_colors`` of :data:`PALETTE`) stands in the room.
   *Passive*: the agent starts facing the ball, on the cell next to it, and is frozen (every
   action is a no-op), so all ``cue_steps`` cue-phase observations show the ball.
   *Active*: ball and agent are placed at random, with the ball NOT visible from the start
   pose; the agent must explore to see it.
2. **Distractor** (``distractor_steps`` actions). A room in which each free cell holds an apple
   with probability ``apple_density``. Apples are MiniGrid ``goal`` tiles (green squares, never
   balls, the cue's kind); moving forward into one (or ``pickup`` while facing it) eats it and
   pays ``apple_reward`` (0 = no distractor reward). This phase is the memory delay.
3. **Reward** (until a choice or ``max_steps``). A room with one ball of each of the
   ``n_colors`` colours. ``reward_layout="row"`` (default) follows Hung et al.'s levels, where
   the colour squares stand in a row on one wall in shuffled order and the agent enters
   facing them: the balls stand in the room's far row, evenly spaced in shuffled colour order,
   and the agent starts in the middle of the near row facing them (the whole row is in view).
   ``reward_layout="random"`` puts the balls and the agent on random cells with a random
   heading, which adds a visual search conditioned on the remembered colour.
   ``reward_layout="adjacent"`` (at most 3 colours) puts the balls on the cells left of, in
   front of and right of the agent (left and right for 2 colours), in shuffled colour order:
   the choice is one or two actions (turn, then forward), as at the end of MiniGrid's Memory
   corridor, so phase 3 asks for the remembered colour and almost no navigation. Moving forward
   into a ball or ``pickup`` while facing it is the choice and ends the episode
   (``terminated``): the matching colour pays the
   success reward and sets ``info["success"] = True``, any other pays 0. If ``max_steps`` is
   reached first the episode is ``truncated`` (no success).

Phase transitions, exactly (``t`` = number of actions taken, MiniGrid's ``step_count``):
the observation from ``reset()`` and those returned by steps ``t = 1 .. cue_steps - 1`` are
cue-room views (``cue_steps`` observations); the step with ``t = cue_steps`` moves the agent to
the distractor room and returns its first view; steps ``t = cue_steps + 1 ..
cue_steps + distractor_steps - 1`` return distractor views (``distractor_steps`` in all); the
step ``t = cue_steps + distractor_steps`` moves the agent to the reward room. ``info["phase"]``
(1, 2, 3) is the phase of the returned observation. Apples are paid in phase 2 only; a choice is
possible in phase 3 only.

Rewards follow MiniGrid's convention of rewarding speed, counted from the start of phase 3
(the first two phases have fixed length): success reward ``1 - 0.9 * k / B`` where ``k`` is the
number of phase-3 actions including the choice and ``B = max_steps - cue_steps -
distractor_steps`` is the phase-3 budget (so it lies in ``[0.1, 1)``).

``reveal_cue=True`` is a no-memory control, not the task: the mission string names the cue
colour ("go to the red ball") on every step, so a policy that reads the mission needs no
memory. Comparing a run with it against one without separates "cannot remember the cue" from
"cannot learn to act on a colour" (docs/rl.md).

:attr:`VisualMatchEnv.memory_horizon` is the shortest truncated-BPTT window that can hold both
a step at which the cue is in view and the first step at which a choice is possible: Passive,
``distractor_steps + 2`` (from the last cue view); Active, ``cue_steps + distractor_steps`` (the
cue may be glimpsed only once, as early as the first step). With a shorter window the
choice's gradient can never reach the cue, so no core can learn the task; the RL trainer
refuses such a config (``agent.bptt_check``).

Nothing outside phase 1 depends on the cue: all three rooms are generated at ``reset`` and the
cue colour is drawn last, so for one seed, phase 2 and 3 observations are identical whatever
the cue (``reset(options={"cue_color": ...})`` forces it; the tests use this). Pickup, drop and
toggle never change the world (nothing can be carried from one phase to the next).
"""

from __future__ import annotations

from typing import Any

from minigrid.core.actions import Actions
from minigrid.core.constants import DIR_TO_VEC
from minigrid.core.grid import Grid
from minigrid.core.mission import MissionSpace
from minigrid.core.world_object import Ball, Goal
from minigrid.minigrid_env import MiniGridEnv

PALETTE: tuple[str, ...] = ("red", "green", "blue", "purple", "yellow", "grey")
"""Cue colours; an env with ``n_colors = k`` uses the first k."""

MISSION = "remember the cue object and go to the matching one"
"""Mission string (names no colour)."""

PHASE_CUE, PHASE_DISTRACTOR, PHASE_REWARD = 1, 2, 3

_DIRS: tuple[tuple[int, int], ...] = tuple((int(dx), int(dy)) for dx, dy in DIR_TO_VEC)
"""(dx, dy) of one step forward for each MiniGrid heading 0..3 (right, down, left, up)."""

REWARD_LAYOUTS: tuple[str, ...] = ("row", "adjacent", "random")
"""Phase-3 layouts: the balls in a row facing the agent, on the cells beside and in front of
the agent, or at random cells."""


def _reveal_mission(color: str) -> str:
    """The ``reveal_cue`` control's mission: it names the cue colour."""
    return f"go to the {color} ball"


class Apple(Goal):
    """Distractor reward: a green ``goal`` tile, eaten by walking into it (never a ball)."""


class VisualMatchEnv(MiniGridEnv):
    """Three-phase memory-matching gridworld (see the module docstring for the exact rules).

    :param room_size: side of each room including walls (>= 5); interior is ``room_size - 2``.
    :param n_colors: number of colours, 2 .. 6 (phase 3 shows each once).
    :param cue_steps: actions in phase 1 (default: 5 passive, ``2 * room_size + 1`` active).
    :param cue_distance: Passive: cells between the agent and the cue ball it faces (1 = the
        next cell). With 2 the cue appears in another cell of the egocentric view than a ball
        the agent faces when it chooses, so the cue and the choice are separate inputs.
    :param distractor_steps: actions in phase 2, the memory delay.
    :param apple_reward: reward per apple eaten in phase 2 (0 = none).
    :param apple_density: probability that a free distractor-room cell holds an apple.
    :param max_steps: episode limit (default ``cue_steps + distractor_steps + 5 * room_size``);
        must leave at least one phase-3 action.
    :param active: Active (explore to find the cue) instead of Passive (shown the cue).
    :param reward_layout: ``row`` (balls in the far row, agent facing them, as Hung et al.),
        ``adjacent`` (balls on the agent's left, front and right cells; n_colors <= 3) or
        ``random`` (random cells and heading).
    :param reveal_cue: no-memory control: the mission names the cue colour.
    """

    def __init__(
        self,
        room_size: int = 7,
        n_colors: int = 3,
        cue_steps: int | None = None,
        cue_distance: int = 1,
        distractor_steps: int = 30,
        apple_reward: float = 0.1,
        apple_density: float = 0.3,
        max_steps: int | None = None,
        active: bool = False,
        reward_layout: str = "row",
        reveal_cue: bool = False,
        **kwargs: Any,
    ) -> None:
        if reward_layout not in REWARD_LAYOUTS:
            raise ValueError(
                f"reward_layout must be one of {', '.join(REWARD_LAYOUTS)}, got {reward_layout!r}"
            )
        if reward_layout == "adjacent" and n_colors > 3:
            raise ValueError(f"reward_layout adjacent holds at most 3 colours, got {n_colors}")
        if not isinstance(room_size, int) or room_size < 5:
            raise ValueError(f"room_size must be an int >= 5, got {room_size!r}")
        if not 2 <= n_colors <= len(PALETTE):
            raise ValueError(f"n_colors must be in 2..{len(PALETTE)}, got {n_colors!r}")
        if (room_size - 2) ** 2 < 2 * n_colors + 1:
            # Room for the agent, the balls and enough free cells to reach every ball.
            raise ValueError(
                f"room_size {room_size} too small for {n_colors} colours: need "
                f"(room_size - 2)**2 >= 2 * n_colors + 1"
            )
        if cue_steps is None:
            cue_steps = 2 * room_size + 1 if active else 5
        if not 1 <= cue_distance <= room_size - 3:
            raise ValueError(f"cue_distance must be in 1..{room_size - 3}, got {cue_distance!r}")
        if cue_steps < 1 or distractor_steps < 1:
            raise ValueError(
                f"cue_steps and distractor_steps must be >= 1, got {cue_steps}, {distractor_steps}"
            )
        if apple_reward < 0:
            raise ValueError(f"apple_reward must be >= 0, got {apple_reward}")
        if not 0.0 <= apple_density <= 1.0:
            raise ValueError(f"apple_density must be in [0, 1], got {apple_density}")
        if max_steps is None:
            max_steps = cue_steps + distractor_steps + 5 * room_size
        if max_steps <= cue_steps + distractor_steps:
            raise ValueError(
                f"max_steps ({max_steps}) must exceed cue_steps + distractor_steps "
                f"({cue_steps + distractor_steps})"
            )
        self.room_size = room_size
        self.n_colors = n_colors
        self.colors = list(PALETTE[:n_colors])
        self.cue_steps = int(cue_steps)
        self.distractor_steps = int(distractor_steps)
        self.apple_reward = float(apple_reward)
        self.apple_density = float(apple_density)
        self.active = active
        self.reward_layout = reward_layout
        self.reveal_cue = bool(reveal_cue)
        self.cue_distance = int(cue_distance)
        self.phase = PHASE_CUE
        self.cue_color: str = self.colors[0]
        self.apples_eaten = 0
        self._rooms: dict[int, tuple[Grid, tuple[int, int], int]] = {}
        super().__init__(
            mission_space=(
                MissionSpace(mission_func=_reveal_mission, ordered_placeholders=[self.colors])
                if self.reveal_cue
                else MissionSpace(mission_func=lambda: MISSION)
            ),
            width=room_size,
            height=room_size,
            max_steps=int(max_steps),
            see_through_walls=False,
            **kwargs,
        )
        self.reward_range = (0, 1)

    # ----------------------------------------------------------------- generation
    def _interior(self) -> list[tuple[int, int]]:
        n = self.room_size
        return [(x, y) for y in range(1, n - 1) for x in range(1, n - 1)]

    def _empty_room(self) -> Grid:
        grid = Grid(self.room_size, self.room_size)
        grid.wall_rect(0, 0, self.room_size, self.room_size)
        return grid

    def _random_cells(self, k: int) -> list[tuple[int, int]]:
        cells = self._interior()
        idx = self.np_random.permutation(len(cells))[:k]
        return [cells[i] for i in idx]

    def _gen_cue_room(self) -> tuple[Grid, tuple[int, int], int, tuple[int, int]]:
        """Returns the room with a placeholder ball, the agent pose and the ball cell."""
        grid = self._empty_room()
        if not self.active:
            # Agent on a random cell and heading with the cue cell (cue_distance ahead) inside.
            while True:
                (ax, ay), d = self._random_cells(1)[0], int(self.np_random.integers(4))
                dx, dy = _DIRS[d]
                bx, by = ax + self.cue_distance * dx, ay + self.cue_distance * dy
                if 1 <= bx < self.room_size - 1 and 1 <= by < self.room_size - 1:
                    break
            grid.set(bx, by, Ball(self.colors[0]))
            return grid, (ax, ay), d, (bx, by)
        # Active: ball not visible from the start pose (rejection sampling; a few tries).
        for _ in range(100):
            (ax, ay), (bx, by) = self._random_cells(2)
            d = int(self.np_random.integers(4))
            grid = self._empty_room()
            grid.set(bx, by, Ball(self.colors[0]))
            self.grid, self.agent_pos, self.agent_dir = grid, (ax, ay), d
            if not self.agent_sees(bx, by):
                break
        return grid, (ax, ay), d, (bx, by)

    def _gen_distractor_room(self) -> tuple[Grid, tuple[int, int], int]:
        grid = self._empty_room()
        cells = self._random_cells(len(self._interior()))
        agent = cells[0]
        for cell in cells[1:]:
            if self.np_random.random() < self.apple_density:
                grid.set(*cell, Apple())
        return grid, agent, int(self.np_random.integers(4))

    def _gen_reward_room(self) -> tuple[Grid, tuple[int, int], int]:
        if self.reward_layout == "row":
            return self._gen_reward_row()
        if self.reward_layout == "adjacent":
            return self._gen_reward_adjacent()
        # Resample until every ball can be reached (balls block; they could wall one in).
        for _ in range(1000):
            grid = self._empty_room()
            cells = self._random_cells(self.n_colors + 1)
            agent, ball_cells = cells[0], cells[1:]
            for color, cell in zip(self.colors, ball_cells, strict=True):
                grid.set(*cell, Ball(color))
            if _all_reachable(grid, agent, ball_cells):
                return grid, agent, int(self.np_random.integers(4))
        raise RuntimeError(
            f"no reward-room layout with every ball reachable in 1000 tries "
            f"(room_size={self.room_size}, n_colors={self.n_colors}); use a larger room"
        )

    def _gen_reward_row(self) -> tuple[Grid, tuple[int, int], int]:
        """Balls evenly spaced along the far (top) row in shuffled colour order; the agent in
        the middle of the near row, facing up: every ball is in view and reachable."""
        grid = self._empty_room()
        inner = self.room_size - 2
        xs = [1 + round(k * (inner - 1) / (self.n_colors - 1)) for k in range(self.n_colors)]
        order = self.np_random.permutation(self.n_colors)
        for x, k in zip(xs, order, strict=True):
            grid.set(x, 1, Ball(self.colors[int(k)]))
        return grid, (self.room_size // 2, self.room_size - 2), 3

    def _gen_reward_adjacent(self) -> tuple[Grid, tuple[int, int], int]:
        """The agent in the room's centre facing up, a ball on its left, front and right cells
        (left and right only for 2 colours), colours in shuffled order."""
        grid = self._empty_room()
        c = self.room_size // 2
        cells = (
            [(c - 1, c), (c + 1, c)] if self.n_colors == 2 else [(c - 1, c), (c, c - 1), (c + 1, c)]
        )
        order = self.np_random.permutation(self.n_colors)
        for cell, k in zip(cells, order, strict=True):
            grid.set(*cell, Ball(self.colors[int(k)]))
        return grid, (c, c), 3

    @property
    def memory_horizon(self) -> int:
        """The shortest BPTT window holding a cue view and the first possible choice."""
        if self.active:
            return self.cue_steps + self.distractor_steps
        return self.distractor_steps + 2

    def _gen_grid(self, width: int, height: int) -> None:
        cue_grid, cue_agent, cue_dir, cue_cell = self._gen_cue_room()
        self._rooms = {
            PHASE_DISTRACTOR: self._gen_distractor_room(),
            PHASE_REWARD: self._gen_reward_room(),
        }
        # Drawn last so that the layout (all rooms) does not depend on the cue.
        self.cue_color = self.colors[int(self.np_random.integers(self.n_colors))]
        forced = self._forced_cue
        if forced is not None:
            self.cue_color = forced
        cue_grid.get(*cue_cell).color = self.cue_color
        self.grid, self.agent_pos, self.agent_dir = cue_grid, cue_agent, cue_dir
        self.phase = PHASE_CUE
        self.apples_eaten = 0
        self.mission = _reveal_mission(self.cue_color) if self.reveal_cue else MISSION

    def _enter(self, phase: int) -> None:
        self.grid, self.agent_pos, self.agent_dir = self._rooms.pop(phase)
        self.phase = phase

    # ----------------------------------------------------------------- gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``options={"cue_color": c}`` forces the cue colour (c in ``self.colors``)."""
        forced = (options or {}).get("cue_color")
        if forced is not None and forced not in self.colors:
            raise ValueError(f"cue_color must be one of {self.colors}, got {forced!r}")
        self._forced_cue = forced
        obs, _ = super().reset(seed=seed)
        return obs, {"phase": self.phase, "success": False}

    _forced_cue: str | None = None

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        action = int(action)
        reward = 0.0
        terminated = False
        success = False
        fwd = self.front_pos
        fwd_cell = self.grid.get(*fwd)
        touches = action in (Actions.forward, Actions.pickup)
        choice: Ball | None = None

        if self.phase == PHASE_CUE and not self.active:
            action = Actions.done  # Passive: the agent watches the cue, frozen.
        elif self.phase == PHASE_DISTRACTOR and touches and isinstance(fwd_cell, Apple):
            self.grid.set(*fwd, None)  # eat it; a forward move then enters the cell
            self.apples_eaten += 1
            reward += self.apple_reward
        elif self.phase == PHASE_REWARD and touches and isinstance(fwd_cell, Ball):
            choice = fwd_cell
            action = Actions.done
        if action in (Actions.pickup, Actions.drop, Actions.toggle):
            action = Actions.done  # nothing can be carried or opened

        obs, _, _, truncated, _ = super().step(action)

        if choice is not None:
            terminated, truncated = True, False
            success = choice.color == self.cue_color
            if success:
                k = self.step_count - self.cue_steps - self.distractor_steps
                budget = self.max_steps - self.cue_steps - self.distractor_steps
                reward = 1.0 - 0.9 * k / budget
        elif self.phase == PHASE_CUE and self.step_count == self.cue_steps:
            self._enter(PHASE_DISTRACTOR)
            obs = self.gen_obs()
        elif (
            self.phase == PHASE_DISTRACTOR
            and self.step_count == self.cue_steps + self.distractor_steps
        ):
            self._enter(PHASE_REWARD)
            obs = self.gen_obs()
        info = {"phase": self.phase, "success": success}
        return obs, reward, terminated, truncated, info


def _all_reachable(grid: Grid, start: tuple[int, int], targets: list[tuple[int, int]]) -> bool:
    """True if every target cell is next to a free cell reachable from ``start``."""
    seen = {tuple(start)}
    stack = [tuple(start)]
    while stack:
        x, y = stack.pop()
        for dx, dy in _DIRS:
            c = (x + dx, y + dy)
            if c not in seen and grid.get(*c) is None:
                seen.add(c)
                stack.append(c)
    return all(any((x + dx, y + dy) in seen for dx, dy in _DIRS) for x, y in targets)


class PassiveVisualMatchEnv(VisualMatchEnv):
    """Passive Visual Match: the agent is shown the cue (frozen, facing it) for ``cue_steps``."""

    def __init__(self, **kwargs: Any) -> None:
        if "active" in kwargs:
            raise TypeError("PassiveVisualMatchEnv takes no 'active' option")
        super().__init__(active=False, **kwargs)


class ActiveVisualMatchEnv(VisualMatchEnv):
    """Active Visual Match: the cue is hidden somewhere in the room; explore to see it."""

    def __init__(self, **kwargs: Any) -> None:
        if "active" in kwargs:
            raise TypeError("ActiveVisualMatchEnv takes no 'active' option")
        super().__init__(active=True, **kwargs)
