"""A faster ``MiniGridEnv.gen_obs`` with exactly the same output.

Why: MiniGrid builds every observation by copying the view window into a new ``Grid`` (with a
fresh ``Wall()`` for each cell outside the map), rotating that ``Grid`` one to four times
cell by cell, running the occlusion pass through ``Grid.get`` and then encoding it. On a
7x7 MiniGrid map that is most of an env step, and in a PPO run on CPU the env step is the
largest single cost. Here the window is read once straight from the grid's cell list and
encoded as it is read, the rotation is a numpy view, and the occlusion pass runs on plain
lists. The result is byte-for-byte MiniGrid's (``tests/test_fast_obs.py`` compares both on
random walks through every kind of env we ship, carrying and doors included).

:func:`install` patches one env instance; envs whose class overrides ``gen_obs`` or
``gen_obs_grid`` are left alone, so custom observations are never replaced. Setting the
environment variable ``MEMCORES_MINIGRID_OBS=1`` turns it off (MiniGrid's own code runs).
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX
from minigrid.minigrid_env import MiniGridEnv

DISABLE_VARIABLE = "MEMCORES_MINIGRID_OBS"
"""Set to ``1`` to keep MiniGrid's own ``gen_obs`` everywhere."""

_EMPTY = (OBJECT_TO_IDX["empty"], 0, 0)
_OUTSIDE_WALL = (OBJECT_TO_IDX["wall"], COLOR_TO_IDX["grey"], 0)  # what Grid.slice puts there


def _rotate_left(a: np.ndarray) -> np.ndarray:
    """``Grid.rotate_left`` for an ``[W, H, ...]`` array: ``out[j, W - 1 - i] = a[i, j]``."""
    return a.swapaxes(0, 1)[:, ::-1]


def _visibility(see_behind: list[list[bool]], size: int) -> list[list[bool]]:
    """``Grid.process_vis`` on a ``size x size`` view (agent at ``(size // 2, size - 1)``).

    :param see_behind: ``see_behind[i][j]`` for the rotated view (``True`` for empty cells).
    :return: ``mask[i][j]``, whether cell ``(i, j)`` is visible.
    """
    mask = [[False] * size for _ in range(size)]
    mask[size // 2][size - 1] = True
    for j in range(size - 1, -1, -1):
        for i in range(size - 1):
            if not mask[i][j] or not see_behind[i][j]:
                continue
            mask[i + 1][j] = True
            if j > 0:
                mask[i + 1][j - 1] = True
                mask[i][j - 1] = True
        for i in range(size - 1, 0, -1):
            if not mask[i][j] or not see_behind[i][j]:
                continue
            mask[i - 1][j] = True
            if j > 0:
                mask[i - 1][j - 1] = True
                mask[i][j - 1] = True
    return mask


def fast_gen_obs(env: MiniGridEnv) -> dict[str, Any]:
    """``env.gen_obs()`` computed without building intermediate ``Grid`` objects.

    :return: ``{"image": [V, V, 3] uint8, "direction": int, "mission": str}``, identical to
        :meth:`minigrid.minigrid_env.MiniGridEnv.gen_obs`.
    """
    size = env.agent_view_size
    top_x, top_y, _, _ = env.get_view_exts(size)
    grid = env.grid
    width, height, cells = grid.width, grid.height, grid.grid
    window: list[tuple[int, int, int]] = []  # row-major over [i, j] of the unrotated window
    clear: list[bool] = []  # see_behind of each of those cells
    for x in range(top_x, top_x + size):
        if not 0 <= x < width:
            window += [_OUTSIDE_WALL] * size
            clear += [False] * size
            continue
        for y in range(top_y, top_y + size):
            if 0 <= y < height:
                cell = cells[y * width + x]
                if cell is None:
                    window.append(_EMPTY)
                    clear.append(True)
                else:
                    window.append(cell.encode())
                    clear.append(cell.see_behind())
            else:
                window.append(_OUTSIDE_WALL)
                clear.append(False)
    codes = np.array(window, dtype=np.uint8).reshape(size, size, 3)
    see_behind = np.array(clear, dtype=bool).reshape(size, size)
    for _ in range(env.agent_dir + 1):
        codes = _rotate_left(codes)
        see_behind = _rotate_left(see_behind)
    agent_i, agent_j = size // 2, size - 1
    if env.see_through_walls:
        visible = np.ones((size, size), dtype=bool)
    else:
        visible = np.array(_visibility(see_behind.tolist(), size), dtype=bool)
    image = np.where(visible[:, :, None], codes, 0).astype(np.uint8)
    # the agent sees what it carries in its own cell (MiniGrid sets it after the occlusion pass)
    image[agent_i, agent_j] = env.carrying.encode() if env.carrying else _EMPTY
    return {"image": image, "direction": env.agent_dir, "mission": env.mission}


def _uses_default_observation(env: MiniGridEnv) -> bool:
    cls = type(env)
    return cls.gen_obs is MiniGridEnv.gen_obs and cls.gen_obs_grid is MiniGridEnv.gen_obs_grid


def install(env: gym.Env) -> bool:
    """Make ``env`` (any wrapper stack over a ``MiniGridEnv``) use :func:`fast_gen_obs`.

    :return: whether it was installed (``False`` for non-MiniGrid envs, envs with their
        own ``gen_obs``/``gen_obs_grid``, which keep their observation code, and when
        ``MEMCORES_MINIGRID_OBS=1``).
    """
    if os.environ.get(DISABLE_VARIABLE) == "1":
        return False
    base = env.unwrapped
    if not isinstance(base, MiniGridEnv) or not _uses_default_observation(base):
        return False
    base.gen_obs = fast_gen_obs.__get__(base)  # instance attribute shadows the method
    return True
