"""A lean vector env for the RL trainer: envs stepped into preallocated arrays, in this process
or in worker processes over shared memory, in groups so stepping overlaps with acting.

Why not gymnasium's vector envs: per step, ``SyncVectorEnv`` merges every env's ``info`` dict
into batched arrays and ``AsyncVectorEnv`` pickles observations through pipes; for MiniGrid
envs, which step in tens of microseconds, that bookkeeping costs as much as the envs. Here each
step writes observations, rewards, ``terminated``, ``truncated`` and ``success`` straight into
numpy arrays (shared memory when there are workers) and nothing else crosses processes but a
two-item message.

Semantics (what the trainer relies on):

- env ``i`` is made with :func:`envs.make_env` and reset with seed ``seed + i``; later resets
  continue each env's own RNG, so a run is reproducible for a given seed and layout;
- auto-reset in the SAME step: after a terminal step the returned observation is already the
  next episode's first one, and ``success`` says whether the finished episode succeeded;
- the envs are split into ``groups`` (contiguous row ranges). :meth:`VectorEnv.step_async`
  starts a group's step and :meth:`VectorEnv.step_wait` collects it, so a trainer can choose
  one group's actions while a worker steps another. With ``workers = 0`` the step runs inside
  ``step_wait``; with ``workers >= 1`` group ``g`` lives in worker ``g % workers``.

The arrays returned are views of the vector env's own buffers, valid until that group's next
step: copy what you keep.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class ArraySpec:
    """Shape (without the env dim) and dtype of one per-env array."""

    shape: tuple[int, ...]
    dtype: np.dtype


def _specs(space: gym.spaces.Dict) -> dict[str, ArraySpec]:
    """Observation key -> per-env array spec, plus the step outputs."""
    specs = {f"obs.{k}": ArraySpec(tuple(s.shape), np.dtype(s.dtype)) for k, s in space.items()}
    specs["action"] = ArraySpec((), np.dtype(np.int64))
    specs["reward"] = ArraySpec((), np.dtype(np.float64))
    for flag in ("terminated", "truncated", "success"):
        specs[flag] = ArraySpec((), np.dtype(bool))
    return specs


class _Buffers:
    """``[N, ...]`` arrays for every spec, in shared memory or plain numpy."""

    def __init__(
        self, specs: dict[str, ArraySpec], n: int, shared: bool, names: dict | None = None
    ):
        self.arrays: dict[str, np.ndarray] = {}
        self.blocks: dict[str, shared_memory.SharedMemory] = {}
        for key, spec in specs.items():
            shape = (n, *spec.shape)
            if not shared:
                self.arrays[key] = np.zeros(shape, spec.dtype)
                continue
            size = max(1, int(np.prod(shape)) * spec.dtype.itemsize)
            if names is None:
                block = shared_memory.SharedMemory(create=True, size=size)
            else:
                block = shared_memory.SharedMemory(name=names[key])
            self.blocks[key] = block
            self.arrays[key] = np.ndarray(shape, spec.dtype, buffer=block.buf)

    @property
    def names(self) -> dict[str, str]:
        return {k: b.name for k, b in self.blocks.items()}

    def close(self, unlink: bool) -> None:
        self.arrays.clear()
        for block in self.blocks.values():
            block.close()
            if unlink:
                block.unlink()
        self.blocks.clear()


class _EnvRunner:
    """Steps a set of envs (global indices ``rows``) and writes results into ``arrays``."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        seed: int,
        rows: list[int],
        arrays: dict[str, np.ndarray],
    ):
        from memcores.envs import make_env

        self.envs = {i: make_env(env_id, seed=seed + i, **env_kwargs) for i in rows}
        self.arrays = arrays
        self.obs_keys = [k[4:] for k in arrays if k.startswith("obs.")]

    def _write_obs(self, i: int, obs: dict[str, Any]) -> None:
        for key in self.obs_keys:
            self.arrays[f"obs.{key}"][i] = obs[key]

    def reset(self, seed: int) -> None:
        for i, env in self.envs.items():
            obs, _ = env.reset(seed=seed + i)
            self._write_obs(i, obs)
        for flag in ("terminated", "truncated", "success"):
            self.arrays[flag][:] = False
        self.arrays["reward"][:] = 0.0

    def step(self, lo: int, hi: int) -> None:
        a = self.arrays
        actions = a["action"]
        for i in range(lo, hi):
            env = self.envs[i]
            obs, reward, terminated, truncated, info = env.step(int(actions[i]))
            a["reward"][i] = reward
            a["terminated"][i] = terminated
            a["truncated"][i] = truncated
            done = terminated or truncated
            a["success"][i] = bool(info.get("success", False)) and done
            if done:
                obs, _ = env.reset()
            self._write_obs(i, obs)

    def close(self) -> None:
        for env in self.envs.values():
            env.close()


def _worker_main(conn, env_id, env_kwargs, seed, rows, specs, n, names) -> None:  # noqa: ANN001
    """Worker process: make its envs, then serve ``reset``/``step``/``close`` messages."""
    buffers = _Buffers(specs, n, shared=True, names=names)
    runner = None
    try:
        runner = _EnvRunner(env_id, env_kwargs, seed, rows, buffers.arrays)
        conn.send(("ready", None))
        while True:
            command, arg = conn.recv()
            if command == "step":
                runner.step(*arg)
                conn.send(("stepped", arg))
            elif command == "reset":
                runner.reset(arg)
                conn.send(("reset", arg))
            else:
                break
    except (KeyboardInterrupt, EOFError):
        pass
    except Exception:  # noqa: BLE001  (the parent re-raises it with the worker's traceback)
        conn.send(("error", traceback.format_exc()))
    finally:
        if runner is not None:
            runner.close()
        buffers.close(unlink=False)
        conn.close()


