"""What a training run is built from (:class:`Setup`): made by :func:`agents.rl_trainer.setup`,
handed to the learners (:mod:`agents.learners`), below both."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.rl_config import RLConfig
from memcores.envs.batched import BatchedEnv
from memcores.envs.vector import VectorEnv


@dataclass
class Setup:
    """Everything a run needs, built and validated before any file is written."""

    config: RLConfig
    device: torch.device
    envs: VectorEnv | BatchedEnv
    policy: RecurrentActorCritic
    optimizer: torch.optim.Optimizer
    n_actions: int
    image_shape: tuple[int, ...]  # (H, W, 3) images, or (n,) vector observations
    graph_acting: bool = False  # train.graph_acting resolved (graph_obstacles)
    graph_update: bool = False  # train.graph_update resolved (graph_obstacles)
    graph_env_step: bool = False  # train.graph_env_step resolved (env_step_obstacle)
