"""Recurrent PQN (``agent.algo=pqn``): Q(lambda) by hand, the rollout's returns equal to it,
the epsilon schedule, epsilon-greedy acting, the update's loss replayed by hand, refusals, and
(slow) learning POPGym RepeatPreviousEasy with gru."""

from __future__ import annotations

import csv

import pytest
import torch

from memcores.agents.pqn import q_lambda_returns, td_loss
from memcores.agents.q_network import EpsilonGreedy, RecurrentQNetwork, linear_epsilon
from memcores.agents.rl_config import RLConfig
from memcores.agents.rl_trainer import train
from memcores.agents.rollout import RolloutBuffer
from memcores.experiments.cli import main
from memcores.experiments.config import load_config

POPGYM_TINY = [
    "env.id=popgym/RepeatPreviousEasy-v0",
    "env.vector=batched",
    "env.n_envs=4",
    "core.hidden_size=8",
    "agent.n_steps=16",
    "agent.seq_len=8",
    "agent.minibatch_size=32",
    "agent.n_epochs=1",
    "agent.mission=none",
    "agent.learning_starts=0",
    "agent.replay_batch=4",
    "agent.burn_in=2",
    "agent.n_step=2",
    "train.total_steps=128",
    "train.device=cpu",
    "train.progress=false",
    "train.log_every=1",
    "train.histogram_every=0",
]
"""4 batched POPGym envs x 16 steps per update, 2 updates; what the value-based tests train."""


PQN_CONFIG = "experiments/configs/popgym_pqn.yaml"


def popgym_config(*overrides: str) -> RLConfig:
    return load_config(RLConfig, None, [*POPGYM_TINY, *overrides])


def test_q_lambda_by_hand():
    """3 steps of one env, an episode ending after step 1; gamma 0.5, lambda 0.5."""
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    starts = torch.tensor([[False], [False], [True]])  # obs 2 begins a new episode
    max_q = torch.tensor([[10.0], [20.0], [30.0]])
    last_q, last_start = torch.tensor([40.0]), torch.tensor([False])
    g = q_lambda_returns(rewards, starts, max_q, last_q, last_start, gamma=0.5, lam=0.5)
    g2 = 3 + 0.5 * 40  # the last step bootstraps from the value after the rollout: 23
    g1 = 2.0  # step 1 ended its episode: nothing after it
    g0 = 1 + 0.5 * (0.5 * g1 + 0.5 * 20)  # 1 + 0.5 * (1 + 10) = 6.5
    assert g[:, 0].tolist() == [g0, g1, g2] == [6.5, 2.0, 23.0]


def test_the_rollout_returns_are_q_lambda():
    """The rollout's GAE with the values set to max_a Q (what the acting network gives) is
    Q(lambda): the returns PQN learns from are computed by the buffer as PPO's are."""
    gen = torch.Generator().manual_seed(0)
    S, N = 12, 3
    buffer = RolloutBuffer({"vector": ((2,), torch.float32)}, S, N, 4, (torch.zeros(N, 5),), "cpu")
    buffer.rewards = torch.randn(S, N, generator=gen)
    buffer.values = torch.randn(S, N, generator=gen)
    buffer.starts = torch.rand(S, N, generator=gen) < 0.2
    last_q, last_start = torch.randn(N, generator=gen), torch.tensor([False, True, False])
    buffer.compute_returns(last_q, last_start, gamma=0.9, gae_lambda=0.65)
    expected = q_lambda_returns(
        buffer.rewards, buffer.starts, buffer.values, last_q, last_start, 0.9, 0.65
    )
    torch.testing.assert_close(buffer.returns, expected)
    # agent.reward_scale multiplies the rewards, not the bootstrapped values
    buffer.compute_returns(last_q, last_start, 0.9, 0.65, reward_scale=3.0)
    scaled = q_lambda_returns(
        3 * buffer.rewards, buffer.starts, buffer.values, last_q, last_start, 0.9, 0.65
    )
    torch.testing.assert_close(buffer.returns, scaled)


def test_epsilon_schedule_is_linear_then_flat():
    assert linear_epsilon(0, 1000, 1.0, 0.05, 0.25) == 1.0
    assert linear_epsilon(125, 1000, 1.0, 0.05, 0.25) == pytest.approx(0.525)
    assert linear_epsilon(250, 1000, 1.0, 0.05, 0.25) == pytest.approx(0.05)
    assert linear_epsilon(900, 1000, 1.0, 0.05, 0.25) == pytest.approx(0.05)
    assert linear_epsilon(10, 1000, 1.0, 0.05, 0.0) == 0.05
    # a decay over one frame: frame 0 still at the start
    assert linear_epsilon(0, 4, 1.0, 0.0, 0.25) == 1.0
    assert linear_epsilon(1, 4, 1.0, 0.0, 0.25) == 0.0


