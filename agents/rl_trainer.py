"""``memcores train``: recurrent PPO/A2C/PQN/R2D2 for any memory core, CleanRL-style top to
bottom.

    setup (validate everything, write nothing) -> run folder claimed (agents.run) -> loop:
        collect (agents.rollout: n_steps x n_envs, core stepped with T=1 under no_grad,
        chunk-start states stored, GAE) -> update (the learner of agent.algo, chosen once:
        agents.learners) -> log -> checkpoint

Run folder: ``config.yaml``, TensorBoard events, ``progress.csv``, ``checkpoints/last.pt``
(every ``train.checkpoint_every`` updates and at the end; atomic; loadable with
``torch.load(weights_only=True)``; holds the config, so evaluation needs nothing else).

Resume (``--resume``): policy, optimiser, step/update counters and the Python/NumPy/torch RNGs
come back from ``checkpoints/last.pt``; ``progress.csv`` rows and TensorBoard events after
that step are dropped; a config that differs from the checkpoint's outside
:data:`agents.run.RESUME_ALLOWED_CHANGES` is refused. The folder is locked while a run writes
into it and a diverged run stops (:mod:`agents.run`); docs/rl.md "Guarantees".
Episodes in flight are not saved: the envs are reset with seeds
``train.seed + RESET_SEED_STRIDE * updates + i`` and the core state starts fresh, so a
resumed run is reproducible but not bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from memcores.agents.acting_graph import ActingGraph
from memcores.agents.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    load_rl_checkpoint,
    saved_policy_weights,
)
from memcores.agents.device import acting_device, module_device, resolve_device
from memcores.agents.divergence import DivergenceGuard
from memcores.agents.episodes import EpisodeStats
from memcores.agents.learners import (
    Learner,
    acting_obstacle,
    check_learner_memory,
    make_learner,
)
from memcores.agents.memory_need import check_fits, observation_bytes
from memcores.agents.networks import build_policy
from memcores.agents.policy import RecurrentActorCritic, observation_shape
from memcores.agents.ppo import UpdateStats, make_optimizer
from memcores.agents.rl_config import AgentConfig, RLConfig
from memcores.agents.rollout import (
    RolloutBuffer,
    collect_with_returns,
    obs_shapes,
    start_rollouts,
)
from memcores.agents.rollout_graph import RolloutGraph
from memcores.agents.run import RunLayout, RunSession
from memcores.agents.run_setup import Setup
from memcores.agents.update_graph import UpdateGraph, keyed_by_state, refusal
from memcores.cores.diagnostics import timescales
from memcores.cores.graphed import cuda_only, graph_switch, maybe_graphed
from memcores.envs.batched import BatchedEnv
from memcores.envs.batched_registry import make_batched_env
from memcores.envs.cpus import check_cpu_counts
from memcores.envs.envpool_env import EnvPoolVectorEnv
from memcores.envs.vector import VectorEnv

__all__ = ["CHECKPOINT_NAME", "LAYOUT", "TrainResult", "setup", "train"]

LAYOUT = RunLayout("memcores train", trainer="rl", budget_key="train.total_steps")
"""The RL trainer's part of the run life cycle (:class:`agents.run.RunLayout`)."""
ROW_TAGS: tuple[str, ...] = (
    "rollout/ep_rew_mean",
    "rollout/ep_len_mean",
    "rollout/success_rate",
    "train/policy_loss",
    "train/value_loss",
    "train/entropy_loss",
    "train/approx_kl",
    "train/clip_fraction",
    "train/explained_variance",
    "train/learning_rate",
    "train/loss",
    "train/grad_norm",
    "train/n_updates",
    "train/skipped_updates",
    "time/fps",
    "time/iterations",
    "time/total_timesteps",
)
"""The scalars of every ``train.log_every`` row (SB3's tags; ``progress.csv``'s columns after
``step``), followed by :data:`RECON_TAG` with ``agent.recon_coef > 0``: what a sweep's
``--metric`` may name."""
RECON_TAG = "train/recon_loss"
VALUE_TAGS: tuple[str, ...] = ("train/q_values", "train/epsilon", "train/td_error")
"""The value-based learners' scalars (``agent.algo=pqn`` and ``r2d2``), logged after
:data:`ROW_TAGS`: the mean ``Q(s, a)`` of the replayed actions, the exploration rate the
rollout was collected with (the mean over the envs for R2D2) and the mean ``|TD error|``."""

