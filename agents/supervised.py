"""Supervised trainer: any memory core + a readout on a sequence task from ``envs.sequences``.

One run, top to bottom (:func:`train`):

1. :func:`prepare` builds the config's task (reading any dataset), core, readout, optimiser
   and device, so every mistake surfaces before anything is written;
2. the run life cycle shared with the RL trainer (:class:`agents.run.RunSession`) locks the
   run directory and claims it: the checkpoint to resume (its config checked against this
   one), or a directory without an earlier run's files (``run.overwrite`` deletes them;
   ``train.init_from`` is loaded first); it writes ``config.yaml`` and opens TensorBoard
   events and ``progress.csv``; a new run also saves ``checkpoints/init.pt`` (weights at
   step 0, for before/after diagnostics);
3. each update (:func:`train_step`) draws a batch that is a pure function of
   ``(seed, step)``, so ``--resume`` replays exactly the data an uninterrupted run would have
   seen; an update with a non-finite or exploding loss is skipped, and
   ``train.max_skipped_updates`` of them in a row stop the run (:mod:`agents.divergence`);
4. every ``train.eval_every`` updates: evaluation on a fixed set, the forget-gate time-scale
   histogram (when the core has a forget gate) and an atomic ``checkpoints/last.pt`` with the
   model, optimiser and RNG states;
5. at the end: the test split (datasets) or the transfer lengths (``transfer_copy``) and
   ``results.json``.

Tensor shapes: inputs ``x [T, B, D]``, core output ``[T, B, H]``, readout output
``[W, B, K]`` on the last ``W`` steps (the only ones that carry targets).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.agents.checkpoint import (
    CHECKPOINT_NAME,
    INIT_CHECKPOINT_NAME,
    CheckpointError,
    checkpoint_path,
    load_trainer_checkpoint,
)
from memcores.agents.device import resolve_device
from memcores.agents.files import write_text_atomic
from memcores.agents.logger import RunLogger
from memcores.agents.memory_need import check_fits
from memcores.agents.run import RunLayout, RunSession
from memcores.agents.supervised_config import SupervisedConfig
from memcores.cores import MemoryCore, make_core
from memcores.cores.diagnostics import log_timescales
from memcores.cores.graphed import maybe_graphed
from memcores.envs.cpus import check_cpu_counts
from memcores.envs.sequences import (
    ClassificationTask,
    SequenceBatch,
    SequenceTask,
    TransferCopyTask,
    make_task,
)

CHECKPOINT = CHECKPOINT_NAME
INIT_CHECKPOINT = INIT_CHECKPOINT_NAME
EVAL_SEED = 2_718_281  # one fixed evaluation set per task, shared by every seed and core
_METRICS = ("loss", "accuracy", "mse")  # summarize(): loss, and accuracy or mse by the loss
LOGGED_TAGS: tuple[str, ...] = (
    *(f"{split}/{m}" for split in ("train", "eval", "test") for m in _METRICS),
    "train/grad_norm",
    "train/learning_rate",
    "train/epoch",
    "train/skipped_updates",
    "train/timescale_median",
    "train/timescale_max",
    "train/log10_timescale_mean",
    "train/log10_timescale_std",
    "time/fps",
    "time/updates_per_s",
)
"""The scalars a run may log (which ones depends on the task's loss and the core's gates),
besides :data:`TRANSFER_PREFIX` ``<variant>/<metric>`` of a transfer task's final evaluation:
what a sweep's ``--metric`` may name."""
TRANSFER_PREFIX = "transfer/"


