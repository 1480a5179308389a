"""The learners ``memcores train`` can run (``agent.algo``), behind one interface.

The trainer's loop (:mod:`agents.rl_trainer`) is the same for every algorithm: collect a
rollout of ``n_steps`` steps of every env into a :class:`~agents.rollout.RolloutBuffer`, hand
it to the learner, log, checkpoint. A learner says how the rollout is cut into chunks
(:attr:`Learner.chunk_len`), how the envs are acted in (:meth:`Learner.acting`: ``None`` for
the policy's own sampling) and what one update does with the rollout (:meth:`Learner.learn`).
Each algorithm's differences live in its module: :mod:`agents.ppo` (PPO, A2C),
:mod:`agents.pqn`, :mod:`agents.r2d2`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.ppo import UpdateStats, update
from memcores.agents.rl_config import RLConfig
from memcores.agents.rollout import Acting, RolloutBuffer

if TYPE_CHECKING:
    from memcores.agents.run_setup import Setup
    from memcores.agents.update_graph import UpdateGraph


class Learner(Protocol):
    """What the trainer's loop asks of an algorithm."""

    chunk_len: int
    """Steps per stored chunk of the rollout buffer (a core state is stored at each start)."""

    def acting(self, policy: RecurrentActorCritic, groups: list[slice]) -> Acting | None:
        """How ``policy`` acts in the envs (acting in ``groups`` of rows); ``None``: by
        sampling its own distribution (:func:`agents.rollout.act`)."""
        ...

    def learn(self, buffer: RolloutBuffer) -> UpdateStats:
        """One update from a filled ``buffer`` (its GAE returns computed)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves of the learner beyond the network and the optimiser
        (checkpoint values: tensors, numbers, lists and dicts of them); empty: nothing."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` when a run resumes (``{}`` from a checkpoint without)."""
        ...


class PolicyGradient:
    """PPO and A2C: :func:`agents.ppo.update` on each rollout."""

    def __init__(
        self, s: Setup, generator: torch.Generator | None, graph: UpdateGraph | None
    ) -> None:
        self.s, self.generator, self.graph = s, generator, graph
        self.chunk_len = s.config.agent.seq_len

    def acting(self, policy: RecurrentActorCritic, groups: list[slice]) -> Acting | None:
        """PPO and A2C act by sampling their policy."""
        return None

    def learn(self, buffer: RolloutBuffer) -> UpdateStats:
        s = self.s
        return update(s.policy, s.optimizer, buffer, s.config.agent, self.generator, self.graph)

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the network and the optimiser."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


def make_learner(
    s: Setup,
    frames: int,
    generator: torch.Generator | None = None,
    graph: UpdateGraph | None = None,
) -> Learner:
    """The learner of ``s.config.agent.algo``, starting at ``frames`` frames collected (a
    resumed run restores the rest with :meth:`Learner.load_state_dict`).

    :param generator: the minibatch order's RNG (``None``: torch's global one).
    :param graph: PPO's recorded minibatch step (``train.graph_update``), or ``None``.
    """
    algo = s.config.agent.algo
    if algo == "pqn":
        from memcores.agents.pqn import PQNLearner

        return PQNLearner(s, frames, generator)
    if algo == "r2d2":
        from memcores.agents.r2d2 import R2D2Learner

        return R2D2Learner(s, frames)
    return PolicyGradient(s, generator, graph)


def acting_obstacle(algo: str) -> str | None:
    """Why the acting graphs (``train.graph_acting``, ``train.graph_env_step``) cannot apply
    to ``algo`` (None where they can): they record the policy's own sampling, and the
    value-based learners act epsilon-greedily."""
    if algo in ("pqn", "r2d2"):
        return f"agent.algo={algo} acts epsilon-greedily, not through the recorded sampling"
    return None


def check_learner_memory(config: RLConfig, obs_bytes: int, device: torch.device) -> None:
    """Refuse a learner's own storage that cannot fit memory, before any env is made (R2D2's
    replay: :func:`agents.replay.replay_bytes`).

    :raises ValueError: one line naming the keys, the sizes and what to lower.
    """
    if config.agent.algo != "r2d2":
        return
    from memcores.agents.replay import check_replay_fits

    check_replay_fits(config, obs_bytes, device)
