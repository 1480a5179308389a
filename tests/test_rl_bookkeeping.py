"""The chunk/starts bookkeeping: what the update replays is what the rollout acted with."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_helpers import evaluate_chunks, tiny_config

from memcores.agents.episodes import EpisodeStats
from memcores.agents.policy import log_prob_entropy
from memcores.agents.ppo import update
from memcores.agents.rl_trainer import setup
from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
from memcores.cores import CORES


def _collect(core: str, n_steps: int = 32, seq_len: int = 8, *extra: str):
    config = tiny_config(
        f"core.name={core}", f"agent.n_steps={n_steps}", f"agent.seq_len={seq_len}", *extra
    )
    s = setup(config)
    N = config.env.n_envs
    buffer = RolloutBuffer(
        obs_shapes(s.envs.single_observation_space),
        n_steps,
        N,
        seq_len,
        s.policy.initial_state(N, s.device),
        s.device,
    )
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    episodes = EpisodeStats(N)
    # two rollouts: the second starts mid-episode from the carried state
    carry = collect_rollout(s.policy, s.envs, buffer, carry, episodes)
    carry = collect_rollout(s.policy, s.envs, buffer, carry, episodes)
    s.envs.close()
    return s, buffer, episodes


@pytest.mark.parametrize("core", sorted(CORES))
def test_replayed_chunks_match_rollout(core):
    """Acting uses the core's step() (T = 1), the update its forward() over chunks: for every
    core they must agree, episode resets inside chunks included."""
    s, buffer, episodes = _collect(core)
    assert buffer.starts.any() and not buffer.starts.all()  # boundaries inside the rollout
    assert len(episodes.returns) > 0
    policy = s.policy.eval()
    with torch.no_grad():
        batch = buffer.chunks()
        logprobs, _, values = evaluate_chunks(policy, batch)  # ONE core call, all chunks
    torch.testing.assert_close(logprobs, batch.logprobs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values, batch.values, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("core", ["lstm", "lru", "rel_lstm"])
def test_separate_critic_replays_its_rollout(core):
    """agent.separate_critic: two cores in one state tuple; acting (step) and the update
    (forward over chunks, resets inside) still agree."""
    s, buffer, _ = _collect(core, 32, 8, "agent.separate_critic=true")
    policy = s.policy.eval()
    assert len(buffer.chunk_states) == 2 * len(policy.core.actor_core.initial_state(1))
    with torch.no_grad():
        batch = buffer.chunks()
        logprobs, _, values = evaluate_chunks(policy, batch)
    torch.testing.assert_close(logprobs, batch.logprobs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values, batch.values, atol=1e-5, rtol=1e-4)


def test_separate_critic_keeps_the_value_loss_out_of_the_actor_core():
    """The value's gradient reaches the critic's core and the shared encoder, never the
    actor's core; the policy's gradient never reaches the critic's core. With one shared core
    (the default) the value's gradient does reach it."""
    s, buffer, _ = _collect("lstm", 32, 8, "agent.separate_critic=true")
    policy = s.policy.train()
    batch = buffer.chunks()

    def grads(loss_of: str) -> dict[str, float]:
        policy.zero_grad()
        out = policy(batch.obs, batch.state, batch.starts)
        loss = out.values.pow(2).mean() if loss_of == "value" else out.logits.logsumexp(-1).mean()
        loss.backward()
        return {
            part: sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)
            for part, module in (
                ("actor_core", policy.core.actor_core),
                ("critic_core", policy.core.critic_core),
                ("encoder", policy.image),
            )
        }

    value, action = grads("value"), grads("policy")
    assert value["actor_core"] == 0 and value["critic_core"] > 0 and value["encoder"] > 0
    assert action["critic_core"] == 0 and action["actor_core"] > 0
    shared, _, _ = _collect("lstm")
    shared.policy.zero_grad()
    out = shared.policy.train()(batch.obs, batch.state[:2], batch.starts)
    out.values.pow(2).mean().backward()
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for p in shared.policy.core.parameters()
    )


