"""Evaluate a trained recurrent agent on any env id: mean return and success rate.

The policy runs in eval mode (deterministic cores), its state carried per env and reset at
episode starts exactly as in training. Episodes are split evenly over the envs in advance
(env ``i`` plays its share and then idles), so short episodes are not over-counted the way
"first N episodes to finish" would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memcores.agents.checkpoint import load_rl_checkpoint, policy_from_checkpoint
from memcores.agents.episodes import RunningEpisodes
from memcores.agents.policy import (
    RecurrentActorCritic,
    obs_to_tensors,
    observation_shape,
    sample_actions,
)
from memcores.agents.rl_trainer import make_vector_env


@dataclass
class EvalResult:
    """Per-episode returns/lengths/successes and their summaries."""

    env_id: str
    returns: list[float]
    lengths: list[int]
    successes: list[bool]

    @property
    def episodes(self) -> int:
        return len(self.returns)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    @property
    def std_return(self) -> float:
        return float(np.std(self.returns)) if self.returns else float("nan")

    @property
    def success_rate(self) -> float:
        return float(np.mean(self.successes)) if self.successes else float("nan")

    @property
    def mean_length(self) -> float:
        return float(np.mean(self.lengths)) if self.lengths else float("nan")

    def summary(self) -> str:
        return (
            f"{self.env_id}: {self.episodes} episodes, mean return {self.mean_return:.3f} "
            f"+- {self.std_return:.3f}, success rate {self.success_rate:.3f}, "
            f"mean length {self.mean_length:.1f}"
        )


def eval_envs(
    env_id: str,
    episodes: int,
    n_envs: int,
    seed: int,
    env_kwargs: dict[str, Any] | None,
    vector: str = "sync",
    device: torch.device | str = "cpu",
) -> Any:
    """The env an evaluation plays on: at most ``episodes`` envs, in process (``sync``),
    batched on ``device`` (``batched``, :mod:`envs.batched`) or by EnvPool (``envpool``, one
    thread).

    :raises ValueError: ``episodes < 1``, unknown env id or bad env options.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if vector not in ("sync", "batched", "envpool"):
        raise ValueError(
            f"evaluation steps envs with vector sync, batched or envpool, got {vector!r}"
        )
    n = max(1, min(n_envs, episodes))
    return make_vector_env(env_id, n, seed, vector, env_kwargs, device=device)


