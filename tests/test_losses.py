"""PPO's and A2C's losses and the GAE returns against values worked out by hand.

Every expected number below is written out from the formula in the test itself (no second
implementation of the loss): a sign flipped, a ``max`` turned into a ``min``, an advantage
left uncentred or a value clip dropped changes at least one of them.
"""

from __future__ import annotations

import math

import pytest
import torch

from memcores.agents.ppo import (
    TOTALS,
    _kl_too_large,
    a2c_loss,
    explained_variance,
    minibatch_indices,
    ppo_loss,
)
from memcores.agents.rl_config import AgentConfig
from memcores.agents.rollout import ChunkBatch, RolloutBuffer, select_chunks

OLD_LOGPROB = -1.0
"""Every row's log-probability under the policy that collected it."""


def _batch(advantages, values=None, returns=None) -> ChunkBatch:
    """A one-step minibatch of ``M`` chunks, ``[1, M]`` each (only the loss's fields count)."""
    adv = torch.tensor([advantages], dtype=torch.float64)
    zeros = torch.zeros_like(adv)
    return ChunkBatch(
        obs={},
        starts=torch.zeros_like(adv, dtype=torch.bool),
        actions=torch.zeros_like(adv, dtype=torch.long),
        logprobs=torch.full_like(adv, OLD_LOGPROB),
        values=zeros if values is None else torch.tensor([values], dtype=torch.float64),
        advantages=adv,
        returns=zeros if returns is None else torch.tensor([returns], dtype=torch.float64),
        state=(),
    )


def _new_logprobs(ratios) -> torch.Tensor:
    """Log-probabilities ``[1, M]`` (a leaf) whose ratio to :data:`OLD_LOGPROB` is ``ratios``."""
    ratio = torch.tensor([ratios], dtype=torch.float64)
    return (OLD_LOGPROB + ratio.log()).requires_grad_()


def _agent(**options) -> AgentConfig:
    """PPO with only the terms a test names switched on."""
    base = {"normalize_advantage": False, "ent_coef": 0.0, "vf_coef": 0.0, "clip_range": 0.2}
    return AgentConfig(**{**base, **options})


def _num(x: torch.Tensor) -> float:
    return float(x.detach())


def _zeros(n: int) -> torch.Tensor:
    return torch.zeros(1, n, dtype=torch.float64)


# ---------------------------------------------------------------------------- PPO, policy
# (advantage, ratio) -> PPO's objective min(r A, clip(r, 0.8, 1.2) A), and whether the clip
# is the smaller term (its gradient is then zero)
SURROGATE_ROWS = [
    (1.0, 1.1, 1.1, False),  # inside the clip range: r A
    (1.0, 1.5, 1.2, True),  # A > 0, ratio above 1 + eps: capped at 1.2 A
    (1.0, 0.5, 0.5, False),  # A > 0, ratio below 1 - eps: r A is the smaller, kept
    (-1.0, 0.5, -0.8, True),  # A < 0, ratio below 1 - eps: capped at 0.8 A
    (-1.0, 1.5, -1.5, False),  # A < 0, ratio above 1 + eps: r A is the smaller, kept
    (-2.0, 0.9, -1.8, False),  # inside: r A
]


def test_ppo_clipped_surrogate_takes_the_pessimistic_term_of_each_row():
    adv, ratios, objective, clipped = zip(*SURROGATE_ROWS, strict=True)
    logp = _new_logprobs(ratios)
    n = len(ratios)
    terms = ppo_loss(logp, _zeros(n), _zeros(n), _batch(adv), _agent())
    expected = -sum(objective) / n  # the loss is minus the mean objective
    assert expected == pytest.approx(-(1.1 + 1.2 + 0.5 - 0.8 - 1.5 - 1.8) / 6)
    assert _num(terms.policy_loss) == pytest.approx(expected, abs=1e-12)
    assert _num(terms.loss) == pytest.approx(expected, abs=1e-12)

    # d loss / d log pi = -A r / n where r A is the kept term, 0 where the clip is
    terms.loss.backward()
    grad = [0.0 if c else -a * r / n for a, r, _, c in SURROGATE_ROWS]
    torch.testing.assert_close(logp.grad, torch.tensor([grad], dtype=torch.float64))
    assert (logp.grad[0, list(clipped)] == 0).all()