def test_step_by_step_recomputation_matches():
    """Each env's whole rollout, replayed one step at a time from the rollout's first stored
    state, resetting where ``starts`` says, gives the stored log-probs and values."""
    s, buffer, _ = _collect("lstm")
    policy = s.policy.eval()
    S = buffer.n_steps
    with torch.no_grad():
        state = tuple(c[0] for c in buffer.chunk_states)  # state before step 0, [N, ...]
        for t in range(S):
            obs = {k: v[t : t + 1] for k, v in buffer.obs.items()}
            out = policy(obs, state, buffer.starts[t : t + 1])
            lp, _ = log_prob_entropy(out.logits[0], buffer.actions[t])
            torch.testing.assert_close(lp, buffer.logprobs[t], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.values[0], buffer.values[t], atol=1e-5, rtol=1e-4)
            state = out.state
            if (t + 1) % buffer.seq_len == 0 and t + 1 < S:  # stored chunk-start states
                k = (t + 1) // buffer.seq_len
                for stored, live in zip(buffer.chunk_states, state, strict=True):
                    torch.testing.assert_close(stored[k], live)


def test_wrong_chunk_states_are_detected():
    """The check above can fail: replaying chunks from the wrong states changes the values."""
    s, buffer, _ = _collect("lstm")
    batch = buffer.chunks()
    shifted = batch._replace(state=tuple(torch.roll(x, 1, dims=0) for x in batch.state))
    with torch.no_grad():
        _, _, values = evaluate_chunks(s.policy.eval(), shifted)
    assert not torch.allclose(values, batch.values, atol=1e-5)


def test_chunk_layout():
    """Chunk c = k * N + e holds steps [k*L, (k+1)*L) of env e."""
    s, buffer, _ = _collect("lstm", n_steps=32, seq_len=8)
    batch = buffer.chunks()
    L, N = buffer.seq_len, buffer.n_envs
    for k in range(buffer.n_chunks_per_env):
        for e in range(N):
            c = k * N + e
            assert torch.equal(batch.actions[:, c], buffer.actions[k * L : (k + 1) * L, e])
            assert torch.equal(batch.starts[:, c], buffer.starts[k * L : (k + 1) * L, e])
            assert torch.equal(batch.state[0][c], buffer.chunk_states[0][k, e])


def test_gae_matches_reference():
    s, buffer, _ = _collect("lstm")
    last_value = torch.randn(buffer.n_envs)
    next_start = torch.tensor([True, False])
    buffer.compute_returns(last_value, next_start, gamma=0.9, gae_lambda=0.8)
    r, v, st = buffer.rewards.numpy(), buffer.values.numpy(), buffer.starts.numpy()
    for e in range(buffer.n_envs):
        adv, gae = np.zeros(buffer.n_steps), 0.0
        for t in reversed(range(buffer.n_steps)):
            ended = next_start[e].item() if t == buffer.n_steps - 1 else st[t + 1, e]
            nv = last_value[e].item() if t == buffer.n_steps - 1 else v[t + 1, e]
            delta = r[t, e] + 0.9 * nv * (1 - ended) - v[t, e]
            gae = delta + 0.9 * 0.8 * (1 - ended) * gae
            adv[t] = gae
        np.testing.assert_allclose(buffer.advantages[:, e].numpy(), adv, rtol=1e-5, atol=1e-6)


def test_nonfinite_loss_skips_update():
    s, buffer, _ = _collect("lstm")
    buffer.compute_returns(torch.zeros(2), torch.zeros(2, dtype=torch.bool), 0.99, 0.95)
    buffer.returns[0, 0] = float("nan")  # poisons the value loss of one chunk's minibatches
    stats = update(s.policy, s.optimizer, buffer, s.config.agent)
    assert stats.skipped_updates > 0
    for k, v in s.policy.state_dict().items():
        assert torch.isfinite(v).all(), k
    buffer.returns[:] = float("nan")
    stats = update(s.policy, s.optimizer, buffer, s.config.agent)
    assert stats.n_minibatches == 0 and stats.skipped_updates > 0


