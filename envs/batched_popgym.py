"""POPGym envs as batched torch envs (placeholder registry, filled below)."""

from __future__ import annotations

BATCHED_POPGYM: dict[str, object] = {}


def make_batched_popgym(env_id, n_envs, device, env_kwargs):  # noqa: ANN001, ANN201
    raise ValueError(env_id)