def test_ppo_clip_fraction_and_approx_kl():
    """clip_fraction counts rows with ``|r - 1| > clip_range``; approx_kl is the mean of
    ``(r - 1) - log r`` (Schulman's k3 estimator)."""
    adv, ratios, _, _ = zip(*SURROGATE_ROWS, strict=True)
    n = len(ratios)
    terms = ppo_loss(_new_logprobs(ratios), _zeros(n), _zeros(n), _batch(adv), _agent())
    assert _num(terms.clip_fraction) == pytest.approx(4 / 6)  # 1.5, 0.5, 0.5, 1.5
    kl = sum((r - 1) - math.log(r) for r in ratios) / n
    assert _num(terms.approx_kl) == pytest.approx(kl, abs=1e-12)
    assert _num(terms.approx_kl) > 0


def test_ppo_clip_range_is_read_from_the_config():
    """With clip_range 0.6, a ratio of 1.5 is inside the range: the loss is -r A."""
    logp = _new_logprobs([1.5])
    terms = ppo_loss(logp, _zeros(1), _zeros(1), _batch([1.0]), _agent(clip_range=0.6))
    assert _num(terms.policy_loss) == pytest.approx(-1.5)
    assert _num(terms.clip_fraction) == 0.0


def test_ppo_clip_fraction_does_not_count_a_ratio_on_the_edge():
    """``|r - 1| = clip_range`` exactly (0.5 and 1.5 with clip 0.5) is not clipped."""
    mb = _batch([1.0, 1.0])._replace(logprobs=_zeros(2))
    logp = torch.tensor([[0.5, 1.5]], dtype=torch.float64).log()
    assert logp.exp().tolist() == [[0.5, 1.5]]  # exact in float64
    terms = ppo_loss(logp, _zeros(2), _zeros(2), mb, _agent(clip_range=0.5))
    assert _num(terms.clip_fraction) == 0.0


def test_ppo_normalisation_divides_by_std_plus_a_small_epsilon():
    """Advantages 1 +- 1e-9 (std sqrt(2) 1e-9): the 1e-8 in the denominator keeps them small,
    (A - mean) / (std + 1e-8) = +-1e-9 / (sqrt(2) 1e-9 + 1e-8)."""
    adv = [1.0 + 1e-9, 1.0 - 1e-9]
    logp = _new_logprobs([1.0, 1.0])
    terms = ppo_loss(logp, _zeros(2), _zeros(2), _batch(adv), _agent(normalize_advantage=True))
    terms.loss.backward()
    spread = torch.tensor(adv, dtype=torch.float64)
    a = (spread - spread.mean()) / (spread.std() + 1e-8)
    assert abs(a[0].item()) < 0.1
    torch.testing.assert_close(logp.grad, -a.unsqueeze(0) / 2, rtol=1e-6, atol=0)


def test_ppo_normalises_advantages_to_zero_mean_unit_std():
    """Advantages 1, 2, 3, 6 (mean 3, unbiased std sqrt(14/3)) become (A - 3) / sqrt(14/3):
    with every ratio 1 the loss is minus their mean, exactly 0, and the gradient on row i is
    ``-(A_i - 3) / sqrt(14/3) / 4``."""
    adv = [1.0, 2.0, 3.0, 6.0]
    logp = _new_logprobs([1.0] * 4)
    terms = ppo_loss(logp, _zeros(4), _zeros(4), _batch(adv), _agent(normalize_advantage=True))
    assert _num(terms.policy_loss) == pytest.approx(0.0, abs=1e-12)
    terms.loss.backward()
    std = math.sqrt(14 / 3)
    expected = [-(a - 3.0) / (std + 1e-8) / 4 for a in adv]
    torch.testing.assert_close(logp.grad, torch.tensor([expected], dtype=torch.float64))