def test_episode_stats_sum_each_episode_of_each_env_row_block():
    """Two row blocks of one 4-env batch (as with overlapped halves): each env's return and
    length run on between its own ends, and the window keeps the last episodes only."""
    stats = EpisodeStats(4, window=3)
    no = np.zeros(2, dtype=bool)
    stats.step(np.array([1.0, 2.0]), no, no, rows=slice(0, 2))
    stats.step(np.array([0.5, 0.0]), np.array([False, True]), np.array([False, True]), slice(2, 4))
    stats.step(np.array([1.0, 1.0]), np.array([True, False]), no, rows=slice(0, 2))
    assert list(stats.returns) == [0.0, 2.0]  # env 3 after one step, then env 0 after two
    assert list(stats.lengths) == [1.0, 2.0]
    assert list(stats.successes) == [1.0, 0.0]
    stats.step(np.ones(4), np.ones(4, dtype=bool), np.zeros(4, dtype=bool))
    # env 0 restarted at 0; the window keeps envs 1-3's ends (lengths 3, 2, 1)
    assert list(stats.returns) == [4.0, 1.5, 1.0]
    assert stats.mean_length == pytest.approx(2.0)


def test_the_device_path_of_an_update_skips_and_sums_as_the_host_path(monkeypatch):
    """On a GPU the update reads nothing back between minibatches: the loss terms stay on the
    device and Adam (fused) skips a non-finite minibatch through its ``found_inf``. Forced on
    CPU tensors, that path gives the same weights, optimiser state and statistics as reading
    every minibatch back, with a poisoned minibatch skipped."""
    from memcores.agents import ppo

    def run(on_device: bool):
        monkeypatch.setattr(ppo, "rows_on_device", lambda device: on_device)
        s, buffer, _ = _collect("lstm")
        buffer.compute_returns(torch.zeros(2), torch.zeros(2, dtype=torch.bool), 0.99, 0.95)
        buffer.returns[0, 0] = float("nan")  # poisons the minibatches holding that chunk
        flags = []  # the found_inf each optimiser step saw
        step = s.optimizer.step
        monkeypatch.setattr(
            s.optimizer,
            "step",
            lambda: (flags.append(getattr(s.optimizer, "found_inf", None)), step()),
        )
        stats = update(s.policy, s.optimizer, buffer, s.config.agent)
        assert not hasattr(s.optimizer, "found_inf")
        return stats, s.policy.state_dict(), s.optimizer.state_dict()["state"], flags

    host, host_weights, host_state, host_flags = run(False)
    dev, dev_weights, dev_state, dev_flags = run(True)
    # (the returns' NaN makes the explained variance NaN in both)
    assert vars(dev).keys() == vars(host).keys() and host.skipped_updates > 0
    assert all(
        getattr(dev, k) == v or (v != v and getattr(dev, k) != getattr(dev, k))
        for k, v in vars(host).items()
    )
    assert host.n_minibatches > 0
    assert host_flags == [None] * host.n_minibatches  # the host path steps only finite ones
    assert len(dev_flags) == host.n_minibatches + host.skipped_updates
    assert [float(f) for f in dev_flags].count(1.0) == host.skipped_updates
    for key, value in host_weights.items():
        torch.testing.assert_close(dev_weights[key], value, rtol=0, atol=0)
    for key, value in host_state.items():
        for name, tensor in value.items():
            torch.testing.assert_close(dev_state[key][name], tensor, rtol=0, atol=0)


def test_returns_accept_the_envs_flags_from_the_cpu_on_any_buffer_device():
    """A GPU learner's buffer with the last value and episode flags as the envs give them (CPU
    tensors); the ``meta`` device stands in for the GPU (mixing it with the CPU raises)."""
    on_meta = RolloutBuffer({}, 8, 2, 4, (torch.zeros(2, 3),), torch.device("meta"))
    on_meta.compute_returns(torch.zeros(2), torch.tensor([False, True]), 0.99, 0.95)
    assert on_meta.returns.device.type == "meta" and on_meta.returns.shape == (8, 2)