RESET_SEED_STRIDE = 7919
"""Rollouts that start at update ``k`` (0, or a resumed run's update count) reset env ``i``
with seed ``train.seed + RESET_SEED_STRIDE * k + i``: a prime larger than any ``n_envs``, so a
resumed run's envs do not replay the episodes its first start already saw."""


# ---------------------------------------------------------------------------- environments
def make_vector_env(
    env_id: str,
    n_envs: int,
    seed: int,
    vector: str = "sync",
    env_kwargs: dict[str, Any] | None = None,
    workers: int = 1,
    device: torch.device | str = "cpu",
) -> VectorEnv | BatchedEnv | EnvPoolVectorEnv:
    """``n_envs`` copies of ``env_id`` (env ``i`` seeded ``seed + i``), auto-reset in the SAME
    step (:mod:`envs.vector`): the observation after a terminal step is already the next
    episode's first one, so every stored transition is a real one.

    :param vector: ``sync`` steps the envs in this process; ``async`` in ``workers`` worker
        processes over shared memory, in two groups so that the policy acts on one group while
        the other steps; ``batched`` steps them all as tensors on ``device``
        (:mod:`envs.batched`); ``envpool`` in EnvPool's C++ envs on ``workers`` threads
        (:mod:`envs.envpool_env`).
    :raises ValueError: unknown env id or bad env options (before any process is started).
    """
    if vector == "batched":
        return make_batched_env(env_id, n_envs, device, env_kwargs)
    if vector == "envpool":
        return EnvPoolVectorEnv(env_id, n_envs, seed, env_kwargs, threads=workers)
    if vector == "async":
        return VectorEnv(env_id, n_envs, seed, env_kwargs, workers=workers, groups=2)
    return VectorEnv(env_id, n_envs, seed, env_kwargs)


# ---------------------------------------------------------------------------- setup


def setup(config: RLConfig) -> Setup:
    """Validate the device, env id/options and core name/options by building them.

    :raises ValueError: with a message naming the bad value and the valid choices.
    """
    device = resolve_device(config.train.device)
    config.core.check_device(device)
    env = config.env
    workers = {"env.workers": env.workers} if env.vector in ("async", "envpool") else {}
    threads = {"train.threads": config.train.threads}
    check_cpu_counts({**threads, "train.update_threads": config.train.update_threads, **workers})
    if config.train.threads > 0:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    check_rollout_memory(config, device)
    envs = make_vector_env(
        env.id, env.n_envs, config.train.seed, env.vector, env.kwargs, env.workers
    )
    try:
        space = envs.single_observation_space
        if not isinstance(envs.single_action_space, gym.spaces.Discrete):
            raise ValueError(f"env {config.env.id!r} must have a Discrete action space")
        n_actions = int(envs.single_action_space.n)
        check_bptt_window(config, envs.memory_horizon)
        image_shape = observation_shape(space)  # (H, W, 3), or (n,) for vector obs
        try:
            policy = build_policy(config, n_actions, image_shape).to(device)
        except TypeError as err:  # a core rejecting an option value
            raise ValueError(f"core {config.core.name!r}: {err}") from err
        if config.train.init_from:
            load_initial_policy(policy, config.train.init_from, config, n_actions, image_shape)
        policy.core = maybe_graphed(policy.core, device, config.core.cuda_graph)
        optimizer = make_optimizer(policy, config.agent)
        why_update, why_acting = graph_obstacles(config, device, policy, optimizer)
        graph_update = graph_switch(config.train.graph_update, "train.graph_update", why_update)
        graph_acting = graph_switch(config.train.graph_acting, "train.graph_acting", why_acting)
        why_env = env_step_obstacle(config, why_acting)
        graph_env = graph_switch(config.train.graph_env_step, "train.graph_env_step", why_env)
    except BaseException:
        envs.close()
        raise
    return Setup(
        config, device, envs, policy, optimizer, n_actions, image_shape, graph_acting,
        graph_update, graph_env,
    )  # fmt: skip