def test_a_run_logs_the_epsilon_each_rollout_was_collected_with(tmp_path):
    """4 updates of 64 frames, decay over the first half (128 frames): rollouts start at
    frames 0, 64, 128, 192."""
    config = popgym_config("agent.algo=pqn", "train.total_steps=256", "agent.epsilon_fraction=0.5")
    train(config, tmp_path)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    eps = [float(r["train/epsilon"]) for r in rows]
    assert eps == pytest.approx([1.0, 0.525, 0.05, 0.05])
    assert all(float(r["train/td_error"]) > 0 for r in rows)


def test_a_run_logs_the_reconstruction_apart_from_the_td_loss(tmp_path):
    """With ``recon_coef`` 0.1 each logged row holds the reconstruction loss (before its
    coefficient) and the TD loss as ``train/value_loss``; ``train/loss`` is their weighted sum."""
    config = popgym_config("agent.algo=pqn", "agent.recon_coef=0.1", "agent.recon_lags=[0,1]")
    train(config, tmp_path)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        recon, value, loss = (float(r[f"train/{k}"]) for k in ("recon_loss", "value_loss", "loss"))
        assert recon > 0 and value > 0
        assert loss == pytest.approx(value + 0.1 * recon, rel=1e-6)


def test_a_trained_q_network_is_evaluated_greedily(tmp_path):
    """Its values are no distribution: evaluation takes their argmax with or without
    ``--argmax`` (the same episodes either way)."""
    from memcores.agents.evaluation import evaluate_run

    train(popgym_config("agent.algo=pqn"), tmp_path)
    sampled = evaluate_run(tmp_path, episodes=4, argmax=False, seed=3)
    greedy = evaluate_run(tmp_path, episodes=4, argmax=True, seed=3)
    assert sampled.returns == greedy.returns


def test_epsilon_greedy_acts_greedily_at_zero_and_per_group():
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none").eval()
    obs = {"vector": torch.randn(1, 6, 4)}
    state, starts = net.initial_state(6), torch.ones(6, dtype=torch.bool)
    greedy = net(obs, state, starts.unsqueeze(0)).logits[0].argmax(-1)
    eps = torch.zeros(6)
    out = EpsilonGreedy(net, eps)(obs, state, starts)
    assert torch.equal(out.actions, greedy)
    torch.testing.assert_close(out.values, net(obs, state, starts.unsqueeze(0)).values[0])
    # two groups of 3 rows: the first greedy, the second always random; over many draws the
    # second group's actions differ from the greedy ones about 2/3 of the time
    eps[3:] = 1.0
    act = EpsilonGreedy(net, eps, [slice(0, 3), slice(3, 6)])
    differs = 0
    for _ in range(200):
        first = act({"vector": obs["vector"][:, :3]}, tuple(s[:3] for s in state), starts[:3])
        second = act({"vector": obs["vector"][:, 3:]}, tuple(s[3:] for s in state), starts[3:])
        assert torch.equal(first.actions, greedy[:3])
        differs += int((second.actions != greedy[3:]).sum())
    assert 0.55 < differs / 600 < 0.78


def test_epsilon_greedy_reads_the_groups_epsilons_in_turn():
    """Three groups of 2 rows, epsilons 0, 1, 0: called group by group, the first and third
    act greedily every time and the second explores (each call reads the next group)."""
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none").eval()
    obs = {"vector": torch.randn(1, 6, 4)}
    state, starts = net.initial_state(6), torch.ones(6, dtype=torch.bool)
    greedy = net(obs, state, starts.unsqueeze(0)).logits[0].argmax(-1)
    eps = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    groups = [slice(0, 2), slice(2, 4), slice(4, 6)]
    act = EpsilonGreedy(net, eps, groups)
    explored = 0
    for _ in range(60):
        for g, rows in enumerate(groups):
            part = act(
                {"vector": obs["vector"][:, rows]}, tuple(s[rows] for s in state), starts[rows]
            )
            if g == 1:
                explored += int((part.actions != greedy[rows]).sum())
            else:
                assert torch.equal(part.actions, greedy[rows])
    assert explored > 0