# =========================================================================== model
class SequenceModel(nn.Module):
    """A memory core followed by a per-step readout.

    :param core: any :class:`cores.MemoryCore`.
    :param output_size: ``K``, classes or target dimension.
    :param readout: ``linear`` or ``mlp`` (ReLU hidden layer of ``readout_hidden`` units).
    """

    def __init__(
        self, core: MemoryCore, output_size: int, readout: str = "linear", readout_hidden: int = 256
    ) -> None:
        super().__init__()
        self.core = core
        hidden = core.hidden_size
        if readout == "linear":
            self.readout: nn.Module = nn.Linear(hidden, output_size)
        elif readout == "mlp":
            self.readout = nn.Sequential(
                nn.Linear(hidden, readout_hidden), nn.ReLU(), nn.Linear(readout_hidden, output_size)
            )
        else:
            raise ValueError(f"unknown readout {readout!r}; valid: linear, mlp")

    def forward(self, x: Tensor, window: int) -> Tensor:
        """``x [T, B, D]`` -> readout outputs ``[W, B, K]`` for the last ``window`` steps."""
        state = self.core.initial_state(x.shape[1], x.device)
        y, _ = self.core(x, state)  # [T, B, H]
        return self.readout(y[-window:])


# =========================================================================== losses
def batch_to_torch(batch: SequenceBatch, device: torch.device) -> dict[str, Tensor]:
    """NumPy batch -> tensors on ``device`` (targets stay int64 for cross-entropy)."""
    return {
        "x": torch.from_numpy(batch.x).to(device, non_blocking=True),
        "y": torch.from_numpy(batch.y).to(device, non_blocking=True),
        "loss_mask": torch.from_numpy(batch.loss_mask).to(device, non_blocking=True),
        "metric_mask": torch.from_numpy(batch.metric_mask).to(device, non_blocking=True),
    }


def loss_and_metrics(kind: str, out: Tensor, batch: dict[str, Tensor]) -> tuple[Tensor, dict]:
    """Masked loss and metric sums.

    :param kind: ``ce`` (``out [W, B, C]``, ``y [W, B]`` int), ``mse`` or ``bce``
        (``out``, ``y`` of shape ``[W, B, K]``).
    :return: the mean loss over ``loss_mask`` and a dict of *sums* (``loss_sum``, ``n_loss``,
        ``correct``, ``n_metric``, ``sq_err``) so evaluation can pool batches exactly.
    """
    y, lm, mm = batch["y"], batch["loss_mask"], batch["metric_mask"]
    if kind == "ce":
        per = F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none").view_as(lm)
        hit = (out.argmax(-1) == y).float()
    elif kind == "bce":
        per = F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(-1)
        hit = ((out > 0) == (y > 0.5)).float().mean(-1)  # per-bit accuracy
    elif kind == "mse":
        per = (out - y).pow(2).mean(-1)
        hit = None
    else:
        raise ValueError(f"unknown loss kind {kind!r}")
    n_loss = lm.sum()
    loss = (per * lm).sum() / n_loss.clamp_min(1.0)
    sums = {
        "loss_sum": (per * lm).sum().detach(),
        "n_loss": n_loss.detach(),
        "n_metric": mm.sum().detach(),
        "sq_err": (per.detach() * mm).sum() if kind == "mse" else None,
        "correct": (hit * mm).sum().detach() if hit is not None else None,
    }
    return loss, sums


def summarize(kind: str, sums: dict[str, float]) -> dict[str, float]:
    """Pooled sums -> ``loss`` and ``accuracy`` (``ce``/``bce``) or ``mse``; no metrics
    (``{}``) for no examples (an empty split: ``task.valid_fraction=0`` holds out none)."""
    if not sums.get("n_loss"):
        return {}
    result = {"loss": sums["loss_sum"] / max(sums["n_loss"], 1.0)}
    if kind == "mse":
        result["mse"] = sums["sq_err"] / max(sums["n_metric"], 1.0)
    else:
        result["accuracy"] = sums["correct"] / max(sums["n_metric"], 1.0)
    return result


