"""Rollouts of recurrent agents: collection from a vector env and storage in truncated-BPTT
chunks.

:func:`start_rollouts` resets the envs and the core state; :func:`collect_rollout` fills a
:class:`RolloutBuffer` with ``n_steps`` steps of every env (the core stepping with ``T = 1``
under ``torch.no_grad()``) and hands a :class:`RolloutCarry` to the next rollout;
:func:`collect_with_returns` adds GAE.

The buffer holds ``n_steps`` steps of ``n_envs`` envs, time-major (``[S, N, ...]``). Each env's
rollout is cut into ``K = n_steps // seq_len`` chunks of ``seq_len`` steps; the core state at
the start of every chunk is stored while collecting, so a chunk can be replayed in the update
from exactly the state the policy acted with. Chunk ``c = k * N + e`` is steps
``[k*L, (k+1)*L)`` of env ``e``. Episode boundaries inside a chunk are handled by ``starts``
(the core resets those rows), so there is no padding.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from memcores.agents.acting import Acting, RolloutCarry, act
from memcores.agents.episodes import EpisodeStats
from memcores.agents.policy import Obs, RecurrentActorCritic, obs_to_tensors
from memcores.agents.rl_config import AgentConfig
from memcores.cores import State
from memcores.envs.batched import BatchedEnv
from memcores.envs.vector import VectorEnv

if TYPE_CHECKING:
    from memcores.agents.rollout_graph import RolloutGraph


class ChunkBatch(NamedTuple):
    """A minibatch of whole chunks, time-major: ``[L, M]`` with ``M`` chunks."""

    obs: Obs  # each [L, M, ...]
    starts: Tensor  # [L, M] bool
    actions: Tensor  # [L, M]
    logprobs: Tensor  # [L, M]
    values: Tensor  # [L, M]
    advantages: Tensor  # [L, M]
    returns: Tensor  # [L, M]
    state: State  # each [M, ...]: the core state before step 0 of each chunk


class RolloutBuffer:
    """Preallocated tensors for one rollout plus the stored chunk-start core states.

    :param obs_shapes: observation key -> (shape, dtype) of one env's observation.
    :param n_steps: steps per env (``S``), a multiple of ``seq_len``.
    :param n_envs: number of envs (``N``).
    :param seq_len: chunk length (``L``).
    :param state_template: a core state for ``N`` envs (its shapes/dtypes size the store).
    """

    def __init__(
        self,
        obs_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
        n_steps: int,
        n_envs: int,
        seq_len: int,
        state_template: State,
        device: torch.device,
    ) -> None:
        if n_steps % seq_len:
            raise ValueError(f"n_steps ({n_steps}) must be a multiple of seq_len ({seq_len})")
        self.n_steps, self.n_envs, self.seq_len = n_steps, n_envs, seq_len
        self.n_chunks_per_env = n_steps // seq_len
        self.device = device
        S, N = n_steps, n_envs
        self.obs = {
            k: torch.zeros((S, N, *shape), dtype=dtype, device=device)
            for k, (shape, dtype) in obs_shapes.items()
        }
        self.starts = torch.zeros((S, N), dtype=torch.bool, device=device)
        self.actions = torch.zeros((S, N), dtype=torch.long, device=device)
        self.logprobs = torch.zeros((S, N), device=device)
        self.rewards = torch.zeros((S, N), device=device)
        self.values = torch.zeros((S, N), device=device)
        self.advantages = torch.zeros((S, N), device=device)
        self.returns = torch.zeros((S, N), device=device)
        # chunk_states[i][k]: component i of the core state before step k*L, [K, N, ...]
        self.chunk_states = tuple(
            torch.zeros((self.n_chunks_per_env, *s.shape), dtype=s.dtype, device=device)
            for s in state_template
        )

    def add(
        self,
        t: int,
        obs: Obs,
        starts: Tensor,
        state_before: State,
        actions: Tensor,
        logprobs: Tensor,
        values: Tensor,
        rows: slice = slice(None),
    ) -> None:
        """Store step ``t`` of the envs ``rows`` (default all); ``obs`` tensors are
        ``[1, R, ...]``, the rest ``[R]``, with ``R`` the number of rows.

        ``state_before`` is the core state the policy was called with at step ``t`` (before
        the reset that ``starts`` triggers); it is kept when ``t`` begins a chunk.
        """
        self.add_inputs(t, obs, starts, state_before, rows)
        self.add_outputs(t, actions, logprobs, values, rows)

    def add_inputs(
        self, t: int, obs: Obs, starts: Tensor, state_before: State, rows: slice = slice(None)
    ) -> None:
        """The first half of :meth:`add`: what the policy reads at step ``t``."""
        for k, v in obs.items():
            self.obs[k][t, rows].copy_(v[0])
        self.starts[t, rows] = starts
        if t % self.seq_len == 0:
            for store, s in zip(self.chunk_states, state_before, strict=True):
                store[t // self.seq_len, rows].copy_(s)

    def add_outputs(
        self, t: int, actions: Tensor, logprobs: Tensor, values: Tensor, rows: slice = slice(None)
    ) -> None:
        """The second half of :meth:`add`: what the policy gave at step ``t``."""
        self.actions[t, rows] = actions
        self.logprobs[t, rows] = logprobs
        self.values[t, rows] = values

    def compute_returns(
        self,
        last_value: Tensor,
        next_start: Tensor,
        gamma: float,
        gae_lambda: float,
        reward_scale: float = 1.0,
    ) -> None:
        """Generalised advantage estimation (Schulman et al. 2016), as CleanRL/SB3.

        ``starts[t + 1]`` marks that step ``t`` ended its episode (terminated or truncated),
        so no value is bootstrapped across it. Truncations are treated as terminations
        (MiniGrid time-outs pay 0 either way).

        :param last_value: ``[N]`` value of the observation after the last step.
        :param next_start: ``[N]`` bool, whether the last step ended an episode.
        :param reward_scale: the rewards are multiplied by this (``agent.reward_scale``).
        """
        last_value = last_value.to(self.values.device)
        next_start = next_start.to(self.values.device)  # a CPU env's flags into a GPU buffer
        last_gae = torch.zeros_like(last_value)
        for t in reversed(range(self.n_steps)):
            if t == self.n_steps - 1:
                not_done = 1.0 - next_start.float()
                next_value = last_value
            else:
                not_done = 1.0 - self.starts[t + 1].float()
                next_value = self.values[t + 1]
            delta = self.rewards[t] * reward_scale + gamma * next_value * not_done - self.values[t]
            last_gae = delta + gamma * gae_lambda * not_done * last_gae
            self.advantages[t] = last_gae
        self.returns = self.advantages + self.values

    # ------------------------------------------------------------------ chunk views
    @property
    def n_chunks(self) -> int:
        """Total chunks ``K * N``."""
        return self.n_chunks_per_env * self.n_envs

    def _chunked(self, x: Tensor) -> Tensor:
        """``[S, N, ...]`` -> ``[L, K*N, ...]`` with chunk index ``c = k * N + e``."""
        K, L, N = self.n_chunks_per_env, self.seq_len, self.n_envs
        return x.view(K, L, N, *x.shape[2:]).transpose(0, 1).reshape(L, K * N, *x.shape[2:])

    def chunks(self) -> ChunkBatch:
        """All chunks as one batch (``M = K * N``); index its dim 1 to take minibatches."""
        return ChunkBatch(
            obs={k: self._chunked(v) for k, v in self.obs.items()},
            starts=self._chunked(self.starts),
            actions=self._chunked(self.actions),
            logprobs=self._chunked(self.logprobs),
            values=self._chunked(self.values),
            advantages=self._chunked(self.advantages),
            returns=self._chunked(self.returns),
            # [K, N, ...] -> [K*N, ...]: the same c = k * N + e order
            state=tuple(s.flatten(0, 1) for s in self.chunk_states),
        )


def select_chunks(batch: ChunkBatch, idx: Tensor) -> ChunkBatch:
    """The chunks ``idx [M']`` of ``batch`` (time dim 0 kept, chunk dim 1 indexed)."""
    return ChunkBatch(
        obs={k: v[:, idx] for k, v in batch.obs.items()},
        starts=batch.starts[:, idx],
        actions=batch.actions[:, idx],
        logprobs=batch.logprobs[:, idx],
        values=batch.values[:, idx],
        advantages=batch.advantages[:, idx],
        returns=batch.returns[:, idx],
        state=tuple(s[idx] for s in batch.state),
    )


def batch_to(batch: ChunkBatch, device: torch.device) -> ChunkBatch:
    """``batch`` with every tensor moved to ``device``."""
    return ChunkBatch(
        obs={k: v.to(device, non_blocking=True) for k, v in batch.obs.items()},
        starts=batch.starts.to(device),
        actions=batch.actions.to(device),
        logprobs=batch.logprobs.to(device),
        values=batch.values.to(device),
        advantages=batch.advantages.to(device),
        returns=batch.returns.to(device),
        state=tuple(s.to(device) for s in batch.state),
    )


def obs_shapes(space: gym.spaces.Dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-env observation shapes/dtypes of a (single-env) Dict space, as torch dtypes."""
    out = {}
    for key, sub in space.spaces.items():
        dtype = torch.from_numpy(np.zeros(0, dtype=sub.dtype)).dtype
        out[key] = (tuple(sub.shape), dtype)
    return out


# ---------------------------------------------------------------------------- collection
def start_rollouts(
    policy: RecurrentActorCritic, envs: VectorEnv | BatchedEnv, seed: int, device: torch.device
) -> RolloutCarry:
    """Reset the envs (env ``i`` seeded ``seed + i``) and the core state."""
    obs = envs.reset(seed=seed)
    n = envs.num_envs
    state = tuple(s.clone() for s in policy.initial_state(n, device))  # written row-wise
    return RolloutCarry(obs, torch.ones(n, dtype=torch.bool, device=device), state)


def collect_rollout(
    policy: RecurrentActorCritic,
    envs: VectorEnv,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    episodes: EpisodeStats | None = None,
    acting: Acting | None = None,
) -> RolloutCarry:
    """Fill ``buffer`` with ``n_steps`` steps of every env, the core stepping with ``T = 1``
    (through ``acting``: :func:`act` of ``policy`` by default).

    The envs come in groups (:attr:`envs.vector.VectorEnv.groups`): at each step the policy
    acts on group 0 and hands its actions to the envs, then acts on group 1 while group 0
    steps (in a worker process when there are workers), and so on; a group's results are
    collected just before the policy acts on it again. The core is called with ``starts`` so
    it resets the rows of envs whose episode just began; the state *before* that reset is what
    :meth:`RolloutBuffer.add` stores at chunk starts, which is exactly what the update replays
    (with the same ``starts``).
    """
    device = buffer.device
    starts, state = carry.starts, carry.state
    groups = envs.groups
    policy.eval()  # deterministic cores while acting (h-detach/online rules are training-only)
    step = acting if acting is not None else functools.partial(act, policy)

    def collect(t: int, g: int, rows: slice) -> None:
        """The results of step ``t`` of group ``g`` -> rewards, starts, episode stats."""
        _, reward, done, success = envs.step_wait(g)
        buffer.rewards[t, rows] = torch.from_numpy(reward).to(device, torch.float32)
        starts[rows] = torch.from_numpy(done).to(device)
        if episodes is not None:
            episodes.step(reward, done, success, rows)

    for t in range(buffer.n_steps):
        for g, rows in enumerate(groups):
            if t > 0:
                collect(t - 1, g, rows)
            obs = obs_to_tensors({k: v[rows] for k, v in envs.obs.items()}, device)
            state_g = tuple(s[rows] for s in state)  # views: [R, ...]
            starts_g = starts[rows]
            out = step(obs, state_g, starts_g)
            buffer.add(t, obs, starts_g, state_g, out.actions, out.logprobs, out.values, rows)
            for s, new in zip(state, out.state, strict=True):
                s[rows] = new
            envs.step_async(g, out.actions.cpu().numpy())
    for g, rows in enumerate(groups):
        collect(buffer.n_steps - 1, g, rows)
    return RolloutCarry(envs.obs, starts, state)


def collect_on_device(
    policy: RecurrentActorCritic,
    envs: BatchedEnv,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    episodes: EpisodeStats | None = None,
    acting: Acting | None = None,
    graph: RolloutGraph | None = None,
) -> RolloutCarry:
    """:func:`collect_rollout` for a batched env (:mod:`envs.batched`) on the buffer's device:
    the env step and the acting step run back to back there and fill the buffer in place, so
    observations, rewards and dones never visit the host during the rollout. The episode
    statistics are read once, after the last step (one transfer of ``done`` and ``success``).

    With ``graph`` (:class:`agents.rollout_graph.RolloutGraph`, of ``policy`` and ``envs``)
    each step is one replay of the acting and env step (``acting`` unused): the buffer stores
    its inputs before the replay and its outputs after. The returned carry's state and starts
    are then the graph's static tensors.
    """
    n_steps = buffer.n_steps
    starts, state, obs = carry.starts.clone(), carry.state, carry.obs
    policy.eval()
    step = acting if acting is not None else functools.partial(act, policy)
    if graph is not None:
        graph.load(carry)
        starts, state = graph.starts, graph.state
    dones = torch.zeros_like(buffer.starts)
    successes = torch.zeros_like(buffer.starts)
    for t in range(n_steps):
        if graph is not None:
            buffer.add_inputs(t, graph.obs, starts, state)
            out = graph()
            buffer.add_outputs(t, out.actions, out.logprobs, out.values)
            reward, done, success = out.reward, out.done, out.success
        else:
            obs_t = {k: v.unsqueeze(0) for k, v in obs.items()}
            acted = step(obs_t, state, starts)
            buffer.add(t, obs_t, starts, state, acted.actions, acted.logprobs, acted.values)
            for s, new in zip(state, acted.state, strict=True):
                s.copy_(new)  # an acting graph's outputs are overwritten by its next replay
            obs, reward, done, success = envs.step(acted.actions)
            starts.copy_(done)
        buffer.rewards[t] = reward
        dones[t], successes[t] = done, success
    if episodes is not None:
        rewards, dones_np, successes_np = (
            x.cpu().numpy() for x in (buffer.rewards, dones, successes)
        )
        for t in range(n_steps):
            episodes.step(rewards[t].astype(np.float64), dones_np[t], successes_np[t])
    return RolloutCarry(envs.obs, starts, state)


def collect_with_returns(
    policy: RecurrentActorCritic,
    envs: VectorEnv | BatchedEnv,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    agent: AgentConfig,
    episodes: EpisodeStats | None = None,
    acting: Acting | None = None,
    graph: RolloutGraph | None = None,
) -> RolloutCarry:
    """:func:`collect_rollout` (:func:`collect_on_device` for a batched env, through
    ``graph`` if given), then GAE from ``policy``'s value of the observation after it."""
    if getattr(envs, "on_device", False):
        carry = collect_on_device(policy, envs, buffer, carry, episodes, acting, graph)
    else:
        carry = collect_rollout(policy, envs, buffer, carry, episodes, acting)
    with torch.no_grad():
        obs = obs_to_tensors(carry.obs, buffer.device)
        last_value = policy(obs, carry.state, carry.starts.unsqueeze(0)).values[0]
    buffer.compute_returns(
        last_value, carry.starts, agent.gamma, agent.gae_lambda, agent.reward_scale
    )
    return carry
