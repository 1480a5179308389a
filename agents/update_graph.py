"""The PPO update's minibatch step recorded once as a CUDA graph and replayed
(``train.graph_update``): at RL shapes a GPU waits on the launches of its few hundred kernels.

The rollout is copied into static buffers once per update, a minibatch's chunk indices into a
static ``[M]`` index; the step's loss terms come back as one static ``[8]`` row, cloned after
each replay. The learning rate is a device tensor while recorded (annealing reaches the
replays); a non-finite minibatch is skipped on the device (fused Adam's ``found_inf``). A new
policy, optimiser, layout, loss setting or optimiser state (a resume) records anew after a
few eager minibatches; a smaller last minibatch runs eagerly. :func:`refusal` names what
cannot be replayed; a recording that raises warns once and the update runs eagerly on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.ppo import LossFn, Row, minibatch_step
from memcores.agents.rl_config import AgentConfig
from memcores.agents.rollout import ChunkBatch
from memcores.cores.base import MemoryCore
from memcores.cores.graphed import (
    WARMUP_CALLS,
    CudaRecorder,
    EagerRecorder,
    RecordedCall,
    recorded_call,
)


def keyed_by_state(policy: nn.Module) -> str | None:
    """The class name of the first core in ``policy`` with a ``graph_key`` (a value of its
    state read on the host, which one recording would fix), or ``None``."""
    for module in policy.modules():
        if not isinstance(module, MemoryCore):
            continue
        state = module.initial_state(1, next(module.parameters()).device)
        if module.graph_key(state) is not None:
            return type(module).__name__
    return None


def refusal(policy: nn.Module, optimizer: torch.optim.Optimizer, agent: AgentConfig) -> str | None:
    """Why this update cannot be replayed from a graph (None: it can)."""
    if agent.algo != "ppo":
        return "A2C takes one step per update, which leaves nothing to replay"
    if not (isinstance(optimizer, torch.optim.Adam) and optimizer.defaults.get("fused")):
        return "it needs the fused Adam optimiser (agent.optimizer=adam)"
    if getattr(policy, "decoder", None) is not None:
        return "the reconstruction loss (agent.recon_coef > 0) picks its cells by the data"
    for module in policy.modules():
        if not isinstance(module, MemoryCore):
            continue
        if module.draws_on_host():
            return (
                f"{type(module).__name__} draws random numbers on the host while training, "
                "which a graph would freeze"
            )
    keyed = keyed_by_state(policy)
    if keyed:
        return (
            f"{keyed} reads from its state on the host, once per call, "
            "what one graph would have to fix (mem_lstm: its memory's width)"
        )
    return None


def _tensors(batch: ChunkBatch) -> list[Tensor]:
    """Every tensor of ``batch``, in a fixed order."""
    return [*(batch.obs[k] for k in sorted(batch.obs)), *batch[1:7], *batch.state]


def _layout(batch: ChunkBatch) -> tuple:
    """What a recording depends on in ``batch``: its keys, shapes, dtypes and devices."""
    return (
        tuple(sorted(batch.obs)),
        tuple((tuple(t.shape), t.dtype, t.device) for t in _tensors(batch)),
        len(batch.state),
    )


def _clone(batch: ChunkBatch) -> ChunkBatch:
    """A copy of ``batch`` in fresh buffers."""
    obs = {k: v.clone() for k, v in batch.obs.items()}  # then starts .. returns, state
    return ChunkBatch(obs, *(t.clone() for t in batch[1:7]), tuple(s.clone() for s in batch.state))


def _storage(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> tuple[int, ...]:
    """The addresses a recording reads and writes: parameters and optimiser state."""
    addresses = [p.data_ptr() for p in params]
    for p in params:
        addresses += [t.data_ptr() for t in optimizer.state.get(p, {}).values()]
    return tuple(addresses)


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a recording holds fixed: the objects it reads (by identity), the loss settings
    (learning rate left out: a replay reads it from a tensor), minibatch size and layout."""

    policy: RecurrentActorCritic = dataclasses.field(compare=False)
    optimizer: torch.optim.Optimizer = dataclasses.field(compare=False)
    loss_fn: LossFn = dataclasses.field(compare=False)
    agent: AgentConfig
    chunks_per_mb: int
    layout: tuple