# =========================================================================== data
class TaskData:
    """Training batches as a pure function of ``(seed, step)`` and a fixed evaluation set.

    Synthetic tasks: batch ``step`` is drawn from ``default_rng([seed, step])``; the evaluation
    set is ``eval_size`` examples from a fixed generator. Datasets: epochs are reshuffled with
    ``default_rng([seed, epoch])`` (the last partial batch is dropped); evaluation uses the
    ``valid`` split during training and ``test`` at the end.
    """

    def __init__(self, task: SequenceTask, batch_size: int, seed: int) -> None:
        self.task, self.batch_size, self.seed = task, batch_size, seed
        self._perm: tuple[int, np.ndarray] | None = None
        if isinstance(task, ClassificationTask):
            n = task.size("train")
            if n < batch_size:
                raise ValueError(f"train.batch_size={batch_size} exceeds the {n} training examples")
            self.steps_per_epoch = n // batch_size

    def train_batch(self, step: int) -> SequenceBatch:
        task = self.task
        if isinstance(task, ClassificationTask):
            epoch, i = divmod(step, self.steps_per_epoch)
            if self._perm is None or self._perm[0] != epoch:
                n = task.size("train")
                self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(n))
            idx = self._perm[1][i * self.batch_size : (i + 1) * self.batch_size]
            return task.batch("train", idx)
        return task.sample(np.random.default_rng([self.seed, step]), self.batch_size)

    def epoch(self, step: int) -> float:
        return step / self.steps_per_epoch if isinstance(self.task, ClassificationTask) else 0.0


def eval_batches(
    task: SequenceTask, split: str, eval_size: int, batch_size: int
) -> Iterator[SequenceBatch]:
    """The fixed evaluation set: a dataset split, or ``eval_size`` generated examples."""
    if isinstance(task, ClassificationTask):
        n = task.size(split)
        for start in range(0, n, batch_size):
            yield task.batch(split, np.arange(start, min(start + batch_size, n)))
        return
    rng = np.random.default_rng(EVAL_SEED)
    for start in range(0, eval_size, batch_size):
        yield task.sample(rng, min(batch_size, eval_size - start))


@torch.no_grad()
def evaluate(
    model: SequenceModel,
    task: SequenceTask,
    device: torch.device,
    split: str = "valid",
    eval_size: int = 1000,
    batch_size: int = 500,
) -> dict[str, float]:
    """Loss and accuracy (or MSE) of ``model`` on ``task``'s evaluation set, in eval mode."""
    was_training = model.training
    model.eval()
    totals: dict[str, float] = {}
    for batch in eval_batches(task, split, eval_size, batch_size):
        tb = batch_to_torch(batch, device)
        out = model(tb["x"], task.window)
        _, sums = loss_and_metrics(task.loss, out, tb)
        for key, value in sums.items():
            if value is not None:
                totals[key] = totals.get(key, 0.0) + float(value)
    model.train(was_training)
    return summarize(task.loss, totals)


# =========================================================================== set-up
@dataclass
class Prepared:
    """Everything a run needs, built and validated before the run directory is touched."""

    config: SupervisedConfig
    task: SequenceTask
    model: SequenceModel
    optimizer: torch.optim.Optimizer
    device: torch.device
    run_dir: Path


def default_run_dir(config: SupervisedConfig) -> Path:
    return (
        Path("runs") / "supervised" / f"{config.task.name}_{config.core.name}_s{config.train.seed}"
    )


def build_task(config: SupervisedConfig) -> SequenceTask:
    """The config's task (reads dataset files; raises on a missing one)."""
    return make_task(config.task.name, **config.task.options)


def build_model(config: SupervisedConfig, task: SequenceTask) -> SequenceModel:
    """Core + readout sized for ``task``; the core is built by :func:`cores.make_core`."""
    core = make_core(
        config.core.name, task.input_size, config.core.hidden_size, **config.core.options
    )
    return SequenceModel(core, task.output_size, config.model.readout, config.model.readout_hidden)


def build_optimizer(config: SupervisedConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = config.optim
    params = model.parameters()
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, eps=o.eps, weight_decay=o.weight_decay)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, eps=o.eps, weight_decay=o.weight_decay)
    return torch.optim.RMSprop(
        params, lr=o.lr, alpha=o.alpha, eps=o.eps, weight_decay=o.weight_decay
    )


