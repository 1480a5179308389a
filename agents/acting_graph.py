"""Acting steps replayed from CUDA graphs (``train.graph_acting``).

One acting step of a GPU policy (encoders, the core's step with its reset, heads, sampling) is
a few dozen small kernels, so an eager GPU step is slower than the CPU's below a few hundred
envs. :class:`ActingGraph` is a drop-in :data:`agents.rollout.Acting`: per input shape it
copies the inputs into static buffers and replays :func:`agents.rollout.act` recorded on them.
Weights are read where they live, so every update reaches the replays; sampling draws from the
device's generator, whose offsets a graph advances at each replay. A step that cannot be
recorded (``mem_lstm`` reads its memory's width on the host) warns once and acts eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

from torch import Tensor

from agents.policy import Obs, RecurrentActorCritic
from agents.rollout import Act, act
from cores import State
from cores.graphed import WARMUP_CALLS, CudaRecorder, EagerRecorder, RecordedCall, recorded_call


class _Inputs:
    """Static copies of one shape's inputs."""

    def __init__(self, obs: Obs, state: State, starts: Tensor) -> None:
        self.obs = {k: v.clone() for k, v in obs.items()}
        self.state = tuple(s.clone() for s in state)
        self.starts = starts.clone()

    def fill(self, obs: Obs, state: State, starts: Tensor) -> None:
        """Copy this step's inputs in (one copy per tensor)."""
        for key, value in obs.items():
            self.obs[key].copy_(value, non_blocking=True)
        for static, value in zip(self.state, state, strict=True):
            static.copy_(value)
        self.starts.copy_(starts)


def _shape_key(obs: Obs, state: State, starts: Tensor) -> Hashable:
    """What a recording depends on in the inputs: keys, shapes and dtypes."""
    tensors = [*(obs[k] for k in sorted(obs)), *state, starts]
    return (tuple(sorted(obs)), tuple((tuple(t.shape), t.dtype) for t in tensors))


class ActingGraph:
    """:func:`agents.rollout.act` of ``policy``, replayed from one recording per input shape.

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
        self._shapes: dict[Hashable, tuple[_Inputs, RecordedCall[Act]]] = {}

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
        step's :class:`agents.rollout.Act`, valid until the next call."""
        key = _shape_key(obs, state, starts)
        entry = self._shapes.get(key)
        if entry is None:
            inputs = _Inputs(obs, state, starts)
            step = functools.partial(act, self.policy, inputs.obs, inputs.state, inputs.starts)
            what = "train.graph_acting: the acting step"
            call = recorded_call(step, self.recorder, what, warmup_calls=self.warmup_calls)
            entry = self._shapes[key] = (inputs, call)
        inputs, call = entry
        inputs.fill(obs, state, starts)
        return call()
