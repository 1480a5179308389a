"""The recurrent Q-network of the value-based learners (``agent.algo=pqn`` and ``r2d2``), and
what both share: epsilon-greedy acting and the learners' statistics.

The network is :class:`agents.policy.RecurrentActorCritic`'s encoder and core with one head:
``Linear(H, 64) -> LayerNorm -> ReLU -> Linear(64, A)`` giving ``Q(s, .)``. PQN relies on the
LayerNorm to train without a target network (Gallici et al., ICLR 2025); R2D2 keeps it too, so
both share one network. The last layer starts small (orthogonal, gain 0.01, as PPO's actor
head): Q starts near 0, so the first steps learn the differences between actions instead of
shrinking an initial output of order 1 towards returns of order 0.01 (POPGym's per-step
rewards are ``1 / episode length``). :meth:`RecurrentQNetwork.forward` returns a
:class:`~agents.policy.PolicyOutput` with ``logits = Q [T, B, A]`` and
``values = max_a Q [T, B]``, so the rollout, evaluation (greedy: the argmax of the "logits")
and checkpoints treat it as any policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from memcores.agents.acting import Act
from memcores.agents.policy import Obs, PolicyOutput, RecurrentActorCritic, layer_init
from memcores.cores import State

VALUE_BASED = ("pqn", "r2d2")
"""The ``agent.algo`` values that train a :class:`RecurrentQNetwork`."""


def value_based(algo: str) -> bool:
    """Whether ``algo`` learns Q-values (and acts epsilon-greedily on them)."""
    return algo in VALUE_BASED


class RecurrentQNetwork(RecurrentActorCritic):
    """Encoder -> memory core -> Q head with LayerNorm (same options as the actor-critic;
    ``separate_critic`` does not apply). Evaluated greedily (:attr:`greedy`)."""

    greedy = True

    def __init__(self, n_actions: int, *args: Any, **kwargs: Any) -> None:
        kwargs["separate_critic"] = False
        super().__init__(n_actions, *args, **kwargs)
        first = layer_init(nn.Linear(self.hidden_size, 64))
        self.actor = nn.Sequential(
            first, nn.LayerNorm(64), nn.ReLU(), layer_init(nn.Linear(64, n_actions), gain=0.01)
        )
        self.critic = None
        object.__setattr__(self, "_device_probe", first)

    def forward(self, obs: Obs, state: State, starts: Tensor) -> PolicyOutput:
        """``Q [T, B, A]`` as the logits, ``max_a Q [T, B]`` as the values, the new state."""
        y, _, state = self.core_outputs(obs, state, starts)
        q = self.actor(y)
        return PolicyOutput(q, q.max(-1).values, state, y)


class EpsilonGreedy:
    """Acting (:data:`agents.rollout.Acting`) epsilon-greedily on a Q-network's values.

    ``epsilon [N]`` holds one value per env (a float tensor, updated in place by the
    learner between rollouts). A vector env acting in groups calls this once per group in
    turn (:func:`agents.rollout.collect_rollout`); a call with fewer rows than envs reads the
    epsilons of the next group. The returned ``values`` are ``max_a Q`` (the bootstrap PQN's
    Q(lambda) reads), ``logprobs`` zeros.
    """

    def __init__(
        self, policy: RecurrentQNetwork, epsilon: Tensor, groups: list[slice] | None = None
    ) -> None:
        self.policy, self.epsilon = policy, epsilon
        self.groups = groups or [slice(None)]
        self._call = 0

    def __call__(self, obs: Obs, state: State, starts: Tensor) -> Act:
        with torch.no_grad():
            out = self.policy(obs, state, starts.unsqueeze(0))
            q = out.logits[0]  # [R, A]
            rows = q.shape[0]
            eps = self.epsilon
            if rows != eps.shape[0]:
                eps = eps[self.groups[self._call % len(self.groups)]]
                self._call += 1
            eps = eps.to(q.device)
            explore = torch.rand(rows, device=q.device) < eps
            random = torch.randint(0, q.shape[-1], (rows,), device=q.device)
            actions = torch.where(explore, random, q.argmax(-1))
        return Act(actions, torch.zeros(rows, device=q.device), out.values[0], out.state)


def linear_epsilon(frames: int, total: int, start: float, end: float, fraction: float) -> float:
    """PQN's schedule: ``start`` decaying linearly to ``end`` over the first ``fraction`` of
    ``total`` frames, then ``end``."""
    span = fraction * total
    if span <= 0:
        return end
    return start + (end - start) * min(frames / span, 1.0)


def apex_epsilons(n_envs: int, base: float = 0.4, alpha: float = 7.0) -> Tensor:
    """Ape-X's per-actor epsilons (Horgan et al. 2018), as R2D2 uses them:
    ``eps_i = base ** (1 + i / (N - 1) * alpha)`` for env ``i`` of ``N`` (``base`` alone for
    one env). ``[N]`` float32."""
    if n_envs == 1:
        return torch.tensor([base])
    i = torch.arange(n_envs, dtype=torch.float64)
    return (base ** (1 + i / (n_envs - 1) * alpha)).float()