def learning_rate(config: SupervisedConfig, step: int) -> float:
    """The learning rate for update ``step`` (0-based): warm-up, then the schedule."""
    o = config.optim
    lr = o.lr
    if o.warmup_steps and step < o.warmup_steps:
        lr *= (step + 1) / o.warmup_steps
    if o.schedule == "step":
        lr *= o.gamma ** sum(step >= m for m in o.milestones)
    elif o.schedule == "cosine":
        lr *= 0.5 * (1.0 + math.cos(math.pi * min(step / config.train.steps, 1.0)))
    return lr


def prepare(config: SupervisedConfig) -> Prepared:
    """Build and check the task, model, optimiser and device; writes nothing.

    :raises ValueError: unknown core/option, bad task option, unavailable device...
    :raises FileNotFoundError: a dataset file is missing from ``task.data_dir``.
    """
    device = resolve_device(config.train.device)
    config.core.check_device(device)
    check_cpu_counts({"train.threads": config.train.threads})
    if config.train.threads > 0:
        torch.set_num_threads(config.train.threads)
    task = build_task(config)
    check_memory(config, length_names(config, task), device)
    torch.manual_seed(config.train.seed)
    model = build_model(config, task).to(device)
    model.core = maybe_graphed(model.core, device, config.core.cuda_graph)
    optimizer = build_optimizer(config, model)
    run_dir = Path(config.run.dir) if config.run.dir else default_run_dir(config)
    TaskData(task, config.train.batch_size, config.train.seed)  # checks batch vs dataset size
    return Prepared(config, task, model, optimizer, device, run_dir)


def check_memory(
    config: SupervisedConfig,
    tasks: dict[str, SequenceTask],
    device: torch.device,
    train: bool = True,
) -> None:
    """Refuse tasks whose batches cannot fit memory, before any is drawn: a batch holds at
    least its inputs ``x [T, B, D]`` and the core's outputs ``[T, B, H]`` as float32, on the
    host and on ``device``.

    :param tasks: what sets each task's length, as the message names it
        (``"task.length=200"``, ``"--eval-lengths 2000"``) -> the task; each is checked with
        evaluation batches of ``train.eval_batch_size`` examples.
    :param train: also check the first task with training batches of ``train.batch_size``.
    :raises ValueError: naming the length, the batch size key and both memory sizes.
    """
    tcfg = config.train
    for i, (name, task) in enumerate(tasks.items()):
        examples = tcfg.eval_size
        if isinstance(task, ClassificationTask):  # valid during training, test at the end
            examples = max(task.size("valid"), task.size("test"))
        batches = {"train.eval_batch_size": min(tcfg.eval_batch_size, examples)}
        if train and i == 0:
            batches = {"train.batch_size": tcfg.batch_size, **batches}
        width = task.input_size + config.core.hidden_size
        setting = re.split(r"[= ]", name)[0]  # "task.length=200" -> "task.length"
        for batch_key, batch in batches.items():
            check_fits(
                4 * task.length * batch * width,
                (torch.device("cpu"), device),
                f"{name} ({task.length:,} steps) x {batch_key}={batch} x {width} float32 "
                "values per step (inputs + hidden units)",
                f"lower {setting} or {batch_key}",
            )


def length_names(config: SupervisedConfig, task: SequenceTask) -> dict[str, SequenceTask]:
    """The config's task, and the transfer lengths a ``transfer_copy`` task scores at the
    end, keyed by the setting that makes each one's length (for :func:`check_memory`)."""
    options = config.task.options
    key = f"task.length={options['length']}" if "length" in options else "task.length"
    names: dict[str, SequenceTask] = {key: task}
    if isinstance(task, TransferCopyTask):
        for label, variant in task.variants().items():
            names[f"task.eval_lengths {label[2:]}"] = variant
    return names


def forget_log_timescales(core: MemoryCore) -> Tensor | None:
    """Natural logs of the per-unit forget-gate time scales ``[H]`` (float64, finite for
    saturated gates), or None for cores without a forget gate."""
    try:
        return log_timescales(core)
    except ValueError:
        return None


