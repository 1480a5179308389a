"""agents.torchrl_module: every core inside torchrl (the ``torchrl`` extra)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchrl", reason="torchrl is not installed (pip install memcores[torchrl])")

from tensordict import TensorDict  # noqa: E402
from torchrl.modules import set_recurrent_mode  # noqa: E402

from memcores.agents.torchrl_module import CoreModule, add_state_values  # noqa: E402
from memcores.cores import CORES, make_core  # noqa: E402

B, T, D, H = 3, 7, 5, 8
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def one_thread():
    """One torch thread, as the trainers use: small batches on a shared CPU run many times
    slower with a thread per core contending."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _episode_starts(generator: torch.Generator) -> torch.Tensor:
    """``[B, T]`` bool with several episode boundaries inside each row."""
    starts = torch.rand(B, T, generator=generator) < 0.3
    starts[:, 0] = True
    starts[0, 3] = True
    return starts


@pytest.mark.parametrize("name", sorted(CORES))
def test_core_module_equals_core_in_both_modes(name):
    generator = torch.Generator().manual_seed(0)
    core = make_core(name, D, H).eval()
    module = CoreModule(core, in_key="x", out_key="y")
    x = torch.randn(B, T, D, generator=generator)
    starts = _episode_starts(generator)
    with torch.no_grad():
        # the core perturbed away from its initial state, then reset by starts[:, 0]
        warm_x = torch.randn(4, B, D, generator=generator)
        _, dirty = core(warm_x, core.initial_state(B))
        y_ref, final_ref = core(x.transpose(0, 1), dirty, starts.transpose(0, 1))

        # recurrent mode: one [B, T] call from the stored first state
        stored = {
            key: torch.zeros(B, T, *s.shape[1:], dtype=s.dtype)
            for key, s in zip(module.state_keys, dirty, strict=True)
        }
        for key, s in zip(module.state_keys, dirty, strict=True):
            stored[key][:, 0] = s
        data = TensorDict({"x": x, "is_init": starts.unsqueeze(-1), **stored}, [B, T])
        with set_recurrent_mode(True):
            out = module(data)
        torch.testing.assert_close(out["y"], y_ref.transpose(0, 1))
        for key, s in zip(module.state_keys, final_ref, strict=True):
            torch.testing.assert_close(out["next", key][:, -1], s)

        # single-step mode, the state carried from "next" as a collector does; the primer's
        # zeros at a reset are replaced by the core's own initial state
        state = {key: torch.zeros_like(stored[key][:, 0]) for key in module.state_keys}
        outputs = []
        for t in range(T):
            step = TensorDict({"x": x[:, t], "is_init": starts[:, t, None], **state}, [B])
            step = module(step)
            outputs.append(step["y"])
            state = {key: step["next", key] for key in module.state_keys}
        torch.testing.assert_close(torch.stack(outputs, 1), y_ref.transpose(0, 1))
        for key, s in zip(module.state_keys, final_ref, strict=True):
            torch.testing.assert_close(state[key], s)


def test_primer_declares_every_state_tensor():
    core = make_core("rel_lstm", D, H)  # a state of several shapes and an integer part
    module = CoreModule(core, state_key="mem")
    primer = module.make_tensordict_primer()
    template = core.initial_state(1)
    assert module.state_keys == [f"mem_{i}" for i in range(len(template))]
    for key, tensor in zip(module.state_keys, template, strict=True):
        spec = primer.primers[key]
        assert tuple(spec.shape) == tuple(tensor.shape[1:]) and spec.dtype == tensor.dtype


