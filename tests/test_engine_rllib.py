"""agents.rllib_module: memcores cores as RLlib RLModules (the ``rllib`` extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("ray.rllib", reason="RLlib is not installed (pip install memcores[rllib])")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from ray.rllib.core.columns import Columns  # noqa: E402

from memcores.agents.rllib_module import CoreRLModule, core_ppo_config, state_batch  # noqa: E402

OBS, MAX_SEQ_LEN = 7, 4
# the gated family, a GRU, scans (min_gru, lru, mlstm), a state with integer parts and a
# transformer's sliding memory
RLLIB_CORES = ["lstm", "ur_lstm", "gru", "min_gru", "lru", "mlstm", "rel_lstm", "gtrxl"]


def _module(core: str) -> CoreRLModule:
    return CoreRLModule(
        observation_space=gym.spaces.Box(-1, 1, (OBS,), np.float32),
        action_space=gym.spaces.Discrete(4),
        model_config={"core": core, "hidden_size": 8, "max_seq_len": MAX_SEQ_LEN},
    ).eval()


@pytest.mark.parametrize("core", RLLIB_CORES)
def test_padded_chunks_equal_the_core_over_whole_episodes(core):
    """Two episodes (9 and 2 steps) cut as RLlib cuts them: sequences of MAX_SEQ_LEN,
    zero-padded at the end, each from the state after the previous one (the first from
    get_initial_state); logits and values equal the core run over each whole episode."""
    torch.manual_seed(0)
    module = _module(core)
    lengths = [9, 2]
    episodes = [torch.randn(n, OBS) for n in lengths]
    with torch.no_grad():
        expected = []
        for episode in episodes:
            x = module.net.vector(episode).unsqueeze(1)  # [n, 1, features]
            y, _ = module.net.core(x, module.net.core.initial_state(1))
            expected.append((module.net.actor(y[:, 0]), module.net.critic(y[:, 0]).squeeze(-1)))
        for index, episode in enumerate(episodes):
            state = state_batch(module, 1)
            logits, values = [], []
            for first in range(0, len(episode), MAX_SEQ_LEN):
                chunk = episode[first : first + MAX_SEQ_LEN]
                real = chunk.shape[0]
                padded = torch.zeros(1, MAX_SEQ_LEN, OBS)
                padded[0, :real] = chunk
                batch = {Columns.OBS: padded, Columns.STATE_IN: state}
                out = module.forward_train(batch)
                logits.append(out[Columns.ACTION_DIST_INPUTS][0, :real])
                values.append(module.compute_values(batch)[0, :real])
                assert module.compute_values(batch, out[Columns.EMBEDDINGS]).shape == (1, 4)
                # RLlib stores STATE_OUT per acting step; a full chunk's final state is it
                if real == MAX_SEQ_LEN:
                    state = out[Columns.STATE_OUT]
            torch.testing.assert_close(torch.cat(logits), expected[index][0])
            torch.testing.assert_close(torch.cat(values), expected[index][1])


@pytest.mark.parametrize("core", RLLIB_CORES)
def test_initial_state_is_the_cores(core):
    module = _module(core)
    state = module.get_initial_state()
    template = module.net.core.initial_state(1)
    assert list(state) == [f"s{i}" for i in range(len(template))]
    for value, tensor in zip(state.values(), template, strict=True):
        assert value.shape == tuple(tensor.shape[1:])
        np.testing.assert_array_equal(value, tensor[0].numpy())


def test_acting_step_carries_state_like_the_core():
    """Acting batches are [B, 1]: stepping one at a time equals one call over the sequence."""
    torch.manual_seed(0)
    module = _module("ur_lstm")
    obs = torch.randn(3, 5, OBS)
    with torch.no_grad():
        whole = module.forward_inference(
            {Columns.OBS: obs, Columns.STATE_IN: state_batch(module, 3)}
        )
        state = state_batch(module, 3)
        for t in range(5):
            out = module.forward_exploration(
                {Columns.OBS: obs[:, t : t + 1], Columns.STATE_IN: state}
            )
            state = out[Columns.STATE_OUT]
            torch.testing.assert_close(
                out[Columns.ACTION_DIST_INPUTS][:, 0], whole[Columns.ACTION_DIST_INPUTS][:, t]
            )


def test_config_helper_matches_memcores_ppo():
    config = core_ppo_config("min_gru", num_env_runners=2, num_envs_per_env_runner=4)
    assert config.train_batch_size_per_learner == 1024
    assert config.get_rollout_fragment_length() * 2 * 4 == 1024
    assert config.minibatch_size == 256 and config.num_epochs == 4
    spec = config.rl_module_spec  # RLlib's connectors read max_seq_len from the module's
    assert spec.module_class is CoreRLModule
    assert spec.model_config["core"] == "min_gru" and spec.model_config["max_seq_len"] == 32


@pytest.mark.slow
def test_rllib_ppo_learns_repeat_previous():
    """RLlib PPO, two env runners, gru, seed 0, RepeatPreviousEasy for 50,176 frames
    (results/engines holds the run); random play scores about -0.5."""
    import ray

    from memcores.agents.rllib_module import train_rllib_ppo

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    try:
        result = train_rllib_ppo(core_ppo_config("gru", seed=0), 50_176, log=lambda _: None)
    finally:
        ray.shutdown()
    assert result["frames"] >= 50_176
    assert len(result["placement"]["env_runners"]) == 2
    assert result["final_mmer"] > -0.35
