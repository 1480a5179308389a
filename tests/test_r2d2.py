"""R2D2 (``agent.algo=r2d2``) with known values: the n-step double-Q target across an episode
end and a truncation, the value rescaling and its inverse, the priority mix, the sampling
probabilities and importance weights, the replay's ring and stored states, burn-in without
gradient, Ape-X's epsilons, what resume does with the replay, refusals; every registered
core trained for two updates by each value-based learner; (slow) learning
RepeatPreviousEasy with gru."""

from __future__ import annotations

import math

import pytest
import torch
from rl_helpers import tiny_config
from test_pqn import POPGYM_TINY, popgym_config

from memcores.agents.q_network import RecurrentQNetwork, apex_epsilons
from memcores.agents.r2d2 import (
    RESUME_NOTE,
    double_q_bootstrap,
    nstep_targets,
    online_q,
    rescale,
    unrescale,
)
from memcores.agents.replay import (
    SequenceReplay,
    Sequences,
    importance_weights,
    sampling_probabilities,
    sequence_priority,
)
from memcores.agents.rl_config import RLConfig
from memcores.agents.rl_trainer import setup, train
from memcores.agents.rollout import RolloutBuffer
from memcores.cores import CORES
from memcores.envs import envpool_env
from memcores.experiments.cli import main
from memcores.experiments.config import load_config

R2D2_CONFIG = "experiments/configs/popgym_r2d2.yaml"


# ---------------------------------------------------------------------------- targets
def test_nstep_target_by_hand_across_an_episode_end():
    """One sequence of 6 steps, n = 3, gamma = 0.5, an episode ending after step 1."""
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unsqueeze(1)
    starts = torch.tensor([False, False, True, False, False, False]).unsqueeze(1)
    boot = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 8.0]).unsqueeze(1)
    y = nstep_targets(rewards, starts, boot, gamma=0.5, n=3, length=3)[:, 0]
    assert y[0] == 1 + 0.5 * 2  # the sum stops at the end, nothing bootstrapped
    assert y[1] == 2  # the last step of its episode
    assert y[2] == 3 + 0.5 * 4 + 0.25 * 5 + 0.125 * 8  # a full n-step return: 7.25


def test_nstep_target_by_hand_with_fewer_steps_than_the_sequence():
    """n = 2 over 3 learnt steps (W = 5), no episode end: ``r_t + g r_{t+1} + g^2 boot_{t+2}``."""
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]).unsqueeze(1)
    starts = torch.zeros(5, 1, dtype=torch.bool)
    boot = torch.tensor([10.0, 20.0, 30.0, 40.0, 50.0]).unsqueeze(1)
    y = nstep_targets(rewards, starts, boot, gamma=0.5, n=2, length=3)[:, 0]
    assert y.tolist() == [1 + 1 + 0.25 * 30, 2 + 1.5 + 0.25 * 40, 3 + 2 + 0.25 * 50]


def test_a_truncation_ends_the_target_as_the_rollout_records_it(tmp_path):
    """MiniGrid-Empty-5x5 truncated every 4 steps (max_steps=4), acting at random: the
    rollout marks step 4, 8, ... as starts, so the target of step 2 sums steps 2 and 3 only
    (the auto-reset drops the truncated episode's last observation, so there is nothing to
    bootstrap from, as in PPO's GAE)."""
    config = tiny_config("agent.algo=r2d2", "env.kwargs.max_steps=4", "agent.apex_epsilon=1.0")
    config.agent.apex_alpha = 0.0
    s = setup(config)
    from memcores.agents.learners import make_learner
    from memcores.agents.rollout import collect_with_returns, obs_shapes, start_rollouts

    learner = make_learner(s, 0)
    buffer = RolloutBuffer(
        obs_shapes(s.envs.single_observation_space), 32, 2, learner.chunk_len,
        s.policy.initial_state(2), s.device,
    )  # fmt: skip
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    step = learner.acting(s.policy, s.envs.groups)
    collect_with_returns(s.policy, s.envs, buffer, carry, config.agent, None, step)
    s.envs.close()
    ended = buffer.starts[1:, 0].nonzero().flatten() + 1
    assert ended[0] <= 4  # a time-out (or the goal) ends each episode within 4 steps
    t = int(ended[0]) - 2
    r = buffer.rewards[:, :1]
    boot = torch.full_like(r, 100.0)
    y = nstep_targets(r[t:], buffer.starts[t:, :1], boot[t:], gamma=0.5, n=3, length=1)
    assert float(y) == pytest.approx(float(r[t] + 0.5 * r[t + 1]))


