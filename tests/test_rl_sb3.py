"""sb3-contrib RecurrentPPO trains with memcores cores through agents.sb3_policy.CorePolicy."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from minigrid.wrappers import ImgObsWrapper
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.vec_env import DummyVecEnv

import envs  # noqa: F401  (registers MiniGrid ids)
from agents.sb3_policy import CoreAsLSTM, CorePolicy
from cores import make_core


def _env() -> gym.Env:
    env = gym.make("MiniGrid-Empty-5x5-v0", max_steps=20)
    return gym.wrappers.FlattenObservation(ImgObsWrapper(env))


@pytest.mark.parametrize(
    "core",
    [
        "fast_lstm",  # (h, c) state: maps onto RecurrentPPO's lstm_states one-to-one
        "gru",  # any other state: packed into (h, c)
        pytest.param("ur_lstm", marks=pytest.mark.slow),
        pytest.param("lru", marks=pytest.mark.slow),
    ],
)
def test_recurrent_ppo_trains_with_core(core):
    vec = DummyVecEnv([_env, _env])
    model = RecurrentPPO(
        CorePolicy,
        vec,
        n_steps=32,
        batch_size=32,
        n_epochs=1,
        policy_kwargs=dict(
            core=core, lstm_hidden_size=16, shared_lstm=True, enable_critic_lstm=False
        ),
        seed=0,
    )
    adapter = model.policy.lstm_actor
    assert isinstance(adapter, CoreAsLSTM)
    before = [p.detach().clone() for p in adapter.parameters()]
    # the optimiser must hold the core's parameters, not the discarded nn.LSTM's
    optimised = {id(p) for g in model.policy.optimizer.param_groups for p in g["params"]}
    assert {id(p) for p in adapter.parameters()} <= optimised
    model.learn(128)
    assert any(not torch.equal(a, b) for a, b in zip(before, adapter.parameters(), strict=True))
    actions, state = model.predict(vec.reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,) and state[0].shape == (1, 2, adapter.hidden_size)
    vec.close()


def test_state_packing_round_trip():
    for name in ["lstm", "gru", "rel_lstm", "lru"]:
        adapter = CoreAsLSTM(make_core(name, 5, 8))
        state = tuple(
            torch.randn_like(s) if s.dtype.is_floating_point else s
            for s in adapter.core.initial_state(3)
        )
        h, c = adapter.pack(state)
        assert h.shape == c.shape == (1, 3, adapter.hidden_size)
        for a, b in zip(adapter.unpack(h, c), state, strict=True):
            torch.testing.assert_close(a, b)
    assert CoreAsLSTM(make_core("fast_lstm", 5, 8)).is_lstm_state
