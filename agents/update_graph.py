"""The PPO update's minibatch step recorded once as a CUDA graph and replayed.

A minibatch step (one core call over ``[L, M]`` chunks, the loss, backward, gradient clipping,
fused Adam) is a few hundred small kernels. At RL shapes the GPU waits on their launches, not
on the arithmetic; :class:`UpdateGraph` launches the whole step as one graph instead
(``train.graph_update``).

How a step becomes replayable (PyTorch's whole-network capture, with what PPO adds):

- **Fixed addresses.** The rollout is copied into static buffers once per update (one
  ``_foreach_copy_``) and a minibatch is chosen by copying its chunk indices into a static
  ``[M]`` index; the graph gathers the minibatch itself. The step returns its loss terms as
  one static ``[8]`` row (:data:`agents.ppo.Row`), cloned after each replay.
- **The learning rate** is a device tensor while the graph is recorded, filled before each
  update, so annealing reaches the replays; the optimiser keeps its float between (checkpoints
  are unchanged). A non-finite minibatch is skipped on the device (fused Adam's
  ``found_inf``), as in the eager update.
- **Warm-up.** The first three minibatches of a new layout (``warmup_steps``) are real steps,
  taken eagerly on a side stream (they build the optimiser state, compile and autotune the
  kernels); the next one is recorded, then every full-size minibatch replays. A smaller last
  minibatch runs eagerly.
- **Re-recording.** A new policy, optimiser, rollout layout, loss setting or optimiser state
  (a resume replaces its tensors) records a new graph.
- **Checked against the eager step.** The recording's first replay is compared with the eager
  step on the same minibatch from the same weights and optimiser state (both are copied
  first and restored between the two): where the weights after them, or the loss terms,
  differ by more than :data:`CHECK_TOLERANCE` of the step's own change, the update warns once
  and runs eagerly from there on, keeping the eager step's result. So a recording that would
  replay something else than the eager step (a graph that froze a value it should read) never
  trains a run. The check costs one more minibatch step per recording.
- **What cannot be recorded** is refused before anything is recorded (:func:`refusal`): A2C,
  an optimiser other than fused Adam, the reconstruction loss (it picks cells by the data),
  cores that draw random numbers on the host (``hdetach_lstm``), whose draws a graph would
  freeze, and cores whose graphs are keyed by their state (``mem_lstm``'s memory width). A
  core that reads the device from the host inside ``forward`` makes the recording raise; the
  update then warns once and runs eagerly from there on.

The recorder is a parameter (:mod:`agents.graph_recording`): CUDA graphs on a GPU; on a CPU
the tests replay by running the recorded step again on the same static buffers and settings,
which checks this bookkeeping.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from agents.graph_recording import (
    WARMUP_CALLS,
    CudaRecorder,
    RecordedCall,
    Recorder,
    keyed_by_state,
)
from agents.policy import RecurrentActorCritic
from agents.ppo import LossFn, Row, minibatch_step
from agents.rl_config import AgentConfig
from agents.rollout import ChunkBatch
from cores.base import MemoryCore

CHECK_TOLERANCE = 1e-2
"""How far a recording's first replay may be from the eager step, as a fraction of the
largest change the eager step made to a weight (and of each loss term's size): float32
kernels that sum in another order differ by about 1e-6 of it, a replay of the wrong minibatch,
learning rate or optimiser state by its whole size."""


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
    obs = [batch.obs[k] for k in sorted(batch.obs)]
    rest = (batch.starts, batch.actions, batch.logprobs, batch.values, batch.advantages)
    return [*obs, *rest, batch.returns, *batch.state]


def _layout(batch: ChunkBatch) -> tuple:
    """What a recording depends on in ``batch``: its keys, shapes, dtypes and devices."""
    return (
        tuple(sorted(batch.obs)),
        tuple((tuple(t.shape), t.dtype, t.device) for t in _tensors(batch)),
        len(batch.state),
    )


def _clone(batch: ChunkBatch) -> ChunkBatch:
    """A copy of ``batch`` in fresh buffers."""
    return ChunkBatch(
        obs={k: v.clone() for k, v in batch.obs.items()},
        starts=batch.starts.clone(),
        actions=batch.actions.clone(),
        logprobs=batch.logprobs.clone(),
        values=batch.values.clone(),
        advantages=batch.advantages.clone(),
        returns=batch.returns.clone(),
        state=tuple(s.clone() for s in batch.state),
    )


def _storage(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> tuple[int, ...]:
    """The addresses a recording reads and writes: parameters and optimiser state."""
    addresses = [p.data_ptr() for p in params]
    for p in params:
        addresses += [t.data_ptr() for t in optimizer.state.get(p, {}).values()]
    return tuple(addresses)


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a recording holds fixed: the objects it reads (compared by identity), the loss
    settings (the agent, its learning rate left out: the rate reaches a replay through a
    tensor), the minibatch size and the rollout's layout."""

    policy: RecurrentActorCritic = dataclasses.field(compare=False)
    optimizer: torch.optim.Optimizer = dataclasses.field(compare=False)
    loss_fn: LossFn = dataclasses.field(compare=False)
    agent: AgentConfig
    chunks_per_mb: int
    layout: tuple

    def same(self, other: _Target) -> bool:
        """The same objects and settings."""
        objects = ("policy", "optimizer", "loss_fn")
        return self == other and all(getattr(self, k) is getattr(other, k) for k in objects)


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
        """Whether a replay computes what the eager step for ``target`` does (the optimiser
        state, which a resume replaces, still where it was recorded)."""
        optimizer = self.target.optimizer
        same_storage = not self.storage or _storage(optimizer, self.params) == self.storage
        return target.same(self.target) and same_storage

    def eager(self, index: Tensor) -> Row:
        """The minibatch step, launched op by op (device rows)."""
        t = self.target
        return minibatch_step(
            t.policy, t.optimizer, self.static, index, t.agent, t.loss_fn, self.params,
            on_device=True,
        )  # fmt: skip

    @contextlib.contextmanager
    def settings(self) -> Iterator[None]:
        """The optimiser as a recording needs it: the rate as a device tensor, ``capturable``
        (PyTorch's check for a step inside a graph); restored after."""
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
    """Replays the PPO minibatch step from a recording (see the module docstring).

    :param recorder: :class:`agents.graph_recording.CudaRecorder` (default) or
        :class:`agents.graph_recording.EagerRecorder`.
    :param warmup_steps: eager steps of a new layout before it is recorded (at least one).
    :param check: compare each recording's first replay with the eager step, and run eagerly
        from there on where they differ (see the module docstring).
    """

    def __init__(
        self, recorder: Recorder | None = None, warmup_steps: int = WARMUP_CALLS, check: bool = True
    ):
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
        self.recorder = recorder if recorder is not None else CudaRecorder()
        self.warmup_steps = warmup_steps
        self.check = check
        """Compare each recording's first replay with the eager step (:func:`_checked`)."""
        self.failure: str | None = None
        """Why a recording failed, after which every update runs eagerly (None: none did)."""
        self.refused: str | None = None
        """Why the last update could not be replayed (:func:`refusal`), if it could not."""
        self.replays = 0
        """Minibatch steps replayed so far."""
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
        rec = _Recording(
            target=target,
            static=_clone(batch),
            index=torch.zeros(target.chunks_per_mb, dtype=torch.long, device=device),
            lr=torch.zeros((), device=device),
            params=[p for p in target.policy.parameters() if p.requires_grad],
        )
        rec.call = RecordedCall(
            lambda: rec.eager(rec.index),
            self.recorder,
            "train.graph_update: the update step",
            rec.settings,
            self.warmup_steps,
        )
        return rec

    def _step(self, rec: _Recording, index: Tensor) -> Row:
        """One minibatch step: a smaller last minibatch eagerly; a full one through the
        recorded call (eager while it warms up, then replayed)."""
        call = rec.call
        assert call is not None
        if index.numel() != rec.index.numel() or self.failure is not None:
            return rec.eager(index)
        rec.index.copy_(index)
        replays = call.replays
        if self.check and call.records_next:
            row = self._checked(rec)
        else:
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

    def _checked(self, rec: _Recording) -> Row:
        """Record ``rec``'s step and replay it once, then take the eager step on the same
        minibatch from the same weights and optimiser state; the eager step's result stands.
        Where the two differ (:func:`step_difference`) the call is marked failed, with a
        warning, so this update and the later ones run eagerly."""
        call = rec.call
        assert call is not None
        optimizer, params = rec.target.optimizer, rec.params
        before = _snapshot(optimizer, params)
        replayed = call()
        if call.failure is not None:  # the recording raised: `replayed` is the eager step
            return replayed
        replayed = replayed.clone()
        after_replay = [p.detach().clone() for p in params]
        _restore(optimizer, params, before)
        row = rec.eager(rec.index)
        gap = step_difference(
            before[: len(params)], after_replay, [p.detach() for p in params], replayed, row
        )
        if gap > CHECK_TOLERANCE:
            call.failure = (
                f"its first replay differs from the eager step by {gap:.3g} of the step's size "
                f"(at most {CHECK_TOLERANCE:g})"
            )
            warnings.warn(
                f"{call.what}: {call.failure}; it runs eagerly from now on",
                RuntimeWarning,
                stacklevel=3,
            )
        return row


def _snapshot(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> list[Tensor]:
    """Copies of :func:`_trained`'s tensors."""
    return [t.clone() for t in _trained(optimizer, params)]


def _restore(optimizer: torch.optim.Optimizer, params: list[nn.Parameter], copies: list[Tensor]):
    """Write :func:`_snapshot`'s ``copies`` back in place (the recording's addresses stay)."""
    torch._foreach_copy_(_trained(optimizer, params), copies)


def _trained(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> list[Tensor]:
    """What a step changes: ``params`` (detached), then their optimiser state's tensors."""
    tensors = [p.detach() for p in params]
    for p in params:
        tensors += [t for t in optimizer.state.get(p, {}).values() if isinstance(t, Tensor)]
    return tensors


def step_difference(
    before: list[Tensor], replayed: list[Tensor], eager: list[Tensor], row_a: Tensor, row_b: Tensor
) -> float:
    """How far two takes of one step are apart: the largest difference between the weights
    after them, over the largest change the eager one made to a weight, or between their loss
    terms (:data:`agents.ppo.Row`, the non-finite ones equal where both are), over each
    term's size; whichever is larger."""
    change = max(
        (float((e - b).abs().max()) for b, e in zip(before, eager, strict=True)), default=0.0
    )
    apart = max(
        (float((r - e).abs().max()) for r, e in zip(replayed, eager, strict=True)), default=0.0
    )
    weights = apart / change if change > 0 else (0.0 if apart == 0 else math.inf)
    a, b = row_a.double(), row_b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    same_inf = torch.isinf(a) & (a == b)
    terms = ((a - b).abs() / b.abs().clamp_min(1e-3)).masked_fill(both_nan | same_inf, 0.0)
    terms = terms.nan_to_num(nan=math.inf)
    return max(weights, float(terms.max()))
