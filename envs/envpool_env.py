"""MiniGrid stepped by EnvPool's C++ envs, behind :class:`envs.vector.VectorEnv`'s interface.

``env.vector: envpool`` in a ``memcores train`` config (or ``memcores evaluate --vector
envpool``) selects it; it needs the optional extra (``pip install memcores[envpool]``).

What the trainer reads is what :class:`~envs.vector.VectorEnv` gives it:

- observations in the memcores format (:mod:`envs.observation`): ``image [N, 7, 7, 3]`` uint8,
  ``direction [N]`` int64, ``mission [N, MAX_MISSION_LEN]`` int64 token ids. EnvPool returns
  the mission as a byte buffer; it is decoded and tokenised with :func:`envs.observation.tokenize`
  (only where an episode starts, since missions change only at reset);
- env ``i`` seeded ``seed + i`` (EnvPool's own rule for an integer seed); EnvPool's envs
  cannot be reseeded, so :meth:`~EnvPoolVectorEnv.reset` builds a fresh pool (except the
  first reset, of the pool just built with that seed): one seed replays the same episodes;
- auto-reset in the SAME step. EnvPool resets an env on the step *after* its terminal step
  (gymnasium's ``NEXT_STEP`` mode, the action of that step ignored); here the envs that just
  ended are reset at once, so the observation after a terminal step is already the next
  episode's first one, as the trainer stores it;
- ``success = terminated and reward > 0`` (:class:`envs.observation.SuccessInfo`'s rule).

The episodes differ from minigrid's for a given seed (EnvPool draws layouts with its own random
generator), not in distribution: ``tests/test_envpool_env.py`` compares both.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from memcores.envs.observation import tokenize

EXTRA_HINT = "pip install 'memcores[envpool]'"


def available() -> bool:
    """Whether the ``envpool`` package is installed."""
    return importlib.util.find_spec("envpool") is not None


def unavailable_reason(env_id: str) -> str | None:
    """Why ``env_id`` cannot run through EnvPool here (``None``: it can)."""
    if not available():
        return f"env.vector=envpool needs the envpool package ({EXTRA_HINT})"
    import envpool

    ids = envpool.list_all_envs()
    if env_id not in ids:
        minigrid = ", ".join(i for i in ids if i.startswith("MiniGrid-"))
        return f"EnvPool has no env {env_id!r}; its MiniGrid ids: {minigrid}"
    return None


class EnvPoolVectorEnv:
    """``n_envs`` copies of a MiniGrid id stepped by EnvPool in ``threads`` C++ threads.

    The interface is :class:`envs.vector.VectorEnv`'s with one group: ``obs`` holds the
    ``[N, ...]`` observation arrays (overwritten by each step: copy what you keep),
    :meth:`step_async`/:meth:`step_wait` or :meth:`step` return ``(obs, reward, done,
    success)``.

    :raises ValueError: envpool not installed, or an id EnvPool does not have (both before a
        pool is made), or bad env options.
    """

    def __init__(
        self,
        env_id: str,
        n_envs: int,
        seed: int,
        env_kwargs: dict[str, Any] | None = None,
        threads: int = 1,
    ) -> None:
        from memcores.envs import make_env

        if n_envs < 1 or threads < 1:
            raise ValueError(f"need n_envs >= 1, threads >= 1; got {n_envs=}, {threads=}")
        from memcores.envs.cpus import check_cpu_counts

        check_cpu_counts({"threads": threads})
        why = unavailable_reason(env_id)
        if why:
            raise ValueError(why)
        self.env_kwargs = dict(env_kwargs or {})
        unknown = set(self.env_kwargs) - {"max_steps"}
        if unknown:
            raise ValueError(
                f"env.vector=envpool takes only the env option max_steps, got {sorted(unknown)}"
            )
        probe = make_env(env_id, **self.env_kwargs)  # the memcores spaces of this id
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.memory_horizon: int | None = getattr(probe.unwrapped, "memory_horizon", None)
        probe.close()
        self.env_id, self.num_envs, self.threads = env_id, n_envs, threads
        self.groups: list[slice] = [slice(0, n_envs)]
        self.workers = 0
        self.obs: dict[str, np.ndarray] = {
            key: np.zeros((n_envs, *space.shape), space.dtype)
            for key, space in self.single_observation_space.items()
        }
        self.reward = np.zeros(n_envs, np.float64)
        self.done = np.zeros(n_envs, bool)
        self.success = np.zeros(n_envs, bool)
        self._missions: dict[bytes, np.ndarray] = {}
        self._all = np.arange(n_envs)
        self._pool: Any = None
        self._fresh_seed: int | None = None  # seed of a pool not reset yet
        self._pending = False
        self._build(seed)

    def _build(self, seed: int) -> None:
        import envpool

        if self._pool is not None:
            self._pool.close()
        options: dict[str, Any] = {}
        if "max_steps" in self.env_kwargs:
            options["max_episode_steps"] = int(self.env_kwargs["max_steps"])
        self._pool = envpool.make_gymnasium(
            self.env_id,
            num_envs=self.num_envs,
            batch_size=self.num_envs,
            num_threads=self.threads,
            seed=seed,
            **options,
        )
        self._fresh_seed = seed

    def _tokens(self, mission: np.ndarray) -> np.ndarray:
        """EnvPool's mission bytes (``[B]`` uint8, NUL-padded) -> ``[MAX_MISSION_LEN]`` ids."""
        key = mission.tobytes()
        tokens = self._missions.get(key)
        if tokens is None:
            tokens = self._missions[key] = tokenize(key.rstrip(b"\0").decode("ascii", "replace"))
        return tokens

    def _write(self, raw: dict[str, np.ndarray], rows: np.ndarray, mission: bool) -> None:
        """EnvPool's observations of envs ``rows`` -> the memcores arrays (the mission only
        where ``mission``: it changes only at reset)."""
        index: Any = slice(None) if np.array_equal(rows, self._all) else rows
        self.obs["image"][index] = raw["image"]
        self.obs["direction"][index] = raw["direction"]
        if mission and "mission" in raw:
            self.obs["mission"][index] = np.stack([self._tokens(m) for m in raw["mission"]])

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Reset every env (env ``i`` with seed ``seed + i``); returns the ``[N, ...]`` arrays."""
        if seed != self._fresh_seed:
            self._build(seed)
        self._fresh_seed = None
        raw, info = self._pool.reset()
        self._write(raw, np.asarray(info["env_id"]), mission=True)
        self.reward[:], self.done[:], self.success[:] = 0.0, False, False
        self._pending = False
        return self.obs

    def step_async(self, group: int, actions: np.ndarray) -> None:
        """Start stepping every env (``group`` must be 0) with ``actions`` (``[N]`` ints)."""
        if group != 0:
            raise ValueError(f"EnvPoolVectorEnv has one group (0), got {group}")
        self._pool.send(np.asarray(actions, dtype=np.int32))
        self._pending = True

    def step_wait(
        self, group: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Finish the step: ``(obs, reward, done, success)``, each ``[N]`` (or ``[N, ...]``).

        ``obs`` is already the next episode's first observation where ``done``.
        """
        if group != 0 or not self._pending:
            raise RuntimeError(f"step_wait({group}) without step_async({group})")
        self._pending = False
        raw, reward, terminated, truncated, info = self._pool.recv()
        rows = np.asarray(info["env_id"])
        self.reward[rows] = reward
        self.done[rows] = terminated | truncated
        self.success[rows] = terminated & (reward > 0)
        self._write(raw, rows, mission=False)
        ended = np.flatnonzero(self.done)
        if ended.size:  # same-step auto-reset: EnvPool would reset them on their next step
            raw, info = self._pool.reset(ended)
            self._write(raw, np.asarray(info["env_id"]), mission=True)
        return self.obs, self.reward, self.done, self.success

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Step every env and return ``(obs, reward, done, success)``, ``[N]``."""
        self.step_async(0, actions)
        return self.step_wait(0)

    def local_env(self, index: int) -> Any:
        """:raises ValueError: always: EnvPool's envs live in C++ (no Python env to read)."""
        raise ValueError("EnvPool's envs run in C++; use env.vector=sync to read an env's state")

    def close(self) -> None:
        """Stop EnvPool's threads (safe to call twice)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