def test_double_q_takes_the_target_value_of_the_online_argmax():
    q_online = torch.tensor([[1.0, 5.0, 2.0]])
    q_target = torch.tensor([[10.0, rescale(torch.tensor(2.0), 1e-3), -3.0]])
    boot = double_q_bootstrap(q_online, q_target, 1e-3)
    assert float(boot) == pytest.approx(2.0, abs=1e-5)  # not max_a Q_target (10)


def test_double_q_over_steps_and_sequences_by_hand():
    """``[W=2, B=3, A=4]`` values: each (step, sequence) takes its own online argmax."""
    gen = torch.Generator().manual_seed(4)
    q_online, q_target = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 3, 4, generator=gen)
    boot = double_q_bootstrap(q_online, q_target, 1e-3)
    assert boot.shape == (2, 3)
    for w in range(2):
        for b in range(3):
            a = int(q_online[w, b].argmax())
            expected = unrescale(q_target[w, b, a], 1e-3)
            torch.testing.assert_close(boot[w, b], expected)


def test_value_rescaling_by_hand_and_inverse():
    eps = 1e-3
    assert float(rescale(torch.tensor(3.0), eps)) == pytest.approx(1 + 3e-3)  # sqrt(4) - 1
    assert float(rescale(torch.tensor(-8.0), eps)) == pytest.approx(-(3 - 1) - 8e-3)
    x = torch.linspace(-1000, 1000, 2001, dtype=torch.float64)
    torch.testing.assert_close(rescale(unrescale(x, eps), eps), x)
    torch.testing.assert_close(unrescale(rescale(x, eps), eps), x)


# ---------------------------------------------------------------------------- priorities
def test_priority_mix_by_hand():
    td = torch.tensor([[1.0, -3.0], [-2.0, 0.5]])  # [L=2, B=2]
    p = sequence_priority(td, eta=0.9)
    assert p.tolist() == pytest.approx([0.9 * 2 + 0.1 * 1.5, 0.9 * 3 + 0.1 * 1.75])


def test_sampling_probabilities_and_importance_weights_by_hand():
    priorities = torch.tensor([1.0, 4.0, 9.0, 100.0])
    valid = torch.tensor([True, True, True, False])
    probs = sampling_probabilities(priorities, valid, alpha=0.5)
    assert probs.tolist() == pytest.approx([1 / 6, 2 / 6, 3 / 6, 0.0])
    w = importance_weights(probs[:3], n_valid=3, beta=1.0)
    # (3 P)^-1 = 2, 1, 2/3; divided by the largest
    assert w.tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    assert sampling_probabilities(priorities, valid, alpha=0.0)[:3].tolist() == pytest.approx(
        [1 / 3] * 3
    )


def test_apex_epsilons_by_hand():
    eps = apex_epsilons(3, 0.4, 7.0)
    assert eps.tolist() == pytest.approx([0.4, 0.4**4.5, 0.4**8])
    assert apex_epsilons(1).tolist() == pytest.approx([0.4])
    # the defaults (base 0.4, alpha 7), computed in float64 and rounded once to float32
    exact = torch.tensor([0.4 ** (1 + i / 7 * 7.0) for i in range(8)], dtype=torch.float64)
    assert torch.equal(apex_epsilons(8), exact.float())


# ---------------------------------------------------------------------------- the replay
def _rollout(n_steps: int, n_envs: int, stride: int, first: int) -> RolloutBuffer:
    """A rollout whose step ``t`` of env ``e`` reads ``first + t`` (obs, reward) and ``e``
    (action), whose chunk states are the step index."""
    state = (torch.zeros(n_envs, 2),)
    buffer = RolloutBuffer({"vector": ((1,), torch.float32)}, n_steps, n_envs, stride, state, "cpu")
    steps = torch.arange(first, first + n_steps, dtype=torch.float32)
    buffer.obs["vector"][:] = steps.view(-1, 1, 1)
    buffer.rewards[:] = steps.view(-1, 1)
    buffer.actions[:] = torch.arange(n_envs)
    buffer.chunk_states[0][:] = steps[::stride].view(-1, 1, 1)
    return buffer


