"""Recurrent PPO built from torchrl's own pieces around a memcores core.

A collector steps the policy (encoder -> :class:`~agents.torchrl_module.CoreModule` -> actor
head) one step at a time; :func:`~agents.torchrl_module.add_state_values` and torchrl's
``GAE`` give advantages; ``ClipPPOLoss`` trains on ``[chunks, seq_len]`` slices of the batch
in recurrent mode, each slice starting from the state the collector stored at its first step.
The network and the hyperparameters are those of memcores' own PPO
(:class:`~agents.policy.RecurrentActorCritic` and ``agents.rl_config``'s defaults), so the
two trainers can be compared on one env at the same frames.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch.distributions import Categorical
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import ProbabilisticActor, set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.torchrl_module import CoreModule, add_state_values
from memcores.envs.popgym_env import make_popgym


@dataclass
class TorchRLPPOConfig:
    """Settings of :func:`train_torchrl_ppo` (memcores' PPO defaults for POPGym)."""

    env_id: str = "popgym/RepeatPreviousEasy-v0"
    core: str = "gru"
    hidden_size: int = 64
    """The core's output size."""
    total_frames: int = 50_176
    n_envs: int = 8
    n_steps: int = 128
    """Steps per env per batch: a batch is ``n_envs * n_steps`` frames."""
    seq_len: int = 32
    """Truncated-BPTT length of a training slice."""
    n_epochs: int = 4
    minibatch_size: int = 256
    """Frames per minibatch (``minibatch_size // seq_len`` slices)."""
    learning_rate: float = 1e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    seed: int = 0


def _make_env(config: TorchRLPPOConfig, core: CoreModule) -> TransformedEnv:
    def one_env() -> GymWrapper:
        return GymWrapper(make_popgym(config.env_id), categorical_action_encoding=True)

    env = TransformedEnv(
        SerialEnv(config.n_envs, one_env),
        Compose(InitTracker(), RewardSum(), core.make_tensordict_primer()),
    )
    env.set_seed(config.seed)
    return env


def build_actor_critic(
    config: TorchRLPPOConfig, obs_size: int, n_actions: int
) -> tuple[ProbabilisticActor, TensorDictSequential, CoreModule]:
    """memcores' actor-critic (shared encoder and core) as torchrl modules.

    :return: the actor (``"vector"`` -> ``"action"``), the critic (``"vector"`` ->
        ``"state_value"``) and the core module they share.
    """
    net = RecurrentActorCritic(
        n_actions, config.core, config.hidden_size, image_shape=(obs_size,), mission="none"
    )
    encoder = TensorDictModule(net.vector, in_keys=["vector"], out_keys=["embed"])
    core = CoreModule(net.core, in_key="embed", out_key="memory")
    heads = TensorDictModule(net.actor, in_keys=["memory"], out_keys=["logits"])
    actor = ProbabilisticActor(
        TensorDictSequential(encoder, core, heads),
        in_keys=["logits"],
        distribution_class=Categorical,
        return_log_prob=True,
    )
    value = TensorDictModule(net.critic, in_keys=["memory"], out_keys=["state_value"])
    return actor, TensorDictSequential(encoder, core, value), core


def make_gae(config: TorchRLPPOConfig) -> GAE:
    """torchrl's ``GAE`` over the values :func:`~agents.torchrl_module.add_state_values` wrote.

    No value network: given one, ``GAE`` calls it again over root and ``"next"`` and
    overwrites the exact values, and on ``"next"`` it copies the root's ``is_init``, so a
    core resets there and ``V(s_{t+1})`` after each episode's first step loses that step.
    ``("next", "terminated")`` stops bootstrapping, as ``starts`` does in memcores' GAE.
    """
    return GAE(gamma=config.gamma, lmbda=config.gae_lambda, value_network=None)


def train_torchrl_ppo(config: TorchRLPPOConfig, log: Any = print) -> dict[str, Any]:
    """Train and return ``{"frames", "wall_seconds", "fps", "final_mmer", "curve"}``.

    MMER is the mean return of the last 100 finished episodes (SB3's ``ep_rew_mean``, what
    memcores logs as ``rollout/ep_rew_mean``); ``curve`` has one row per batch.
    """
    torch.manual_seed(config.seed)
    torch.set_num_threads(1)  # as memcores' train.threads=1: no oversubscribed cores
    probe = make_popgym(config.env_id)
    obs_size = probe.observation_space["vector"].shape[0]
    actor, critic, core = build_actor_critic(config, obs_size, int(probe.action_space.n))
    env = _make_env(config, core)
    batch_frames = config.n_envs * config.n_steps
    n_batches = max(1, config.total_frames // batch_frames)
    collector = Collector(
        env, actor, frames_per_batch=batch_frames, total_frames=n_batches * batch_frames
    )
    advantage = make_gae(config)
    loss_fn = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=config.clip_range,
        entropy_coeff=config.ent_coef,
        critic_coeff=config.vf_coef / 2,  # memcores: vf_coef * 0.5 * MSE; torchrl: coeff * MSE
        loss_critic_type="l2",
        normalize_advantage=True,
    )
    params = list({id(p): p for p in [*actor.parameters(), *critic.parameters()]}.values())
    optimizer = torch.optim.Adam(params, lr=config.learning_rate, eps=1e-5)
    returns: deque[float] = deque(maxlen=100)
    curve, frames, start = [], 0, time.perf_counter()
    chunks_per_minibatch = max(1, config.minibatch_size // config.seq_len)
    for batch_index, data in enumerate(collector):
        data = data.reshape(config.n_envs, config.n_steps)  # [B, T]: one env per row
        frames += data.numel()
        finished = data.get(("next", "done")).squeeze(-1)
        returns.extend(data.get(("next", "episode_reward"))[finished].squeeze(-1).tolist())
        for group in optimizer.param_groups:  # linear annealing, as memcores' anneal_lr
            group["lr"] = config.learning_rate * (1.0 - batch_index / n_batches)
        add_state_values(critic, data)
        advantage(data)
        # [B, T] -> [B * T / seq_len, seq_len] slices, each from its stored first state
        slices = data.reshape(config.n_envs, -1, config.seq_len).flatten(0, 1)
        for _ in range(config.n_epochs):
            order = torch.randperm(slices.shape[0])
            for first in range(0, slices.shape[0], chunks_per_minibatch):
                minibatch = slices[order[first : first + chunks_per_minibatch]].clone()
                with set_recurrent_mode(True):
                    losses = loss_fn(minibatch)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
        collector.update_policy_weights_()
        mmer = float(np.mean(returns)) if returns else float("nan")
        elapsed = time.perf_counter() - start
        curve.append({"step": frames, "mmer": mmer, "fps": frames / elapsed})
        log(f"torchrl frames={frames} mmer={mmer:.3f} fps={frames / elapsed:.0f}")
    collector.shutdown()
    wall = time.perf_counter() - start
    return {
        "frames": frames,
        "wall_seconds": round(wall, 1),
        "fps": frames / wall,
        "final_mmer": curve[-1]["mmer"],
        "curve": curve,
    }
