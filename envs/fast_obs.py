"""A faster ``MiniGridEnv.gen_obs`` with exactly the same output.

Why: MiniGrid builds every observation by copying the view window into a new ``Grid`` (with a
fresh ``Wall()`` for each cell outside the map), rotating that ``Grid`` one to four times
cell by cell, running the occlusion pass through ``Grid.get`` and then encoding it. On a
7x7 MiniGrid map that is most of an env step, and in a PPO run on CPU the env step is the
largest single cost. Here the map is encoded into arrays once per map (framed by the outside
walls), each step re-encodes only the cells that changed (replaced objects, doors, recoloured
objects), the view window is a slice of those arrays, the rotation a numpy view, and the
occlusion pass is looked up by the window's see-behind pattern. The result is byte-for-byte
MiniGrid's (``tests/test_fast_obs.py`` compares both on
random walks through every kind of env we ship, carrying and doors included).

:func:`install` patches one env instance; envs whose class overrides ``gen_obs`` or
``gen_obs_grid`` are left alone, so custom observations are never replaced. Setting the
environment variable ``MEMCORES_MINIGRID_OBS=1`` turns it off (MiniGrid's own code runs).
"""

from __future__ import annotations

import os
from operator import is_not
from typing import Any

import gymnasium as gym
import numpy as np
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX
from minigrid.core.world_object import Floor, Goal, Lava, Wall, WorldObj
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


class _EncodedMap:
    """A MiniGrid map encoded once into arrays, and kept equal to the map step by step.

    ``codes [W + 2p, H + 2p, 3]`` and ``clear [W + 2p, H + 2p]`` (see-behind) hold the map
    framed by ``p`` cells of the outside wall that ``Grid.slice`` invents, so any view window is
    one slice. Cells whose object was replaced (``grid.set``) are found by identity. Walls,
    floors, lava and goals never change in place. Objects whose class keeps ``WorldObj``'s own
    ``encode`` and ``see_behind`` (keys, balls, boxes, an env's own subclasses of them) show
    only their type and colour, so they are re-encoded when one of those changes; every other
    object (doors that open or unlock) is re-encoded on every refresh.
    """

    def __init__(self, grid: Any, pad: int) -> None:
        self.grid, self.pad = grid, pad
        width, height = grid.width, grid.height
        self.codes = np.empty((width + 2 * pad, height + 2 * pad, 3), dtype=np.uint8)
        self.codes[...] = _OUTSIDE_WALL
        self.clear = np.zeros((width + 2 * pad, height + 2 * pad), dtype=bool)
        self.cells: list[Any] = list(grid.grid)
        inner = (slice(pad, pad + width), slice(pad, pad + height))
        # one pass over the cell list: grid.grid is row-major over y, the arrays index [x, y]
        encoded = [_EMPTY if cell is None else cell.encode() for cell in self.cells]
        self.codes[inner] = (
            np.array(encoded, dtype=np.uint8).reshape(height, width, 3).swapaxes(0, 1)
        )
        clear = [cell is None or cell.see_behind() for cell in self.cells]
        self.clear[inner] = np.array(clear, dtype=bool).reshape(height, width).T
        self.stateful: set[int] = set()  # flat indices re-encoded on every refresh
        self.coloured: dict[int, tuple[str, str]] = {}  # flat index -> its (type, colour)
        for k, cell in enumerate(self.cells):
            self._track(k, cell)

    def _track(self, k: int, cell: Any) -> None:
        """File cell ``k`` under how it can change in place (nothing, colour, anything)."""
        self.stateful.discard(k)
        self.coloured.pop(k, None)
        if cell is None or type(cell) in _STATIC:
            return
        if _shows_type_and_colour(type(cell)):
            self.coloured[k] = (cell.type, cell.color)
        else:
            self.stateful.add(k)

    def _write(self, k: int, cell: Any) -> None:
        """Encode ``cell`` into the arrays at flat index ``k`` (``y * W + x``)."""
        x, y = k % self.grid.width + self.pad, k // self.grid.width + self.pad
        if cell is None:
            self.codes[x, y] = _EMPTY
            self.clear[x, y] = True
        else:
            self.codes[x, y] = cell.encode()
            self.clear[x, y] = cell.see_behind()

    def _encode(self, k: int) -> None:
        """Re-encode cell ``k`` of ``self.cells`` and re-file it."""
        self._write(k, self.cells[k])
        self._track(k, self.cells[k])

    def refresh(self) -> None:
        """Bring the arrays up to date with the map (the same ``Grid`` object)."""
        cells = self.cells
        now = self.grid.grid
        if any(map(is_not, now, cells)):
            for k, (cell, before) in enumerate(zip(now, cells, strict=True)):
                if cell is not before:
                    cells[k] = cell
                    self._encode(k)
        for k, (kind, colour) in tuple(self.coloured.items()):
            if cells[k].color != colour or cells[k].type != kind:
                self._encode(k)
        for k in self.stateful:  # encoding keeps the object's kind, so the set is unchanged
            self._write(k, cells[k])