STORED_STEP_BYTES = 8 + 1 + 5 * 4
"""What a rollout stores per env and step besides the observation: the action (int64), the
episode-start flag, log-probability, reward, value, advantage and return (float32)."""


def check_rollout_memory(config: RLConfig, device: torch.device) -> None:
    """Refuse rollouts that cannot fit memory before any env is made (``env.n_envs`` envs
    take minutes to make): ``n_steps x n_envs`` stored steps, each its observation (sized
    by one probe env) and :data:`STORED_STEP_BYTES`, twice with ``train.overlap``.

    :raises ValueError: naming ``env.n_envs``, ``agent.n_steps`` and both memory sizes; an
        unknown env id or bad env options (the probe env's errors).
    """
    env, agent = config.env, config.agent
    obs_bytes = observation_bytes(env.id, env.kwargs)
    per_step = obs_bytes + STORED_STEP_BYTES
    buffers = 2 if config.train.overlap else 1
    check_fits(
        buffers * agent.n_steps * env.n_envs * per_step,
        (torch.device("cpu"), device),
        f"env.n_envs={env.n_envs:,} x agent.n_steps={agent.n_steps:,} stored steps of "
        f"{per_step:,} bytes{' x 2 rollouts (train.overlap)' if buffers == 2 else ''}",
        "lower env.n_envs or agent.n_steps",
    )
    check_learner_memory(config, obs_bytes, device)


def graph_obstacles(
    config: RLConfig,
    device: torch.device,
    policy: RecurrentActorCritic,
    optimizer: torch.optim.Optimizer,
) -> tuple[str | None, str | None]:
    """Why ``train.graph_update`` and ``train.graph_acting`` cannot apply (None where one
    can), for :func:`cores.graphed.graph_switch`: both need a CUDA learner without
    ``train.overlap`` (whose collector thread would launch its own kernels while a graph
    records); the update also what :func:`agents.update_graph.refusal` asks, acting a core
    that reads nothing of its state on the host (not ``mem_lstm``)."""
    both = cuda_only(device)
    if both is None and config.train.overlap:
        both = "train.overlap acts in a second thread while the learner records; set one to false"
    keyed = keyed_by_state(policy)
    acting = acting_obstacle(config.agent.algo) or (
        keyed and f"{keyed} reads its state on the host at every step"
    )
    return both or refusal(policy, optimizer, config.agent), both or acting


def env_step_obstacle(config: RLConfig, why_acting: str | None) -> str | None:
    """Why ``train.graph_env_step`` cannot apply (None where it can): what stops
    ``train.graph_acting`` (``why_acting``, :func:`graph_obstacles`), or an env that does not
    step on the device."""
    vector = config.env.vector
    if why_acting is None and vector != "batched":
        return f"env.vector is {vector}, not batched (only a batched env steps on the device)"
    return why_acting


def check_bptt_window(config: RLConfig, horizon: int | None) -> None:
    """Refuse a truncated-BPTT window that cannot span the env's declared memory horizon.

    :raises ValueError: ``agent.seq_len < horizon`` while ``agent.bptt_check`` is on.
    """
    agent = config.agent
    if horizon is None or not agent.bptt_check or agent.seq_len >= horizon:
        return
    raise ValueError(
        f"agent.seq_len={agent.seq_len} is shorter than {config.env.id}'s memory horizon of "
        f"{horizon} steps (cue to choice): the choice's gradient can never reach the cue. "
        f"Use agent.seq_len >= {horizon} (e.g. agent.seq_len = agent.n_steps, a multiple of "
        "it), or agent.bptt_check=false to train with the short window anyway"
    )