def test_epsilon_greedy_explores_every_action_and_returns_the_networks_step():
    """At epsilon 1 the actions are uniform over all A = 3 actions (5 rows, so a draw over
    the rows would show 3 and 4); values, state and zero log-probs are the network's step
    from a carried state with one row starting an episode."""
    torch.manual_seed(2)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none").eval()
    obs = {"vector": torch.randn(1, 5, 4)}
    state = tuple(s + 0.5 for s in net.initial_state(5))
    starts = torch.tensor([False, True, False, False, False])
    expected = net(obs, state, starts.unsqueeze(0))
    act = EpsilonGreedy(net, torch.ones(5))
    seen = torch.zeros(3)
    for _ in range(100):
        out = act(obs, state, starts)
        seen += torch.bincount(out.actions, minlength=3)[:3]
        assert out.actions.min() >= 0 and out.actions.max() < 3
    assert (seen > 100).all() and seen.sum() == 500  # 500 draws, about 167 each
    assert torch.equal(out.logprobs, torch.zeros(5))
    torch.testing.assert_close(out.values, expected.values[0])
    for got, want in zip(out.state, expected.state, strict=True):
        torch.testing.assert_close(got, want)


def test_the_td_loss_adds_the_reconstruction_only_with_its_coefficient():
    """A network with a decoder: no coefficient, the TD loss alone; ``recon_coef`` 0.5, the
    TD loss plus half the decoder's loss on the replayed features, observations and starts."""
    from memcores.agents.rollout import ChunkBatch

    torch.manual_seed(3)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none", recon_lags=(0, 1))
    assert net.decoder is not None
    L, M = 4, 2
    obs = {"vector": torch.randn(L, M, 4)}
    starts = torch.zeros(L, M, dtype=torch.bool)
    starts[2, 0] = True
    actions = torch.randint(0, 3, (L, M))
    returns = torch.randn(L, M)
    state = tuple(s + 0.2 for s in net.initial_state(M))
    zeros = torch.zeros(L, M)
    mb = ChunkBatch(obs, starts, actions, zeros, zeros, zeros, returns, state)
    out = net(obs, state, starts)
    q = out.logits.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    td_part = 0.5 * (q - returns).pow(2).mean()
    recon = net.decoder.loss(out.features, obs, starts)
    assert recon.item() > 0
    torch.testing.assert_close(td_loss(net, mb)[0], td_part)
    torch.testing.assert_close(td_loss(net, mb, 0.5)[0], td_part + 0.5 * recon)
    # logged before its coefficient, and 0 without a decoder
    torch.testing.assert_close(td_loss(net, mb, 0.5)[3], recon.detach())
    plain = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none")
    assert td_loss(plain, mb)[3].item() == 0.0


def test_the_td_loss_is_half_the_mean_squared_error_of_the_taken_actions():
    """Replayed chunk by chunk by hand: ``0.5 mean (Q(s_t, a_t) - G_t)^2``."""
    from memcores.agents.rollout import ChunkBatch

    torch.manual_seed(1)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none")
    L, M = 5, 2
    obs = {"vector": torch.randn(L, M, 4)}
    starts = torch.zeros(L, M, dtype=torch.bool)
    starts[2, 1] = True
    actions = torch.randint(0, 3, (L, M))
    returns = torch.randn(L, M)
    state = net.initial_state(M)
    state = tuple(s + 0.3 for s in state)
    zeros = torch.zeros(L, M)
    mb = ChunkBatch(obs, starts, actions, zeros, zeros, zeros, returns, state)
    loss, _q, td, _recon = td_loss(net, mb)
    by_hand = []
    for m in range(M):
        h = tuple(s[m : m + 1] for s in state)
        for t in range(L):
            rows = (slice(t, t + 1), slice(m, m + 1))
            out = net({"vector": obs["vector"][rows]}, h, starts[rows])
            h = out.state
            by_hand.append(out.logits[0, 0, actions[t, m]] - returns[t, m])
    errors = torch.stack(by_hand)
    torch.testing.assert_close(loss, 0.5 * errors.pow(2).mean())
    torch.testing.assert_close(td, errors.abs().mean())


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.separate_critic=true", "agent.separate_critic=true does not apply"),
        ("agent.epsilon_end=1.5", "agent.epsilon_end must be in [0, 1]"),
        ("agent.minibatch_size=12", "must be a multiple of agent.seq_len"),
    ],
)
def test_bad_pqn_options_are_refused_in_one_line(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    code = main(["train", PQN_CONFIG, *POPGYM_TINY, override, f"run.dir={run}"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not run.exists()


@pytest.mark.slow
def test_pqn_learns_repeat_previous_easy_with_gru(tmp_path):
    """experiments/configs/popgym_pqn.yaml, seed 0, 150,528 frames: above 0 MMER (guessing
    is -0.5)."""
    config = load_config(RLConfig, PQN_CONFIG, [])
    result = train(config, tmp_path)
    assert result.global_step == 150_528
    assert result.ep_rew_mean > 0.0