def test_the_ring_keeps_complete_sequences_and_their_states():
    """Capacity 16 steps, rollouts of 8, stride 4, window 6: which slots hold a complete
    sequence after each rollout, and a sampled sequence read across the ring's end."""
    shapes = {"vector": ((1,), torch.float32)}
    replay = SequenceReplay(shapes, 16, 2, 4, 6, (torch.zeros(2, 2),), "cpu")
    replay.add(_rollout(8, 2, 4, 0))
    # slots start at 0, 4 (written), 8, 12 (never): only step 0 has 6 steps after it
    assert replay.valid()[:, 0].tolist() == [True, False, False, False]
    replay.add(_rollout(8, 2, 4, 8))
    replay.add(_rollout(8, 2, 4, 16))  # overwrites rows 0..7 with steps 16..23
    assert replay.slot_starts().tolist() == [16, 20, 8, 12]
    # 24 steps written: 16 + 6 fit, 20 + 6 do not yet; 8 and 12 still hold theirs
    assert replay.valid()[:, 0].tolist() == [True, False, True, True]
    replay.priorities.zero_()
    replay.priorities[3, 1] = 1.0  # only slot 3 (step 12) of env 1 can be drawn
    seq, index, weights = replay.sample(3, alpha=1.0, beta=0.5)
    assert index.tolist() == [7, 7, 7] and weights.tolist() == [1.0, 1.0, 1.0]
    assert seq.obs["vector"][:, 0, 0].tolist() == [12, 13, 14, 15, 16, 17]  # wraps around
    assert seq.rewards[:, 0].tolist() == [12, 13, 14, 15, 16, 17]
    assert seq.actions[:, 0].tolist() == [1] * 6
    assert seq.state[0][0].tolist() == [12.0, 12.0]  # the state stored at step 12
    replay.update_priorities(index[:1], torch.tensor([7.0]))
    assert replay.priorities[3, 1] == 7.0 and replay.max_priority == 7.0
    replay.add(_rollout(8, 2, 4, 24))
    assert replay.priorities[2:, :].eq(7.0).all()  # new sequences get the largest priority


def _replay(capacity: int, stride: int, window: int) -> SequenceReplay:
    shapes = {"vector": ((1,), torch.float32)}
    return SequenceReplay(shapes, capacity, 2, stride, window, (torch.zeros(2, 2),), "cpu")


def test_slot_starts_and_complete_sequences_by_hand():
    """Capacity 8, stride 1, window 4, rollouts of 4: after one rollout slots 0-3 hold steps
    0-3 and only step 0's sequence is complete (exactly 4 steps written); after three, the
    ring has wrapped: slots hold steps 8-11 then 4-7."""
    replay = _replay(8, 1, 4)
    assert replay.slot_starts().tolist() == [-1] * 8
    replay.add(_rollout(4, 2, 1, 0))
    assert replay.slot_starts().tolist() == [0, 1, 2, 3, -1, -1, -1, -1]
    assert replay.valid()[:, 1].tolist() == [True] + [False] * 7
    replay.add(_rollout(4, 2, 1, 4))
    replay.add(_rollout(4, 2, 1, 8))
    assert replay.slot_starts().tolist() == [8, 9, 10, 11, 4, 5, 6, 7]
    # 12 steps written: sequences starting at 4 .. 8 are complete
    assert replay.valid()[:, 0].tolist() == [True, False, False, False] + [True] * 4


def test_sampling_needs_one_complete_sequence_and_returns_its_starts():
    replay = _replay(8, 1, 4)
    with pytest.raises(ValueError, match="^the replay holds no complete sequence yet$"):
        replay.sample(2, alpha=1.0, beta=0.5)
    buffer = _rollout(4, 2, 1, 0)
    buffer.starts[2, 0] = True  # env 0's episode restarts at step 2
    replay.add(buffer)  # exactly one complete sequence per env
    seq, index, _ = replay.sample(16, alpha=1.0, beta=0.5)
    assert set(index.tolist()) <= {0, 1}
    rows = index == 0  # env 0's sequence (slot 0)
    assert rows.any()
    assert seq.starts[:, rows].t().tolist() == [[False, False, True, False]] * int(rows.sum())
    assert not seq.starts[:, ~rows].any()