def load_initial_policy(
    policy: RecurrentActorCritic,
    source: str,
    config: RLConfig,
    n_actions: int,
    image_shape: tuple[int, ...],
) -> None:
    """Load ``train.init_from`` (a run folder or a checkpoint file) into ``policy``.

    The reconstruction decoder (``agent.recon_*``) is loaded only when the source read the
    same lags and target; otherwise it keeps its fresh initialisation.

    :raises ValueError: the source is missing or not an RL checkpoint, its env had other
        observation or action spaces, or its parameters do not fit this network (the message
        names what differs).
    """
    context = f"train.init_from: {source}:"
    try:
        payload = load_rl_checkpoint(source)
    except (CheckpointError, FileNotFoundError) as err:
        raise ValueError(f"train.init_from: {err}") from err
    saved_shape, saved_actions = tuple(payload["image_shape"]), int(payload["n_actions"])
    if (saved_shape, saved_actions) != (tuple(image_shape), n_actions):
        raise ValueError(
            f"{context} trained on observations {saved_shape} with {saved_actions} actions, "
            f"this env has {tuple(image_shape)} and {n_actions}"
        )
    weights = saved_policy_weights(payload)
    saved = payload["config"]
    same_decoder = _same_decoder(saved["agent"], config.agent, policy)
    if not same_decoder:
        weights = {k: v for k, v in weights.items() if not k.startswith("decoder.")}
    network = (
        f"core {saved['core'].get('name')!r}, hidden_size {saved['core'].get('hidden_size')}, "
        f"image_encoder {saved['agent'].get('image_encoder')!r}"
    )
    try:
        missing, unexpected = policy.load_state_dict(weights, strict=False)
    except RuntimeError as err:  # parameters of other shapes; line 0 of the message is a header
        problem = str(err).splitlines()[1].strip().rstrip(".")
    else:
        missing = [k for k in missing if same_decoder or not k.startswith("decoder.")]
        if not missing and not unexpected:
            return
        problem = "; ".join(
            f"{kind} key(s) in state_dict: {', '.join(keys)}"
            for kind, keys in (("Missing", missing), ("Unexpected", unexpected))
            if keys
        )
    raise ValueError(f"{context} its network ({network}) does not fit this one: {problem}")


def _same_decoder(saved: dict[str, Any], agent: AgentConfig, policy: RecurrentActorCritic) -> bool:
    """Whether a source run's reconstruction decoder fits ``policy``'s: it is an auxiliary
    head indexed by lag position, so it comes over only when it reads the same lags and
    target (and starts fresh otherwise)."""
    if not float(saved.get("recon_coef") or 0) > 0 or policy.decoder is None:
        return False
    return all(saved.get(key) == getattr(agent, key) for key in ("recon_lags", "recon_target"))


# ---------------------------------------------------------------------------- training
@dataclass
class TrainResult:
    """Summary of a finished run."""

    run_dir: Path
    global_step: int
    updates: int
    ep_rew_mean: float = float("nan")
    success_rate: float = float("nan")
    history: list[dict[str, float]] = field(default_factory=list)
    loop_seconds: float = 0.0
    """Wall-clock time of the training loop (rollouts, updates, logging, checkpoints)."""
    loop_cpu_seconds: float = 0.0
    """CPU time of this process in the training loop (``time.process_time``)."""
    skipped_updates: int = 0
    """Minibatch updates skipped for a non-finite loss or gradient (their step not taken)."""


def train(
    config: RLConfig,
    run_dir: str | Path,
    resume: bool = False,
    on_log: Callable[[dict[str, float]], None] | None = None,
    allow_changes: Iterable[str] = (),
) -> TrainResult:
    """Train an agent as ``config`` says; write everything into ``run_dir``.

    The run folder is locked and claimed by :class:`agents.run.RunSession`.

    :param resume: continue from ``run_dir/checkpoints/last.pt``.
    :param on_log: called with every logged row (``{"step": frames, tag: value, ...}``).
    :param allow_changes: with ``resume``, dotted config keys that may differ from the
        checkpoint's besides :data:`agents.run.RESUME_ALLOWED_CHANGES` (e.g.
        ``("agent.learning_rate", "agent.ent_coef")`` for Population Based Training).
    :raises ValueError: bad config values; ``run_dir`` already holds a run (files of one,
        with or without a checkpoint) and neither ``resume`` nor ``run.overwrite`` is set; or
        ``resume`` with a config that differs from the checkpoint's in a key not allowed
        (nothing is written in any of these cases).
    :raises agents.run_lock.RunFolderBusy: another process is writing into ``run_dir``.
    :raises agents.divergence.TrainingDiverged: ``train.max_skipped_updates`` consecutive
        updates were skipped (the last checkpoint is kept).
    """
    s = setup(config)  # validates env/core/device; writes nothing
    try:
        with RunSession(LAYOUT, run_dir, config, resume, allow_changes, on_log) as session:
            return _train_loop(s, session)
    finally:
        s.envs.close()


