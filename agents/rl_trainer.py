"""``memcores train``: recurrent PPO/A2C for any memory core, CleanRL-style top to bottom.

    setup (validate everything, write nothing) -> run dir + config.yaml -> loop:
        rollout: n_steps x n_envs, core stepped with T=1 under no_grad, chunk-start states
        stored -> GAE -> update (:func:`agents.ppo.update`) -> log -> checkpoint

Run folder: ``config.yaml``, TensorBoard events, ``progress.csv``, ``checkpoints/last.pt``
(every ``train.checkpoint_every`` updates and at the end; atomic; loadable with
``torch.load(weights_only=True)``; holds the config, so evaluation needs nothing else).

Resume (``--resume``): policy, optimiser, step/update counters and the Python/NumPy/torch RNGs
come back from ``checkpoints/last.pt``; ``progress.csv`` rows and TensorBoard events after
that step are dropped. The folder is locked while a run writes into it (``agents/run_lock.py``)
and a diverged run stops (``agents/divergence.py``); docs/rl.md "Guarantees".
Episodes in flight are not saved: the envs are reset with seeds
``train.seed + 7919 * updates + i`` and the core state starts fresh, so a resumed run is
reproducible but not bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml

from agents.checkpoint import (
    CheckpointError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from agents.device import acting_device, module_device, resolve_device
from agents.divergence import DivergenceGuard
from agents.episodes import EpisodeStats
from agents.files import write_text_atomic
from agents.logger import RunLogger
from agents.policy import (
    RecurrentActorCritic,
    build_policy,
    obs_to_tensors,
    observation_shape,
    sample_actions,
)
from agents.ppo import load_optimizer_state, make_optimizer, update
from agents.rl_config import AgentConfig, RLConfig, config_from_dict, config_to_dict
from agents.rollout import RolloutBuffer
from agents.run_lock import RunLock, refuse_earlier_run, run_files
from envs.vector import VectorEnv

CHECKPOINT_FORMAT = "memcores-rl/1"
"""``format`` field of every RL checkpoint."""
CHECKPOINT_NAME = "checkpoints/last.pt"
"""Where, inside a run folder, the latest checkpoint lives."""


# ---------------------------------------------------------------------------- environments
def make_vector_env(
    env_id: str,
    n_envs: int,
    seed: int,
    vector: str = "sync",
    env_kwargs: dict[str, Any] | None = None,
    workers: int = 1,
) -> VectorEnv:
    """``n_envs`` copies of ``env_id`` (env ``i`` seeded ``seed + i``), auto-reset in the SAME
    step (:mod:`envs.vector`): the observation after a terminal step is already the next
    episode's first one, so every stored transition is a real one.

    :param vector: ``sync`` steps the envs in this process; ``async`` in ``workers`` worker
        processes over shared memory, in two groups so that the policy acts on one group while
        the other steps.
    :raises ValueError: unknown env id or bad env options (before any process is started).
    """
    if vector == "async":
        return VectorEnv(env_id, n_envs, seed, env_kwargs, workers=workers, groups=2)
    return VectorEnv(env_id, n_envs, seed, env_kwargs)


def obs_shapes(space: gym.spaces.Dict) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Per-env observation shapes/dtypes of a (single-env) Dict space, as torch dtypes."""
    out = {}
    for key, sub in space.spaces.items():
        dtype = torch.from_numpy(np.zeros(0, dtype=sub.dtype)).dtype
        out[key] = (tuple(sub.shape), dtype)
    return out


# ---------------------------------------------------------------------------- setup
@dataclass
class Setup:
    """Everything a run needs, built and validated before any file is written."""

    config: RLConfig
    device: torch.device
    envs: VectorEnv
    policy: RecurrentActorCritic
    optimizer: torch.optim.Optimizer
    n_actions: int
    image_shape: tuple[int, ...]  # (H, W, 3) images, or (n,) vector observations