@dataclasses.dataclass
class _Recording:
    """One recorded target: its static buffers, settings and recorded step."""

    target: _Target
    static: ChunkBatch
    index: Tensor  # [M] long: the chunks of the current minibatch
    lr: Tensor  # 0-d float32 on the device
    params: list[nn.Parameter]
    call: RecordedCall[Tensor] | None = None  # the step on `static` and `index`
    storage: tuple[int, ...] = ()  # `_storage` when it was recorded

    def fits(self, target: _Target) -> bool:
        """Whether a replay computes ``target``'s step: the same objects (``is``) and settings,
        and the optimiser state where recorded."""
        old, objects = self.target, ("policy", "optimizer", "loss_fn")
        same = target == old and all(getattr(target, k) is getattr(old, k) for k in objects)
        return same and (not self.storage or _storage(old.optimizer, self.params) == self.storage)

    def eager(self, index: Tensor) -> Row:
        """The minibatch step, launched op by op (device rows)."""
        t = self.target
        return minibatch_step(
            t.policy, t.optimizer, self.static, index, t.agent, t.loss_fn, self.params,
            on_device=True,
        )  # fmt: skip

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        """The optimiser with the rate as a device tensor and ``capturable``; restored after."""
        groups = self.target.optimizer.param_groups
        saved = [(g["lr"], g["capturable"]) for g in groups]
        for g in groups:
            g["lr"], g["capturable"] = self.lr, True
        try:
            yield
        finally:
            for g, (lr, capturable) in zip(groups, saved, strict=True):
                g["lr"], g["capturable"] = lr, capturable


class UpdateGraph:
    """Replays the PPO minibatch step from a recording.

    :param recorder: ``CudaRecorder`` (default) or the tests' ``EagerRecorder``.
    :param warmup_steps: eager steps of a new layout before it is recorded (at least one).
    """

    def __init__(self, recorder: EagerRecorder | None = None, warmup_steps: int = WARMUP_CALLS):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.recorder = recorder if recorder is not None else CudaRecorder()
        self.warmup_steps = warmup_steps
        self.failure: str | None = None  # why a recording failed; updates then run eagerly
        self.refused: str | None = None  # why the last update was not replayed (refusal)
        self.replays = 0  # minibatch steps replayed so far
        self._recording: _Recording | None = None

    def bind(
        self,
        policy: RecurrentActorCritic,
        optimizer: torch.optim.Optimizer,
        batch: ChunkBatch,
        chunks_per_mb: int,
        agent: AgentConfig,
        loss_fn: LossFn,
    ) -> Callable[[Tensor], Row] | None:
        """The minibatch step for this update (``index [M] -> row``), replaying where it can;
        None where this update runs eagerly (a failed recording, or :func:`refusal`)."""
        if self.failure is not None:
            return None
        target = _Target(
            policy, optimizer, loss_fn, dataclasses.replace(agent, learning_rate=0.0),
            chunks_per_mb, _layout(batch),
        )  # fmt: skip
        rec = self._recording
        if rec is not None and rec.fits(target):  # checked when it was made: not refused
            torch._foreach_copy_(_tensors(rec.static), _tensors(batch))
        else:
            self._recording = None  # the old graph's memory goes before the new one's is taken
            self.refused = refusal(policy, optimizer, agent)
            if self.refused is not None:
                return None
            rec = self._recording = self._new_recording(target, batch)
        rec.lr.fill_(float(optimizer.param_groups[0]["lr"]))
        return lambda index: self._step(rec, index)

    def _new_recording(self, target: _Target, batch: ChunkBatch) -> _Recording:
        """Static buffers for a new target, and its step (recorded after its warm-up)."""
        device = batch.starts.device
        params = [p for p in target.policy.parameters() if p.requires_grad]
        index = torch.zeros(target.chunks_per_mb, dtype=torch.long, device=device)
        rec = _Recording(target, _clone(batch), index, torch.zeros((), device=device), params)
        what = "train.graph_update: the update step"
        step = lambda: rec.eager(rec.index)  # noqa: E731
        rec.call = recorded_call(step, self.recorder, what, rec.settings, self.warmup_steps)
        return rec

    def _step(self, rec: _Recording, index: Tensor) -> Row:
        """One minibatch step: a smaller last one eagerly, a full one through the recording."""
        call = rec.call
        assert call is not None
        if index.numel() != rec.index.numel() or self.failure is not None:
            return rec.eager(index)
        rec.index.copy_(index)
        replays = call.replays
        row = call()
        if call.failure is not None:  # warned once; the next updates run eagerly
            self.failure, self._recording = call.failure, None
            return row
        if call.replays > replays:
            if not rec.storage:
                rec.storage = _storage(rec.target.optimizer, rec.params)
            self.replays += 1
            return row.clone()  # the static row, which the next replay overwrites
        return row