# ---------------------------------------------------------------------------- rollouts
class SerialRollouts:
    """Collect rollout k with the current policy, then learn from it: the default."""

    def __init__(
        self,
        collect: Callable[[RolloutBuffer], None],
        learn: Callable[[RolloutBuffer], UpdateStats],
        buffer: RolloutBuffer,
        update_threads: int,
    ) -> None:
        self.collect, self.learn, self.buffer = collect, learn, buffer
        self.update_threads = update_threads

    def next_update(self, more: bool) -> UpdateStats:
        """One rollout and the update on it (``more`` is unused: nothing runs ahead)."""
        self.collect(self.buffer)
        with _threads(self.update_threads):
            return self.learn(self.buffer)


class OverlappedRollouts:
    """``train.overlap``: collect rollout k+1 in a second thread, with the acting copy of the
    policy from before update k, while update k learns from rollout k (two buffers in turn).
    """

    def __init__(
        self,
        collect: Callable[[RolloutBuffer], None],
        learn: Callable[[RolloutBuffer], UpdateStats],
        buffers: tuple[RolloutBuffer, RolloutBuffer],
    ) -> None:
        self.collect, self.learn, self.buffers = collect, learn, buffers
        self.k = 0  # updates done by this object

    def next_update(self, more: bool) -> UpdateStats:
        """Update k on rollout k, collecting rollout k+1 meanwhile when ``more`` follow."""
        current, following = self.buffers[self.k % 2], self.buffers[(self.k + 1) % 2]
        if self.k == 0:
            self.collect(current)  # the first rollout has nothing to overlap with
        collector = _InThread(self.collect, following) if more else None
        try:
            return self.learn(current)
        finally:
            if collector is not None:
                collector.join()
            self.k += 1


def _rollouts(
    s: Setup,
    acting: RecurrentActorCritic,
    episodes: EpisodeStats,
    updates: int,
    learner: Learner,
) -> SerialRollouts | OverlappedRollouts:
    """The rollout schedule of ``train.overlap``, starting at update ``updates``, with
    ``learner`` learning from each rollout."""
    cfg, agent, envs = s.config, s.config.agent, s.envs
    act_device = module_device(acting)
    if isinstance(envs, BatchedEnv):
        envs.to(act_device)  # batched envs step where the policy acts
    carry = [start_rollouts(acting, envs, _reset_seed(cfg, updates), act_device)]

    env_graph = RolloutGraph(acting, envs) if s.graph_env_step else None
    step = learner.acting(acting, getattr(envs, "groups", [slice(None)]))
    if step is None and s.graph_acting and env_graph is None:
        step = ActingGraph(acting)

    def collect(buffer: RolloutBuffer) -> None:
        carry[0] = collect_with_returns(
            acting, envs, buffer, carry[0], agent, episodes, step, env_graph
        )

    def make_buffer() -> RolloutBuffer:
        n = cfg.env.n_envs
        state = acting.initial_state(n, act_device)
        space = obs_shapes(envs.single_observation_space)
        return RolloutBuffer(space, agent.n_steps, n, learner.chunk_len, state, act_device)

    if not cfg.train.overlap:
        return SerialRollouts(collect, learner.learn, make_buffer(), cfg.train.update_threads)
    return OverlappedRollouts(collect, learner.learn, (make_buffer(), make_buffer()))


# ---------------------------------------------------------------------------- the loop
@dataclass
class _Loop:
    """What the training loop carries from one update to the next."""

    s: Setup
    run: RunSession
    total_updates: int
    global_step: int
    updates: int
    acting: RecurrentActorCritic
    episodes: EpisodeStats
    rollouts: SerialRollouts | OverlappedRollouts
    guard: DivergenceGuard
    bar: Any
    learner: Learner
    history: list[dict[str, float]] = field(default_factory=list)
    start: tuple[float, float, int] = (0.0, 0.0, 0)
    """``perf_counter``, ``process_time`` and the frame count when the loop started."""

    @property
    def frames_per_update(self) -> int:
        return self.s.config.env.n_envs * self.s.config.agent.n_steps

    def fps(self) -> float:
        return (self.global_step - self.start[2]) / max(time.perf_counter() - self.start[0], 1e-9)