def test_ppo_normalisation_changes_the_loss_of_uncentred_advantages():
    """Ratios that differ per row: normalised and raw advantages give other losses, each the
    one computed by hand."""
    adv, ratios = [1.0, 3.0], [1.1, 0.9]
    n = 2
    raw = ppo_loss(_new_logprobs(ratios), _zeros(n), _zeros(n), _batch(adv), _agent())
    assert _num(raw.policy_loss) == pytest.approx(-(1.1 * 1 + 0.9 * 3) / 2)
    agent = _agent(normalize_advantage=True)
    norm = ppo_loss(_new_logprobs(ratios), _zeros(n), _zeros(n), _batch(adv), agent)
    a = 1 / math.sqrt(2)  # (1 - 2) / std and (3 - 2) / std with std = sqrt(2)
    assert _num(norm.policy_loss) == pytest.approx(-(1.1 * -a + 0.9 * a) / 2, abs=1e-7)


def test_ppo_leaves_a_single_advantage_unnormalised():
    """One row has no spread to divide by: its advantage is used as it is."""
    agent = _agent(normalize_advantage=True)
    terms = ppo_loss(_new_logprobs([1.1]), _zeros(1), _zeros(1), _batch([2.0]), agent)
    assert _num(terms.policy_loss) == pytest.approx(-2.2)


# ---------------------------------------------------------------------------- PPO, value
def test_ppo_value_loss_is_half_the_mse():
    new_values = torch.tensor([[0.5, -0.1, 0.5]], dtype=torch.float64, requires_grad=True)
    mb = _batch([0.0] * 3, values=[0.0] * 3, returns=[1.0, 0.0, -2.0])
    terms = ppo_loss(_new_logprobs([1.0] * 3), _zeros(3), new_values, mb, _agent(vf_coef=2.0))
    mse = (0.25 + 0.01 + 6.25) / 3
    assert _num(terms.value_loss) == pytest.approx(0.5 * mse)
    assert _num(terms.loss) == pytest.approx(2.0 * 0.5 * mse)


def test_ppo_value_clipping_keeps_the_larger_error_of_each_row():
    """``clip_range_vf = 0.2`` around the old values. Per row (old, new, return): the clipped
    value, both squared errors, and which one counts (its gradient is then ``v - R``, or 0
    where the clipped error counts)::

        (1.0, 1.5, 2.0)   clipped 1.2:  0.25 vs 0.64  -> clipped, grad 0
        (1.0, 0.9, 0.0)   inside:       0.81          -> 0.81, grad 0.9
        (-1.0, -1.6, 0.0) clipped -1.2: 2.56 vs 1.44  -> unclipped, grad -1.6
        (0.5, 0.5, 0.4)   unchanged:    0.01          -> 0.01, grad 0.1
        (0.0, -0.5, -1.0) clipped -0.2: 0.25 vs 0.64  -> clipped, grad 0
    """
    old = [1.0, 1.0, -1.0, 0.5, 0.0]
    new_values = torch.tensor(
        [[1.5, 0.9, -1.6, 0.5, -0.5]], dtype=torch.float64, requires_grad=True
    )
    mb = _batch([0.0] * 5, values=old, returns=[2.0, 0.0, 0.0, 0.4, -1.0])
    agent = _agent(vf_coef=1.0, clip_range_vf=0.2)
    terms = ppo_loss(_new_logprobs([1.0] * 5), _zeros(5), new_values, mb, agent)
    assert _num(terms.value_loss) == pytest.approx(0.5 * (0.64 + 0.81 + 2.56 + 0.01 + 0.64) / 5)
    terms.loss.backward()
    # d/dv 0.5 * (v - R)^2 / 5 = (v - R) / 5 on the rows whose unclipped error counts
    expected = [0.0, 0.9 / 5, -1.6 / 5, 0.1 / 5, 0.0]
    torch.testing.assert_close(new_values.grad, torch.tensor([expected], dtype=torch.float64))


def test_ppo_value_clipping_is_relative_to_the_old_values():
    """Old value 1, new 2, return 0, clip 0.5: the clipped value is 1.5 (error 2.25), the
    unclipped error 4 is larger and counts."""
    new_values = torch.tensor([[2.0, 1.2]], dtype=torch.float64)
    mb = _batch([0.0, 0.0], values=[1.0, 1.0], returns=[0.0, 3.0])
    agent = _agent(clip_range_vf=0.5)
    terms = ppo_loss(_new_logprobs([1.0, 1.0]), _zeros(2), new_values, mb, agent)
    # row 1: clipped 1.2 (inside), error (1.2 - 3)^2 = 3.24 either way
    assert _num(terms.value_loss) == pytest.approx(0.5 * (4.0 + 3.24) / 2)