def timescale_stats(log_ts: Tensor) -> dict[str, float]:
    """Median and max of the time scales that fit a float, mean and std over units of their
    ``log10``.

    The fast-gate paper's Fig. 5 averages time scales that grow to ``e^74`` and beyond; their
    arithmetic mean is the largest unit's value (or ``inf``), so the mean is taken over logs.
    """
    ts = log_ts.exp()
    finite = ts[torch.isfinite(ts)]
    stats = {}
    if finite.numel():
        stats["timescale_median"] = float(finite.median())
        stats["timescale_max"] = float(finite.max())
    log10_ts = log_ts / math.log(10.0)
    stats["log10_timescale_mean"] = float(log10_ts.mean())
    stats["log10_timescale_std"] = float(log10_ts.std(unbiased=False))
    return stats


# =========================================================================== training
LAYOUT = RunLayout(
    "memcores supervised",
    trainer="supervised",
    budget_key="train.steps",
    extra_files=("results.json", ".results.json.*.tmp"),
)
"""The supervised trainer's part of the run life cycle (:class:`agents.run.RunLayout`)."""


def train(
    config: SupervisedConfig,
    resume: bool = False,
    on_log: Callable[[dict[str, float]], None] | None = None,
    allow_changes: Iterable[str] = (),
) -> dict[str, Any]:
    """Train (or resume) one run; returns the final metrics (also in ``results.json``).

    The run directory is locked and claimed by :class:`agents.run.RunSession`.

    :param on_log: called with every logged row (``{"step": updates, tag: value, ...}``).
    :param allow_changes: with ``resume``, dotted config keys that may differ from the
        checkpoint's besides :data:`agents.run.RESUME_ALLOWED_CHANGES`.
    :raises ValueError: bad config; the directory holds a run and neither ``resume`` nor
        ``run.overwrite`` is set; a resume whose config differs from the checkpoint's in a key
        not allowed; an unusable ``train.init_from`` (nothing is written in these cases).
    :raises agents.checkpoint.CheckpointError: ``resume`` without a readable checkpoint.
    :raises agents.run_lock.RunFolderBusy: another process is writing into the directory.
    :raises agents.divergence.TrainingDiverged: ``train.max_skipped_updates`` consecutive bad
        updates (the last checkpoint is kept; ``results.json`` is not written).
    """
    prep = prepare(config)

    def load_init_from() -> None:  # before an earlier run's files are deleted
        if config.train.init_from:
            load_initial_weights(prep.model, config.train.init_from, config)

    session = RunSession(
        LAYOUT, prep.run_dir, config, resume, allow_changes, on_log, before_clear=load_init_from
    )
    with session as run:
        start_step, best = 0, {}
        if run.resumed:
            start_step = run.restore(prep.model, prep.optimizer)
            best = dict(run.payload.get("best", {}))
        else:  # the weights at step 0, for before/after diagnostics
            run.save_checkpoint(0, prep.model, prep.optimizer, path=INIT_CHECKPOINT)
        t0 = time.perf_counter()
        step, stopped_early, skipped = training_loop(prep, run, start_step, best)
        results = final_report(prep, step, best, time.perf_counter() - t0, stopped_early)
        results["skipped_updates"] = skipped
        for key, value in results.get("final", {}).items():
            run.logger.record(key, value)
        run.logger.dump(step)
        write_text_atomic(prep.run_dir / "results.json", json.dumps(results, indent=2))
    return results


def run_eval(prep: Prepared, logger: RunLogger, best: dict[str, float], step: int) -> dict:
    """Evaluate on the fixed set, update ``best`` and queue the metrics and gate time scales."""
    tcfg = prep.config.train
    metrics = evaluate(
        prep.model, prep.task, prep.device, "valid", tcfg.eval_size, tcfg.eval_batch_size
    )
    for key, value in metrics.items():
        logger.record(f"eval/{key}", value)
        if key == "accuracy":
            best["accuracy"] = max(best.get("accuracy", 0.0), value)
        elif key in ("mse", "loss"):
            best[key] = min(best.get(key, math.inf), value)
    log_ts = forget_log_timescales(prep.model.core)
    if log_ts is not None:
        logger.histogram("train/forget_timescales", log_ts.exp().float(), step)
        for key, value in timescale_stats(log_ts).items():
            logger.record(f"train/{key}", value)
    return metrics