def _begin(s: Setup, run: RunSession) -> _Loop:
    """Restore a resumed run (or seed a new one) and build what the loop carries."""
    cfg = s.config
    frames_per_update = cfg.env.n_envs * cfg.agent.n_steps
    total_updates = max(1, math.ceil(cfg.train.total_steps / frames_per_update))
    global_step, updates = 0, 0
    if run.resumed:
        global_step = run.restore(s.policy, s.optimizer)
        updates = int(run.payload["updates"])
    else:
        np.random.seed(cfg.train.seed)  # noqa: NPY002  (third-party code draws from it)
        torch.manual_seed(cfg.train.seed)
    # Acting (batch of N, T = 1) is latency-bound: a GPU learner acts itself through acting
    # graphs (train.graph_acting), and without them, with few envs, on a CPU copy of the
    # policy refreshed after every update (agents.device.acting_device); the rollout is stored
    # where the policy acts and each update moves it to the learner's device once.
    # Overlapped, the copy is what lets the next rollout be collected while the learner
    # updates.
    acting = acting_policy(
        s.policy,
        s.device,
        separate=cfg.train.overlap,
        n_envs=cfg.env.n_envs,
        graphed=s.graph_acting or s.graph_env_step,
    )
    episodes = EpisodeStats(cfg.env.n_envs)
    learner = _learner(s, updates)
    if run.resumed:
        learner.load_state_dict(run.payload.get("learner", {}))
    rollouts = _rollouts(s, acting, episodes, updates, learner)
    guard = run.guard(cfg.train.max_skipped_updates, global_step, "frame")
    desc = f"{cfg.core.name} {cfg.agent.algo} {cfg.env.id}"
    bar = run.progress_bar(cfg.train.progress, cfg.train.total_steps, global_step, desc, "frames")
    start = (time.perf_counter(), time.process_time(), global_step)
    return _Loop(
        s, run, total_updates, global_step, updates, acting, episodes, rollouts, guard, bar,
        learner, start=start,
    )  # fmt: skip


def _reset_seed(cfg: RLConfig, updates: int) -> int:
    """The seed of the rollouts starting at update ``updates`` (:data:`RESET_SEED_STRIDE`),
    which also orders an overlapped learner's minibatches."""
    return cfg.train.seed + RESET_SEED_STRIDE * updates


def _learner(s: Setup, updates: int) -> Learner:
    """The learner of ``agent.algo`` (:func:`agents.learners.make_learner`), ``updates``
    updates into the run."""
    cfg = s.config
    graph = UpdateGraph() if s.graph_update else None
    # Overlapped, the learner draws its minibatch order from its own generator while the
    # collector samples actions from torch's global one, so the run stays reproducible.
    generator = (
        torch.Generator().manual_seed(_reset_seed(cfg, updates)) if cfg.train.overlap else None
    )
    frames = updates * cfg.env.n_envs * cfg.agent.n_steps
    return make_learner(s, frames, generator, graph)


def _train_loop(s: Setup, run: RunSession) -> TrainResult:
    """Collect, update, log, checkpoint: once per update until the budget is spent."""
    loop = _begin(s, run)
    train_cfg = s.config.train
    while loop.updates < loop.total_updates:
        lr = _set_learning_rate(s.optimizer, s.config.agent, loop.updates, loop.total_updates)
        stats = loop.rollouts.next_update(more=loop.updates + 1 < loop.total_updates)
        loop.global_step += loop.frames_per_update
        if loop.acting is not s.policy:
            loop.acting.load_state_dict(s.policy.state_dict())
        loop.updates += 1
        last = loop.updates == loop.total_updates

        _log_update(loop, stats, lr, last)
        all_skipped = stats.n_minibatches == 0 and stats.skipped_updates > 0
        why = "non-finite loss or gradient"
        loop.guard.observe(loop.global_step, all_skipped, stats.skipped_updates, why)
        if loop.updates % train_cfg.checkpoint_every == 0 or last:
            _save_checkpoint(loop)
    return TrainResult(
        run_dir=run.run_dir,
        global_step=loop.global_step,
        updates=loop.updates,
        loop_seconds=time.perf_counter() - loop.start[0],
        loop_cpu_seconds=time.process_time() - loop.start[1],
        ep_rew_mean=loop.episodes.mean_return,
        success_rate=loop.episodes.success_rate,
        history=loop.history,
        skipped_updates=loop.guard.skipped,
    )