def test_a_rollout_that_does_not_fit_the_replay_is_refused():
    replay = _replay(16, 4, 6)
    for bad in (_rollout(8, 2, 2, 0), _rollout(12, 2, 4, 0)):  # stride 2; 12 does not tile 16
        with pytest.raises(
            ValueError, match="^the rollout's chunks must be the replay's stride and tile it$"
        ):
            replay.add(bad)
    two_tensors = SequenceReplay(
        {"vector": ((1,), torch.float32)}, 16, 2, 4, 6, (torch.zeros(2, 2),) * 2, "cpu"
    )
    with pytest.raises(ValueError, match="zip"):  # a state of another arity
        two_tensors.add(_rollout(8, 2, 4, 0))


def test_new_priorities_are_stored_as_float32():
    replay = _replay(16, 4, 6)
    replay.add(_rollout(8, 2, 4, 0))
    replay.update_priorities(torch.tensor([0, 1]), torch.tensor([1.1, 0.5], dtype=torch.float64))
    assert replay.priorities.dtype == torch.float32
    assert replay.max_priority == float(torch.tensor(1.1, dtype=torch.float32))  # not 1.1


def test_the_stored_state_is_the_actors_state_at_the_sequence_start():
    """Two rollouts of a real run: the replay's state of each sequence equals the state the
    acting network was called with at that sequence's first step."""
    config = popgym_config("agent.algo=r2d2", "agent.n_steps=16", "agent.seq_len=8")
    s = setup(config)
    from memcores.agents.learners import make_learner
    from memcores.agents.rollout import collect_with_returns, obs_shapes, start_rollouts

    s.envs.to(s.device)
    learner = make_learner(s, 0)
    step = learner.acting(s.policy, [slice(None)])
    seen = []

    def recording(obs, state, starts):
        seen.append(tuple(x.clone() for x in state))
        return step(obs, state, starts)

    n = config.env.n_envs
    space = obs_shapes(s.envs.single_observation_space)
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    for _ in range(2):
        buffer = RolloutBuffer(space, 16, n, learner.chunk_len, s.policy.initial_state(n), s.device)
        carry = collect_with_returns(s.policy, s.envs, buffer, carry, config.agent, None, recording)
        learner._replay_for(buffer).add(buffer)
    replay = learner.replay
    assert replay.stride == 4 and len(seen) == 32
    starts = replay.slot_starts().tolist()
    assert starts[:8] == [0, 4, 8, 12, 16, 20, 24, 28] and set(starts[8:]) == {-1}
    for slot, g in enumerate(starts[:8]):
        for stored, acted in zip(replay.states, seen[g], strict=True):
            torch.testing.assert_close(stored[slot], acted)
    assert any(float(seen[g][0].abs().sum()) > 0 for g in range(1, 32))  # not all zeros


def test_burn_in_gets_no_gradient_and_ends_in_the_online_state():
    torch.manual_seed(0)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none")
    W, B, b = 7, 2, 3
    obs = {"vector": torch.randn(W, B, 4, requires_grad=True)}
    starts = torch.zeros(W, B, dtype=torch.bool)
    state = tuple(x + 0.5 for x in net.initial_state(B))
    seq = Sequences(obs, starts, torch.zeros(W, B, dtype=torch.long), torch.zeros(W, B), state)
    q = online_q(net, seq, b)
    # the same values as one call over the whole sequence from the stored state
    torch.testing.assert_close(q, net(obs, state, starts).logits[b:])
    q.sum().backward()
    grad = obs["vector"].grad
    assert grad[:b].abs().sum() == 0  # burn-in steps: no gradient
    assert (grad[b:].abs().sum(-1) > 0).all()  # every learnt step: a gradient
    with torch.no_grad():
        burnt = net({"vector": obs["vector"][:b]}, state, starts[:b]).state
        after = net({"vector": obs["vector"][b:]}, burnt, starts[b:]).logits
    torch.testing.assert_close(q.detach(), after)


