"""R2D2 (Kapturowski et al., "Recurrent Experience Replay in Distributed Reinforcement
Learning", ICLR 2019) on the envs of one process.

- Acting: :class:`agents.q_network.RecurrentQNetwork`, epsilon-greedy with one fixed epsilon
  per env, Ape-X's ``eps_i = apex_epsilon ** (1 + i / (N - 1) * apex_alpha)``
  (:func:`agents.q_network.apex_epsilons`).
- Storage: each rollout goes into the prioritized sequence replay (:mod:`agents.replay`) with
  the acting network's core state at every sequence start (stored state), sequences of
  ``burn_in + seq_len + n_step`` steps starting every ``replay_stride`` steps (overlapping).
- Learning: once ``learning_starts`` frames are stored, ``n_epochs`` gradient steps per rollout
  on ``replay_batch`` sequences each. A sequence is replayed from its stored state: the online
  network runs over the first ``burn_in`` steps without gradient (recomputing the state),
  then over the rest with gradient (:func:`online_q`); the target network over the whole
  sequence. Targets are n-step double Q with the value rescaling ``h``
  (:func:`nstep_targets`, :func:`rescale`): ``y_t = h(sum_{k<n} gamma^k r_{t+k} + gamma^n
  h^-1(Q_target(s_{t+n}, argmax_a Q_online(s_{t+n}, a))))``, the sum cut and nothing
  bootstrapped where an episode ends first (a truncation too: the auto-reset drops the last
  observation, as for PPO's GAE). Loss ``0.5 mean_i w_i mean_t (Q - y)^2`` over the
  ``seq_len`` steps after the burn-in, ``w_i`` the importance weights; the sequence's
  priority becomes ``eta max|TD| + (1 - eta) mean|TD|``. The target network is a copy of the
  online one, refreshed every ``target_update_every`` gradient steps.
- Resume: checkpoints hold the replay (every stored step, state and priority), the target
  network and the gradient-step count (:meth:`R2D2Learner.state_dict`), so a resumed run
  samples what an uninterrupted one would have. A checkpoint without them (written before
  replays were saved) or with a replay of another layout (``agent.replay_size``,
  ``env.n_envs``, the sequence lengths changed on resume) starts with an empty replay and a
  target copied from the online network, and says so (:data:`RESUME_NOTE`).
"""

from __future__ import annotations

import copy
import math
import sys
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.ppo import UpdateStats, _backward, _step_if
from memcores.agents.q_network import EpsilonGreedy, apex_epsilons
from memcores.agents.replay import SequenceReplay, Sequences, capacity, sequence_priority, window
from memcores.agents.rl_config import AgentConfig
from memcores.agents.rollout import Acting, RolloutBuffer
from memcores.cores import State

if TYPE_CHECKING:
    from memcores.agents.run_setup import Setup

RESUME_NOTE = (
    "memcores train: agent.algo=r2d2 resumes without its replay ({}); the resumed run "
    "starts with an empty replay and learns again after agent.learning_starts={} frames"
)
"""What a resumed R2D2 run prints (on stderr) when its checkpoint's replay cannot be used."""


