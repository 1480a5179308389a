"""Batched envs in torch: ``N`` copies of an env as ``[N, ...]`` tensors on any device.

A batched env holds the state of all ``N`` envs in tensors and advances them all in one
:meth:`BatchedEnv.step`, so stepping costs a few tensor ops whatever ``N`` is, on the CPU or
on the accelerator the policy runs on. Its semantics are the vector env's
(:mod:`envs.vector`), so the trainer can use either:

- env ``i`` is seeded from ``seed + i`` (:meth:`BatchedEnv.reset`) and its episodes depend on
  nothing else: not on ``N``, not on the other envs (the random numbers are a counter-based
  hash of ``(seed + i, episode, slot)``, :func:`random_words`, the same on every device);
- auto-reset in the SAME step: after a terminal step the returned observation is already the
  next episode's first one and ``success`` says whether the finished episode succeeded;
- the observation dict has the gymnasium version's keys, shapes and dtypes, so a policy trained
  on one evaluates on the other.

Nothing leaves the device: observations, rewards, ``done`` and ``success`` are tensors on
:attr:`BatchedEnv.device`. An env that ends an episode takes its next one from a pool drawn
ahead for every env and refilled in one batch every ``min_episode_length - 1`` steps (before
any env can end again), so the cost of drawing layouts is spread over many steps. On a CPU the
finished rows are found by index (cheap); on an accelerator every row is computed and masked
(no host sync). Both give identical results.

**Recordable steps.** :meth:`BatchedEnv.step` is :meth:`BatchedEnv.step_recordable` then
:meth:`BatchedEnv.tick`. The first writes every tensor it keeps or returns in place (state,
pool, episode counters, observation, reward/done/success), so their storage never changes and
a CUDA graph recorded from it replays correctly (a graph replays kernels only: a Python-side
reassignment would happen once, at capture); on the masked path it syncs nothing with the
host. :meth:`BatchedEnv.tick` counts steps on the host and refills the pool when due: the
caller of a recording runs it eagerly after each replay (:mod:`agents.rollout_graph`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
OUTPUTS = ("reward", "done", "success", "terminated", "truncated")
"""What a step writes besides the observation, ``[N]`` each (reward float32, the rest bool)."""


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` (int64) without int64 overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & MASK32


def hash32(x: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser (fmix32) on int64 tensors holding 32-bit values."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def env_keys(seed: int, n: int, device: torch.device | str = "cpu") -> Tensor:
    """``[n]`` int64 keys of envs ``0..n-1``: env ``i`` is keyed by ``seed + i`` alone."""
    ids = torch.arange(n, dtype=torch.int64, device=device) + int(seed)
    return hash32(hash32(ids & MASK32) ^ ((ids >> 32) & MASK32))


def random_words(
    keys: Tensor, episodes: Tensor, n_slots: int, first_slot: int | Tensor = 0
) -> Tensor:
    """``[M, n_slots]`` uniform floats in ``[0, 1)`` for envs ``keys [M]`` at episode
    ``episodes [M]``, slots ``first_slot ..`` (an int or ``[M]``): a pure function of
    ``(key, episode, slot)``, equal on every device."""
    base = hash32(keys + _mul32(episodes & MASK32, 0x9E3779B1))
    slots = torch.arange(1, n_slots + 1, dtype=torch.int64, device=keys.device)
    slots = slots + (first_slot.view(-1, 1) if isinstance(first_slot, Tensor) else first_slot)
    words = hash32(base.unsqueeze(1) ^ _mul32(slots & MASK32, 0x7FEB352D))
    return (words >> 8).to(torch.float32) * (1.0 / (1 << 24))


def uniform_int(u: Tensor, n: int | Tensor) -> Tensor:
    """Integers uniform in ``[0, n)`` from uniforms ``u`` in ``[0, 1)`` (int64)."""
    k = (u * n).to(torch.int64)
    if isinstance(n, int):  # no host-to-device copy of a scalar
        return k.clamp_(max=n - 1)
    return torch.minimum(k, n - 1)


class BatchedEnv:
    """Base of the batched envs: seeding, auto-reset and the vector env's trainer API.

    Subclasses define :attr:`single_observation_space`, :attr:`single_action_space`,
    :meth:`_fresh` (new episodes for some rows), :meth:`_advance` (one step of every env,
    without reset) and :meth:`_observe` (the observation of every env).

    :param n_envs: ``N``.
    :param device: where the state and every output live.
    """

    single_observation_space: gym.spaces.Dict
    single_action_space: gym.spaces.Discrete
    memory_horizon: int | None = None
    on_device = True
    """Tells the trainer the observations are tensors on :attr:`device` (no numpy)."""

    def __init__(self, n_envs: int, device: torch.device | str = "cpu") -> None:
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        self.num_envs = int(n_envs)
        self.device = torch.device(device)
        self.groups = [slice(0, self.num_envs)]
        self.compact_resets = self.device.type == "cpu"
        """Reset and refill only the rows concerned (found with ``nonzero``, a host sync on an
        accelerator) instead of computing every row and masking."""
        self.keys = env_keys(0, self.num_envs, self.device)
        self.episodes = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self._stale = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.state: dict[str, Tensor] = {}
        self.obs: dict[str, Tensor] = {}
        self._next: dict[str, Tensor] = {}
        self._out: dict[str, Tensor] = {}  # OUTPUTS, [N] each
        self._actions: Tensor | None = None

    # ------------------------------------------------------------------ subclass hooks
    def _fresh(self, keys: Tensor, episodes: Tensor) -> dict[str, Tensor]:
        """The initial state of one episode of each env ``keys [M]`` / ``episodes [M]``."""
        raise NotImplementedError

    def _advance(self, actions: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Step every env in place: ``(reward [N] float32, terminated, truncated, success)``."""
        raise NotImplementedError

    def _observe(self) -> dict[str, Tensor]:
        """Every env's observation from :attr:`state`, ``[N, ...]`` each."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    min_episode_length = 1
    """No episode ends in fewer steps (a subclass sets it): the pool of next episodes
    (:meth:`_reset_done`) is refilled every ``min_episode_length - 1`` steps."""

    def load_rows(self, rows: Tensor, fresh: dict[str, Tensor]) -> None:
        """Overwrite the state of envs ``rows [M]`` (int64) with ``fresh`` (``[M, ...]``)."""
        for key, value in fresh.items():
            self.state[key][rows] = value.to(self.state[key].dtype)

    def _refill(self) -> None:
        """Draw the next episode of every env whose pooled one was used (in place)."""
        nxt = self.episodes + 1
        if self.compact_resets:
            rows = self._stale.nonzero().squeeze(1)
            if rows.numel():
                fresh = self._fresh(self.keys[rows], nxt[rows])
                for key, value in fresh.items():
                    self._next[key][rows] = value.to(self._next[key].dtype)
        else:
            fresh = self._fresh(self.keys, nxt)
            for key, value in fresh.items():
                pool = self._next[key]
                pool.copy_(_masked(self._stale, value.to(pool.dtype), pool))
        self._stale.zero_()

    def _reset_done(self, done: Tensor) -> None:
        """Start the next episode of every env where ``done``, in place: it is taken from a
        pool drawn ahead in batches (drawing a few rows costs as many ops as drawing all of
        them), which :meth:`tick` refills before any env can end again."""
        self.episodes.add_(done)
        if self.compact_resets:
            rows = done.nonzero().squeeze(1)
            if rows.numel():
                for key, cur in self.state.items():
                    cur[rows] = self._next[key][rows]
        else:
            for key, cur in self.state.items():
                cur.copy_(_masked(done, self._next[key], cur))
        self._stale |= done

    # ------------------------------------------------------------------ API
    def reset(self, seed: int) -> dict[str, Tensor]:
        """Reset every env (env ``i`` from ``seed + i``); returns the ``[N, ...]`` observation.

        Tensors kept from an earlier reset keep their storage (a recording reads them)."""
        n, dev = self.num_envs, self.device
        self.keys = _kept(self.keys, env_keys(seed, n, dev))
        self.episodes = _kept(self.episodes, torch.zeros(n, dtype=torch.int64, device=dev))
        self._stale = _kept(self._stale, torch.zeros(n, dtype=torch.bool, device=dev))
        for name, episodes in (("state", self.episodes), ("_next", self.episodes + 1)):
            for key, value in self._fresh(self.keys, episodes).items():
                _write(getattr(self, name), key, value)
        for key, value in self._observe().items():
            _write(self.obs, key, value)
        for key in OUTPUTS:
            dtype = torch.float32 if key == "reward" else torch.bool
            _write(self._out, key, torch.zeros(n, dtype=dtype, device=dev))
        self._steps = 0
        return self.obs

    def step(self, actions: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
        """Step every env with ``actions [N]``: ``(obs, reward, done, success)``, ``[N]`` each.

        ``done = terminated or truncated``; where ``done`` the observation is already the next
        episode's first one and ``success`` tells whether the finished episode succeeded.
        The outputs are the env's own tensors, overwritten by the next step.
        """
        out = self.step_recordable(self.checked_actions(actions))
        self.tick()
        return out

    def checked_actions(self, actions: Any) -> Tensor:
        """``actions`` as the ``[N]`` int64 tensor a step takes.

        :raises RuntimeError: no :meth:`reset` yet.
        :raises ValueError: not ``[N]``, not integers, or (on the CPU, where the check costs
            no wait on the device) outside the action space.
        """
        if "reward" not in self._out:
            raise RuntimeError("call reset(seed) before step: the envs hold no episode yet")
        actions = torch.as_tensor(actions, device=self.device)
        n = self.num_envs
        if actions.shape != (n,):
            raise ValueError(f"actions must be [{n}] (one per env), got {list(actions.shape)}")
        if (
            actions.dtype.is_floating_point
            or actions.dtype.is_complex
            or actions.dtype == torch.bool
        ):
            raise ValueError(f"actions must be integers, got {actions.dtype}")
        actions = actions.to(torch.int64)
        if self.device.type == "cpu":
            count = int(self.single_action_space.n)
            low, high = int(actions.min()), int(actions.max())
            if low < 0 or high >= count:
                bad = low if low < 0 else high
                raise ValueError(f"actions must be in 0..{count - 1} (the action space), got {bad}")
        return actions

    def step_recordable(self, actions: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
        """:meth:`step` without :meth:`tick`: every tensor it writes keeps its storage, and
        with ``compact_resets`` off nothing waits on the host, so a CUDA graph can record it.
        """
        actions = torch.as_tensor(actions, device=self.device).to(torch.int64)
        reward, terminated, truncated, success = self._advance(actions)
        done = terminated | truncated
        self._reset_done(done)
        for key, value in self._observe().items():
            _write(self.obs, key, value)
        outputs = (reward, done, success & done, terminated, truncated)
        torch._foreach_copy_([self._out[key] for key in OUTPUTS], list(outputs))
        return self.obs, self._out["reward"], self._out["done"], self._out["success"]

    @property
    def last_terminated(self) -> Tensor:
        """``[N]`` bool: the last step ended the episode by termination."""
        return self._out["terminated"]

    @property
    def last_truncated(self) -> Tensor:
        """``[N]`` bool: the last step ended the episode by time-out."""
        return self._out["truncated"]

    def tick(self) -> None:
        """Count a step and refill the pool of next episodes every ``min_episode_length - 1``
        steps (eager: the count lives on the host)."""
        self._steps += 1
        if self._steps % max(1, self.min_episode_length - 1) == 0:
            self._refill()

    # The vector env's grouped API (one group), so code written for VectorEnv runs too.
    def step_async(self, group: int, actions: Tensor) -> None:
        """Hold ``actions`` for :meth:`step_wait` (one group: ``group`` must be 0)."""
        if group != 0:
            raise ValueError(f"a batched env has one group, got group {group}")
        self._actions = self.checked_actions(actions)

    def step_wait(self, group: int) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
        """Step with the actions given to :meth:`step_async`."""
        if group != 0 or self._actions is None:
            raise RuntimeError(f"step_wait({group}) without step_async({group})")
        actions, self._actions = self._actions, None
        return self.step(actions)

    def to(self, device: torch.device | str) -> BatchedEnv:
        """Move the envs (state and constants) to ``device``; returns ``self``."""
        device = torch.device(device)
        for name, value in list(vars(self).items()):
            if isinstance(value, Tensor):
                setattr(self, name, value.to(device))
            elif isinstance(value, dict) and all(isinstance(v, Tensor) for v in value.values()):
                setattr(self, name, {k: v.to(device) for k, v in value.items()})
        self.device = device
        self.compact_resets = device.type == "cpu"
        return self

    def close(self) -> None:
        """Nothing to release (kept for the vector env's API)."""


def _kept(old: Tensor | None, value: Tensor) -> Tensor:
    """``value`` written into ``old`` (its storage kept) where ``old`` has ``value``'s shape,
    dtype and device and storage of its own; else a contiguous copy of ``value`` (which may be
    a view)."""
    if isinstance(old, Tensor) and old.is_contiguous() and (old.shape, old.dtype, old.device) == (
        value.shape, value.dtype, value.device,
    ):  # fmt: skip
        return old.copy_(value)
    return value.clone(memory_format=torch.contiguous_format)


def _write(store: dict[str, Tensor], key: str, value: Tensor) -> None:
    """``store[key] = value``, into the tensor already there where :func:`_kept` can."""
    store[key] = _kept(store.get(key), value)


def _masked(mask: Tensor, new: Tensor, old: Tensor) -> Tensor:
    """``new`` in the rows where ``mask [N]``, else ``old`` (``[N, ...]`` each)."""
    return torch.where(mask.view(-1, *([1] * (old.dim() - 1))), new, old)
