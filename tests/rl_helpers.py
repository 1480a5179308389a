"""Shared helpers of the RL tests: a tiny, fast config."""

from __future__ import annotations

from agents.rl_config import RLConfig
from experiments.config import load_config

TINY = [
    "env.id=MiniGrid-Empty-5x5-v0",
    "env.n_envs=2",
    "env.kwargs.max_steps=20",  # short episodes: boundaries inside chunks, rollout stats
    "core.hidden_size=16",
    "agent.n_steps=32",
    "agent.seq_len=8",
    "agent.n_epochs=2",
    "agent.minibatch_size=32",
    "train.total_steps=128",
    "train.device=cpu",
    "train.progress=false",
    "train.checkpoint_every=1",
    "train.histogram_every=1",
]
"""2 envs x 32 steps per update, 4 updates, chunks of 8 steps, hidden size 16."""


def tiny_config(*overrides: str) -> RLConfig:
    """The tiny config with ``overrides`` applied on top."""
    return load_config(RLConfig, None, [*TINY, *overrides])