def _set_learning_rate(
    optimizer: torch.optim.Optimizer, agent: AgentConfig, updates: int, total_updates: int
) -> float:
    """Linear annealing to 0 over the whole budget (CleanRL) when ``agent.anneal_lr``."""
    lr = agent.learning_rate
    if agent.anneal_lr:
        lr *= 1.0 - updates / total_updates
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _log_update(loop: _Loop, stats: UpdateStats, lr: float, last: bool) -> None:
    """The ``train.log_every`` row (SB3's tags), the time-scale histogram, the progress bar."""
    cfg, logger, fps = loop.s.config, loop.run.logger, loop.fps()
    episodes, updates = loop.episodes, loop.updates
    if updates % cfg.train.log_every == 0 or last:
        values = (  # in ROW_TAGS' order
            episodes.mean_return,
            episodes.mean_length,
            episodes.success_rate,
            stats.policy_loss,
            stats.value_loss,
            stats.entropy_loss,
            stats.approx_kl,
            stats.clip_fraction,
            stats.explained_variance,
            lr,
            stats.loss,
            stats.grad_norm,
            updates,
            loop.guard.skipped + stats.skipped_updates,
            fps,
            updates,
            loop.global_step,
        )
        row = dict(zip(ROW_TAGS, values, strict=True))
        if cfg.agent.recon_coef > 0:
            row[RECON_TAG] = stats.recon_loss
        row.update({tag: stats.extra[tag] for tag in VALUE_TAGS if tag in stats.extra})
        for tag, value in row.items():
            logger.record(tag, value)
        logger.dump(loop.global_step)
        loop.history.append({"step": loop.global_step, **row})
    every = cfg.train.histogram_every
    if every > 0 and (updates % every == 0 or updates == 1):
        _log_timescales(loop.run, loop.s.policy, loop.global_step)
    loop.bar.update(loop.frames_per_update)
    loop.bar.set_postfix(fps=f"{fps:.0f}", ret=f"{episodes.mean_return:.2f}", refresh=False)


def _save_checkpoint(loop: _Loop) -> None:
    """``checkpoints/last.pt`` (atomic) with what acting and resuming need."""
    s = loop.s
    extra = {
        "updates": loop.updates,
        "n_actions": s.n_actions,
        "image_shape": list(s.image_shape),
        "skipped_updates": loop.guard.skipped,
        "learner": loop.learner.state_dict(),
    }
    loop.run.save_checkpoint(loop.global_step, s.policy, s.optimizer, extra)


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (``0``: leave the count alone)."""
    if n <= 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def acting_policy(
    policy: RecurrentActorCritic,
    device: torch.device,
    separate: bool = False,
    n_envs: int = 1,
    graphed: bool = False,
) -> RecurrentActorCritic:
    """The policy that acts in the envs: ``policy`` itself where it acts on the learner's
    device, else a copy on the acting device (:func:`agents.device.acting_device`: the CPU for
    a CPU learner, and for a GPU learner with few envs unless ``graphed``); always a copy when
    ``separate`` (acting while the learner updates)."""
    act = acting_device(device, n_envs, graphed=graphed)
    if act == device and not separate:
        return policy
    return copy.deepcopy(policy).to(act)


class _InThread(threading.Thread):
    """Run ``fn(*args)`` in a thread; :meth:`join` re-raises what it raised."""

    def __init__(self, fn: Callable[..., None], *args: Any) -> None:
        super().__init__(daemon=True)
        self._fn, self._args = fn, args
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._fn(*self._args)
        except BaseException as err:  # noqa: BLE001  (handed to the joining thread)
            self._error = err

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self._error is not None:
            raise self._error


def _log_timescales(run: RunSession, policy: RecurrentActorCritic, step: int) -> None:
    """The core's forget-gate characteristic time scales, when it has a forget gate."""
    try:
        values = timescales(getattr(policy.core, "actor_core", policy.core))
    except (ValueError, NotImplementedError, AttributeError):
        return  # cores without a forget gate (cores.diagnostics raises ValueError)
    run.logger.histogram("core/gate_timescales", values, step)
