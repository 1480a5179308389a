"""``agents/evaluation.py`` on scripted envs: which episodes an evaluation counts, what it
feeds the policy, and the summary of episodes whose returns are chosen by hand.

The env and the policy are stand-ins with the interfaces :func:`play_episodes` reads (a
vector env's ``reset``/``step``, a policy's ``initial_state``/``forward``): every episode's
length, reward and success is written out here, and the policy records what it is given.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import Tensor, nn

from memcores.agents import evaluation
from memcores.agents.evaluation import (
    EvalResult,
    check_observations,
    evaluate_policy,
    play_episodes,
)
from memcores.agents.policy import sample_actions

INITIAL = 100.0
"""The stand-in core's own initial state (not zeros, so a reset to zeros would show)."""


class ScriptedEnvs:
    """``len(lengths)`` envs; env ``i``'s episodes last ``lengths[i]`` steps, each step of its
    ``k``-th episode (from 0) pays ``(i + 1) * (k + 1)``, and the episode succeeds where ``k``
    is even. The observation ``vector`` is ``[step in the episode, episode number]``.

    :param as_tensors: give rewards, dones and successes as torch tensors (a batched env's).
    """

    def __init__(self, lengths: list[int], as_tensors: bool = False) -> None:
        self.num_envs = len(lengths)
        box = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_observation_space = gym.spaces.Dict({"vector": box})
        self.lengths = np.asarray(lengths)
        self.t = np.zeros(self.num_envs, np.int64)
        self.episode = np.zeros(self.num_envs, np.int64)
        self.as_tensors = as_tensors
        self.seeds: list[int] = []
        self.actions: list[np.ndarray] = []
        self.closed = False

    def _obs(self) -> dict[str, np.ndarray]:
        return {"vector": np.stack([self.t, self.episode], -1).astype(np.float32)}

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        self.seeds.append(seed)
        self.t[:] = 0
        self.episode[:] = 0
        return self._obs()

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        assert isinstance(actions, np.ndarray)
        self.actions.append(actions.copy())
        reward = ((np.arange(self.num_envs) + 1) * (self.episode + 1)).astype(np.float32)
        self.t += 1
        done = self.t >= self.lengths
        success = done & (self.episode % 2 == 0)
        self.episode += done
        self.t[done] = 0
        if self.as_tensors:
            return (
                self._obs(),
                torch.as_tensor(reward),
                torch.as_tensor(done),
                torch.as_tensor(success),
            )
        return self._obs(), reward, done, success

    def close(self) -> None:
        self.closed = True


class RecordingPolicy(nn.Module):
    """Fixed logits over two actions; the state is ``[N]``: the steps since the episode's
    start plus :data:`INITIAL` (reset to :data:`INITIAL` where ``starts``). Records the
    observation, state and starts of every call."""

    greedy = False

    def __init__(self, logits: tuple[float, float] = (0.0, 0.0), inputs: int = 2) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))
        self.logits = torch.tensor(logits)
        self.input_shape = (inputs,)
        self.calls: list[tuple[Tensor, Tensor, Tensor]] = []
        self.devices: list[set[torch.device]] = []

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """On ``device``, by default the policy's (as :class:`RecurrentActorCritic`'s)."""
        device = self.device if device is None else device
        return (torch.full((batch_size,), INITIAL, device=device),)

    def forward(self, obs: dict[str, Tensor], state: Any, starts: Tensor) -> SimpleNamespace:
        self.devices.append({obs["vector"].device, state[0].device, starts.device})
        if self.device.type == "meta":  # no values to read: logits on the CPU, as fixed
            return SimpleNamespace(logits=self.logits.expand(1, starts.shape[1], 2), state=state)
        self.calls.append((obs["vector"].clone(), state[0].clone(), starts.clone()))
        kept = torch.where(starts[0], torch.full_like(state[0], INITIAL), state[0])
        logits = self.logits.expand(1, len(kept), 2)
        return SimpleNamespace(logits=logits, state=(kept + 1,))


def _play(envs: ScriptedEnvs, policy: RecordingPolicy, episodes: int, **kw: Any) -> list[tuple]:
    return [
        tuple(np.asarray(x).tolist() for x in step)
        for step in play_episodes(policy, envs, episodes, **kw)
    ]


