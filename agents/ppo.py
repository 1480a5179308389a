"""The update step of recurrent PPO and A2C over truncated-BPTT chunks.

Both algorithms share :func:`update`: minibatches of whole chunks, ONE core call per
minibatch (``x [L, M, D]`` from the stored chunk-start states, resets via ``starts``),
gradient clipping and an optimiser step. They differ only in the loss
(:func:`ppo_loss` vs :func:`a2c_loss`), the number of epochs/minibatches (A2C: one step on the
whole rollout) and the optimiser (:func:`make_optimizer`).

A minibatch whose loss or gradient is not finite is skipped (its step is not taken) and
counted in ``skipped_updates``, so one bad batch cannot corrupt the weights. The check runs
where the tensors are: Adam (fused) skips a step on the device itself, and the loss terms are
read back once per update, so on a GPU the update never waits for the host between
minibatches (unless ``target_kl`` asks for the KL after each one). That also makes the step
(:func:`minibatch_step`, written once) recordable: with ``train.graph_update`` each one
replays a CUDA graph (:mod:`agents.update_graph`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from memcores.agents.policy import RecurrentActorCritic, log_prob_entropy
from memcores.agents.rl_config import AgentConfig
from memcores.agents.rollout import ChunkBatch, RolloutBuffer, batch_to, select_chunks


@dataclass
class LossTerms:
    """The pieces of one minibatch loss (scalars, for logging)."""

    loss: Tensor
    policy_loss: Tensor
    value_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clip_fraction: Tensor
    recon_loss: Tensor | None = None


@dataclass
class UpdateStats:
    """What one update returns: means over its applied minibatches (SB3's ``train/*``
    values), their count and the skipped ones."""

    policy_loss: float = 0.0
    value_loss: float = 0.0
    entropy_loss: float = 0.0
    approx_kl: float = 0.0
    clip_fraction: float = 0.0
    recon_loss: float = 0.0
    loss: float = 0.0
    grad_norm: float = 0.0
    explained_variance: float = float("nan")
    n_minibatches: int = 0
    skipped_updates: int = 0
    early_stopped: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    """A learner's own scalars, logged under their tags after SB3's (the value-based
    learners': ``train/q_values``, ``train/epsilon``, ``train/td_error``)."""


def make_optimizer(policy: nn.Module, agent: AgentConfig) -> torch.optim.Optimizer:
    """Adam (eps 1e-5, CleanRL) for PPO, PQN and R2D2; RMSprop (alpha 0.99, eps 1e-5, SB3)
    for A2C."""
    kind = agent.optimizer
    if kind == "auto":
        kind = "rmsprop" if agent.algo == "a2c" else "adam"
    # Adam: the fused kernel (one pass over each tensor, CPU and CUDA) is 1.4-4.6x torch's
    # multi-tensor step on the MemoryS7 policy on a CPU; RMSprop has no fused kernel, and its
    # multi-tensor step (torch only picks it by itself on CUDA) beats the per-tensor loop.
    if kind == "adam":
        return torch.optim.Adam(policy.parameters(), lr=agent.learning_rate, eps=1e-5, fused=True)
    return torch.optim.RMSprop(
        policy.parameters(), lr=agent.learning_rate, alpha=0.99, eps=1e-5, foreach=True
    )


_KERNEL_OPTIONS = ("foreach", "fused")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Resume ``optimizer`` from a checkpoint, keeping the kernel choice it was built with.

    ``load_state_dict`` restores every saved group option, ``foreach`` and ``fused``
    included, so a checkpoint written by an optimiser with another kernel would switch this
    one back to it.
    """
    kernels = [{k: group.get(k) for k in _KERNEL_OPTIONS} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, choice in zip(optimizer.param_groups, kernels, strict=True):
        group.update(choice)


LossFn = Callable[[Tensor, Tensor, Tensor, ChunkBatch, AgentConfig], LossTerms]
"""``(new_logprobs, entropy, new_values, minibatch, agent) -> LossTerms``, all ``[L, M]``."""


def ppo_loss(
    new_logprobs: Tensor, entropy: Tensor, new_values: Tensor, mb: ChunkBatch, agent: AgentConfig
) -> LossTerms:
    """Clipped-surrogate PPO loss (Schulman et al. 2017), CleanRL's formulation.

    All tensors are ``[L, M]``.
    """
    log_ratio = new_logprobs - mb.logprobs
    ratio = log_ratio.exp()
    with torch.no_grad():
        # http://joschu.net/blog/kl-approx.html: unbiased, low-variance KL estimator
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > agent.clip_range).float().mean()
    adv = mb.advantages
    if agent.normalize_advantage and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(
        -adv * ratio, -adv * ratio.clamp(1 - agent.clip_range, 1 + agent.clip_range)
    ).mean()
    if agent.clip_range_vf is None:
        v_loss = 0.5 * (new_values - mb.returns).pow(2).mean()
    else:
        v_clipped = mb.values + (new_values - mb.values).clamp(
            -agent.clip_range_vf, agent.clip_range_vf
        )
        v_loss = (
            0.5
            * torch.max((new_values - mb.returns).pow(2), (v_clipped - mb.returns).pow(2)).mean()
        )
    ent = entropy.mean()
    loss = pg_loss - agent.ent_coef * ent + agent.vf_coef * v_loss
    return LossTerms(loss, pg_loss, v_loss, ent, approx_kl, clip_fraction)


def a2c_loss(
    new_logprobs: Tensor, entropy: Tensor, new_values: Tensor, mb: ChunkBatch, agent: AgentConfig
) -> LossTerms:
    """Advantage actor-critic loss (Mnih et al. 2016), term for term SB3's ``A2C.train()``.

    ``-(A * log pi).mean() - ent_coef * H.mean() + vf_coef * MSE(V, R)``: the value loss is the
    plain mean squared error, as in SB3 and torch-ac (PPO keeps CleanRL's ``0.5 * MSE``).
    Advantages are normalised over the rollout only when ``agent.normalize_advantage`` is
    set explicitly (SB3's option of the same name; off by default for A2C). All tensors are
    ``[L, M]``.
    """
    adv = mb.advantages
    if agent.normalize_advantage and adv.numel() > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = -(adv * new_logprobs).mean()
    v_loss = (new_values - mb.returns).pow(2).mean()
    ent = entropy.mean()
    loss = pg_loss - agent.ent_coef * ent + agent.vf_coef * v_loss
    with torch.no_grad():
        log_ratio = new_logprobs - mb.logprobs
        approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean()
    return LossTerms(loss, pg_loss, v_loss, ent, approx_kl, torch.zeros(()))


def minibatch_loss(
    policy: RecurrentActorCritic, mb: ChunkBatch, agent: AgentConfig, loss_fn: LossFn
) -> LossTerms:
    """``loss_fn``'s terms on minibatch ``mb``, plus the weighted reconstruction loss."""
    new_logprobs, entropy, new_values, recon = replay_chunks(policy, mb)
    terms = loss_fn(new_logprobs, entropy, new_values, mb, agent)
    if recon is not None:
        terms.loss = terms.loss + agent.recon_coef * recon
        terms.recon_loss = recon
    return terms


def replay_chunks(
    policy: RecurrentActorCritic, mb: ChunkBatch
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Replay chunks with ONE core call: log-probs, entropy and values, each ``[L, M]``, and
    the reconstruction loss (``None`` without a decoder)."""
    out = policy(mb.obs, mb.state, mb.starts)
    logprobs, entropy = log_prob_entropy(out.logits, mb.actions)
    decoder = policy.decoder
    recon = None if decoder is None else decoder.loss(out.features, mb.obs, mb.starts)
    return logprobs, entropy, out.values, recon


class StepRecording(Protocol):
    """A recorded minibatch step that :func:`update` can replay
    (:class:`agents.update_graph.UpdateGraph`, which records :func:`minibatch_step`)."""

    def bind(
        self,
        policy: RecurrentActorCritic,
        optimizer: torch.optim.Optimizer,
        batch: ChunkBatch,
        chunks_per_mb: int,
        agent: AgentConfig,
        loss_fn: LossFn,
    ) -> Callable[[Tensor], Row] | None:
        """The step for this update (``index [M] -> row``); None: run it eagerly."""


def update(
    policy: RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    buffer: RolloutBuffer,
    agent: AgentConfig,
    generator: torch.Generator | None = None,
    graph: StepRecording | None = None,
) -> UpdateStats:
    """One PPO or A2C update from a filled ``buffer`` (returns already computed).

    PPO: ``n_epochs`` passes over minibatches of ``minibatch_size // seq_len`` chunks (stopping
    early past ``1.5 * target_kl``); A2C: one gradient step on the whole rollout.

    :param generator: RNG for the minibatch permutation (``None``: torch's global RNG).
    :param graph: where it applies (:class:`agents.update_graph.UpdateGraph`), each minibatch
        step replays one CUDA graph instead of launching its kernels one by one
        (``train.graph_update``).
    :return: the means over the applied minibatches, and how many were skipped.
    """
    batch = buffer.chunks()  # every tensor [L, K*N], states [K*N, ...]
    device = next(policy.parameters()).device
    if device != buffer.device:  # a CPU rollout for a GPU learner: one move per update
        batch = batch_to(batch, device)
    n_chunks = buffer.n_chunks
    if agent.algo == "ppo":
        loss_fn, n_epochs = ppo_loss, agent.n_epochs
        chunks_per_mb = max(1, agent.minibatch_size // buffer.seq_len)
    else:  # a2c: one gradient step on the whole rollout
        loss_fn, n_epochs, chunks_per_mb = a2c_loss, 1, n_chunks
    params = [p for p in policy.parameters() if p.requires_grad]
    on_device = rows_on_device(device)
    policy.train()

    def eager_step(index: Tensor) -> Row:
        return minibatch_step(policy, optimizer, batch, index, agent, loss_fn, params, on_device)

    step = eager_step
    if graph is not None:
        step = graph.bind(policy, optimizer, batch, chunks_per_mb, agent, loss_fn) or eager_step
    totals = LossTotals()
    for index in minibatch_indices(n_chunks, chunks_per_mb, n_epochs, device, generator):
        row = step(index)
        totals.add(row)
        if agent.target_kl is not None and bool(row_finite(row)) and _kl_too_large(row, agent):
            return totals.stats(buffer, early_stopped=True)
    return totals.stats(buffer)


def minibatch_indices(
    n_chunks: int,
    chunks_per_mb: int,
    n_epochs: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> Iterator[Tensor]:
    """The chunk indices ``[M]`` of each minibatch of an update: per epoch one random
    permutation of the ``n_chunks`` chunks (drawn with ``generator``, then moved to
    ``device``), cut into runs of ``chunks_per_mb`` (the last run may be shorter)."""
    for _epoch in range(n_epochs):
        perm = torch.randperm(n_chunks, generator=generator).to(device)
        for start in range(0, n_chunks, chunks_per_mb):
            yield perm[start : start + chunks_per_mb]


def rows_on_device(device: torch.device) -> bool:
    """Whether an update on ``device`` keeps its loss terms there (a GPU: see :data:`Row`)."""
    return device.type == "cuda"


Row = list[float] | Tensor
"""One minibatch's :data:`TOTALS`: floats on a CPU; on a GPU, one ``[8]`` float64 tensor on
the device, since reading a number makes the host wait for the minibatch to finish (on a CPU
reading one costs nothing, and stacking them would cost more)."""


def minibatch_step(
    policy: RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
    batch: ChunkBatch,
    index: Tensor,
    agent: AgentConfig,
    loss_fn: LossFn,
    params: list[nn.Parameter],
    on_device: bool,
) -> Row:
    """One gradient step on the chunks ``index [M]`` of ``batch``: the loss, its gradients
    clipped, and the optimiser's step where the loss and gradient norm are finite (never
    writing NaN/inf weights). Returns the minibatch's :data:`TOTALS` row (``on_device``: a
    device tensor, so nothing waits for the host; what a :class:`StepRecording` records)."""
    mb = select_chunks(batch, index)
    terms = minibatch_loss(policy, mb, agent, loss_fn)
    grad_norm = _backward(optimizer, terms.loss, params, agent.max_grad_norm)
    row = loss_row(terms, grad_norm, on_device)
    _step_if(optimizer, row_finite(row))
    return row


def loss_row(terms: LossTerms, grad_norm: Tensor, on_device: bool) -> Row:
    """The :data:`TOTALS` of one minibatch, as floats or (``on_device``) one tensor."""
    recon = terms.recon_loss if terms.recon_loss is not None else torch.zeros_like(terms.loss)
    values = (terms.loss, grad_norm, terms.policy_loss, terms.value_loss, terms.entropy)
    values += (terms.approx_kl, terms.clip_fraction, recon)
    if not on_device:
        return [float(v.detach()) for v in values]
    device = terms.loss.device
    return torch.stack([v.detach().to(device) for v in values]).double()


def row_finite(row: Row) -> Tensor | bool:
    """Whether a row's loss and gradient norm are finite (a 0-d bool tensor for a tensor
    row: nothing is read back)."""
    if isinstance(row, Tensor):
        return torch.isfinite(row[:2]).all()
    return math.isfinite(row[0]) and math.isfinite(row[1])


def _step_if(optimizer: torch.optim.Optimizer, finite: Tensor | bool) -> None:
    """The optimiser's step where ``finite`` holds, else none. Given a device flag, a fused
    optimiser reads it on the device (its ``found_inf``, which torch.amp's GradScaler sets the
    same way), so the host does not wait for the minibatch; otherwise it is read here."""
    if not (isinstance(finite, Tensor) and optimizer.defaults.get("fused")):
        if bool(finite):
            optimizer.step()
        return
    optimizer.found_inf = (~finite).float()  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]


def _backward(
    optimizer: torch.optim.Optimizer, loss: Tensor, params: list[nn.Parameter], max_norm: float
) -> Tensor:
    """Gradients of ``loss``, clipped to ``max_norm`` (``<= 0``: not clipped); their norm."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_norm > 0:
        return nn.utils.clip_grad_norm_(params, max_norm)
    squares = (p.grad.pow(2).sum() for p in params if p.grad is not None)
    return torch.sqrt(sum(squares, torch.zeros(())))


def _kl_too_large(row: Row, agent: AgentConfig) -> bool:
    """PPO's early stop: the minibatch's approximate KL passed ``1.5 * target_kl``."""
    if agent.algo != "ppo" or agent.target_kl is None:
        return False
    return float(row[TOTALS.index("approx_kl")]) > 1.5 * agent.target_kl


TOTALS = (
    "loss", "grad_norm", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
    "recon",
)  # fmt: skip
"""The per-minibatch values :class:`LossTotals` keeps, in its rows' order."""


@dataclass
class LossTotals:
    """Each minibatch's :data:`Row`, summed in :meth:`stats` (tensor rows are read back
    there, once per update)."""

    rows: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        """Keep one minibatch's row."""
        self.rows.append(row)

    def stats(self, buffer: RolloutBuffer, early_stopped: bool = False) -> UpdateStats:
        """Means over the applied minibatches (those with a finite loss and gradient norm),
        the skipped ones' count, and the rollout's explained variance."""
        rows = self.rows
        if rows and isinstance(rows[0], Tensor):
            rows = torch.stack(rows).tolist()
        applied = [r for r in rows if math.isfinite(r[0]) and math.isfinite(r[1])]
        # summed in minibatch order, as floats: the same numbers a running sum gives
        sums = dict(zip(TOTALS, (sum(col) for col in zip(*applied, strict=True)), strict=False))
        n = max(len(applied), 1)

        def mean(name: str) -> float:
            return sums.get(name, 0.0) / n

        return UpdateStats(
            policy_loss=mean("policy_loss"),
            value_loss=mean("value_loss"),
            entropy_loss=-mean("entropy"),  # SB3 logs the entropy *loss*: minus the entropy
            approx_kl=mean("approx_kl"),
            clip_fraction=mean("clip_fraction"),
            recon_loss=mean("recon"),
            loss=mean("loss"),
            grad_norm=mean("grad_norm"),
            explained_variance=explained_variance(buffer.values, buffer.returns),
            n_minibatches=len(applied),
            skipped_updates=len(rows) - len(applied),
            early_stopped=early_stopped,
        )


def explained_variance(y_pred: Tensor, y_true: Tensor) -> float:
    """``1 - Var[y_true - y_pred] / Var[y_true]`` (SB3); NaN when ``y_true`` is constant."""
    var_y = float(y_true.var())
    if var_y == 0 or not math.isfinite(var_y):
        return float("nan")
    return 1.0 - float((y_true - y_pred).var()) / var_y
