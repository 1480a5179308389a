"""Test helpers for the memory-match envs: an oracle's path planner (it reads the grid)."""

from __future__ import annotations

from collections import deque

from minigrid.core.actions import Actions
from minigrid.core.constants import DIR_TO_VEC
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball

State = tuple[int, int, int]
"""(x, y, heading) of the agent."""


def plan_to_face(
    grid: Grid, pos: tuple[int, int], direction: int, target: tuple[int, int]
) -> list[int] | None:
    """Shortest list of left/right/forward actions after which the agent faces ``target``.

    Breadth-first search over (x, y, direction); the agent may enter empty cells and cells it
    can overlap (apples); every other object blocks. Returns None if ``target`` cannot be
    faced.
    """
    dirs = [(int(dx), int(dy)) for dx, dy in DIR_TO_VEC]
    start = (int(pos[0]), int(pos[1]), int(direction))
    parent: dict[State, tuple[State, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        x, y, d = state = queue.popleft()
        fx, fy = x + dirs[d][0], y + dirs[d][1]
        if (fx, fy) == tuple(target):
            actions: list[int] = []
            while (link := parent[state]) is not None:
                state, action = link
                actions.append(action)
            return actions[::-1]
        nxt = [((x, y, (d - 1) % 4), int(Actions.left)), ((x, y, (d + 1) % 4), int(Actions.right))]
        # Outside the grid counts as blocked (a ball stands in for any blocking object).
        cell = grid.get(fx, fy) if 0 <= fx < grid.width and 0 <= fy < grid.height else Ball()
        if cell is None or cell.can_overlap():
            nxt.append(((fx, fy, d), int(Actions.forward)))
        for s, a in nxt:
            if s not in parent:
                parent[s] = (state, a)
                queue.append(s)
    return None
