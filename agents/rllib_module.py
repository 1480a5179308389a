"""Any memcores core as an RLlib ``RLModule`` (new API stack; ``pip install memcores[rllib]``).

::

    from memcores.agents.rllib_module import core_ppo_config

    config = core_ppo_config("ur_lstm", "popgym/RepeatPreviousEasy-v0", num_env_runners=2)
    algo = config.build_algo()
    for _ in range(50):
        result = algo.train()

:class:`CoreRLModule` is a stateful ``TorchRLModule`` with a value function: memcores'
actor-critic (:class:`~agents.policy.RecurrentActorCritic`: vector encoder, the core, actor and
critic heads). How RLlib drives it:

- ``get_initial_state()`` is the core's own initial state, one ``"s<i>"`` entry per state
  tensor (the flat tuple of a core becomes RLlib's flat dict). RLlib starts every episode
  from it and never crosses an episode boundary inside a sequence, so the module passes no
  ``starts``: resets happen because each sequence starts at an episode start or from the
  ``STATE_OUT`` RLlib stored one step earlier in the same episode.
- Training batches are ``[B, T]`` sequences zero-padded at the end to ``max_seq_len``; padded
  steps run through the core after the real ones, so they never touch real outputs, and the
  loss masks them. Acting batches are ``[B, 1]``.
- ``compute_values`` runs the core itself when no embeddings are given (RLlib's GAE connector
  calls it on whole padded sequences with their ``STATE_IN``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.tune.registry import register_env
from torch import Tensor

from memcores.agents.policy import RecurrentActorCritic

ENV_NAME = "memcores_popgym"
"""The RLlib env name :func:`core_ppo_config` registers (``env_config["id"]`` picks the id)."""


class CoreRLModule(TorchRLModule, ValueFunctionAPI):
    """memcores' recurrent actor-critic as an RLlib ``TorchRLModule``.

    ``model_config`` keys: ``core`` (a name in :data:`cores.CORES`, default ``"gru"``),
    ``hidden_size`` (default 64), ``core_options`` (dict, default none) and RLlib's own
    ``max_seq_len`` (the training sequence length, default 32).
    Observations are flat ``Box`` vectors; actions ``Discrete``.
    """

    def setup(self) -> None:
        config = self.model_config or {}
        self.net = RecurrentActorCritic(
            int(self.action_space.n),
            config.get("core", "gru"),
            int(config.get("hidden_size", 64)),
            core_options=config.get("core_options"),
            mission="none",
            image_shape=(int(np.prod(self.observation_space.shape)),),
        )

    def get_initial_state(self) -> dict[str, np.ndarray]:
        """The core's initial state for one env: ``{"s0": [...], "s1": [...], ...}``."""
        state = self.net.core.initial_state(1, "cpu")
        return {f"s{i}": tensor[0].numpy() for i, tensor in enumerate(state)}

    def _memory(self, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
        """``batch[OBS] [B, T, n]`` and ``STATE_IN`` (each ``[B, ...]``) -> core output
        ``[B, T, H]`` and ``STATE_OUT`` after step ``T``."""
        obs = batch[Columns.OBS].float()
        state = self._state_in(batch, obs)
        x = self.net.vector(obs.flatten(0, 1)).view(obs.shape[0], obs.shape[1], -1)
        y, state = self.net.core(x.transpose(0, 1), state)  # y: [T, B, H]
        return y.transpose(0, 1), {f"s{i}": tensor for i, tensor in enumerate(state)}

    def _state_in(self, batch: dict[str, Any], obs: Tensor) -> tuple[Tensor, ...]:
        """The core's state from ``batch[STATE_IN]``, after checking ``obs`` is ``[B, T, n]``.

        :raises ValueError: observations of another rank or feature count than the module's
            space, or ``STATE_IN`` missing or not the core's state (one line each).
        """
        n = int(np.prod(self.observation_space.shape))
        if obs.ndim != 3 or obs.shape[-1] != n:
            raise ValueError(
                f"CoreRLModule: observations must be [B, T, {n}] sequences (T = 1 when acting: "
                f"obs[:, None]), got {list(obs.shape)}"
            )
        template = self.net.core.initial_state(1, "cpu")
        state_in = batch.get(Columns.STATE_IN)
        keys = [f"s{i}" for i in range(len(template))]
        if not isinstance(state_in, dict) or sorted(state_in) != sorted(keys):
            got = sorted(state_in) if isinstance(state_in, dict) else type(state_in).__name__
            raise ValueError(
                f"CoreRLModule: batch[STATE_IN] must hold the core's state {keys} (each row "
                f"from get_initial_state() or an earlier STATE_OUT), got {got}"
            )
        for key, tensor in zip(keys, template, strict=True):
            have = state_in[key]
            if tuple(have.shape) != (obs.shape[0], *tensor.shape[1:]):
                raise ValueError(
                    f"CoreRLModule: STATE_IN[{key!r}] must be {[obs.shape[0], *tensor.shape[1:]]} "
                    f"for {obs.shape[0]} sequences, got {list(have.shape)}"
                )
        return tuple(state_in[key] for key in keys)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        memory, state_out = self._memory(batch)
        return {
            Columns.ACTION_DIST_INPUTS: self.net.actor(memory),
            Columns.STATE_OUT: state_out,
            Columns.EMBEDDINGS: memory,
        }

    def compute_values(self, batch: dict[str, Any], embeddings: Tensor | None = None) -> Tensor:
        """``[B, T]`` values; runs the core over ``batch`` when ``embeddings`` is None."""
        if embeddings is None:
            embeddings, _ = self._memory(batch)
        return self.net.critic(embeddings).squeeze(-1)


def make_vector_env(env_config: dict[str, Any]) -> gym.Env:
    """A ``popgym/*`` env (:mod:`envs.popgym_env`) with its ``"vector"`` entry as a plain
    ``Box`` observation, which RLlib's default connectors pass through unchanged."""
    from memcores.envs.popgym_env import make_popgym

    env = make_popgym(env_config.get("id", "popgym/RepeatPreviousEasy-v0"))
    space = env.observation_space["vector"]
    return gym.wrappers.TransformObservation(env, lambda obs: obs["vector"], space)


def core_ppo_config(
    core: str = "gru",
    env_id: str = "popgym/RepeatPreviousEasy-v0",
    hidden_size: int = 64,
    core_options: dict[str, Any] | None = None,
    num_env_runners: int = 2,
    num_envs_per_env_runner: int = 4,
    seed: int = 0,
) -> PPOConfig:
    """RLlib PPO running :class:`CoreRLModule`, with memcores' PPO settings for POPGym.

    A batch is 1024 frames (8 envs x 128 steps over all runners), trained for 4 epochs in
    minibatches of 256 frames, sequences of 32 steps; Adam at 1e-3, gamma 0.99, lambda 0.95,
    clip 0.2, entropy 0.01, value coefficient 0.5, gradient norm 0.5, no KL penalty.
    Change anything further on the returned config.
    """
    if num_env_runners < 0:
        raise ValueError(
            f"num_env_runners must be >= 0 (0: sample in the driver), got {num_env_runners}"
        )
    runners = max(1, num_env_runners)
    if not 1 <= runners * num_envs_per_env_runner <= 1024:
        raise ValueError(
            f"num_envs_per_env_runner must be in 1..{1024 // runners} with {runners} runner(s) "
            f"(a batch of 1024 frames split over every env), got {num_envs_per_env_runner}"
        )
    register_env(ENV_NAME, make_vector_env)
    return (
        PPOConfig()
        .environment(ENV_NAME, env_config={"id": env_id})
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=num_envs_per_env_runner,
            rollout_fragment_length=1024 // (runners * num_envs_per_env_runner),
        )
        .training(
            train_batch_size_per_learner=1024,
            minibatch_size=256,
            num_epochs=4,
            lr=1e-3,
            gamma=0.99,
            lambda_=0.95,
            clip_param=0.2,
            entropy_coeff=0.01,
            vf_loss_coeff=0.25,  # memcores: 0.5 * 0.5 * MSE; RLlib: coeff * MSE
            vf_clip_param=float("inf"),
            use_kl_loss=False,
            grad_clip=0.5,
            grad_clip_by="global_norm",
        )
        .rl_module(
            rl_module_spec=RLModuleSpec(
                module_class=CoreRLModule,
                model_config={
                    "core": core,
                    "hidden_size": hidden_size,
                    "core_options": dict(core_options or {}),
                    "max_seq_len": 32,
                },
            )
        )
        .debugging(seed=seed)
    )


