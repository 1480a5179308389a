"""POPGym environments (Morad et al., "POPGym: Benchmarking Partially Observable Reinforcement
Learning", ICLR 2023, arXiv:2303.01859) as ``popgym/<Name>-v0`` ids with a vector observation.

Every env class in ``popgym.envs.ALL`` is registered as ``popgym/<ClassName>-v0`` (e.g.
``popgym/RepeatPreviousEasy-v0``). :func:`make_popgym` wraps it the way POPGym's own PPO
baseline does (``Antialias(PreviousAction(env))``: the previous action and a first-step flag
are part of the observation), optionally adds the previous reward, and flattens everything
into one float vector::

    Dict("vector": Box(-inf, inf, (n,), float32))
      = [ observation            Discrete/MultiDiscrete one-hot, Box as is, Tuple concatenated
        | previous action        one-hot (each MultiDiscrete part), zeros at the first step
        | is first step          1.0 at the first step of an episode, else 0.0
        | previous reward ]      only with ``prev_reward=True`` (0.0 at the first step)

A ``MultiDiscrete`` action space (Battleship, MineSweeper) becomes one ``Discrete`` of
``prod(nvec)`` actions (POPGym's ``DiscreteAction`` wrapper). Continuous action spaces
(the Pendulum envs) are refused with a one-line error: the memcores policies are categorical.
The labyrinth envs exist only when the optional ``mazelib`` package is installed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import register, registry

PREFIX = "popgym/"


def _popgym_classes() -> dict[str, type]:
    """``popgym/<ClassName>-v0`` -> env class, for every env POPGym registers."""
    from popgym import envs as popgym_envs

    return {f"{PREFIX}{cls.__name__}-v0": cls for cls in popgym_envs.ALL}


POPGYM_IDS: dict[str, type] = _popgym_classes()
"""Every registered POPGym id -> its env class."""


def unsupported_reason(env_id: str) -> str | None:
    """Why the memcores agents cannot train on ``env_id`` (None when they can)."""
    action_space = POPGYM_IDS[env_id]().action_space
    if isinstance(action_space, (spaces.Discrete, spaces.MultiDiscrete)):
        return None
    return (
        f"env {env_id!r} has a continuous action space {action_space}; the memcores "
        "policies are categorical (Discrete or MultiDiscrete actions only)"
    )


def _flat_size(space: spaces.Space) -> int:
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return int(np.prod(space.shape))
    if isinstance(space, spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    raise ValueError(f"unsupported POPGym observation space {space}")


def _flatten(space: spaces.Space, value: Any, out: np.ndarray) -> int:
    """Write ``value`` of ``space`` into ``out`` (one-hot for discrete parts); returns size."""
    if isinstance(space, spaces.Discrete):
        out[int(value) - int(space.start)] = 1.0
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        offset = 0
        for v, n in zip(np.asarray(value).ravel(), space.nvec.ravel(), strict=True):
            out[offset + int(v)] = 1.0
            offset += int(n)
        return offset
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        flat = np.asarray(value, dtype=np.float32).ravel()
        out[: flat.size] = flat
        return flat.size
    if isinstance(space, spaces.Tuple):
        offset = 0
        for sub, v in zip(space.spaces, value, strict=True):
            offset += _flatten(sub, v, out[offset:])
        return offset
    raise ValueError(f"unsupported POPGym observation space {space}")


class VectorObservation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """POPGym env -> ``Dict(vector=Box(n,))`` with previous action, first-step flag and
    (optionally) previous reward; ``MultiDiscrete`` actions raveled into one ``Discrete``."""

    def __init__(self, env: gym.Env, prev_reward: bool = False) -> None:
        gym.utils.RecordConstructorArgs.__init__(self, prev_reward=prev_reward)
        gym.Wrapper.__init__(self, env)
        self.prev_reward = bool(prev_reward)
        self._obs_space = env.observation_space
        self._act_space = env.action_space
        size = _flat_size(self._obs_space) + _flat_size(self._act_space) + 1 + self.prev_reward
        self.observation_space = spaces.Dict(
            {"vector": spaces.Box(-np.inf, np.inf, shape=(size,), dtype=np.float32)}
        )
        if isinstance(self._act_space, spaces.MultiDiscrete):
            self.action_space = spaces.Discrete(int(np.prod(self._act_space.nvec)))
        else:
            self.action_space = self._act_space

    def _vector(self, obs: Any, action: Any, reward: float, first: bool) -> dict[str, np.ndarray]:
        out = np.zeros(self.observation_space["vector"].shape, dtype=np.float32)
        offset = _flatten(self._obs_space, obs, out)
        if not first:
            _flatten(self._act_space, action, out[offset:])
        offset += _flat_size(self._act_space)
        out[offset] = float(first)
        if self.prev_reward:
            out[offset + 1] = reward
        return {"vector": out}

    def reset(self, **kwargs: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._vector(obs, None, 0.0, True), dict(info)

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        if isinstance(self._act_space, spaces.MultiDiscrete):
            action = np.array(np.unravel_index(int(action), self._act_space.nvec))
        obs, reward, terminated, truncated, info = self.env.step(action)
        return (
            self._vector(obs, action, float(reward), False),
            float(reward),
            terminated,
            truncated,
            dict(info),
        )


def _build(env_class: str, prev_reward: bool = False, **kwargs: Any) -> gym.Env:
    """Gymnasium entry point of every ``popgym/*`` id."""
    cls = POPGYM_IDS[f"{PREFIX}{env_class}-v0"]
    return VectorObservation(cls(**kwargs), prev_reward=prev_reward)


for _id, _cls in POPGYM_IDS.items():
    if _id not in registry:
        register(
            id=_id,
            entry_point="memcores.envs.popgym_env:_build",
            kwargs={"env_class": _cls.__name__},
            disable_env_checker=True,
        )


def make_popgym(env_id: str, **env_kwargs: Any) -> gym.Env:
    """Build a registered ``popgym/*`` id (see the module docstring).

    :param env_kwargs: ``prev_reward`` (bool) and the env class's own options.
    :raises ValueError: a continuous-action env or options the env does not take.
    """
    reason = unsupported_reason(env_id)
    if reason:
        raise ValueError(reason)
    try:
        return gym.make(env_id, **env_kwargs)
    except TypeError as exc:
        raise ValueError(f"bad options for {env_id!r} {sorted(env_kwargs)}: {exc}") from exc


def describe(env_id: str) -> str:
    """One line for ``memcores list envs``."""
    cls = POPGYM_IDS[env_id]
    doc = (cls.__doc__ or cls.__mro__[1].__doc__ or "").strip().splitlines()
    text = f"POPGym {cls.__name__}" + (f": {doc[0].strip()}" if doc else "")
    reason = unsupported_reason(env_id)
    return text + (" - unsupported: continuous actions" if reason else "")