def test_eval_result_summary_of_chosen_episodes():
    """Returns 1, 0, 0.5: mean 0.5, population std sqrt(1/6) = 0.408; 2 of 3 successes;
    lengths 3, 4, 5: mean 4.0; the line word for word. No episode: NaN everywhere."""
    result = EvalResult("memcores/X-v0", [1.0, 0.0, 0.5], [3, 4, 5], [True, False, True])
    assert result.episodes == 3
    assert result.summary() == (
        "memcores/X-v0: 3 episodes, mean return 0.500 +- 0.408, success rate 0.667, mean length 4.0"
    )
    empty = EvalResult("e", [], [], [])
    assert empty.summary() == (
        "e: 0 episodes, mean return nan +- nan, success rate nan, mean length nan"
    )


def test_play_episodes_splits_the_episodes_over_the_envs_in_advance():
    """5 episodes over 2 envs: env 0 plays 3 and env 1 plays 2, whatever their lengths. Env 0
    (1 step per episode) ends episodes at steps 1, 2, 3 (counted) and 4, 5, 6 (not counted:
    its share is played); env 1 (3 steps) at steps 3 and 6. The play stops after step 6,
    when both shares are played. Each step's (reward, done, counted, success) by hand."""
    envs = ScriptedEnvs([1, 3])
    steps = _play(envs, RecordingPolicy(), 5)
    assert steps == [
        ([1.0, 2.0], [True, False], [True, False], [True, False]),
        ([2.0, 2.0], [True, False], [True, False], [False, False]),
        ([3.0, 2.0], [True, True], [True, True], [True, True]),
        ([4.0, 4.0], [True, False], [False, False], [False, False]),
        ([5.0, 4.0], [True, False], [False, False], [True, False]),
        ([6.0, 4.0], [True, True], [False, True], [False, False]),
    ]


def test_play_episodes_gives_the_first_envs_the_remainder():
    """7 episodes over 3 envs of 2 steps each: shares 3, 2, 2, so env 0's third episode
    (steps 5-6) is counted and the others' are not."""
    steps = _play(ScriptedEnvs([2, 2, 2]), RecordingPolicy(), 7)
    assert len(steps) == 6
    counted = [c for _, done, c, _ in steps if any(done)]
    assert counted == [[True, True, True], [True, True, True], [True, False, False]]


def test_play_episodes_carries_the_state_and_resets_it_at_episode_starts():
    """The policy sees every env start at step 0, then ``starts`` is the previous step's
    done; the state it is given is the one it returned (steps since the start + 100), and
    the observations are the env's, in a leading ``[1, N]``; ``observe`` sees each batch
    before the policy acts on it; the env is reset once, with the seed."""
    envs, policy = ScriptedEnvs([2, 3]), RecordingPolicy()
    observed: list[np.ndarray] = []
    steps = _play(
        envs, policy, 2, seed=7, observe=lambda obs: observed.append(obs["vector"].copy())
    )
    assert len(steps) == 3 and envs.seeds == [7]
    starts = [call[2].tolist() for call in policy.calls]
    assert starts == [[[True, True]], [[False, False]], [[True, False]]]
    states = [call[1].tolist() for call in policy.calls]
    assert states == [[INITIAL, INITIAL], [INITIAL + 1, INITIAL + 1], [INITIAL + 2, INITIAL + 2]]
    seen = [call[0].tolist() for call in policy.calls]
    assert seen == [
        [[[0.0, 0.0], [0.0, 0.0]]],
        [[[1.0, 0.0], [1.0, 0.0]]],
        [[[0.0, 1.0], [2.0, 0.0]]],
    ]
    assert [o.tolist() for o in observed] == [s[0] for s in seen]


def test_play_episodes_reads_a_batched_envs_tensors():
    """Rewards, dones and successes given as torch tensors come out as the same numpy
    arrays."""
    steps = _play(ScriptedEnvs([1, 3], as_tensors=True), RecordingPolicy(), 5)
    assert steps[2] == ([3.0, 2.0], [True, True], [True, True], [True, True])
    assert len(steps) == 6


def test_play_episodes_samples_from_its_seed_and_restores_the_callers_generator():
    """Sampled actions are torch's draws after ``manual_seed(seed)`` (uniform logits: both
    actions appear), the same for the same seed and not for another; the caller's generator
    goes on as if nothing had been drawn; the policy is put in eval mode."""
    policy = RecordingPolicy()
    assert policy.training
    torch.manual_seed(123)
    want_next = torch.rand(3)
    torch.manual_seed(123)
    envs = ScriptedEnvs([20])
    _play(envs, policy, 1, seed=5)
    assert torch.equal(torch.rand(3), want_next)
    assert not policy.training
    actions = [int(a[0]) for a in envs.actions]
    assert len(actions) == 20 and set(actions) == {0, 1}
    torch.manual_seed(5)
    assert actions == [int(sample_actions(torch.zeros(1, 2))[0]) for _ in range(20)]
    again, other = ScriptedEnvs([20]), ScriptedEnvs([20])
    _play(again, RecordingPolicy(), 1, seed=5)
    _play(other, RecordingPolicy(), 1, seed=6)
    assert [int(a[0]) for a in again.actions] == actions
    assert [int(a[0]) for a in other.actions] != actions


