"""R2D2's prioritized sequence replay with stored core states (Kapturowski et al., ICLR 2019).

The replay is a ring of ``C`` steps of each of the ``N`` envs, time-major (``[C, N, ...]``),
filled one rollout at a time (the envs step together, so step ``g`` of every env sits in row
``g % C``). A sequence of env ``e`` starts every ``stride`` steps (slot ``j`` of ``C / stride``)
and spans ``window = burn_in + seq_len + n_step`` steps, so consecutive sequences overlap by
``window - stride`` steps. The core state before each sequence's first step is what the acting
network held there: the rollout buffer stores it at each of its chunk starts
(:class:`agents.rollout.RolloutBuffer` with chunks of ``stride`` steps), and :meth:`add` copies
it into ``states[j]`` (the stored-state strategy).

Priorities: a new sequence gets the largest priority seen so far; a replayed one
``eta max|TD| + (1 - eta) mean|TD|`` (:func:`sequence_priority`). Sampling draws a sequence
with probability ``P_i = p_i^alpha / sum_k p_k^alpha`` over the complete sequences, and
weights its loss by ``w_i = (M P_i)^-beta / max_batch w`` (``M`` complete sequences;
:func:`importance_weights`). The replay lives on the device of the rollout buffer: with a
batched env on a GPU, no step of it visits the host.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from memcores.agents.memory_need import check_fits
from memcores.agents.policy import Obs
from memcores.agents.rl_config import AgentConfig, RLConfig
from memcores.agents.rollout import RolloutBuffer
from memcores.cores import State

STEP_BYTES = 8 + 1 + 4
"""What the replay stores per env and step besides the observation: the action (int64), the
episode-start flag and the reward (float32)."""


class Sequences(NamedTuple):
    """A batch of ``B`` replayed sequences, time-major ``[W, B]``."""

    obs: Obs  # each [W, B, ...]
    starts: Tensor  # [W, B] bool: observation t begins an episode
    actions: Tensor  # [W, B] int64
    rewards: Tensor  # [W, B]
    state: State  # each [B, ...]: the acting network's state before step 0


def window(agent: AgentConfig) -> int:
    """Steps of one replayed sequence: burn-in, the steps learnt from, the n-step tail."""
    return agent.burn_in + agent.seq_len + agent.n_step


def capacity(agent: AgentConfig, n_envs: int) -> int:
    """Steps per env of the ring: ``replay_size / n_envs`` rounded up to whole rollouts, and
    at least one rollout more than a sequence, so a complete sequence always exists."""
    per_env = max(math.ceil(agent.replay_size / n_envs), window(agent) + agent.n_steps)
    return math.ceil(per_env / agent.n_steps) * agent.n_steps


def check_replay_fits(config: RLConfig, obs_bytes: int, device: torch.device) -> None:
    """Refuse a replay larger than the memory of the CPU or ``device``.

    :raises ValueError: one line with ``agent.replay_size``, both sizes and what to lower.
    """
    agent, n = config.agent, config.env.n_envs
    steps = capacity(agent, n)
    per_step = obs_bytes + STEP_BYTES
    check_fits(
        steps * n * per_step,
        (torch.device("cpu"), device),
        f"agent.replay_size={agent.replay_size:,} frames ({steps:,} steps x env.n_envs={n:,}) "
        f"of {per_step:,} bytes (besides the stored core states)",
        "lower agent.replay_size",
    )


def sequence_priority(td: Tensor, eta: float) -> Tensor:
    """R2D2's priority of each sequence from its TD errors ``td [L, B]``:
    ``eta max_t |td| + (1 - eta) mean_t |td|``, ``[B]``."""
    a = td.abs()
    return eta * a.max(0).values + (1 - eta) * a.mean(0)


def sampling_probabilities(priorities: Tensor, valid: Tensor, alpha: float) -> Tensor:
    """``P_i = p_i^alpha / sum_k p_k^alpha`` over the ``valid`` entries (0 elsewhere); any
    shape, the same shape back."""
    scaled = torch.where(valid, priorities.pow(alpha), torch.zeros_like(priorities))
    return scaled / scaled.sum()


def importance_weights(probs: Tensor, n_valid: int, beta: float) -> Tensor:
    """``w_i = (n_valid P_i)^-beta``, divided by the batch's largest: ``probs [B]`` -> ``[B]``."""
    w = (n_valid * probs).pow(-beta)
    return w / w.max()