def train_step(
    prep: Prepared, batch: SequenceBatch, lr: float, max_loss: float
) -> tuple[dict[str, float], float, str]:
    """One update on ``batch`` at learning rate ``lr``, unless it is bad.

    :param max_loss: a mean loss above this counts as exploding.
    :return: the batch's metric sums (:func:`loss_and_metrics`), the gradient norm (NaN when
        not computed) and why the update was skipped (``""`` when it was applied).
    """
    model, optimizer, task = prep.model, prep.optimizer, prep.task
    for group in optimizer.param_groups:
        group["lr"] = lr
    tb = batch_to_torch(batch, prep.device)
    loss, batch_sums = loss_and_metrics(task.loss, model(tb["x"], task.window), tb)
    sums = {key: float(value) for key, value in batch_sums.items() if value is not None}
    mean_loss = sums["loss_sum"] / max(sums["n_loss"], 1.0)
    if not math.isfinite(mean_loss):
        return sums, math.nan, "non-finite loss"
    if mean_loss > max_loss:
        return sums, math.nan, f"loss {mean_loss:.3g} above {max_loss:.3g}"
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    clip = prep.config.optim.clip_grad_norm
    norm = float(nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf))
    if not math.isfinite(norm):  # the step would write NaN into every weight
        optimizer.zero_grad(set_to_none=True)
        return sums, norm, "non-finite gradient"
    optimizer.step()
    return sums, norm, ""


class LogWindow:
    """Training sums of the updates since the last log row (skipped updates count in time
    only)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = {}
        self.grad_norms: list[float] = []
        self.steps = 0
        self.start = time.perf_counter()

    def add(self, sums: dict[str, float], grad_norm: float, applied: bool) -> None:
        self.steps += 1
        if applied:
            for key, value in sums.items():
                self.sums[key] = self.sums.get(key, 0.0) + value
            self.grad_norms.append(grad_norm)

    def log(self, logger: RunLogger, prep: Prepared, data: TaskData, step: int, lr: float) -> dict:
        """Queue the window's ``train/*`` and ``time/*`` scalars; returns the train stats."""
        task, batch_size = prep.task, prep.config.train.batch_size
        stats = summarize(task.loss, self.sums) if self.grad_norms else {}
        for key, value in stats.items():
            logger.record(f"train/{key}", value)
        if self.grad_norms:
            logger.record("train/grad_norm", float(np.mean(self.grad_norms)))
        logger.record("train/learning_rate", lr)
        if isinstance(task, ClassificationTask):
            logger.record("train/epoch", data.epoch(step))
        elapsed = time.perf_counter() - self.start
        logger.record("time/fps", self.steps * batch_size * task.length / elapsed)
        logger.record("time/updates_per_s", self.steps / elapsed)
        self.reset()
        return stats