@pytest.mark.parametrize("burn_in", [0, 1])
def test_burn_in_and_learnt_steps_reset_at_their_episode_starts(burn_in: int):
    """A start inside the burn-in (row 0, step 0) and one among the learnt steps (row 1,
    step 3): ``online_q`` equals the network run over the burn-in, then over the rest from
    the state it reached, each part with its starts."""
    torch.manual_seed(1)
    net = RecurrentQNetwork(3, "gru", 8, image_shape=(4,), mission="none")
    W, B = 6, 2
    obs = {"vector": torch.randn(W, B, 4)}
    starts = torch.zeros(W, B, dtype=torch.bool)
    starts[0, 0] = starts[3, 1] = True
    state = tuple(x + 0.5 for x in net.initial_state(B))
    seq = Sequences(obs, starts, torch.zeros(W, B, dtype=torch.long), torch.zeros(W, B), state)
    with torch.no_grad():
        q = online_q(net, seq, burn_in)
        burnt = state
        if burn_in:
            burnt = net({"vector": obs["vector"][:burn_in]}, state, starts[:burn_in]).state
        expected = net({"vector": obs["vector"][burn_in:]}, burnt, starts[burn_in:]).logits
        unreset = net({"vector": obs["vector"][burn_in:]}, burnt, starts[burn_in:] & False)
    assert q.shape == (W - burn_in, B, 3)
    torch.testing.assert_close(q, expected)
    assert not torch.allclose(q[3 - burn_in :, 1], unreset.logits[3 - burn_in :, 1])


# ---------------------------------------------------------------------------- the run
def test_resume_restores_the_replay_target_and_gradient_steps(tmp_path, capsys):
    """One update, then a resumed second: the final checkpoint's replay holds both rollouts
    (the first one's steps unchanged), the gradient steps continue, nothing is said."""
    from memcores.agents.checkpoint import load_checkpoint

    config = popgym_config("agent.algo=r2d2", "train.total_steps=64")
    train(config, tmp_path)
    first = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["learner"]
    assert first["replay"]["written"] == 16 and first["grad_steps"] == 1
    capsys.readouterr()
    config = popgym_config("agent.algo=r2d2", "train.total_steps=128")
    result = train(config, tmp_path, resume=True)
    assert "resumes without its replay" not in capsys.readouterr().err
    assert result.global_step == 128
    last = load_checkpoint(tmp_path / "checkpoints" / "last.pt")["learner"]
    assert last["replay"]["written"] == 32 and last["grad_steps"] == 2
    for key in ("starts", "actions", "rewards"):
        torch.testing.assert_close(last["replay"][key][:16], first["replay"][key][:16])
    torch.testing.assert_close(
        last["replay"]["obs"]["vector"][:16], first["replay"]["obs"]["vector"][:16]
    )


def test_resume_from_a_checkpoint_without_the_replay_says_so(tmp_path, capsys):
    from memcores.agents.checkpoint import load_checkpoint, save_checkpoint

    config = popgym_config("agent.algo=r2d2", "train.total_steps=64")
    train(config, tmp_path)
    path = tmp_path / "checkpoints" / "last.pt"
    payload = load_checkpoint(path)
    del payload["learner"]  # as a checkpoint written before replays were saved
    save_checkpoint(path, payload)
    capsys.readouterr()
    config = popgym_config("agent.algo=r2d2", "train.total_steps=128")
    result = train(config, tmp_path, resume=True)
    assert RESUME_NOTE.format("the checkpoint holds none", 0) in capsys.readouterr().err
    assert result.global_step == 128
    last = load_checkpoint(path)["learner"]
    assert last["replay"]["written"] == 16  # started empty: the second rollout only


