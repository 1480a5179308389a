"""The network an RL config describes (:func:`build_policy`): an actor-critic for PPO/A2C, a
Q-network for the value-based learners. Above both network modules, which it chooses between."""

from __future__ import annotations

from typing import Any

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.q_network import RecurrentQNetwork, value_based
from memcores.envs.observation import VOCAB_SIZE


def build_policy(config: Any, n_actions: int, image_shape: tuple[int, ...]) -> Any:
    """The policy described by an :class:`agents.rl_config.RLConfig`: an actor-critic for
    PPO/A2C, a :class:`agents.q_network.RecurrentQNetwork` for the value-based algorithms."""
    network = RecurrentQNetwork if value_based(config.agent.algo) else RecurrentActorCritic
    return network(
        n_actions=n_actions,
        core_name=config.core.name,
        hidden_size=config.core.hidden_size,
        core_options=config.core.options,
        image_encoder=config.agent.image_encoder,
        mission=config.agent.mission,
        vocab_size=VOCAB_SIZE,
        image_shape=image_shape,
        separate_critic=config.agent.separate_critic,
        recon_lags=tuple(config.agent.recon_lags) if config.agent.recon_coef > 0 else (),
        recon_objects_only=config.agent.recon_target == "objects",
    )
