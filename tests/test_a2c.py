"""A2C pinned against references: the update against a transcription of Stable-Baselines3's
``A2C.train()`` (loss, RMSprop step, gradient clipping), the returns against SB3's
``RolloutBuffer`` and a hand-computed example, and A2C's defaults in the config."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from gymnasium import spaces
from rl_helpers import tiny_config
from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

from memcores.agents.episodes import EpisodeStats
from memcores.agents.policy import log_prob_entropy
from memcores.agents.ppo import make_optimizer, update
from memcores.agents.rl_config import ALGO_DEFAULTS, RLConfig, algo_switch_overrides
from memcores.agents.rl_trainer import setup
from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError, load_config


def _a2c_rollout(*overrides: str):
    """Two rollouts of the tiny A2C config (the second starts mid-episode), returns computed."""
    config = tiny_config("agent.algo=a2c", "agent.gae_lambda=1.0", *overrides)
    s = setup(config)
    agent, N = config.agent, config.env.n_envs
    buffer = RolloutBuffer(
        obs_shapes(s.envs.single_observation_space),
        agent.n_steps,
        N,
        agent.seq_len,
        s.policy.initial_state(N, s.device),
        s.device,
    )
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    for _ in range(2):
        carry = collect_rollout(s.policy, s.envs, buffer, carry, EpisodeStats(N))
    s.envs.close()
    # MiniGrid pays a reward only at the goal: add dense noise so every term has a gradient.
    buffer.rewards += torch.randn(buffer.rewards.shape, generator=torch.Generator().manual_seed(1))
    buffer.compute_returns(torch.randn(N), carry.starts, agent.gamma, agent.gae_lambda)
    assert buffer.starts[1:].any()  # episode boundaries inside the rollout
    return s, buffer


def _sb3_a2c_step(policy, optimizer, buffer: RolloutBuffer, agent) -> None:
    """SB3's ``A2C.train()`` written out for a recurrent policy: the rollout is replayed one env
    and one chunk at a time from the stored chunk-start state (truncated BPTT), flattened as
    SB3 flattens its buffer, and one clipped RMSprop step is taken on the whole batch."""
    S, N, L = buffer.n_steps, buffer.n_envs, buffer.seq_len
    logp, ent, val = [], [], []
    for e in range(N):
        for k in range(S // L):
            steps = slice(k * L, (k + 1) * L)
            state = tuple(c[k, e : e + 1] for c in buffer.chunk_states)  # [1, ...]
            obs = {key: v[steps, e : e + 1] for key, v in buffer.obs.items()}
            out = policy(obs, state, buffer.starts[steps, e : e + 1])
            lp, en = log_prob_entropy(out.logits, buffer.actions[steps, e : e + 1])
            logp.append(lp.flatten())
            ent.append(en.flatten())
            val.append(out.values.flatten())
    advantages = buffer.advantages.T.flatten()  # env-major [N*S], as the replay above
    returns = buffer.returns.T.flatten()
    log_prob, entropy, values = torch.cat(logp), torch.cat(ent), torch.cat(val)
    if agent.normalize_advantage:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(advantages * log_prob).mean()
    value_loss = F.mse_loss(returns, values)
    entropy_loss = -torch.mean(entropy)
    loss = policy_loss + agent.ent_coef * entropy_loss + agent.vf_coef * value_loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), agent.max_grad_norm)
    optimizer.step()


@pytest.mark.parametrize(
    ("core", "seq_len", "max_grad_norm", "normalize"),
    [
        ("lstm", 32, 0.5, "false"),
        ("lstm", 8, 0.5, "true"),
        ("gru", 8, 100.0, "false"),
        ("ur_lstm", 4, 0.5, "true"),
    ],
)
def test_a2c_update_matches_sb3(core, seq_len, max_grad_norm, normalize):
    """Same weights, same rollout: two A2C updates give SB3's parameters to float tolerance
    (one chunk per env and truncated BPTT; clipping active and inactive; RMSprop's running
    average carried into the second step)."""
    s, buffer = _a2c_rollout(
        f"core.name={core}",
        f"agent.seq_len={seq_len}",
        f"agent.max_grad_norm={max_grad_norm}",
        f"agent.normalize_advantage={normalize}",
    )
    agent = s.config.agent
    reference = copy.deepcopy(s.policy)
    ref_opt = torch.optim.RMSprop(  # what SB3's A2C builds with use_rms_prop=True
        reference.parameters(), lr=agent.learning_rate, alpha=0.99, eps=1e-5, weight_decay=0
    )
    before = [p.detach().clone() for p in s.policy.parameters()]
    for _ in range(2):
        stats = update(s.policy, s.optimizer, buffer, agent)
        reference.train()
        _sb3_a2c_step(reference, ref_opt, buffer, agent)
    assert stats.n_minibatches == 1  # one gradient step per update
    moved = sum(
        float((p.detach() - b).abs().max())
        for p, b in zip(s.policy.parameters(), before, strict=True)
    )
    assert moved > 1e-3
    for (name, p), q in zip(s.policy.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=2e-6, rtol=1e-5, msg=name)


def test_a2c_update_differs_from_wrong_reference():
    """The comparison above can fail: the old ``0.5 * MSE`` value loss gives other weights."""
    s, buffer = _a2c_rollout()
    agent = s.config.agent
    reference = copy.deepcopy(s.policy)
    ref_opt = torch.optim.RMSprop(reference.parameters(), lr=agent.learning_rate, eps=1e-5)
    update(s.policy, s.optimizer, buffer, agent)
    halved = copy.copy(agent)
    halved.vf_coef = agent.vf_coef / 2
    _sb3_a2c_step(reference, ref_opt, buffer, halved)
    pairs = zip(s.policy.parameters(), reference.parameters(), strict=True)
    diffs = [float((p.detach() - q.detach()).abs().max()) for p, q in pairs]
    assert max(diffs) > 1e-4


def test_a2c_optimizer_is_sb3_rmsprop():
    config = tiny_config("agent.algo=a2c")
    s = setup(config)
    s.envs.close()
    opt = make_optimizer(s.policy, config.agent)
    assert isinstance(opt, torch.optim.RMSprop)
    group = opt.param_groups[0]
    assert (group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        0.99,
        1e-5,
        0,
        False,
    )


# ---------------------------------------------------------------------------- returns
def _buffer(n_steps: int, n_envs: int) -> RolloutBuffer:
    shapes = {"image": ((1,), torch.uint8)}
    return RolloutBuffer(shapes, n_steps, n_envs, n_steps, (torch.zeros(n_envs, 1),), "cpu")


def test_nstep_returns_by_hand():
    """gae_lambda = 1: discounted rewards up to the episode end, or to the rollout end plus
    gamma^k times the bootstrapped value of the next observation."""
    buf = _buffer(4, 2)
    # env 0: an episode ends after step 2; the rollout ends mid-episode -> bootstrap 2.0
    # env 1: an episode ends after step 1 and another after the last step -> no bootstrap
    buf.rewards[:] = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0], [0.5, 4.0]])
    buf.starts[:] = torch.tensor([[True, True], [False, False], [False, True], [True, False]])
    buf.values[:] = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6], [0.7, 0.8]])
    buf.compute_returns(torch.tensor([2.0, 10.0]), torch.tensor([False, True]), 0.5, 1.0)
    expected = torch.tensor([[0.25, 2.0], [0.5, 2.0], [1.0, 2.0], [1.5, 4.0]])
    torch.testing.assert_close(buf.returns, expected)
    torch.testing.assert_close(buf.advantages, expected - buf.values)


@pytest.mark.parametrize("gae_lambda", [1.0, 0.95])
def test_returns_match_sb3_buffer(gae_lambda):
    """Same rewards, values, episode starts and last value as SB3's buffer, same returns and
    advantages (SB3's ``episode_starts[t]`` is our ``starts[t]``, its ``dones`` our
    ``next_start``)."""
    S, N = 16, 3
    g = torch.Generator().manual_seed(0)
    buf = _buffer(S, N)
    buf.rewards[:] = torch.randn(S, N, generator=g)
    buf.values[:] = torch.randn(S, N, generator=g)
    buf.starts[:] = torch.rand(S, N, generator=g) < 0.2
    last_value, next_start = torch.randn(N, generator=g), torch.tensor([True, False, False])
    buf.compute_returns(last_value, next_start, 0.9, gae_lambda)

    ref = SB3RolloutBuffer(
        S, spaces.Box(0, 1, (1,)), spaces.Discrete(2), "cpu", gae_lambda, 0.9, n_envs=N
    )
    ref.rewards[:] = buf.rewards.numpy()
    ref.values[:] = buf.values.numpy()
    ref.episode_starts[:] = buf.starts.numpy()
    ref.compute_returns_and_advantage(last_value, next_start.numpy())
    np.testing.assert_allclose(buf.advantages.numpy(), ref.advantages, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buf.returns.numpy(), ref.returns, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- defaults
def test_a2c_ignores_ppo_minibatch_keys():
    """A2C takes one step on the whole rollout: a PPO minibatch size that does not divide
    ``seq_len`` is no error for it (it still is for PPO)."""
    cfg = load_config(RLConfig, None, ["agent.algo=a2c", "agent.n_steps=5", "agent.seq_len=5"])
    assert cfg.agent.seq_len == 5
    with pytest.raises(ConfigError, match="minibatch_size"):
        load_config(RLConfig, None, ["agent.n_steps=5", "agent.seq_len=5"])


def test_algo_switch_fills_in_defaults():
    """Swapping the algorithm by one key takes that algorithm's defaults for the keys the
    command line does not set; keys it sets win."""
    extra = algo_switch_overrides("ppo", ["agent.algo=a2c", "agent.learning_rate=0.002"])
    keys = [item.split("=")[0] for item in extra]
    assert "agent.learning_rate" not in keys
    assert set(keys) == set(ALGO_DEFAULTS["a2c"]) - {"agent.learning_rate"}
    assert algo_switch_overrides("ppo", ["core.name=gru"]) == []
    assert algo_switch_overrides("a2c", ["agent.algo=a2c"]) == []
    cfg = load_config(
        RLConfig,
        "experiments/configs/doorkey5.yaml",
        [*extra, "agent.algo=a2c", "agent.learning_rate=0.002"],
    )
    assert cfg.agent.algo == "a2c" and cfg.agent.learning_rate == 0.002
    for key, value in ALGO_DEFAULTS["a2c"].items():
        if key != "agent.learning_rate":
            section, name = key.split(".")
            assert getattr(getattr(cfg, section), name) == value, key


def test_advantage_normalisation_follows_the_algorithm():
    """Unset, ``normalize_advantage`` is on for PPO and off for A2C; set, it is kept."""
    assert load_config(RLConfig, None, []).agent.normalize_advantage is True
    assert load_config(RLConfig, None, ["agent.algo=a2c"]).agent.normalize_advantage is False
    cfg = load_config(RLConfig, None, ["agent.algo=a2c", "agent.normalize_advantage=true"])
    assert cfg.agent.normalize_advantage is True


def test_train_cli_switches_to_a2c_defaults(tmp_path, capsys):
    """``memcores train doorkey5.yaml agent.algo=a2c``: a working A2C run with A2C's values
    for the keys not given, and a note naming them; keys given on the command line win."""
    run = tmp_path / "run"
    args = ["experiments/configs/doorkey5.yaml", "agent.algo=a2c", "env.n_envs=2"]
    args += ["train.total_steps=32", "train.progress=false", f"run.dir={run}"]
    assert main(["train", *args]) == 0
    assert "agent.n_steps=8" in capsys.readouterr().err
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["agent"]["algo"] == "a2c" and saved["env"]["n_envs"] == 2
    for key, value in ALGO_DEFAULTS["a2c"].items():
        if key != "env.n_envs":
            section, name = key.split(".")
            assert saved[section][name] == value, key