# ---------------------------------------------------------------------------- PPO, total
def test_ppo_total_loss_weighs_each_term():
    """loss = policy - ent_coef * entropy + vf_coef * value, each term by hand."""
    logp = _new_logprobs([1.1, 0.9])
    entropy = torch.tensor([[1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    new_values = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    mb = _batch([1.0, -1.0], values=[0.0, 0.0], returns=[0.0, 2.0])
    agent = _agent(ent_coef=0.1, vf_coef=0.25)
    terms = ppo_loss(logp, entropy, new_values, mb, agent)
    policy = -(1.1 * 1.0 + 0.9 * -1.0) / 2
    value = 0.5 * (1.0 + 4.0) / 2
    assert _num(terms.policy_loss) == pytest.approx(policy)
    assert _num(terms.entropy) == pytest.approx(1.5)
    assert _num(terms.value_loss) == pytest.approx(value)
    assert _num(terms.loss) == pytest.approx(policy - 0.1 * 1.5 + 0.25 * value)
    terms.loss.backward()  # the entropy bonus pushes the entropy up
    torch.testing.assert_close(entropy.grad, torch.full((1, 2), -0.05, dtype=torch.float64))


def _row(approx_kl: float) -> list[float]:
    return [approx_kl if name == "approx_kl" else 0.0 for name in TOTALS]


def test_ppo_stops_early_only_past_one_and_a_half_target_kl():
    agent = _agent(target_kl=0.01)
    assert not _kl_too_large(_row(0.015), agent)  # 1.5 * target_kl is still allowed
    assert _kl_too_large(_row(0.0151), agent)
    assert not _kl_too_large(_row(1.0), _agent(target_kl=None))
    assert not _kl_too_large(_row(1.0), AgentConfig(algo="a2c", target_kl=0.01))


def test_minibatch_indices_cover_every_chunk_once_per_epoch_in_runs():
    """5 chunks, 2 per minibatch, 3 epochs: runs of 2, 2, 1 per epoch, each epoch a
    permutation of 0..4, drawn from the generator (the same seed, the same order)."""
    cpu = torch.device("cpu")
    runs = list(minibatch_indices(5, 2, 3, cpu, torch.Generator().manual_seed(0)))
    assert [len(r) for r in runs] == [2, 2, 1] * 3
    for epoch in range(3):
        assert sorted(torch.cat(runs[3 * epoch : 3 * epoch + 3]).tolist()) == [0, 1, 2, 3, 4]
    again = list(minibatch_indices(5, 2, 3, cpu, torch.Generator().manual_seed(0)))
    assert all(torch.equal(a, b) for a, b in zip(runs, again, strict=True))
    expected = torch.randperm(5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.cat(runs[:3]), expected)
    assert len(list(minibatch_indices(3, 8, 1, cpu))[0]) == 3


def test_explained_variance_by_hand():
    """``1 - Var[R - V] / Var[R]`` with unbiased variances; NaN for constant returns."""
    returns = torch.tensor([1.0, 2.0, 3.0, 6.0])  # Var = 14/3
    values = torch.tensor([1.0, 2.0, 4.0, 4.0])  # R - V = 0, 0, -1, 2: Var = 19/12
    assert explained_variance(values, returns) == pytest.approx(1 - (19 / 12) / (14 / 3))
    assert explained_variance(returns, returns) == 1.0
    assert math.isnan(explained_variance(values, torch.ones(4)))


# ---------------------------------------------------------------------------- A2C
def test_a2c_loss_by_hand():
    """-(A log pi).mean() - ent_coef H.mean() + vf_coef MSE(V, R) (no 0.5, no ratio)."""
    logp = torch.tensor([[-0.5, -2.0]], dtype=torch.float64, requires_grad=True)
    entropy = torch.tensor([[1.0, 0.5]], dtype=torch.float64)
    new_values = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mb = _batch([2.0, -1.0], values=[0.0, 0.0], returns=[0.0, 1.0])
    agent = AgentConfig(algo="a2c", ent_coef=0.1, vf_coef=0.5)
    assert agent.normalize_advantage is False  # A2C's default (SB3)
    terms = a2c_loss(logp, entropy, new_values, mb, agent)
    policy = -(2.0 * -0.5 + -1.0 * -2.0) / 2
    value = (1.0 + 4.0) / 2
    assert _num(terms.policy_loss) == pytest.approx(policy)
    assert _num(terms.value_loss) == pytest.approx(value)
    assert _num(terms.entropy) == pytest.approx(0.75)
    assert _num(terms.loss) == pytest.approx(policy - 0.1 * 0.75 + 0.5 * value)
    assert _num(terms.clip_fraction) == 0.0
    # the log-ratio to the old log-prob -1 is 0.5 and -1
    kl = ((math.exp(0.5) - 1) - 0.5 + (math.exp(-1.0) - 1) + 1.0) / 2
    assert _num(terms.approx_kl) == pytest.approx(kl)
    terms.loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, 0.5]], dtype=torch.float64))