class SequenceReplay:
    """The ring of steps, the stored states and the priorities (see the module docstring).

    :param obs_shapes: observation key -> (shape, dtype) of one env's observation.
    :param capacity: steps per env ``C`` (a multiple of ``stride`` and of the rollout length).
    :param n_envs: ``N``.
    :param stride: steps between consecutive sequence starts of one env.
    :param window: steps per sequence ``W``.
    :param state_template: a core state for ``N`` envs (sizes the stored states).
    """

    def __init__(
        self,
        obs_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
        capacity: int,
        n_envs: int,
        stride: int,
        window: int,
        state_template: State,
        device: torch.device,
    ) -> None:
        if capacity % stride or capacity < window:
            raise ValueError(
                f"replay capacity {capacity} must be a multiple of {stride} >= {window}"
            )
        C, N = capacity, n_envs
        self.capacity, self.n_envs, self.stride, self.window = C, N, stride, window
        self.device = device
        self.obs = {
            k: torch.zeros((C, N, *shape), dtype=dtype, device=device)
            for k, (shape, dtype) in obs_shapes.items()
        }
        self.starts = torch.zeros((C, N), dtype=torch.bool, device=device)
        self.actions = torch.zeros((C, N), dtype=torch.long, device=device)
        self.rewards = torch.zeros((C, N), device=device)
        n_slots = C // stride
        self.states = tuple(
            torch.zeros((n_slots, *s.shape), dtype=s.dtype, device=device) for s in state_template
        )
        self.priorities = torch.zeros((n_slots, N), device=device)
        self.max_priority = 1.0
        self.written = 0  # steps per env written so far

    def add(self, buffer: RolloutBuffer) -> None:
        """Append a rollout (chunks of ``stride`` steps; ``C`` a multiple of its length)."""
        if buffer.seq_len != self.stride or self.capacity % buffer.n_steps:
            raise ValueError("the rollout's chunks must be the replay's stride and tile it")
        S, pos = buffer.n_steps, self.written % self.capacity
        rows = slice(pos, pos + S)
        for k, v in buffer.obs.items():
            self.obs[k][rows] = v
        self.starts[rows] = buffer.starts
        self.actions[rows] = buffer.actions
        self.rewards[rows] = buffer.rewards
        slots = slice(pos // self.stride, (pos + S) // self.stride)
        for store, chunk in zip(self.states, buffer.chunk_states, strict=True):
            store[slots] = chunk
        self.priorities[slots] = self.max_priority
        self.written += S

    def slot_starts(self) -> Tensor:
        """``[C / stride]`` int64: the step (counted from the first ever written) at which
        each slot's current sequence starts; ``-1`` for a slot never written."""
        j = torch.arange(0, self.capacity, self.stride, device=self.device)
        last = self.written - 1
        g = j + self.capacity * torch.div(last - j, self.capacity, rounding_mode="floor")
        return torch.where(j <= last, g, torch.full_like(g, -1))

    def valid(self) -> Tensor:
        """``[C / stride, N]`` bool: the slot holds a complete sequence (all ``W`` steps)."""
        g = self.slot_starts()
        ok = (g >= 0) & (g + self.window <= self.written)
        return ok.unsqueeze(1).expand(-1, self.n_envs)

    def sample(self, batch: int, alpha: float, beta: float) -> tuple[Sequences, Tensor, Tensor]:
        """``batch`` sequences drawn with replacement by priority: the sequences, their flat
        indices ``[B]`` (for :meth:`update_priorities`) and importance weights ``[B]``.

        :raises ValueError: no complete sequence yet.
        """
        valid = self.valid()
        n_valid = int(valid.sum())
        if n_valid == 0:
            raise ValueError("the replay holds no complete sequence yet")
        probs = sampling_probabilities(self.priorities, valid, alpha).flatten()
        index = torch.multinomial(probs, batch, replacement=True)
        slot, env = index // self.n_envs, index % self.n_envs
        steps = torch.arange(self.window, device=self.device).unsqueeze(1)
        t = (self.slot_starts()[slot].unsqueeze(0) + steps) % self.capacity  # [W, B]
        e = env.unsqueeze(0)
        sequences = Sequences(
            obs={k: v[t, e] for k, v in self.obs.items()},
            starts=self.starts[t, e],
            actions=self.actions[t, e],
            rewards=self.rewards[t, e],
            state=tuple(s[slot, env] for s in self.states),
        )
        return sequences, index, importance_weights(probs[index], n_valid, beta)

    def layout(self) -> tuple[int, int, int, int]:
        """``(capacity, n_envs, stride, window)``: what a saved replay must match to load."""
        return self.capacity, self.n_envs, self.stride, self.window

    def state_dict(self) -> dict[str, Any]:
        """Every stored step, state and priority (checkpoint values: tensors and numbers)."""
        return {
            "layout": list(self.layout()),
            "obs": dict(self.obs),
            "starts": self.starts,
            "actions": self.actions,
            "rewards": self.rewards,
            "states": list(self.states),
            "priorities": self.priorities,
            "max_priority": self.max_priority,
            "written": self.written,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s contents into this replay (copied to its device).

        :raises ValueError: the saved replay has another layout or other observations.
        """
        saved = tuple(int(v) for v in state["layout"])
        if saved != self.layout():
            raise ValueError(
                f"the saved replay's (capacity, n_envs, stride, window) {saved} differs from "
                f"this run's {self.layout()}"
            )
        if set(state["obs"]) != set(self.obs) or len(state["states"]) != len(self.states):
            raise ValueError("the saved replay holds other observations or core states")
        for key, store in self.obs.items():
            store.copy_(state["obs"][key])
        for name in ("starts", "actions", "rewards", "priorities"):
            getattr(self, name).copy_(state[name])
        for store, saved_state in zip(self.states, state["states"], strict=True):
            store.copy_(saved_state)
        self.max_priority = float(state["max_priority"])
        self.written = int(state["written"])

    def update_priorities(self, index: Tensor, priorities: Tensor) -> None:
        """Set the sampled sequences' priorities (``index [B]`` from :meth:`sample`)."""
        priorities = priorities.detach().to(self.device, torch.float32)
        self.priorities.view(-1)[index.to(self.device)] = priorities
        self.max_priority = max(self.max_priority, float(priorities.max()))