def setup(config: RLConfig) -> Setup:
    """Validate the device, env id/options and core name/options by building them.

    :raises ValueError: with a message naming the bad value and the valid choices.
    """
    device = resolve_device(config.train.device)
    if config.train.threads > 0:
        torch.set_num_threads(config.train.threads)
    torch.manual_seed(config.train.seed)
    env = config.env
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
        optimizer = make_optimizer(policy, config.agent)
    except BaseException:
        envs.close()
        raise
    return Setup(config, device, envs, policy, optimizer, n_actions, image_shape)


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
    # The reconstruction decoder is an auxiliary head, indexed by lag position: it comes
    # over only when it reads the same lags and target, and starts fresh otherwise.
    had_decoder = float(saved["agent"].get("recon_coef") or 0) > 0
    same_decoder = (
        had_decoder
        and policy.decoder is not None
        and all(
            saved["agent"].get(key) == getattr(config.agent, key)
            for key in ("recon_lags", "recon_target")
        )
    )
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


# ---------------------------------------------------------------------------- checkpoints
def checkpoint_payload(
    s: Setup, global_step: int, updates: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What a checkpoint holds (only ``weights_only``-safe types)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "config": config_to_dict(s.config),
        "policy": s.policy.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "global_step": int(global_step),
        "updates": int(updates),
        "rng": rng_state(),
        "n_actions": s.n_actions,
        "image_shape": list(s.image_shape),
        **(extra or {}),
    }


def find_checkpoint(run: str | Path) -> Path:
    """A run folder (or a checkpoint file) -> the checkpoint file."""
    run = Path(run)
    if run.is_dir():
        path = run / CHECKPOINT_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"no checkpoint in run folder {run} (expected {CHECKPOINT_NAME}); "
                "was it trained with `memcores train`?"
            )
        return path
    if not run.exists():
        raise FileNotFoundError(f"run folder or checkpoint not found: {run}")
    return run


def load_rl_checkpoint(run: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """Load and check an RL checkpoint (a run folder or a ``.pt`` file)."""
    path = find_checkpoint(run)
    payload = load_checkpoint(path, map_location=device)
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"{path} is not a memcores RL checkpoint (format {payload.get('format')!r}, "
            f"expected {CHECKPOINT_FORMAT!r})"
        )
    return payload


