"""One acting step of a recurrent policy (``T = 1``, no autograd) and what a rollout carries
from one step to the next: used by the rollouts (:mod:`agents.rollout`) and by the recordings
that replay the step (:mod:`agents.acting_graph`, :mod:`agents.rollout_graph`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from memcores.agents.policy import Obs, RecurrentActorCritic, sample_actions
from memcores.cores import State


@dataclass
class RolloutCarry:
    """What one rollout hands to the next: the current observation, starts and core state."""

    obs: dict[str, np.ndarray] | dict[str, Tensor]  # the env's batched observation, [N, ...]
    starts: Tensor  # [N] bool: obs is the first of an episode
    state: State  # core state before reading obs, [N, ...] each


class Act(NamedTuple):
    """One acting step's outputs for ``R`` envs."""

    actions: Tensor  # [R] int64
    logprobs: Tensor  # [R]
    values: Tensor  # [R]
    state: State  # each [R, ...]: the core state after the step


Acting = Callable[[Obs, State, Tensor], Act]
"""``(obs [1, R, ...], state [R, ...], starts [R]) -> Act``: :func:`act`, or a replay of it
(:class:`agents.acting_graph.ActingGraph`), whose outputs hold until its next call."""


def act(policy: RecurrentActorCritic, obs: Obs, state: State, starts: Tensor) -> Act:
    """One acting step of ``policy`` (``T = 1``, no autograd): rows where ``starts`` begin an
    episode are reset, then actions are sampled."""
    with torch.no_grad():
        out = policy(obs, state, starts.unsqueeze(0))
        actions, logprobs = sample_actions(out.logits[0])  # [R], [R]
    return Act(actions, logprobs, out.values[0], out.state)