class VectorEnv:
    """``n_envs`` copies of ``env_id`` behind one batched, grouped step.

    :param workers: 0 steps the envs in this process; ``k >= 1`` starts ``k`` worker processes.
    :param groups: how many contiguous groups of envs to split the batch into (at most
        ``n_envs``); more than one lets a trainer act on one group while another steps.
    :raises ValueError: unknown env id or bad env options (checked before any process starts).
    """

    def __init__(
        self,
        env_id: str,
        n_envs: int,
        seed: int,
        env_kwargs: dict[str, Any] | None = None,
        workers: int = 0,
        groups: int = 1,
    ) -> None:
        from memcores.envs import make_env

        if n_envs < 1 or workers < 0 or groups < 1:
            raise ValueError(
                f"need n_envs >= 1, workers >= 0, groups >= 1; got {n_envs=}, {workers=}, {groups=}"
            )
        env_kwargs = dict(env_kwargs or {})
        probe = make_env(env_id, **env_kwargs)  # validates the id/options in this process
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        self.memory_horizon: int | None = getattr(probe.unwrapped, "memory_horizon", None)
        """Steps a BPTT window must span for this env's memory (``None``: not declared)."""
        probe.close()
        self.num_envs = n_envs
        groups = min(groups, n_envs)
        bounds = np.linspace(0, n_envs, groups + 1).round().astype(int)
        self.groups: list[slice] = [
            slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        self.workers = workers
        specs = _specs(self.single_observation_space)
        self._buffers = _Buffers(specs, n_envs, shared=workers > 0)
        a = self._buffers.arrays
        self.obs = {k[4:]: v for k, v in a.items() if k.startswith("obs.")}
        self._pending: dict[int, bool] = {}
        self._runner: _EnvRunner | None = None
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        if workers == 0:
            self._runner = _EnvRunner(env_id, env_kwargs, seed, list(range(n_envs)), a)
            return
        ctx = mp.get_context("spawn")  # no fork of a process holding torch's thread pools
        try:
            for w in range(workers):
                rows = [
                    i
                    for g, s in enumerate(self.groups)
                    if g % workers == w
                    for i in range(s.start, s.stop)
                ]
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker_main,
                    args=(
                        child,
                        env_id,
                        env_kwargs,
                        seed,
                        rows,
                        specs,
                        n_envs,
                        self._buffers.names,
                    ),
                    daemon=True,
                )
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
            for w in range(workers):
                self._expect(w, "ready")
        except BaseException:
            self.close()
            raise

    def local_env(self, index: int) -> Any:
        """Env ``index`` itself, for envs stepped in this process (``workers=0``): lets a
        diagnostic read an env's internal state between steps.

        :raises ValueError: the envs live in worker processes.
        """
        if self._runner is None:
            raise ValueError("the envs run in worker processes; use workers=0 to read them")
        return self._runner.envs[index]

    # ------------------------------------------------------------------ protocol helpers
    def _worker_of(self, group: int) -> int:
        return group % self.workers

    def _expect(self, w: int, kind: str) -> Any:
        try:
            got, arg = self._conns[w].recv()
        except EOFError as err:
            raise RuntimeError(f"env worker {w} exited unexpectedly") from err
        if got == "error":
            raise RuntimeError(f"env worker {w} failed:\n{arg}")
        if got != kind:
            raise RuntimeError(f"env worker {w}: expected {kind!r}, got {got!r}")
        return arg

    # ------------------------------------------------------------------ API
    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Reset every env (env ``i`` with seed ``seed + i``); returns the ``[N, ...]`` views."""
        if self._runner is not None:
            self._runner.reset(seed)
        else:
            for conn in self._conns:
                conn.send(("reset", seed))
            for w in range(self.workers):
                self._expect(w, "reset")
        self._pending.clear()
        return self.obs

    def step_async(self, group: int, actions: np.ndarray) -> None:
        """Start stepping group ``group`` with ``actions`` (``[rows]`` ints)."""
        rows = self.groups[group]
        self._buffers.arrays["action"][rows] = actions
        if self._runner is None:
            self._conns[self._worker_of(group)].send(("step", (rows.start, rows.stop)))
        self._pending[group] = True

    def step_wait(
        self, group: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Finish group ``group``'s step: ``(obs, reward, done, success)`` views of its rows.

        ``done = terminated or truncated``; ``obs`` is already the next episode's first
        observation where ``done``.
        """
        if not self._pending.pop(group, False):
            raise RuntimeError(f"step_wait({group}) without step_async({group})")
        rows = self.groups[group]
        if self._runner is not None:
            self._runner.step(rows.start, rows.stop)
        else:
            self._expect(self._worker_of(group), "stepped")
        a = self._buffers.arrays
        done = a["terminated"][rows] | a["truncated"][rows]
        obs = {k: v[rows] for k, v in self.obs.items()}
        return obs, a["reward"][rows], done, a["success"][rows]

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Step every env (all groups) and return ``(obs, reward, done, success)``, ``[N]``."""
        for g, rows in enumerate(self.groups):
            self.step_async(g, actions[rows])
        for g in range(len(self.groups)):
            self.step_wait(g)
        a = self._buffers.arrays
        return self.obs, a["reward"], a["terminated"] | a["truncated"], a["success"]

    def close(self) -> None:
        """Stop the workers and free the shared memory (safe to call twice)."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        for conn in self._conns:
            try:
                conn.send(("close", None))
            except (BrokenPipeError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        if self._buffers is not None:
            self._buffers.close(unlink=self.workers > 0)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110  (interpreter shutdown)
            pass