def training_loop(
    prep: Prepared, run: RunSession, start_step: int, best: dict[str, float]
) -> tuple[int, bool, int]:
    """Update from ``start_step`` to ``train.steps`` (or the target accuracy), logging every
    ``log_every`` and evaluating and checkpointing every ``eval_every`` updates.

    :return: the last step, whether the target accuracy stopped the run early, and how many
        updates were skipped in all (a resumed run's earlier ones included).
    :raises agents.divergence.TrainingDiverged: too many consecutive bad updates.
    """
    config, tcfg, task, logger = prep.config, prep.config.train, prep.task, run.logger
    data = TaskData(task, tcfg.batch_size, tcfg.seed)
    guard = run.guard(tcfg.max_skipped_updates, start_step)
    max_loss = math.inf  # set from the first training loss
    window = LogWindow()
    desc = f"{config.task.name}/{config.core.name}"
    bar = run.progress_bar(tcfg.progress, tcfg.steps, start_step, desc)
    prep.model.train()
    step, stopped_early = start_step, False
    if start_step == 0:
        run_eval(prep, logger, best, 0)
        logger.dump(0)
    while step < tcfg.steps:
        lr = learning_rate(config, step)
        sums, norm, why = train_step(prep, data.train_batch(step), lr, max_loss)
        step += 1
        window.add(sums, norm, applied=not why)
        bar.update(1)
        if not why and math.isinf(max_loss):
            first = sums["loss_sum"] / max(sums["n_loss"], 1.0)
            max_loss = tcfg.max_loss_ratio * max(task.baseline or 0.0, first)

        if step % tcfg.log_every == 0 or step == tcfg.steps:
            stats = window.log(logger, prep, data, step, lr)
            logger.record("train/skipped_updates", guard.skipped + bool(why))
            bar.set_postfix({k: f"{v:.4g}" for k, v in stats.items()}, refresh=False)
        if step % tcfg.eval_every == 0 or step == tcfg.steps:
            acc = run_eval(prep, logger, best, step).get("accuracy")
            extra = {"best": best, "skipped_updates": guard.skipped + bool(why)}
            run.save_checkpoint(step, prep.model, prep.optimizer, extra)
            if tcfg.target_accuracy is not None and acc is not None:
                stopped_early = acc >= tcfg.target_accuracy and step < tcfg.steps
        last = step == tcfg.steps or stopped_early
        if (step % tcfg.log_every == 0 or step % tcfg.eval_every == 0) and not last:
            logger.dump(step)  # the last row is written with the final metrics
        guard.observe(step, bool(why), why=why)
        if stopped_early:
            break
    return step, stopped_early, guard.skipped


def final_report(
    prep: Prepared, step: int, best: dict[str, float], wall_s: float, stopped_early: bool
) -> dict[str, Any]:
    """Final metrics: validation, test split (datasets) and transfer lengths (transfer_copy)."""
    cfg, task = prep.config, prep.task
    evaluate_kw = dict(eval_size=cfg.train.eval_size, batch_size=cfg.train.eval_batch_size)
    final: dict[str, float] = {}
    for key, value in evaluate(prep.model, task, prep.device, "valid", **evaluate_kw).items():
        final[f"eval/{key}"] = value
    if isinstance(task, ClassificationTask):
        for key, value in evaluate(prep.model, task, prep.device, "test", **evaluate_kw).items():
            final[f"test/{key}"] = value
    if isinstance(task, TransferCopyTask):
        for name, variant in task.variants().items():
            metrics = evaluate(prep.model, variant, prep.device, "valid", **evaluate_kw)
            for key, value in metrics.items():
                final[f"{TRANSFER_PREFIX}{name}/{key}"] = value
    return {
        "task": cfg.task.name,
        "core": cfg.core.name,
        "step": step,
        "stopped_early": stopped_early,
        "wall_s": round(wall_s, 1),
        "baseline_loss": task.baseline,
        "best": best,
        "final": final,
    }


def load_initial_weights(model: torch.nn.Module, source: str, config: SupervisedConfig) -> None:
    """Load ``train.init_from`` (a run directory or a checkpoint file) into ``model``.

    The core may change when its parameters are the same (e.g. ``lstm`` weights fine-tuned as
    ``hdetach_lstm``, or with another gate initialisation): the model section and the hidden
    size must match and every parameter must load with its shape.

    :raises ValueError: the source is missing, not a supervised checkpoint, was trained with
        other model settings or hidden size, or its parameters do not fit this core (the
        message names what differs).
    """
    path = Path(source)
    if path.is_dir():
        path = checkpoint_path(path)
    context = f"train.init_from: {path}:"
    try:
        payload = load_trainer_checkpoint(path, "supervised")
    except CheckpointError as err:
        raise ValueError(f"train.init_from: {err}") from err
    check_same_sections(payload, config, ("model",), context)
    saved_core = payload["config"].get("core") or {}
    if saved_core.get("hidden_size") != config.core.hidden_size:
        raise ValueError(
            f"{context} config section 'core' differs from the checkpoint's: hidden_size "
            f"{saved_core.get('hidden_size')} vs {config.core.hidden_size}"
        )
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as err:  # other parameter names or shapes
        raise ValueError(
            f"{context} the parameters of core {saved_core.get('name')!r} do not fit core "
            f"{config.core.name!r}: {str(err).splitlines()[0]}"
        ) from err