_STATIC = (Wall, Floor, Lava, Goal)


def _shows_type_and_colour(kind: type) -> bool:
    """Whether objects of class ``kind`` encode as ``(type, colour, 0)`` and see-behind True."""
    return kind.encode is WorldObj.encode and kind.see_behind is WorldObj.see_behind


_VISIBILITY_CACHE_SIZE = 1 << 14
_visibility_cache: dict[tuple[int, bytes], np.ndarray] = {}


def _visible(see_behind: np.ndarray) -> np.ndarray:
    """``[V, V, 1]`` uint8 visibility of a rotated view, memoised on its see-behind pattern."""
    size = see_behind.shape[0]
    key = (size, see_behind.tobytes())
    mask = _visibility_cache.get(key)
    if mask is None:
        if len(_visibility_cache) >= _VISIBILITY_CACHE_SIZE:
            _visibility_cache.clear()
        vis = _visibility(see_behind.tolist(), size)
        mask = np.array(vis, dtype=np.uint8)[:, :, None]
        _visibility_cache[key] = mask
    return mask


def fast_gen_obs(env: MiniGridEnv) -> dict[str, Any]:
    """``env.gen_obs()`` computed without building intermediate ``Grid`` objects.

    :return: ``{"image": [V, V, 3] uint8, "direction": int, "mission": str}``, identical to
        :meth:`minigrid.minigrid_env.MiniGridEnv.gen_obs`.
    """
    size = env.agent_view_size
    encoded = env.__dict__.get("_memcores_encoded_map")
    if encoded is None or encoded.grid is not env.grid or encoded.pad < size:
        encoded = env.__dict__["_memcores_encoded_map"] = _EncodedMap(env.grid, size)
    else:
        encoded.refresh()
    top_x, top_y, _, _ = env.get_view_exts(size)
    x0, y0 = top_x + encoded.pad, top_y + encoded.pad
    codes = encoded.codes[x0 : x0 + size, y0 : y0 + size]
    see_behind = encoded.clear[x0 : x0 + size, y0 : y0 + size]
    for _ in range(env.agent_dir + 1):
        codes = _rotate_left(codes)
        see_behind = _rotate_left(see_behind)
    if env.see_through_walls:
        image = np.array(codes, order="C")  # always a copy: the map arrays stay untouched
    else:
        # a new C-ordered array (as MiniGrid's; torch views need it): invisible cells -> 0
        image = np.multiply(codes, _visible(see_behind), order="C")
    # the agent sees what it carries in its own cell (MiniGrid sets it after the occlusion pass)
    image[size // 2, size - 1] = env.carrying.encode() if env.carrying else _EMPTY
    return {"image": image, "direction": env.agent_dir, "mission": env.mission}


def uninstall(env: gym.Env) -> None:
    """Give ``env`` back MiniGrid's own ``gen_obs`` (no-op where :func:`install` did not patch)."""
    base = env.unwrapped
    patched = vars(base).get("gen_obs")
    if getattr(patched, "__func__", None) is fast_gen_obs:
        del base.gen_obs
    vars(base).pop("_memcores_encoded_map", None)


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