def play_episodes(
    policy: RecurrentActorCritic,
    envs: Any,
    episodes: int,
    argmax: bool = False,
    seed: int = 10_000,
    observe: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Play ``policy`` (in eval mode) on the vector env ``envs`` until ``episodes`` episodes
    have ended.

    Episodes are split evenly over the envs in advance (env ``i`` plays its share and then
    idles), so short episodes are not over-counted the way "first N to finish" would be. The
    policy's state is carried per env and reset at episode starts as in training. Sampled
    actions draw from torch's generator seeded with ``seed`` (the caller's generator state is
    restored afterwards), so one seed gives the same episodes every time. Observations,
    state and starts are made on the policy's device.

    :param observe: called with each observation batch before the policy acts on it.
    :return: an iterator over steps of ``(reward, done, counted, success)``, each ``[N]``:
        ``counted`` marks the envs whose ended episode is one of the ``episodes``.
    """
    device = policy.device
    n_envs = envs.num_envs
    quota = np.full(n_envs, episodes // n_envs)
    quota[: episodes % n_envs] += 1
    done_count = np.zeros(n_envs, dtype=np.int64)
    policy.eval()
    rng_devices = [] if device.type != "cuda" else [device.index or torch.cuda.current_device()]
    with torch.random.fork_rng(devices=rng_devices):
        torch.manual_seed(seed)
        obs = envs.reset(seed=seed)
        starts = torch.ones(n_envs, dtype=torch.bool, device=device)
        state = policy.initial_state(n_envs, device)
        while (done_count < quota).any():
            if observe is not None:
                observe(obs)
            out = policy(obs_to_tensors(obs, device), state, starts.unsqueeze(0))
            actions, _ = sample_actions(out.logits[0], argmax=argmax or policy.greedy)
            state = out.state
            obs, *outcome = envs.step(actions.cpu().numpy())
            reward, done, success = (np.asarray(torch.as_tensor(x).cpu()) for x in outcome)
            starts = torch.as_tensor(done, device=device)
            counted = done & (done_count < quota)
            done_count += done
            yield reward, done, counted, success


@torch.no_grad()
def evaluate_policy(
    policy: RecurrentActorCritic,
    env_id: str,
    episodes: int = 100,
    argmax: bool = False,
    seed: int = 10_000,
    n_envs: int = 8,
    env_kwargs: dict[str, Any] | None = None,
    vector: str = "sync",
) -> EvalResult:
    """Run ``episodes`` episodes of ``policy`` on ``env_id`` (:func:`play_episodes`), on the
    policy's device.

    :param argmax: take the most likely action instead of sampling.
    :param seed: env ``i`` is seeded ``seed + i`` (defaults away from training seeds).
    :param vector: ``sync`` (the gymnasium envs), ``batched`` (:mod:`envs.batched`, on the
        policy's device) or ``envpool`` (EnvPool's MiniGrid).
    :raises ValueError: unknown env id, or an env whose observations the policy cannot read.
    """
    envs = eval_envs(env_id, episodes, n_envs, seed, env_kwargs, vector, policy.device)
    try:
        check_observations(policy, envs, env_id)
        running = RunningEpisodes(envs.num_envs)
        result = EvalResult(env_id, [], [], [])
        for reward, done, counted, success in play_episodes(policy, envs, episodes, argmax, seed):
            finished = running.step(reward, done)
            for i, ret, length in zip(*finished, strict=True):
                if counted[i]:
                    result.returns.append(float(ret))
                    result.lengths.append(int(length))
                    result.successes.append(bool(success[i]))
        return result
    finally:
        envs.close()


def check_observations(policy: RecurrentActorCritic, envs: Any, env_id: str) -> None:
    """:raises ValueError: ``envs`` give observations of another shape than ``policy`` reads."""
    image_shape = observation_shape(envs.single_observation_space)
    if image_shape != policy.input_shape:
        raise ValueError(
            f"env {env_id!r} gives {image_shape} observations; this policy reads "
            f"{policy.input_shape}"
        )


def load_policy(
    run: str | Path, device: str | torch.device = "cpu"
) -> tuple[RecurrentActorCritic, Any]:
    """A run folder or checkpoint file -> (policy in eval mode, its config)."""
    payload = load_rl_checkpoint(run)
    return policy_from_checkpoint(payload, device)


def evaluate_run(
    run: str | Path,
    env_id: str | None = None,
    episodes: int = 100,
    argmax: bool = False,
    seed: int = 10_000,
    device: str | torch.device = "cpu",
    vector: str | None = None,
) -> EvalResult:
    """Load ``run``'s checkpoint onto ``device`` and evaluate it on ``env_id`` (default: its
    training env), stepped as ``vector`` says (:func:`evaluate_policy`; default: the run's
    ``env.vector`` where ``env_id`` has that version, else the gymnasium envs)."""
    from memcores.envs.batched_registry import batched_ids

    policy, config = load_policy(run, device)
    env_id = env_id or config.env.id
    kwargs = config.env.kwargs if env_id == config.env.id else {}
    if vector is None:
        trained = config.env.vector
        batched = trained == "batched" and env_id in batched_ids()
        vector = trained if trained == "envpool" or batched else "sync"
    return evaluate_policy(policy, env_id, episodes, argmax, seed, env_kwargs=kwargs, vector=vector)


@torch.no_grad()
def record_gif(
    run: str | Path,
    gif_path: str | Path,
    env_id: str | None = None,
    episodes: int = 3,
    argmax: bool = False,
    seed: int = 10_000,
    fps: float = 8.0,
    max_frames: int = 2_000,
    device: str | torch.device = "cpu",
) -> GifResult:
    """Play ``episodes`` episodes of a trained run (its policy on ``device``) and write them as
    one GIF (imageio).

    :return: the steps rendered, the frames in the written file and each episode's return.
    """
    from memcores.envs import make_env

    policy, config = load_policy(run, device)
    device = policy.device
    env_id = env_id or config.env.id
    kwargs = config.env.kwargs if env_id == config.env.id else {}
    if env_id.startswith("popgym/"):  # checked before an env is made or a frame is drawn
        raise ValueError(
            f"env {env_id!r} cannot be rendered: POPGym envs draw no pictures; visualize "
            "records MiniGrid, BabyAI and memcores/* envs (evaluate scores any env)"
        )
    env = make_env(env_id, seed=seed, render_mode="rgb_array", **kwargs)
    frames: list[np.ndarray] = []
    returns: list[float] = []
    try:
        for _ in range(episodes):
            obs, _ = env.reset()
            state = policy.initial_state(1)
            start = torch.ones(1, 1, dtype=torch.bool, device=device)
            total, done = 0.0, False
            frames.append(env.render())
            while not done and len(frames) < max_frames:
                batch = {
                    k: torch.as_tensor(np.asarray(v), device=device).view(1, 1, *np.shape(v))
                    for k, v in obs.items()
                }
                out = policy(batch, state, start)
                action, _ = sample_actions(out.logits[0], argmax=argmax or policy.greedy)
                state, start = out.state, torch.zeros(1, 1, dtype=torch.bool, device=device)
                obs, reward, terminated, truncated, _ = env.step(int(action[0]))
                total += float(reward)
                done = terminated or truncated
                frames.append(env.render())
            returns.append(total)
    finally:
        env.close()
    return GifResult(len(frames), write_gif(gif_path, frames, fps), returns)


@dataclass(frozen=True)
class GifResult:
    """What :func:`record_gif` did: ``steps`` frames rendered, ``frames`` in the file (the GIF
    encoder merges identical consecutive frames into one that is shown as long), and each
    episode's return."""

    steps: int
    frames: int
    returns: list[float]


def write_gif(path: str | Path, frames: list[np.ndarray], fps: float) -> int:
    """Write ``frames`` (each ``[H, W, 3]`` uint8) as a looping GIF shown at ``fps``, atomically.

    imageio's Pillow plugin takes the frame duration in milliseconds (GIF stores hundredths
    of a second). Pillow merges identical consecutive frames and adds up their durations, so
    the timing is kept while the file holds fewer frames.

    :return: the number of frames in the written file.
    """
    import imageio.v3 as iio

    from memcores.agents.files import atomic_write

    duration_ms = 1000.0 / fps

    def write(handle) -> None:
        iio.imwrite(
            handle,
            np.stack(frames),
            extension=".gif",
            plugin="pillow",
            duration=duration_ms,
            loop=0,
        )

    atomic_write(path, write)
    return int(iio.improps(path, plugin="pillow", index=None).shape[0])