def state_batch(module: CoreRLModule, batch_size: int) -> dict[str, Tensor]:
    """``get_initial_state()`` repeated for ``batch_size`` rows, as ``STATE_IN`` tensors."""
    return {
        key: torch.as_tensor(value).unsqueeze(0).repeat(batch_size, *([1] * value.ndim))
        for key, value in module.get_initial_state().items()
    }


def train_rllib_ppo(config: PPOConfig, total_frames: int, log: Any = print) -> dict[str, Any]:
    """Build ``config`` on the running Ray (``ray.init`` first) and train for
    ``total_frames`` env steps.

    :return: ``{"frames", "wall_seconds", "setup_seconds", "fps", "final_mmer", "curve",
        "placement"}``; MMER is RLlib's ``episode_return_mean`` (the last 100 episodes),
        ``placement`` says which Ray node ran the learner and each env runner.
    """
    import time

    import ray

    torch.set_num_threads(1)  # the learner runs in this process, as memcores' threads=1
    start = time.perf_counter()
    algo = config.build_algo()
    setup = time.perf_counter() - start
    placement = {
        "learner": {"node_id": ray.get_runtime_context().get_node_id()},
        "env_runners": _runner_nodes(algo),
    }
    curve, frames, start = [], 0, time.perf_counter()
    while frames < total_frames:
        result = algo.train()
        frames = int(result["num_env_steps_sampled_lifetime"])
        mmer = float(result["env_runners"].get("episode_return_mean", float("nan")))
        elapsed = time.perf_counter() - start
        curve.append({"step": frames, "mmer": mmer, "fps": frames / elapsed})
        log(f"rllib frames={frames} mmer={mmer:.3f} fps={frames / elapsed:.0f}")
    wall = time.perf_counter() - start
    algo.stop()
    return {
        "frames": frames,
        "wall_seconds": round(wall, 1),
        "setup_seconds": round(setup, 1),
        "fps": frames / wall,
        "final_mmer": curve[-1]["mmer"],
        "curve": curve,
        "placement": placement,
    }


def _runner_nodes(algo: Any) -> list[dict[str, Any]]:
    """Node id, address and pid of each remote env runner."""

    def where(runner: Any) -> dict[str, Any]:
        import os
        import socket

        import ray

        return {
            "worker_index": runner.worker_index,
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }

    return algo.env_runner_group.foreach_env_runner(where, local_env_runner=False)
