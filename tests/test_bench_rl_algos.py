"""``memcores bench rl --algos``: its settings at other env counts, and its refusals."""

from __future__ import annotations

import pytest

from memcores.experiments.bench import rl_algos


def test_the_configs_own_envs_change_nothing() -> None:
    assert rl_algos.scaled_overrides(8, 128) == []


def test_more_envs_keep_four_minibatches_and_r2d2s_replay_ratio() -> None:
    assert rl_algos.scaled_overrides(1024, 128) == [
        "env.n_envs=1024",
        "agent.minibatch_size=32768",  # 1024 x 128 / 4
        "agent.replay_batch=4096",  # 32 sequences per step at 8 envs
        "agent.replay_size=524288",  # four rollouts
    ]
    assert rl_algos.scaled_overrides(16, 128)[-1] == "agent.replay_size=50000"  # the config's


@pytest.mark.parametrize("envs", ["0", "-3"])
def test_no_envs_is_refused_in_one_line(envs: str) -> None:
    with pytest.raises(ValueError, match="--envs must be at least 1"):
        rl_algos.main(["--envs", envs, "--no-record"])
