"""Shared helpers of the RL tests: a tiny, fast config; the grid a sweep config documents."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import Tensor

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.ppo import replay_chunks
from memcores.agents.rl_config import RLConfig
from memcores.agents.rollout import ChunkBatch
from memcores.experiments.config import load_config

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


def sb3_recurrent_ppo(
    core: str,
    *,
    n_steps: int = 16,
    hidden_size: int = 16,
    core_options: dict[str, Any] | None = None,
    max_steps: int = 20,
    device: str = "auto",
) -> Any:
    """sb3-contrib ``RecurrentPPO`` with memcores' ``CorePolicy`` (one shared core) on two
    flattened MiniGrid-Empty-5x5 envs, one epoch per ``n_steps`` rollout, seed 0; the vector
    env is ``model.get_env()``; the policy on ``device``."""
    import gymnasium as gym
    from minigrid.wrappers import ImgObsWrapper
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv

    import memcores.envs  # noqa: F401  (registers MiniGrid ids)
    from memcores.agents.sb3_policy import CorePolicy

    def env() -> gym.Env:
        return gym.wrappers.FlattenObservation(
            ImgObsWrapper(gym.make("MiniGrid-Empty-5x5-v0", max_steps=max_steps))
        )

    model = RecurrentPPO(
        CorePolicy,
        DummyVecEnv([env, env]),
        n_steps=n_steps,
        batch_size=n_steps,
        n_epochs=1,
        policy_kwargs=dict(
            core=core,
            core_options=core_options,
            lstm_hidden_size=hidden_size,
            shared_lstm=True,
            enable_critic_lstm=False,
        ),
        seed=0,
        device=device,
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # no SB3-<time> folder per learn()
    return model


def documented_grid(config: str | Path) -> list[tuple[str, list[str]]]:
    """The ``--grid KEY=v1,v2`` options of the sweep command in a config's header comment."""
    header = Path(config).read_text().split("\nenv:")[0]
    return [(k, v.split(",")) for k, v in re.findall(r"--grid ([\w.]+)=(\S+)", header)]


def evaluate_chunks(policy: RecurrentActorCritic, mb: ChunkBatch) -> tuple[Tensor, Tensor, Tensor]:
    """Replay chunks with ONE core call: log-probs, entropy and values, each ``[L, M]``."""
    logprobs, entropy, values, _ = replay_chunks(policy, mb)
    return logprobs, entropy, values