def saved_policy_weights(payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A checkpoint's policy weights, without the constants early versions also saved."""
    weights = dict(payload["policy"])
    for name in ("image.scale", "image.offsets"):
        weights.pop(name, None)
    return weights


def policy_from_checkpoint(
    payload: dict[str, Any], device: str | torch.device = "cpu"
) -> tuple[RecurrentActorCritic, RLConfig]:
    """Rebuild the trained policy (eval mode) and its config from a loaded checkpoint.

    A record's ``policy.pt`` keeps no reconstruction decoder (it only trains the core), so the
    rebuilt policy has none either when the weights lack it."""
    config = config_from_dict(payload["config"])
    policy = build_policy(config, int(payload["n_actions"]), tuple(payload["image_shape"]))
    weights = saved_policy_weights(payload)
    if not any(name.startswith("decoder.") for name in weights):
        policy.decoder = None
    policy.load_state_dict(weights)
    return policy.to(device).eval(), config


# ---------------------------------------------------------------------------- rollouts
@dataclass
class RolloutCarry:
    """What one rollout hands to the next: the current observation, starts and core state."""

    obs: dict[str, np.ndarray]  # the vector env's batched observation, [N, ...] each
    starts: torch.Tensor  # [N] bool: obs is the first of an episode
    state: tuple[torch.Tensor, ...]  # core state before reading obs, [N, ...] each


def start_rollouts(
    policy: RecurrentActorCritic, envs: VectorEnv, seed: int, device: torch.device
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
) -> RolloutCarry:
    """Fill ``buffer`` with ``n_steps`` steps of every env, the core stepping with ``T = 1``.

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
            with torch.no_grad():
                out = policy(obs, state_g, starts_g.unsqueeze(0))
                actions, logprobs = sample_actions(out.logits[0])  # [R], [R]
            buffer.add(t, obs, starts_g, state_g, actions, logprobs, out.values[0], rows)
            for s, new in zip(state, out.state, strict=True):
                s[rows] = new
            envs.step_async(g, actions.cpu().numpy())
    for g, rows in enumerate(groups):
        collect(buffer.n_steps - 1, g, rows)
    return RolloutCarry(envs.obs, starts, state)


def collect_with_returns(
    policy: RecurrentActorCritic,
    envs: VectorEnv,
    buffer: RolloutBuffer,
    carry: RolloutCarry,
    agent: AgentConfig,
    episodes: EpisodeStats | None = None,
) -> RolloutCarry:
    """:func:`collect_rollout`, then GAE from ``policy``'s value of the observation after it."""
    carry = collect_rollout(policy, envs, buffer, carry, episodes)
    with torch.no_grad():
        obs = obs_to_tensors(carry.obs, buffer.device)
        last_value = policy(obs, carry.state, carry.starts.unsqueeze(0)).values[0]
    buffer.compute_returns(last_value, carry.starts, agent.gamma, agent.gae_lambda)
    return carry


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
) -> TrainResult:
    """Train an agent as ``config`` says; write everything into ``run_dir``.

    The run folder is locked (:class:`agents.run_lock.RunLock`) while the run writes into it.

    :param resume: continue from ``run_dir/checkpoints/last.pt``.
    :param on_log: called with every logged row (``{"step": frames, tag: value, ...}``).
    :raises ValueError: bad config values, or ``run_dir`` already holds a run (files of one,
        with or without a checkpoint) and neither ``resume`` nor ``run.overwrite`` is set
        (nothing is written in either case).
    :raises agents.run_lock.RunFolderBusy: another process is writing into ``run_dir``.
    :raises agents.divergence.TrainingDiverged: ``train.max_skipped_updates`` consecutive
        updates were skipped (the last checkpoint is kept).
    """
    run_dir = Path(run_dir)
    s = setup(config)  # validates env/core/device; writes nothing
    try:
        with RunLock(run_dir, "memcores train"):
            resume_payload = _claim_run_dir(run_dir, config, resume)
            return _train_loop(s, run_dir, resume_payload, on_log)
    finally:
        s.envs.close()


RUN_FILES = ("config.yaml", "progress.csv", "progress.csv.tmp", "events.out.tfevents.*")
RUN_FILES += ("checkpoints", ".config.yaml.*.tmp")
"""Globs of what a run writes into its folder (what ``run.overwrite`` deletes)."""


def _claim_run_dir(run_dir: Path, config: RLConfig, resume: bool) -> dict[str, Any] | None:
    """With the folder locked: the checkpoint to resume from, or a clean folder.

    :raises ValueError: ``resume`` without a checkpoint, or an earlier run's files in the
        folder without ``resume`` or ``run.overwrite``.
    """
    ckpt_path = run_dir / CHECKPOINT_NAME
    if resume:
        payload = load_rl_checkpoint(ckpt_path)  # clear error if missing/corrupt
        for tmp in ckpt_path.parent.glob(f".{ckpt_path.name}.*.tmp"):  # a kill mid-write
            tmp.unlink()
        return payload
    refuse_earlier_run(run_dir, RUN_FILES, ckpt_path, config.run.overwrite)
    _clear_run(run_dir)
    return None


def _check_same_network(saved: dict[str, Any], config: RLConfig) -> None:
    """``--resume`` needs the network the checkpoint was trained with."""
    now = config_to_dict(config)
    keys = [("core", k) for k in ("name", "hidden_size", "options")]
    keys += [("agent", "image_encoder"), ("agent", "mission")]
    diff = [
        f"{a}.{b}: checkpoint {saved[a].get(b)!r}, config {now[a][b]!r}"
        for a, b in keys
        if saved.get(a, {}).get(b) != now[a][b]
    ]
    if diff:
        raise ValueError(
            "cannot resume: the network differs from the checkpoint's (" + "; ".join(diff) + ")"
        )


def _clear_run(run_dir: Path) -> None:
    """Delete what an earlier run wrote into ``run_dir`` (only the files a run writes)."""
    for path in reversed(run_files(run_dir, (*RUN_FILES, "checkpoints/*"))):
        if path.is_dir():  # emptied first: reversed, the sorted list has files before folders
            if not any(path.iterdir()):
                path.rmdir()
        else:
            path.unlink()