def test_collector_values_are_exact_across_episode_boundaries():
    """add_state_values from stored states equals the critic run over each whole row."""
    from torchrl.collectors import Collector

    from memcores.agents.torchrl_ppo import TorchRLPPOConfig, _make_env, build_actor_critic

    torch.manual_seed(0)
    config = TorchRLPPOConfig(n_envs=2, n_steps=64)  # RepeatPreviousEasy: 52-step episodes
    actor, critic, core = build_actor_critic(config, 9, 4)
    env = _make_env(config, core)
    collector = Collector(env, actor, frames_per_batch=128, total_frames=128)
    data = next(iter(collector)).reshape(2, 64)
    collector.shutdown()
    assert data["next", "done"].sum() >= 2  # boundaries inside the rows
    add_state_values(critic, data)
    with torch.no_grad(), set_recurrent_mode(True):
        whole = critic(data.select(*critic.in_keys).clone())["state_value"]
    torch.testing.assert_close(data["state_value"], whole, atol=1e-5, rtol=1e-5)
    # V(s_{t+1}) as "next" value wherever step t did not end the episode
    done = data["next", "done"][:, :-1].squeeze(-1)
    following = data["next", "state_value"][:, :-1][~done]
    torch.testing.assert_close(following, whole[:, 1:][~done], atol=1e-5, rtol=1e-5)


def test_trainer_gae_keeps_exact_values_and_matches_memcores_recursion():
    """The trainer's GAE reads add_state_values' values (it recomputed V(s_{t+1}) from a reset
    state after each episode's first step when given the critic) and its advantages are
    memcores' GAE recursion, no bootstrap past a terminal step."""
    from torchrl.collectors import Collector

    from memcores.agents.torchrl_ppo import (
        TorchRLPPOConfig,
        _make_env,
        build_actor_critic,
        make_gae,
    )

    torch.manual_seed(1)
    config = TorchRLPPOConfig(n_envs=2, n_steps=64)
    actor, critic, core = build_actor_critic(config, 9, 4)
    env = _make_env(config, core)
    collector = Collector(env, actor, frames_per_batch=128, total_frames=128)
    data = next(iter(collector)).reshape(2, 64)
    collector.shutdown()
    assert data["is_init"][:, 1:].any()  # an episode starts inside a row
    add_state_values(critic, data)
    values = data["state_value"].clone().squeeze(-1)
    next_values = data["next", "state_value"].clone().squeeze(-1)
    make_gae(config)(data)
    torch.testing.assert_close(data["next", "state_value"].squeeze(-1), next_values)
    rewards = data["next", "reward"].squeeze(-1)
    ended = data["next", "terminated"].squeeze(-1).float()
    expected, running = torch.zeros_like(values), torch.zeros(values.shape[0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + config.gamma * next_values[:, t] * (1 - ended[:, t]) - values[:, t]
        running = delta + config.gamma * config.gae_lambda * (1 - ended[:, t]) * running
        expected[:, t] = running
    torch.testing.assert_close(data["advantage"].squeeze(-1), expected, atol=1e-5, rtol=1e-5)


def test_missing_state_starts_from_initial_state():
    core = make_core("lstm", D, H).eval()
    module = CoreModule(core, in_key="x", out_key="y")
    x = torch.randn(B, D)
    with torch.no_grad():
        out = module(TensorDict({"x": x}, [B]))
        y_ref, _ = core(x.unsqueeze(0), core.initial_state(B))
    torch.testing.assert_close(out["y"], y_ref[0])


@pytest.mark.slow
def test_torchrl_ppo_learns_repeat_previous():
    """torchrl's collector + GAE + ClipPPOLoss with a gru core on RepeatPreviousEasy, seed 0,
    50,176 frames (results/engines holds the run); random play scores about -0.5."""
    from memcores.agents.torchrl_ppo import TorchRLPPOConfig, train_torchrl_ppo

    result = train_torchrl_ppo(TorchRLPPOConfig(core="gru", seed=0), log=lambda _: None)
    assert result["frames"] == 50_176
    assert result["final_mmer"] > -0.35


@pytest.mark.slow
def test_docs_example_runs():
    """The torchrl example of docs/engines.md, cut to one batch."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()
    code = re.search(r"```python\n(import torch\n.*?)```", text, re.S).group(1)
    assert "total_frames=10_240" in code
    scope: dict = {}
    exec(compile(code.replace("total_frames=10_240", "total_frames=1_024"), "docs", "exec"), scope)
    assert scope["data"].shape == (8, 128) and "advantage" in scope["data"].keys()