def test_a2c_normalised_advantages_are_centred():
    """With normalize_advantage, advantages 1 and 3 become -1/sqrt(2) and 1/sqrt(2)."""
    logp = torch.tensor([[-0.5, -2.0]], dtype=torch.float64)
    agent = AgentConfig(algo="a2c", ent_coef=0.0, vf_coef=0.0, normalize_advantage=True)
    terms = a2c_loss(logp, _zeros(2), _zeros(2), _batch([1.0, 3.0]), agent)
    a = 1 / math.sqrt(2)
    assert _num(terms.policy_loss) == pytest.approx(-(-a * -0.5 + a * -2.0) / 2, abs=1e-7)
    one = a2c_loss(logp[:, :1], _zeros(1), _zeros(1), _batch([3.0]), agent)
    assert _num(one.policy_loss) == pytest.approx(1.5)  # one row: used as it is
    # near-constant advantages: the 1e-8 added to the std keeps them small
    spread = torch.tensor([1.0 + 1e-9, 1.0 - 1e-9], dtype=torch.float64)
    tight = a2c_loss(logp, _zeros(2), _zeros(2), _batch(spread.tolist()), agent)
    a = (spread - spread.mean()) / (spread.std() + 1e-8)
    assert abs(a[0].item()) < 0.1
    assert _num(tight.policy_loss) == pytest.approx(-(a * logp[0]).mean().item(), rel=1e-6)


# ---------------------------------------------------------------------------- returns
def _buffer(n_steps: int, n_envs: int) -> RolloutBuffer:
    shapes = {"image": ((1,), torch.uint8)}
    return RolloutBuffer(shapes, n_steps, n_envs, n_steps, (torch.zeros(n_envs, 1),), "cpu")


def test_gae_by_hand_across_an_episode_end_and_a_truncated_rollout():
    """gamma 0.5, lambda 0.5, one env, 3 steps; an episode ends after step 0 (``starts[1]``)
    and the rollout stops mid-episode (bootstrap from the last value 4)."""
    g, lam = 0.5, 0.5
    buf = _buffer(3, 1)
    buf.rewards[:, 0] = torch.tensor([1.0, 2.0, 3.0])
    buf.values[:, 0] = torch.tensor([0.5, 1.0, 2.0])
    buf.starts[:, 0] = torch.tensor([True, True, False])
    buf.compute_returns(torch.tensor([4.0]), torch.tensor([False]), g, lam)
    d2 = 3.0 + g * 4.0 - 2.0  # 3.0: bootstraps the last value
    d1 = 2.0 + g * 2.0 - 1.0  # 2.0
    d0 = 1.0 - 0.5  # the episode ended: no bootstrap from step 1
    a2, a1, a0 = d2, d1 + g * lam * d2, d0  # GAE does not cross the episode end either
    torch.testing.assert_close(buf.advantages[:, 0], torch.tensor([a0, a1, a2]))
    torch.testing.assert_close(buf.returns[:, 0], torch.tensor([a0 + 0.5, a1 + 1.0, a2 + 2.0]))


