"""sb3-contrib RecurrentPPO trains with memcores cores through agents.sb3_policy.CorePolicy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_helpers import sb3_recurrent_ppo

import memcores.envs  # noqa: F401  (registers MiniGrid ids)
from memcores.agents.sb3_policy import CoreAsLSTM
from memcores.cores import make_core


@pytest.mark.parametrize(
    "core",
    [
        "fast_lstm",  # (h, c) state: maps onto RecurrentPPO's lstm_states one-to-one
        "gru",  # any other state: packed into (h, c)
        "gtrxl",  # a [B, memory_len, H] memory and a count per layer, packed the same way
        pytest.param("ur_lstm", marks=pytest.mark.slow),
        pytest.param("lru", marks=pytest.mark.slow),
    ],
)
def test_recurrent_ppo_trains_with_core(core):
    model = sb3_recurrent_ppo(core, n_steps=32)
    vec = model.get_env()
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
