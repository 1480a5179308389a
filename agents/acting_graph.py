"""Acting steps replayed from CUDA graphs (``train.graph_acting``): a GPU policy's acting step
(encoders, the core's step with its reset, heads, sampling) is a few dozen small kernels, so
eagerly it is slower than the CPU's below a few hundred envs.

:class:`ActingGraph` (an :data:`agents.acting.Acting`) copies each input shape's inputs into
static buffers and replays :func:`agents.acting.act` recorded on them. Weights are read where
they live, so updates reach the replays; sampling draws from the device's generator, whose
offsets a replay advances. A step that cannot be recorded warns once and acts eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import torch
from torch import Tensor

from memcores.agents.acting import Act, act
from memcores.agents.policy import Obs, RecurrentActorCritic
from memcores.cores import State
from memcores.cores.graphed import (
    WARMUP_CALLS,
    CudaRecorder,
    EagerRecorder,
    RecordedCall,
    recorded_call,
)


class ActingGraph:
    """:func:`agents.acting.act` of ``policy``, replayed from one recording per input shape.

    :param policy: the acting policy, on the device its inputs come to.
    :param recorder: ``CudaRecorder`` (default) or the tests' ``EagerRecorder``.
    :param warmup_calls: eager steps per shape before it is recorded (at least one).
    """

    def __init__(
        self,
        policy: RecurrentActorCritic,
        recorder: EagerRecorder | None = None,
        warmup_calls: int = WARMUP_CALLS,
    ) -> None:
        self.policy = policy
        self.recorder = recorder if recorder is not None else CudaRecorder()
        self.warmup_calls = warmup_calls
        self._shapes: dict[Hashable, tuple[list[Tensor], RecordedCall[Act]]] = {}

    @property
    def replays(self) -> int:
        """Steps replayed so far, over every shape."""
        return sum(call.replays for _, call in self._shapes.values())

    @property
    def failure(self) -> str | None:
        """Why a recording failed (its shape then acts eagerly), if one did."""
        return next((c.failure for _, c in self._shapes.values() if c.failure), None)

    def __call__(self, obs: Obs, state: State, starts: Tensor) -> Act:
        """One acting step: ``obs [1, R, ...]``, ``state [R, ...]``, ``starts [R]`` -> the
        step's :class:`agents.acting.Act`, valid until the next call."""
        inputs = [*(obs[k] for k in sorted(obs)), *state, starts]
        key = (tuple(sorted(obs)), tuple((tuple(t.shape), t.dtype) for t in inputs))
        entry = self._shapes.get(key)
        if entry is None:  # static copies, read by the recording: obs, state, starts
            static = [t.clone() for t in inputs]
            obs_s = dict(zip(sorted(obs), static, strict=False))
            state_s = tuple(static[len(obs) : -1])
            step = functools.partial(act, self.policy, obs_s, state_s, static[-1])
            what = "train.graph_acting: the acting step"
            call = recorded_call(step, self.recorder, what, warmup_calls=self.warmup_calls)
            entry = self._shapes[key] = (static, call)
        static, call = entry
        torch._foreach_copy_(static, inputs, non_blocking=True)
        return call()
