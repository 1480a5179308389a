"""The acting step and a batched env's step replayed from one recording
(``train.graph_env_step``): with a batched env on the GPU (:mod:`envs.batched`), a rollout step
is the policy's few dozen small kernels and the env's, back to back on the device; one CUDA
graph launches them all at once.

:class:`RolloutGraph` records :func:`agents.acting.act` on the env's own observation tensors
and static copies of the core state and episode starts, then
:meth:`envs.batched.BatchedEnv.step_recordable` with the sampled actions, then writes the new
state and starts back into the static copies, so each replay leaves the inputs of the next.
Between replays the caller stores the inputs, then the outputs, and runs the env's eager
:meth:`envs.batched.BatchedEnv.tick` (the pool refill). Sampling draws from the device's
generator, whose offsets a replay advances, as :class:`agents.acting_graph.ActingGraph`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from memcores.agents.acting import RolloutCarry, act
from memcores.agents.policy import RecurrentActorCritic
from memcores.cores.graphed import WARMUP_CALLS, CudaRecorder, EagerRecorder, recorded_call
from memcores.envs.batched import BatchedEnv


class EnvStep(NamedTuple):
    """One recorded rollout step's outputs, ``[N]`` each, valid until the next replay."""

    actions: Tensor  # int64
    logprobs: Tensor
    values: Tensor
    reward: Tensor  # float32
    done: Tensor  # bool: the step ended the episode (the observation is the next one's)
    success: Tensor  # bool: the ended episode succeeded


class RolloutGraph:
    """Acting with ``policy`` then stepping ``envs``, replayed from one recording.

    :param policy: the acting policy, on the env's device.
    :param envs: a batched env, already reset (its observation tensors are read in place).
    :param recorder: ``CudaRecorder`` (default) or the tests' ``EagerRecorder``.
    :param warmup_calls: eager steps before the recording (at least one).
    """

    def __init__(
        self,
        policy: RecurrentActorCritic,
        envs: BatchedEnv,
        recorder: EagerRecorder | None = None,
        warmup_calls: int = WARMUP_CALLS,
    ) -> None:
        if not envs.obs:
            raise ValueError("RolloutGraph needs a reset env (it reads the env's observation)")
        n = envs.num_envs
        self.policy, self.envs = policy, envs
        self.obs = {k: v.unsqueeze(0) for k, v in envs.obs.items()}  # [1, N, ...] views
        self.state = tuple(s.clone() for s in policy.initial_state(n, envs.device))
        self.starts = torch.ones(n, dtype=torch.bool, device=envs.device)
        recorder = recorder if recorder is not None else CudaRecorder()
        what = "train.graph_env_step: the acting and env step"
        self._call = recorded_call(self._step, recorder, what, warmup_calls=warmup_calls)

    @property
    def replays(self) -> int:
        """Steps replayed so far."""
        return self._call.replays

    @property
    def failure(self) -> str | None:
        """Why the recording failed (every step is then eager), if it did."""
        return self._call.failure

    def load(self, carry: RolloutCarry) -> None:
        """Continue from ``carry``: its core state and starts into the static copies (its
        observation must be the env's own, as :func:`agents.rollout.start_rollouts` and every
        rollout leave it)."""
        if any(carry.obs[k] is not v for k, v in self.envs.obs.items()):
            raise ValueError("the carry's observation is not the env's own tensors")
        torch._foreach_copy_([*self.state, self.starts], [*carry.state, carry.starts])

    def prime(self, carry: RolloutCarry) -> RolloutCarry:
        """From ``carry``, take the warm-up steps and the recording (rollout steps stored
        nowhere), so later steps are replays (to time them alone: ``memcores bench gpu``);
        returns the carry to continue from.

        :raises RuntimeError: the recording failed.
        """
        self.load(carry)
        for _ in range(self._call.warmups_left + (self._call.replay is None)):
            self()
        if self.failure is not None:
            raise RuntimeError(f"train.graph_env_step: recording failed ({self.failure})")
        return RolloutCarry(self.envs.obs, self.starts, self.state)

    def _step(self) -> EnvStep:
        """The recorded step: act, step the env, leave the new state and starts in place."""
        out = act(self.policy, self.obs, self.state, self.starts)
        _, reward, done, success = self.envs.step_recordable(out.actions)
        torch._foreach_copy_([*self.state, self.starts], [*out.state, done])
        return EnvStep(out.actions, out.logprobs, out.values, reward, done, success)

    def __call__(self) -> EnvStep:
        """One rollout step of every env (replayed once recorded), then the env's eager
        :meth:`envs.batched.BatchedEnv.tick`."""
        out = self._call()
        self.envs.tick()
        return out
