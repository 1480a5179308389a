"""Recurrent PQN (Gallici et al., "Simplifying Deep Temporal Difference Learning", ICLR 2025):
Q-learning on the rollouts of the parallel envs, with no replay and no target network.

- The network is :class:`agents.q_network.RecurrentQNetwork` (LayerNorm in the Q head, which
  is what lets PQN drop the target network).
- Acting: epsilon-greedy over all envs with one schedule, linear from ``epsilon_start`` to
  ``epsilon_end`` over the first ``epsilon_fraction`` of ``train.total_steps`` frames
  (:func:`agents.q_network.linear_epsilon`), set before each rollout.
- Targets: Q(lambda) returns over each rollout, computed backwards,
  ``G_t = r_t + gamma (1 - d_t) [lambda G_{t+1} + (1 - lambda) max_a Q(s_{t+1}, a)]`` with
  ``G`` at the last step bootstrapped from ``max_a Q`` of the observation after the rollout;
  ``d_t``: step ``t`` ended its episode (a truncation too: the auto-reset drops its last
  observation). The rollout's GAE (:meth:`agents.rollout.RolloutBuffer.compute_returns`)
  with the values set to ``max_a Q`` of the acting network is exactly this return
  (``returns = advantages + values`` unrolls to the line above; ``tests/test_pqn.py`` pins
  it by hand), so the rollout is collected and its returns computed as PPO's are, with
  ``gae_lambda`` as lambda.
- Update: ``n_epochs`` passes over minibatches of whole chunks, each replayed from its stored
  chunk-start state in one core call as PPO's update does, loss
  ``0.5 * mean (Q(s_t, a_t) - G_t)^2``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.ppo import (
    UpdateStats,
    _backward,
    _step_if,
    explained_variance,
    minibatch_indices,
)
from memcores.agents.q_network import EpsilonGreedy, linear_epsilon
from memcores.agents.rl_config import AgentConfig
from memcores.agents.rollout import Acting, ChunkBatch, RolloutBuffer, batch_to, select_chunks

if TYPE_CHECKING:
    from memcores.agents.run_setup import Setup


def q_lambda_returns(
    rewards: Tensor,
    starts: Tensor,
    max_q: Tensor,
    last_max_q: Tensor,
    last_start: Tensor,
    gamma: float,
    lam: float,
) -> Tensor:
    """Q(lambda) returns (Peng's, as PQN) over a rollout, computed backwards.

    :param rewards: ``[S, N]`` reward of step ``t``.
    :param starts: ``[S, N]`` bool, observation ``t`` begins an episode (so step ``t - 1``
        ended one).
    :param max_q: ``[S, N]`` ``max_a Q(s_t, a)``.
    :param last_max_q: ``[N]`` ``max_a Q`` of the observation after the rollout.
    :param last_start: ``[N]`` bool, the last step ended its episode.
    :return: ``[S, N]`` ``G_t = r_t + gamma (1 - d_t) (lambda G_{t+1} + (1 - lambda) maxQ_{t+1})``.
    """
    S = rewards.shape[0]
    out = torch.empty_like(rewards)
    next_g, next_q, next_done = last_max_q, last_max_q, last_start.float()
    for t in reversed(range(S)):
        blend = lam * next_g + (1 - lam) * next_q
        out[t] = rewards[t] + gamma * (1 - next_done) * blend
        next_g, next_q, next_done = out[t], max_q[t], starts[t].float()
    return out


def td_loss(
    policy: RecurrentActorCritic, mb: ChunkBatch, recon_coef: float = 0.0
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The loss ``0.5 mean (Q(s, a) - G)^2`` on minibatch ``mb`` (its chunks replayed from
    their stored states in one core call; plus ``recon_coef`` times the reconstruction loss
    where the network has a decoder), the mean ``Q(s, a)``, mean ``|TD|`` and the
    reconstruction loss before its coefficient (0 without a decoder), the last three
    detached for logging."""
    out = policy(mb.obs, mb.state, mb.starts)
    q = out.logits.gather(-1, mb.actions.long().unsqueeze(-1)).squeeze(-1)  # [L, M]
    td = q - mb.returns
    loss = 0.5 * td.pow(2).mean()
    recon = torch.zeros_like(loss)
    decoder = policy.decoder
    if decoder is not None:
        recon = decoder.loss(out.features, mb.obs, mb.starts)
        loss = loss + recon * recon_coef
    return loss, q.detach().mean(), td.detach().abs().mean(), recon.detach()


def update(
    policy: RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    agent: AgentConfig,
    generator: torch.Generator | None = None,
) -> UpdateStats:
    """``n_epochs`` passes over minibatches of ``minibatch_size // seq_len`` chunks, one
    clipped Adam step each (skipped where the loss or gradient norm is not finite)."""
    batch = buffer.chunks()
    device = next(policy.parameters()).device
    if device != buffer.device:
        batch = batch_to(batch, device)
    per_mb = max(1, agent.minibatch_size // buffer.seq_len)
    params = [p for p in policy.parameters() if p.requires_grad]
    policy.train()
    rows: list[Tensor] = []
    for index in minibatch_indices(buffer.n_chunks, per_mb, agent.n_epochs, device, generator):
        mb = select_chunks(batch, index)
        loss, q_mean, td_mean, recon = td_loss(policy, mb, agent.recon_coef)
        grad_norm = _backward(optimizer, loss, params, agent.max_grad_norm)
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm.to(loss.device))
        _step_if(optimizer, finite if device.type == "cuda" else bool(finite))
        row = [loss.detach(), grad_norm.to(loss.device), q_mean, td_mean, recon]
        rows.append(torch.stack(row))
    table = torch.stack(rows).double().cpu()
    applied = table[torch.isfinite(table[:, :2]).all(1)]
    means = applied.mean(0).tolist() if len(applied) else [math.nan] * 5
    return UpdateStats(
        value_loss=means[0] - agent.recon_coef * means[4],  # the TD part, as PPO's value loss
        recon_loss=means[4],
        loss=means[0],
        grad_norm=means[1],
        explained_variance=explained_variance(buffer.values, buffer.returns),
        n_minibatches=len(applied),
        skipped_updates=len(table) - len(applied),
        extra={"train/q_values": means[2] / agent.reward_scale, "train/td_error": means[3]},
    )


class PQNLearner:
    """``agent.algo=pqn`` for the trainer's loop (:class:`agents.learners.Learner`)."""

    def __init__(self, s: Setup, frames: int, generator: torch.Generator | None) -> None:
        self.s, self.generator = s, generator
        self.chunk_len = s.config.agent.seq_len
        self.frames = frames
        self.epsilon = torch.full((s.config.env.n_envs,), self._epsilon())

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the network and the optimiser (epsilon follows the frame count)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""

    def _epsilon(self) -> float:
        agent = self.s.config.agent
        return linear_epsilon(
            self.frames,
            self.s.config.train.total_steps,
            agent.epsilon_start,
            agent.epsilon_end,
            agent.epsilon_fraction,
        )

    def acting(self, policy: RecurrentActorCritic, groups: list[slice]) -> Acting | None:
        """Epsilon-greedy on the acting network, all envs at :attr:`epsilon`."""
        return EpsilonGreedy(policy, self.epsilon, groups)  # type: ignore[arg-type]

    def learn(self, buffer: RolloutBuffer) -> UpdateStats:
        """The update on the rollout, then the next rollout's epsilon."""
        s = self.s
        stats = update(s.policy, s.optimizer, buffer, s.config.agent, self.generator)
        stats.extra["train/epsilon"] = float(self.epsilon[0])
        self.frames += buffer.n_steps * buffer.n_envs
        self.epsilon.fill_(self._epsilon())
        return stats