def test_play_episodes_makes_observations_state_and_starts_on_the_policys_device():
    """A policy on the ``meta`` device (a device other than the CPU's, holding no values) is
    given observations, state and starts on that device at every step; by default the env
    is reset with seed 10000."""
    policy = RecordingPolicy().to("meta")
    envs = ScriptedEnvs([1, 2])
    steps = _play(envs, policy, 4)
    assert len(steps) == 4 and envs.seeds == [10_000]
    assert policy.devices == [{torch.device("meta")}] * 4


@pytest.mark.parametrize(("argmax", "greedy"), [(True, False), (False, True)])
def test_play_episodes_takes_the_argmax_when_asked_or_for_a_greedy_policy(argmax, greedy):
    """Logits (0, 0.1): the argmax is action 1 at every step, where sampling takes action 0
    about half the time."""
    policy = RecordingPolicy((0.0, 0.1))
    policy.greedy = greedy
    envs = ScriptedEnvs([20])
    _play(envs, policy, 1, argmax=argmax)
    assert [int(a[0]) for a in envs.actions] == [1] * 20
    sampled = ScriptedEnvs([20])
    _play(sampled, RecordingPolicy((0.0, 0.1)), 1)
    assert 0 in [int(a[0]) for a in sampled.actions]


def test_evaluate_policy_keeps_the_counted_episodes_in_the_order_they_end(monkeypatch):
    """The scripted play of :func:`test_play_episodes_splits_the_episodes_over_the_envs_in_advance`:
    returns 1, 2, 3 (env 0) and 6 = 3 x 2 (env 1) and then 12 = 3 x 4, in the order they
    end (env 0 before env 1 on the same step); their lengths and successes; the env is made
    with the evaluation's arguments on the policy's device and closed."""
    made: list[tuple] = []
    envs = ScriptedEnvs([1, 3])

    def eval_envs(*args: Any) -> ScriptedEnvs:
        made.append(args)
        return envs

    monkeypatch.setattr(evaluation, "eval_envs", eval_envs)
    policy = RecordingPolicy()
    kwargs = {"size": 3}
    result = evaluate_policy(policy, "memcores/X-v0", 5, True, 9, 2, kwargs, "batched")
    assert made == [("memcores/X-v0", 5, 2, 9, kwargs, "batched", torch.device("cpu"))]
    assert envs.seeds == [9] and envs.closed
    assert result.env_id == "memcores/X-v0"
    assert result.returns == [1.0, 2.0, 3.0, 6.0, 12.0]
    assert result.lengths == [1, 1, 1, 3, 3]
    assert result.successes == [True, False, True, True, False]
    assert [type(r) for r in result.returns] == [float] * 5
    assert [type(n) for n in result.lengths] == [int] * 5
    assert [type(s) for s in result.successes] == [bool] * 5


def test_evaluate_policy_defaults(monkeypatch):
    """By default: 100 episodes, sampled, seed 10000, 8 envs, no env options, the gymnasium
    envs."""
    made: list[tuple] = []

    def eval_envs(*args: Any) -> ScriptedEnvs:
        made.append(args)
        return ScriptedEnvs([1] * 8)

    monkeypatch.setattr(evaluation, "eval_envs", eval_envs)
    result = evaluate_policy(RecordingPolicy(), "memcores/X-v0")
    assert made == [("memcores/X-v0", 100, 8, 10_000, None, "sync", torch.device("cpu"))]
    assert result.episodes == 100


def test_evaluate_policy_refuses_observations_the_policy_cannot_read(monkeypatch):
    """An env of 2 features for a policy of 3: the one-line error, nothing played, the env
    closed."""
    envs = ScriptedEnvs([1, 1])
    monkeypatch.setattr(evaluation, "eval_envs", lambda *args: envs)
    want = r"^env 'memcores/X-v0' gives \(2,\) observations; this policy reads \(3,\)$"
    with pytest.raises(ValueError, match=want):
        evaluate_policy(RecordingPolicy(inputs=3), "memcores/X-v0", 2)
    assert envs.actions == [] and envs.closed
    check_observations(RecordingPolicy(inputs=2), envs, "memcores/X-v0")  # the same width