def test_gae_does_not_bootstrap_after_a_final_step_that_ended_its_episode():
    """``next_start`` (terminated or truncated by a time limit) cuts the bootstrap: the last
    step's advantage is ``r - V``."""
    buf = _buffer(2, 2)
    buf.rewards[:] = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    buf.values[:] = torch.tensor([[0.0, 0.0], [0.25, 0.25]])
    buf.compute_returns(torch.tensor([8.0, 8.0]), torch.tensor([True, False]), 0.5, 0.5)
    # env 0 ended: delta_1 = 1 - 0.25; env 1 bootstraps: delta_1 = 1 + 0.5 * 8 - 0.25
    # step 0: delta_0 = 0 + 0.5 * 0.25 - 0, plus gamma * lambda * delta_1
    expected = torch.tensor([[0.125 + 0.25 * 0.75, 0.125 + 0.25 * 4.75], [0.75, 4.75]])
    torch.testing.assert_close(buf.advantages, expected)


def test_gae_scales_the_rewards_but_not_the_values():
    """``reward_scale`` 10, gamma 0.5, lambda 1, one env, 2 steps ending the episode: the
    rewards 0.1 and 0.2 count as 1 and 2, the values as they are."""
    buf = _buffer(2, 1)
    buf.rewards[:, 0] = torch.tensor([0.1, 0.2])
    buf.values[:, 0] = torch.tensor([0.5, 1.0])
    buf.compute_returns(torch.tensor([8.0]), torch.tensor([True]), 0.5, 1.0, reward_scale=10.0)
    a1 = 2.0 - 1.0  # the episode ended: no bootstrap from 8
    a0 = 1.0 + 0.5 * 1.0 - 0.5 + 0.5 * a1
    torch.testing.assert_close(buf.advantages[:, 0], torch.tensor([a0, a1]))
    torch.testing.assert_close(buf.returns[:, 0], torch.tensor([a0 + 0.5, a1 + 1.0]))


# ---------------------------------------------------------------------------- chunks
def test_chunks_and_their_selection_by_hand():
    """S = 4 steps of N = 2 envs in chunks of L = 2: chunk c = k * N + e holds steps
    [2k, 2k + 2) of env e; selecting chunks [2, 1] takes those columns of every field and those
    rows of the chunk-start states."""
    buf = RolloutBuffer({"image": ((1,), torch.uint8)}, 4, 2, 2, (torch.zeros(2, 3),), "cpu")
    step_env = torch.arange(8.0).view(4, 2)  # value 2t + e at step t of env e
    buf.rewards[:] = step_env
    buf.values[:] = step_env
    buf.advantages[:] = step_env + 100
    buf.returns = step_env + 200
    buf.logprobs[:] = -step_env
    buf.actions[:] = step_env.long()
    buf.starts[:] = step_env.long() % 3 == 0
    buf.obs["image"][:] = step_env.to(torch.uint8).unsqueeze(-1)
    buf.chunk_states[0][:] = torch.arange(4.0).view(2, 2, 1).expand(2, 2, 3)  # k * 2 + e
    batch = buf.chunks()
    # column c = k * 2 + e: steps 2k, 2k + 1 of env e
    columns = torch.tensor([[0.0, 1.0, 4.0, 5.0], [2.0, 3.0, 6.0, 7.0]])
    torch.testing.assert_close(batch.values, columns)
    torch.testing.assert_close(batch.state[0][:, 0], torch.arange(4.0))
    picked = select_chunks(batch, torch.tensor([2, 1]))
    expected = columns[:, [2, 1]]
    torch.testing.assert_close(picked.values, expected)
    torch.testing.assert_close(picked.advantages, expected + 100)
    torch.testing.assert_close(picked.returns, expected + 200)
    torch.testing.assert_close(picked.logprobs, -expected)
    assert torch.equal(picked.actions, expected.long())
    assert torch.equal(picked.starts, expected.long() % 3 == 0)
    assert torch.equal(picked.obs["image"][..., 0], expected.to(torch.uint8))
    torch.testing.assert_close(picked.state[0], torch.tensor([[2.0] * 3, [1.0] * 3]))