def rescale(x: Tensor, eps: float) -> Tensor:
    """The invertible value rescaling ``h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x``."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def unrescale(x: Tensor, eps: float) -> Tensor:
    """``h^-1``: ``sign(x)(((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``."""
    root = (torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(x) * (root.pow(2) - 1)


def nstep_targets(
    rewards: Tensor, starts: Tensor, bootstrap: Tensor, gamma: float, n: int, length: int
) -> Tensor:
    """n-step returns of steps ``0 .. length - 1`` of a sequence (in reward units).

    :param rewards: ``[W, B]`` reward of step ``t`` (``W >= length + n``).
    :param starts: ``[W, B]`` bool, observation ``t`` begins an episode (step ``t - 1`` ended
        one: the sum stops there and nothing is bootstrapped).
    :param bootstrap: ``[W, B]`` the value of observation ``t`` to bootstrap from (for double
        Q: ``h^-1(Q_target(s_t, argmax_a Q_online(s_t, a)))``).
    :return: ``[length, B]`` ``sum_{k<n} gamma^k r_{t+k} + gamma^n bootstrap_{t+n}`` with the
        terms after an episode end dropped.
    """
    out = torch.zeros_like(rewards[:length])
    alive = torch.ones_like(out)
    for k in range(n):
        out = out + alive * gamma**k * rewards[k : k + length]
        alive = alive * (~starts[k + 1 : k + 1 + length]).float()
    return out + alive * gamma**n * bootstrap[n : n + length]


def double_q_bootstrap(q_online: Tensor, q_target: Tensor, eps: float) -> Tensor:
    """Double Q's bootstrap in reward units: ``h^-1(Q_target(s, argmax_a Q_online(s, a)))``;
    ``[..., A]`` each -> ``[...]``."""
    best = q_online.argmax(-1, keepdim=True)
    return unrescale(q_target.gather(-1, best).squeeze(-1), eps)


def online_q(policy: RecurrentActorCritic, seq: Sequences, burn_in: int) -> Tensor:
    """``Q [W - burn_in, B, A]`` of the online network over a sequence replayed from its stored
    state, the first ``burn_in`` steps run without gradient (only their final state is kept)."""
    state: State = seq.state
    if burn_in > 0:
        with torch.no_grad():
            head = {k: v[:burn_in] for k, v in seq.obs.items()}
            state = policy(head, state, seq.starts[:burn_in]).state
    tail = {k: v[burn_in:] for k, v in seq.obs.items()}
    return policy(tail, state, seq.starts[burn_in:]).logits


def r2d2_loss(
    policy: RecurrentActorCritic,
    target: RecurrentActorCritic,
    seq: Sequences,
    weights: Tensor,
    agent: AgentConfig,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The weighted loss of one batch of sequences, the sequences' new priorities ``[B]``, the
    mean ``Q(s, a)`` (in the env's reward units: unrescaled, divided by
    ``agent.reward_scale``) and the mean ``|TD|`` (rescaled units)."""
    b, eps, L = agent.burn_in, agent.value_rescale_eps, agent.seq_len
    q = online_q(policy, seq, b)  # [W - b, B, A]
    with torch.no_grad():
        q_target = target(seq.obs, seq.state, seq.starts).logits[b:]  # [W - b, B, A]
        bootstrap = double_q_bootstrap(q.detach(), q_target, eps)
        rewards = seq.rewards[b:] * agent.reward_scale
        returns = nstep_targets(rewards, seq.starts[b:], bootstrap, agent.gamma, agent.n_step, L)
        y = rescale(returns, eps)  # [L, B]
    taken = q[:L].gather(-1, seq.actions[b : b + L].unsqueeze(-1)).squeeze(-1)  # [L, B]
    td = taken - y
    loss = 0.5 * (weights.unsqueeze(0) * td.pow(2)).mean()
    priorities = sequence_priority(td.detach(), agent.priority_eta)
    q_mean = unrescale(taken.detach(), eps).mean() / agent.reward_scale
    return loss, priorities, q_mean, td.detach().abs().mean()


class R2D2Learner:
    """``agent.algo=r2d2`` for the trainer's loop (:class:`agents.learners.Learner`)."""

    def __init__(self, s: Setup, frames: int) -> None:
        agent = s.config.agent
        self.s, self.agent = s, agent
        self.chunk_len = agent.stride
        n = s.config.env.n_envs
        self.epsilon = apex_epsilons(n, agent.apex_epsilon, agent.apex_alpha)
        self.target = copy.deepcopy(s.policy).requires_grad_(False)
        self.replay: SequenceReplay | None = None  # made from the first rollout's layout
        self._saved_replay: dict[str, Any] | None = None  # a resumed run's, loaded with it
        self.grad_steps = 0

    def state_dict(self) -> dict[str, Any]:
        """The replay (``None`` before the first rollout), the target network's weights and
        the gradient steps taken: what a checkpoint saves beyond the online network."""
        return {
            "replay": None if self.replay is None else self.replay.state_dict(),
            "target": self.target.state_dict(),
            "grad_steps": self.grad_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the replay is filled when the first rollout gives its
        device and observation layout); an empty ``state`` (a checkpoint that predates saved
        replays) keeps a fresh replay and says so on stderr."""
        if not state.get("replay"):
            why = "the checkpoint holds none"
            print(RESUME_NOTE.format(why, self.agent.learning_starts), file=sys.stderr)
            return
        self.target.load_state_dict(state["target"])
        self.grad_steps = int(state["grad_steps"])
        self._saved_replay = state["replay"]

    def acting(self, policy: RecurrentActorCritic, groups: list[slice]) -> Acting | None:
        """Epsilon-greedy on the acting network, env ``i`` at Ape-X's ``eps_i``."""
        return EpsilonGreedy(policy, self.epsilon, groups)  # type: ignore[arg-type]

    def _replay_for(self, buffer: RolloutBuffer) -> SequenceReplay:
        if self.replay is None:
            shapes = {k: (tuple(v.shape[2:]), v.dtype) for k, v in buffer.obs.items()}
            template = tuple(c[0] for c in buffer.chunk_states)  # [N, ...] each
            self.replay = SequenceReplay(
                shapes,
                capacity(self.agent, buffer.n_envs),
                buffer.n_envs,
                self.agent.stride,
                window(self.agent),
                template,
                buffer.device,
            )
            if self._saved_replay is not None:
                self._restore_replay(self.replay, self._saved_replay)
                self._saved_replay = None
        return self.replay

    def _restore_replay(self, replay: SequenceReplay, saved: dict[str, Any]) -> None:
        try:
            replay.load_state_dict(saved)
        except ValueError as err:  # the run's settings changed on resume
            print(RESUME_NOTE.format(err, self.agent.learning_starts), file=sys.stderr)
            self.target.load_state_dict(self.s.policy.state_dict())

    def learn(self, buffer: RolloutBuffer) -> UpdateStats:
        """Store the rollout; then, past ``learning_starts``, ``n_epochs`` gradient steps."""
        agent, s = self.agent, self.s
        replay = self._replay_for(buffer)
        replay.add(buffer)
        extra = {"train/epsilon": float(self.epsilon.mean())}
        stored = replay.written * replay.n_envs
        if stored < agent.learning_starts or not bool(replay.valid().any()):
            nan = float("nan")
            extra |= {"train/q_values": nan, "train/td_error": nan}
            return UpdateStats(value_loss=nan, loss=nan, grad_norm=nan, extra=extra)
        params = [p for p in s.policy.parameters() if p.requires_grad]
        device = next(s.policy.parameters()).device
        s.policy.train()
        self.target.eval()
        rows = []
        for _ in range(agent.n_epochs):
            seq, index, weights = replay.sample(
                agent.replay_batch, agent.priority_alpha, agent.priority_beta
            )
            if replay.device != device:
                seq = _sequences_to(seq, device)
                weights = weights.to(device)
            loss, priorities, q_mean, td_mean = r2d2_loss(
                s.policy, self.target, seq, weights, agent
            )
            grad_norm = _backward(s.optimizer, loss, params, agent.max_grad_norm)
            finite = bool(torch.isfinite(loss) & torch.isfinite(grad_norm))
            _step_if(s.optimizer, finite)
            if finite:
                replay.update_priorities(index, priorities)
            self.grad_steps += 1
            if self.grad_steps % agent.target_update_every == 0:
                self.target.load_state_dict(s.policy.state_dict())
            rows.append([float(v.detach()) for v in (loss, grad_norm, q_mean, td_mean)])
        applied = [r for r in rows if math.isfinite(r[0]) and math.isfinite(r[1])]
        means = [sum(col) / len(applied) for col in zip(*applied, strict=True)] or [math.nan] * 4
        extra |= {"train/q_values": means[2], "train/td_error": means[3]}
        return UpdateStats(
            value_loss=means[0],
            loss=means[0],
            grad_norm=means[1],
            n_minibatches=len(applied),
            skipped_updates=len(rows) - len(applied),
            extra=extra,
        )


def _sequences_to(seq: Sequences, device: torch.device) -> Sequences:
    """``seq`` with every tensor on ``device`` (a replay on the CPU for a GPU learner)."""
    return Sequences(
        obs={k: v.to(device) for k, v in seq.obs.items()},
        starts=seq.starts.to(device),
        actions=seq.actions.to(device),
        rewards=seq.rewards.to(device),
        state=tuple(x.to(device) for x in seq.state),
    )