def test_a_replay_round_trips_through_its_state_and_refuses_another_layout():
    replay = _replay(16, 4, 6)
    replay.add(_rollout(8, 2, 4, 0))
    replay.update_priorities(torch.tensor([1]), torch.tensor([3.0]))
    state = replay.state_dict()
    copy = _replay(16, 4, 6)
    copy.load_state_dict(state)
    assert copy.written == 8 and copy.max_priority == 3.0
    for name in ("starts", "actions", "rewards", "priorities"):
        assert torch.equal(getattr(copy, name), getattr(replay, name))
    assert torch.equal(copy.obs["vector"], replay.obs["vector"])
    assert torch.equal(copy.states[0], replay.states[0])
    message = (
        r"^the saved replay's \(capacity, n_envs, stride, window\) \(16, 2, 4, 6\) differs "
        r"from this run's \(32, 2, 4, 6\)$"
    )
    with pytest.raises(ValueError, match=message):
        _replay(32, 4, 6).load_state_dict(state)
    other = "^the saved replay holds other observations or core states$"
    images = SequenceReplay(
        {"image": ((1,), torch.uint8)}, 16, 2, 4, 6, (torch.zeros(2, 2),), "cpu"
    )
    two_states = SequenceReplay(
        {"vector": ((1,), torch.float32)}, 16, 2, 4, 6, (torch.zeros(2, 2),) * 2, "cpu"
    )
    for target in (images, two_states):
        with pytest.raises(ValueError, match=other):
            target.load_state_dict(state)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("agent.burn_in=8", "agent.burn_in (8) must be >= 0 and < agent.seq_len (8)"),
        ("agent.replay_size=100000000000000", "agent.replay_size=100,000,000,000,000 frames"),
        ("agent.replay_stride=3", "agent.replay_stride (3) must be >= 1 and divide"),
        ("agent.priority_alpha=2", "agent.priority_alpha must be in [0, 1]"),
        ("agent.recon_coef=0.1", "agent.recon_coef (0.1) applies to agent.algo ppo, a2c and pqn"),
    ],
)
def test_bad_r2d2_combinations_are_refused_in_one_line(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    code = main(["train", R2D2_CONFIG, *POPGYM_TINY, override, f"run.dir={run}"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    assert not run.exists()


def test_a_continuous_action_space_is_refused(monkeypatch):
    import gymnasium as gym

    from memcores.agents import rl_trainer

    make = rl_trainer.make_vector_env

    def continuous(*args, **kwargs):
        envs = make(*args, **kwargs)
        envs.single_action_space = gym.spaces.Box(-1, 1, (2,))
        return envs

    monkeypatch.setattr(rl_trainer, "make_vector_env", continuous)
    config = popgym_config("agent.algo=r2d2", "env.vector=sync")
    with pytest.raises(ValueError, match="must have a Discrete action space"):
        setup(config)


@pytest.mark.parametrize("algo", ["pqn", "r2d2"])
@pytest.mark.parametrize("core", sorted(CORES))
def test_every_core_trains_two_updates(tmp_path, core, algo):
    """Two updates of each value-based learner on 4 batched POPGym envs, hidden size 8."""
    config = popgym_config(f"agent.algo={algo}", f"core.name={core}")
    result = train(config, tmp_path)
    assert result.updates == 2 and result.skipped_updates == 0
    last = result.history[-1]
    assert math.isfinite(last["train/loss"]) and math.isfinite(last["train/q_values"])


@pytest.mark.slow
def test_r2d2_learns_repeat_previous_easy_with_gru(tmp_path):
    """experiments/configs/popgym_r2d2.yaml, seed 0, 150,528 frames: above 0 MMER."""
    config = load_config(RLConfig, R2D2_CONFIG, [])
    result = train(config, tmp_path)
    assert result.global_step == 150_528
    assert result.ep_rew_mean > 0.0


ENVPOOL = pytest.param(
    "envpool",
    marks=pytest.mark.skipif(
        not envpool_env.available(),
        reason="envpool not installed (pip install 'memcores[envpool]')",
    ),
)


@pytest.mark.parametrize("algo", ["pqn", "r2d2"])
@pytest.mark.parametrize("vector", ["sync", "async", ENVPOOL])
def test_gymnasium_envs_train_in_groups(tmp_path, algo, vector):
    """MiniGrid through the gymnasium vector envs (``async``: two groups of envs in a worker,
    acted on in turn, each with its own envs' epsilons) and through EnvPool (MemoryS7, one of
    the ids it steps)."""
    env_id = ["env.id=MiniGrid-MemoryS7-v0"] if vector == "envpool" else []
    config = tiny_config(
        f"agent.algo={algo}", f"env.vector={vector}", "agent.learning_starts=0",
        "agent.replay_batch=4", "agent.burn_in=2", "agent.n_step=2", "train.total_steps=128",
        *env_id,
    )  # fmt: skip
    result = train(config, tmp_path)
    assert result.updates == 2 and result.skipped_updates == 0
    assert math.isfinite(result.history[-1]["train/td_error"])
