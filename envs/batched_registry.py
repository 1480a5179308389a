"""The batched version of an env id: :func:`make_batched_env` and :func:`batched_ids`.

A module of its own above :mod:`envs.batched` (the mechanics every batched env shares) and
the envs built on it, which it imports.
"""

from __future__ import annotations

from typing import Any

import torch

from memcores.envs import MEMORY_MATCH_IDS
from memcores.envs.batched import BatchedEnv
from memcores.envs.batched_memory_match import BatchedVisualMatch, memory_match_kwargs
from memcores.envs.batched_popgym import BATCHED_POPGYM, make_batched_popgym
from memcores.envs.env_options import check_env_options


def make_batched_env(
    env_id: str,
    n_envs: int,
    device: torch.device | str = "cpu",
    env_kwargs: dict[str, Any] | None = None,
) -> BatchedEnv:
    """The batched version of ``env_id`` (one of :func:`batched_ids`), ``n_envs`` envs on
    ``device``.

    :raises ValueError: no batched version of ``env_id`` (the message lists those there are),
        or options it does not take.
    """
    env_kwargs = dict(env_kwargs or {})
    ids = batched_ids()
    if env_id not in ids:
        raise ValueError(
            f"env {env_id!r} has no batched version (env.vector=batched); batched ids: "
            f"{', '.join(ids)}"
        )
    check_env_options(env_id, env_kwargs)
    if env_id in BATCHED_POPGYM:
        return make_batched_popgym(env_id, n_envs, device, env_kwargs)
    return BatchedVisualMatch(n_envs, device=device, **memory_match_kwargs(env_id, env_kwargs))


def batched_ids() -> list[str]:
    """Every env id with a batched version."""
    return [*MEMORY_MATCH_IDS, *BATCHED_POPGYM]
