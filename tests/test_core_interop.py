"""The paper cores plug in unchanged: registered by name, built from the documented configs,
and trained by sb3-contrib's RecurrentPPO through CorePolicy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_helpers import sb3_recurrent_ppo

import memcores.envs  # noqa: F401  (registers MiniGrid ids)
from memcores.cores import CORES

SB3_CORES = ["janet", "nru", "o_lstm", "om_lstm", "um_lstm", "or_lstm"]
PAPER_CORES = (*SB3_CORES, "rel_rnn", "power_lstm", "power_gru", "linear_rnn", "block_gru")


def test_new_cores_are_registered() -> None:
    assert set(PAPER_CORES) <= set(CORES)


@pytest.mark.parametrize("core", SB3_CORES)
def test_recurrent_ppo_trains_with_new_core(core: str) -> None:
    """sb3-contrib RecurrentPPO runs each new core unchanged through CorePolicy."""
    model = sb3_recurrent_ppo(core, max_steps=16)
    vec = model.get_env()
    adapter = model.policy.lstm_actor
    before = [p.detach().clone() for p in adapter.parameters()]
    model.learn(32)
    assert any(not torch.equal(a, b) for a, b in zip(before, adapter.parameters(), strict=True))
    actions, state = model.predict(vec.reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,) and state[0].shape == (1, 2, adapter.hidden_size)
    vec.close()


@pytest.mark.parametrize(
    "core, options",
    [("rel_rnn", {}), ("power_lstm", {}), ("block_gru", {"grad": "snap1", "layers": 1})],
)
def test_recurrent_ppo_runs_new_cores(core, options) -> None:
    model = sb3_recurrent_ppo(core, hidden_size=8, core_options=options)
    vec = model.get_env()
    before = [p.detach().clone() for p in model.policy.lstm_actor.parameters()]
    model.learn(32)
    after = list(model.policy.lstm_actor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    actions, _ = model.predict(vec.reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,)
    vec.close()


@pytest.mark.parametrize(
    "path, overrides, expected",
    [
        ("experiments/configs/snap1_pattern_copy.yaml", [], {"grad": "snap1", "state_size": 64}),
        (
            "experiments/configs/snap1_pattern_copy.yaml",
            ["core.name=block_gru", "core.hidden_size=91", "core.grad=bptt"],
            {"grad": "bptt", "hidden_size": 91},
        ),
        ("experiments/configs/rel_copy.yaml", ["core.name=rel_rnn"], {"screen": "exit"}),
        ("experiments/configs/adding.yaml", ["core.name=power_lstm"], {"power": 2.0}),
    ],
)
def test_documented_configs_build(path, overrides, expected) -> None:
    from memcores.agents.supervised import build_model, build_task
    from memcores.agents.supervised_config import SupervisedConfig
    from memcores.experiments.config import load_config

    config = load_config(SupervisedConfig, path, overrides)
    core = build_model(config, build_task(config)).core
    assert {k: getattr(core, k) for k in expected} == expected