def check_same_sections(
    payload: dict[str, Any], config: SupervisedConfig, sections: tuple[str, ...], context: str
) -> None:
    """Reject a checkpoint whose ``sections`` differ from ``config``'s.

    :param context: what the message starts with (which operation found the mismatch).
    """
    saved, current = payload["config"], asdict(config)
    for section in sections:
        if saved.get(section) != current.get(section):
            raise ValueError(
                f"{context} config section {section!r} differs from the checkpoint's "
                f"({saved.get(section)} vs {current.get(section)})"
            )


# =========================================================================== evaluation only
def load_trained(
    run_dir: str | Path, config: SupervisedConfig, saved: SupervisedConfig
) -> tuple[SequenceTask, SequenceModel, torch.device]:
    """Rebuild a run's model from its latest checkpoint for evaluation on ``config``'s task.

    :param config: the run's saved config with any overrides applied (e.g. ``task.length``).
    :param saved: the run's saved config as trained; the task may differ only in ways that keep
        the model's input size, output size and loss.
    """
    payload = load_trainer_checkpoint(checkpoint_path(run_dir), "supervised")
    device = resolve_device(config.train.device)
    config.core.check_device(device)
    task = build_task(config)
    check_compatible(task, build_task(saved) if saved.task != config.task else task)
    model = build_model(config, task).to(device)
    model.load_state_dict(payload["model"])
    model.eval()
    return task, model, device


def check_compatible(task: SequenceTask, trained: SequenceTask) -> None:
    """``task`` must have the trained task's input size, output size and loss kind."""
    got = (task.input_size, task.output_size, task.loss)
    want = (trained.input_size, trained.output_size, trained.loss)
    if got != want:
        raise ValueError(
            f"task {task.describe()} does not fit the trained model: (input, output, loss) "
            f"{got} vs {want}"
        )


def with_length(config: SupervisedConfig, length: int) -> SupervisedConfig:
    """``config`` with ``task.length`` set to ``length``."""
    task = dataclasses.replace(config.task, options={**config.task.options, "length": length})
    return dataclasses.replace(config, task=task)


def evaluate_run(
    run_dir: str | Path,
    config: SupervisedConfig,
    saved: SupervisedConfig,
    eval_lengths: list[int] | None = None,
) -> dict[str, dict[str, float]]:
    """Evaluate a trained run, optionally at several task lengths (transfer).

    :return: ``{label: metrics}``; labels are ``T=<length>`` with ``eval_lengths``, else the
        split name (``test`` for datasets, ``eval`` for synthetic tasks).
    """
    task, model, device = load_trained(run_dir, config, saved)
    kw = dict(eval_size=config.train.eval_size, batch_size=config.train.eval_batch_size)
    if eval_lengths:
        variants = {f"--eval-lengths {n}": build_task(with_length(config, n)) for n in eval_lengths}
        for variant in variants.values():
            check_compatible(variant, task)
        check_memory(config, variants, device, train=False)  # every length before the first
        return {
            f"T={length}": evaluate(model, variant, device, "valid", **kw)
            for length, variant in zip(eval_lengths, variants.values(), strict=True)
        }
    check_memory(config, dict([next(iter(length_names(config, task).items()))]), device, False)
    if isinstance(task, ClassificationTask):
        return {"test": evaluate(model, task, device, "test", **kw)}
    return {"eval": evaluate(model, task, device, "valid", **kw)}