def _train_loop(
    s: Setup,
    run_dir: Path,
    resume: dict[str, Any] | None,
    on_log: Callable[[dict[str, float]], None] | None = None,
) -> TrainResult:
    cfg, agent, device = s.config, s.config.agent, s.device
    policy, optimizer, envs = s.policy, s.optimizer, s.envs
    N, S = cfg.env.n_envs, agent.n_steps
    frames_per_update = N * S
    total_updates = max(1, math.ceil(cfg.train.total_steps / frames_per_update))

    global_step, updates = 0, 0
    if resume is not None:
        _check_same_network(resume["config"], cfg)
        policy.load_state_dict(resume["policy"])
        load_optimizer_state(optimizer, resume["optimizer"])
        global_step, updates = int(resume["global_step"]), int(resume["updates"])
        set_rng_state(resume["rng"])
    else:
        np.random.seed(cfg.train.seed)  # noqa: NPY002  (third-party code draws from it)
        torch.manual_seed(cfg.train.seed)

    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    logger = RunLogger(run_dir, tensorboard=cfg.run.tensorboard, on_dump=on_log)
    if resume is not None:
        logger.truncate_after(global_step)

    # Acting (batch of N, T = 1) is latency-bound: on a GPU learner with few envs it stays on
    # the CPU with a copy of the policy, refreshed after every update (agents.device.
    # acting_device); the rollout is stored where the policy acts and each update moves it to
    # the learner's device once.
    # With train.overlap the acting copy also lets rollout k+1 be collected (by the policy from
    # before update k) while update k runs: two rollout buffers, used in turn.
    overlap = cfg.train.overlap
    acting = acting_policy(policy, device, separate=overlap, n_envs=N)
    act_device = module_device(acting)
    buffers = [
        RolloutBuffer(
            obs_shapes(envs.single_observation_space),
            S,
            N,
            agent.seq_len,
            acting.initial_state(N, act_device),
            act_device,
        )
        for _ in range(2 if overlap else 1)
    ]
    episodes = EpisodeStats(N)
    history: list[dict[str, float]] = []
    carry = start_rollouts(acting, envs, cfg.train.seed + 7919 * updates, act_device)
    # Overlapped, the learner draws its minibatch order from its own generator while the
    # collector samples actions from torch's global one, so a run stays reproducible.
    learner_rng = (
        torch.Generator().manual_seed(cfg.train.seed + 7919 * updates) if overlap else None
    )

    def collect_into(buffer: RolloutBuffer) -> None:
        nonlocal carry
        carry = collect_with_returns(acting, envs, buffer, carry, agent, episodes)

    skipped_before = int((resume or {}).get("skipped_updates", 0))
    guard = DivergenceGuard(cfg.train.max_skipped_updates, global_step, "frame", skipped_before)
    progress = _progress_bar(cfg, global_step)
    start_time, start_step = time.perf_counter(), global_step
    start_cpu = time.process_time()
    try:
        if overlap:
            collect_into(buffers[0])  # the first rollout has nothing to overlap with
        while updates < total_updates:
            # Linear LR annealing to 0 over the whole budget (CleanRL).
            lr = agent.learning_rate
            if agent.anneal_lr:
                lr *= 1.0 - updates / total_updates
            for group in optimizer.param_groups:
                group["lr"] = lr

            if not overlap:
                # ---------------- rollout (T = 1 core steps, state carried per env), GAE
                collect_into(buffers[0])
                # ---------------- update
                with _threads(cfg.train.update_threads):
                    stats = update(policy, optimizer, buffers[0], agent)
            else:
                # ---------------- update k on rollout k while rollout k+1 is collected
                collector = None
                if updates + 1 < total_updates:
                    collector = _InThread(collect_into, buffers[(updates + 1) % 2])
                try:
                    stats = update(policy, optimizer, buffers[updates % 2], agent, learner_rng)
                finally:
                    if collector is not None:
                        collector.join()
            global_step += frames_per_update
            if acting is not policy:
                acting.load_state_dict(policy.state_dict())
            updates += 1

            # ---------------- logging
            fps = (global_step - start_step) / max(time.perf_counter() - start_time, 1e-9)
            ep_rew = episodes.mean_return
            if updates % cfg.train.log_every == 0 or updates == total_updates:
                row = {
                    "rollout/ep_rew_mean": ep_rew,
                    "rollout/ep_len_mean": episodes.mean_length,
                    "rollout/success_rate": episodes.success_rate,
                    "train/policy_loss": stats.policy_loss,
                    "train/value_loss": stats.value_loss,
                    "train/entropy_loss": stats.entropy_loss,
                    "train/approx_kl": stats.approx_kl,
                    "train/clip_fraction": stats.clip_fraction,
                    "train/explained_variance": stats.explained_variance,
                    "train/learning_rate": lr,
                    "train/loss": stats.loss,
                    "train/grad_norm": stats.grad_norm,
                    "train/n_updates": updates,
                    "train/skipped_updates": guard.skipped + stats.skipped_updates,
                    "time/fps": fps,
                    "time/iterations": updates,
                    "time/total_timesteps": global_step,
                }
                if cfg.agent.recon_coef > 0:
                    row["train/recon_loss"] = stats.recon_loss
                for tag, value in row.items():
                    logger.record(tag, value)
                logger.dump(global_step)
                history.append({"step": global_step, **row})
            every = cfg.train.histogram_every
            if every > 0 and (updates % every == 0 or updates == 1):
                _log_timescales(logger, policy, global_step)
            if progress is not None:
                progress.update(frames_per_update)
                progress.set_postfix(fps=f"{fps:.0f}", ret=f"{ep_rew:.2f}", refresh=False)

            all_skipped = stats.n_minibatches == 0 and stats.skipped_updates > 0
            guard.observe(
                global_step, all_skipped, stats.skipped_updates, "non-finite loss or gradient"
            )

            # ---------------- checkpoint (atomic; the last one always)
            if updates % cfg.train.checkpoint_every == 0 or updates == total_updates:
                extra = {"skipped_updates": guard.skipped}
                save_checkpoint(
                    run_dir / CHECKPOINT_NAME, checkpoint_payload(s, global_step, updates, extra)
                )
    finally:
        if progress is not None:
            progress.close()
        logger.close()
    return TrainResult(
        run_dir=run_dir,
        global_step=global_step,
        updates=updates,
        loop_seconds=time.perf_counter() - start_time,
        loop_cpu_seconds=time.process_time() - start_cpu,
        ep_rew_mean=episodes.mean_return,
        success_rate=episodes.success_rate,
        history=history,
        skipped_updates=guard.skipped,
    )


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
    policy: RecurrentActorCritic, device: torch.device, separate: bool = False, n_envs: int = 1
) -> RecurrentActorCritic:
    """The policy that acts in the envs: ``policy`` itself where it acts on the learner's
    device, else a copy on the acting device (:func:`agents.device.acting_device`: the CPU for
    a CPU learner, and for a GPU learner with few envs); always a copy when ``separate``
    (acting while the learner updates)."""
    act = acting_device(device, n_envs)
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


def _progress_bar(cfg: RLConfig, initial: int) -> Any:
    if not cfg.train.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=cfg.train.total_steps,
        initial=min(initial, cfg.train.total_steps),
        unit="frames",
        unit_scale=True,
        desc=f"{cfg.core.name} {cfg.agent.algo} {cfg.env.id}",
        dynamic_ncols=True,
    )


def _log_timescales(logger: RunLogger, policy: RecurrentActorCritic, step: int) -> None:
    """The core's forget-gate characteristic time scales, when it has a forget gate."""
    try:
        from cores.diagnostics import timescales
    except ImportError:
        return
    try:
        values = timescales(getattr(policy.core, "actor_core", policy.core))
    except (ValueError, NotImplementedError, AttributeError):
        return  # cores without a forget gate (cores.diagnostics raises ValueError)
    logger.histogram("core/gate_timescales", values, step)
