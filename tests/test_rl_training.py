"""Every registered core trains with PPO and A2C and writes TensorBoard scalars."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import tiny_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from memcores.agents.rl_trainer import CHECKPOINT_NAME, train
from memcores.cores import CORES

SCALARS = [
    "rollout/ep_rew_mean",
    "rollout/ep_len_mean",
    "rollout/success_rate",
    "train/policy_loss",
    "train/value_loss",
    "train/entropy_loss",
    "train/approx_kl",
    "train/explained_variance",
    "train/learning_rate",
    "time/fps",
]


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
@pytest.mark.parametrize("core", sorted(CORES))
def test_every_core_trains_and_logs(tmp_path, core, algo):
    steps = "128" if algo == "ppo" else "64"  # a few hundred steps in total per core
    config = tiny_config(f"core.name={core}", f"agent.algo={algo}", f"train.total_steps={steps}")
    result = train(config, tmp_path / "run")
    updates = int(steps) // 64
    assert result.updates == updates and result.global_step == updates * 64

    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert set(SCALARS) <= tags, sorted(set(SCALARS) - tags)  # episodes last <= 20 steps
    lrs = [e.value for e in events.Scalars("train/learning_rate")]
    assert len(lrs) == updates and lrs == sorted(lrs, reverse=True)  # annealed
    assert all(math.isfinite(e.value) for e in events.Scalars("train/value_loss"))

    payload = torch.load(tmp_path / "run" / CHECKPOINT_NAME, weights_only=True)
    assert payload["step"] == result.global_step
    assert payload["config"]["core"]["name"] == core
    assert all(torch.isfinite(v).all() for v in payload["model"].values())
    header = (tmp_path / "run" / "progress.csv").read_text().splitlines()[0]
    assert "train/value_loss" in header and "time/fps" in header


def test_core_options_pass_through(tmp_path):
    config = tiny_config("core.name=hdetach_lstm", "core.p=0.5", "train.total_steps=64")
    assert config.core.options == {"p": 0.5}
    train(config, tmp_path / "run")
    payload = torch.load(tmp_path / "run" / CHECKPOINT_NAME, weights_only=True)
    assert payload["config"]["core"]["options"] == {"p": 0.5}


def test_gate_timescale_histogram_logged(tmp_path):
    train(tiny_config("core.name=lstm", "train.total_steps=64"), tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert "core/gate_timescales" in events.Tags()["histograms"]


@pytest.mark.parametrize(
    ("encoder", "mission"),
    [("flat", "none"), ("onehot", "mean"), ("cnn", "gru"), ("embed", "mean")],
)
def test_encoders_train(tmp_path, encoder, mission):
    config = tiny_config(
        f"agent.image_encoder={encoder}", f"agent.mission={mission}", "train.total_steps=64"
    )
    result = train(config, tmp_path / "run")
    assert result.updates == 1
    payload = torch.load(tmp_path / "run" / CHECKPOINT_NAME, weights_only=True)
    assert all(torch.isfinite(v).all() for v in payload["model"].values())
