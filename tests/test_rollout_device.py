"""The device rollout (``collect_on_device`` in agents/rollout.py), eager and through its
recording, against a second env stepped with the stored actions, the policy run again step by
step, and episode returns summed by hand: what the buffer, the carry and the episode
statistics hold must be what happened, not only what the other path stored."""

from __future__ import annotations

import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents.acting import act
from memcores.agents.episodes import EpisodeStats
from memcores.agents.networks import build_policy
from memcores.agents.policy import observation_shape
from memcores.agents.rollout import (
    RolloutBuffer,
    collect_on_device,
    obs_shapes,
    start_rollouts,
)
from memcores.agents.rollout_graph import RolloutGraph
from memcores.cores.graphed import EagerRecorder
from memcores.envs.batched_registry import make_batched_env

ENV_ID, ENV_KWARGS = "memcores/PassiveVisualMatch-v0", {"distractor_steps": 3, "max_steps": 12}
N_ENVS, N_STEPS, SEQ_LEN = 3, 24, 8


@pytest.mark.parametrize("graphed", [False, True])
def test_a_device_rollout_stores_each_step_as_it_happened(graphed):
    config = tiny_config(f"env.id={ENV_ID}")
    envs = make_batched_env(ENV_ID, N_ENVS, env_kwargs=ENV_KWARGS)
    space = envs.single_observation_space
    torch.manual_seed(0)
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    carry = start_rollouts(policy, envs, seed=3, device=envs.device)
    initial = policy.initial_state(N_ENVS)
    buffer = RolloutBuffer(obs_shapes(space), N_STEPS, N_ENVS, SEQ_LEN, initial, envs.device)
    graph = RolloutGraph(policy, envs, EagerRecorder(), warmup_calls=2) if graphed else None
    episodes = EpisodeStats(N_ENVS)
    torch.manual_seed(1)
    carry = collect_on_device(policy, envs, buffer, carry, episodes, graph=graph)

    replay = make_batched_env(ENV_ID, N_ENVS, env_kwargs=ENV_KWARGS)
    replay.reset(seed=3)
    state, done = initial, torch.ones(N_ENVS, dtype=torch.bool)
    running, returns, successes = [0.0] * N_ENVS, [], []
    for t in range(N_STEPS):
        obs = {key: value.unsqueeze(0) for key, value in replay.obs.items()}
        for key, value in obs.items():
            assert torch.equal(buffer.obs[key][t], value[0]), (key, t)
        assert torch.equal(buffer.starts[t], done), t
        if t % SEQ_LEN == 0:  # the state the policy was called with, before the resets
            for stored, s in zip(buffer.chunk_states, state, strict=True):
                assert torch.equal(stored[t // SEQ_LEN], s), t
        with torch.no_grad():
            out = policy.eval()(obs, state, done.unsqueeze(0))
        actions = buffer.actions[t]
        logprobs = out.logits[0].log_softmax(-1).gather(1, actions.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(buffer.logprobs[t], logprobs)
        torch.testing.assert_close(buffer.values[t], out.values[0])
        state = out.state
        _, reward, done, success = replay.step(actions)
        assert torch.equal(buffer.rewards[t], reward), t
        for i in range(N_ENVS):
            running[i] += float(reward[i])
            if done[i]:
                returns.append(running[i])
                successes.append(float(success[i]))
                running[i] = 0.0
    assert len(returns) >= N_ENVS  # every env ended an episode inside the rollout
    assert list(episodes.returns) == pytest.approx(returns)
    assert list(episodes.successes) == successes
    assert torch.equal(carry.starts, done)
    for key, value in replay.obs.items():
        assert torch.equal(carry.obs[key], value), key
    for got, want in zip(carry.state, state, strict=True):
        torch.testing.assert_close(got, want)


def test_a_device_rollout_acts_through_the_acting_step_it_is_given():
    """A trainer's own acting step (a compiled or recorded one) is what acts: here one that
    always moves forward, called once per step."""
    config = tiny_config(f"env.id={ENV_ID}")
    envs = make_batched_env(ENV_ID, N_ENVS, env_kwargs=ENV_KWARGS)
    space = envs.single_observation_space
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    carry = start_rollouts(policy, envs, seed=3, device=envs.device)
    initial = policy.initial_state(N_ENVS)
    buffer = RolloutBuffer(obs_shapes(space), N_STEPS, N_ENVS, SEQ_LEN, initial, envs.device)
    calls = []

    def forward(obs, state, starts):  # noqa: ANN001, ANN202
        calls.append(starts.clone())
        return act(policy, obs, state, starts)._replace(actions=torch.full((N_ENVS,), 2))

    collect_on_device(policy, envs, buffer, carry, acting=forward)
    assert len(calls) == N_STEPS and (buffer.actions == 2).all()
