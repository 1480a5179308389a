"""The acting step and a batched env's step in one recording (``train.graph_env_step``,
agents/rollout_graph.py), and the batched envs' recordable step it relies on.

A CUDA graph replays kernels, not Python: every tensor a batched env's step reads or writes
must keep its storage. On a CPU the recording is the eager recorder (the same static inputs,
run again at each replay), which checks the bookkeeping; on a GPU (``pytest -m cuda``) the
rollout test records a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from rl_helpers import evaluate_chunks, tiny_config

from memcores.agents.episodes import EpisodeStats
from memcores.agents.networks import build_policy
from memcores.agents.policy import observation_shape
from memcores.agents.rl_trainer import env_step_obstacle, setup
from memcores.agents.rollout import RolloutBuffer, collect_with_returns, obs_shapes, start_rollouts
from memcores.agents.rollout_graph import RolloutGraph
from memcores.cores.graphed import CudaRecorder, EagerRecorder, cuda_only, graph_switch
from memcores.envs.batched import BatchedEnv
from memcores.envs.batched_registry import batched_ids, make_batched_env


def _tensors(env: BatchedEnv) -> dict[str, torch.Tensor]:
    """Every tensor a step reads or writes, by name."""
    named = {"keys": env.keys, "episodes": env.episodes, "stale": env._stale}
    for prefix, store in (("state", env.state), ("next", env._next), ("obs", env.obs)):
        named.update({f"{prefix}.{k}": v for k, v in store.items()})
    return {**named, **{f"out.{k}": v for k, v in env._out.items()}}


@pytest.mark.parametrize("env_id", batched_ids())
def test_masked_steps_keep_every_tensor_in_place_and_equal_compact_steps(env_id):
    """Every batched env on the masked path (as on a GPU): over two whole episodes of every
    env, pool refills and a second reset, each state, pool, observation and output tensor
    keeps its storage (what a graph replay needs); and the masked env steps as the compact
    one (rows found by index), observation, reward, done and success."""
    masked, compact = make_batched_env(env_id, 6), make_batched_env(env_id, 6)
    masked.compact_resets = False
    generator = torch.Generator().manual_seed(0)
    n_actions = int(masked.single_action_space.n)
    masked.reset(seed=5)
    where = {k: v.data_ptr() for k, v in _tensors(masked).items()}
    for seed in (5, 9):
        masked.reset(seed=seed), compact.reset(seed=seed)
        ended = torch.zeros(6, dtype=torch.int64)
        steps = 0
        while ended.min() < 2:
            actions = torch.randint(n_actions, (6,), generator=generator)
            got, want = masked.step(actions), compact.step(actions)
            for key in want[0]:
                assert torch.equal(got[0][key], want[0][key]), (key, steps)
            for name, a, b in zip(("reward", "done", "success"), got[1:], want[1:], strict=True):
                assert torch.equal(a, b), (name, steps)
            assert {k: v.data_ptr() for k, v in _tensors(masked).items()} == where, steps
            ended += got[2]
            steps += 1
        assert steps >= masked.min_episode_length  # refills happened on the way
        assert torch.equal(masked.episodes, ended)


FIELDS = ("starts", "actions", "logprobs", "values", "rewards", "returns")


def _rollouts(env_id: str, env_kwargs: dict, device: str, graphed: bool):  # noqa: ANN202
    """Two PPO rollouts of 4 envs x 32 steps, eager or through a :class:`RolloutGraph` (two
    warm-up steps): a copy of each rollout's buffer, the episode statistics, the graph and
    the last buffer."""
    config = tiny_config(f"env.id={env_id}", f"train.device={device}")
    dev = torch.device(device)
    envs = make_batched_env(env_id, 4, dev, env_kwargs)
    space = envs.single_observation_space
    torch.manual_seed(0)
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    policy = policy.to(dev)
    carry = start_rollouts(policy, envs, seed=3, device=dev)
    buffer = RolloutBuffer(obs_shapes(space), 32, 4, 8, policy.initial_state(4, dev), dev)
    graph = None
    if graphed:
        recorder = CudaRecorder() if device == "cuda" else EagerRecorder()
        graph = RolloutGraph(policy, envs, recorder, warmup_calls=2)
    episodes = EpisodeStats(4)
    torch.manual_seed(1)
    copies = []
    for _ in range(2):
        agent = config.agent
        carry = collect_with_returns(policy, envs, buffer, carry, agent, episodes, None, graph)
        copy = {name: getattr(buffer, name).clone() for name in FIELDS}
        copy.update({f"obs.{k}": v.clone() for k, v in buffer.obs.items()})
        copy.update({f"state.{i}": s.clone() for i, s in enumerate(buffer.chunk_states)})
        copies.append(copy)
    return copies, episodes, graph, policy, buffer


ENVS = [
    ("memcores/PassiveVisualMatch-v0", {"distractor_steps": 3, "max_steps": 20}),
    ("popgym/MineSweeperEasy-v0", {}),
]


@pytest.mark.parametrize(("env_id", "env_kwargs"), ENVS)
def test_recorded_rollout_steps_the_env_as_the_eager_env(env_id, env_kwargs, device):
    """Through the replays (after two warm-up steps), the stored observations, rewards and
    starts are what the env gives stepped eagerly with the stored actions (resets and pool
    refills inside the rollouts), and the stored log-probabilities and values are the
    policy's for the stored actions; on a CPU the whole
    rollout (actions, log-probabilities, values, chunk states, returns, episodes) equals the
    unrecorded one bit for bit."""
    rollouts, episodes, graph, policy, buffer = _rollouts(env_id, env_kwargs, device, True)
    assert graph.failure is None and graph.replays == 2 * 32 - 2
    assert sum(int(r["starts"][1:].sum()) for r in rollouts) >= 4  # episodes ended inside
    replay = make_batched_env(env_id, 4, device, env_kwargs)
    replay.reset(seed=3)
    done = torch.ones(4, dtype=torch.bool, device=device)
    for k, rollout in enumerate(rollouts):
        for t in range(32):
            for key, value in replay.obs.items():
                assert torch.equal(rollout[f"obs.{key}"][t], value), (key, k, t)
            assert torch.equal(rollout["starts"][t], done), (k, t)
            _, reward, done, _ = replay.step(rollout["actions"][t])
            assert torch.equal(rollout["rewards"][t], reward), (k, t)
    with torch.no_grad():
        batch = buffer.chunks()
        logprobs, _, values = evaluate_chunks(policy.eval(), batch)
    torch.testing.assert_close(logprobs, batch.logprobs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values, batch.values, atol=1e-5, rtol=1e-4)
    if device == "cpu":
        eager, eager_episodes, *_ = _rollouts(env_id, env_kwargs, device, graphed=False)
        for got, want in zip(rollouts, eager, strict=True):
            for name in want:
                assert torch.equal(got[name], want[name]), name
        assert list(episodes.returns) == list(eager_episodes.returns)
        assert list(episodes.successes) == list(eager_episodes.successes)


@pytest.mark.parametrize(("env_id", "env_kwargs"), ENVS)
def test_the_recorded_step_reads_nothing_back_to_the_host(env_id, env_kwargs):
    """The whole recorded step (acting, the env's step with its masked resets) and the eager
    refill between replays on ``meta`` tensors, which hold no values: a read of the device
    from the host (``.item()``, ``nonzero``) or a CPU tensor mixed in raises there."""
    envs = make_batched_env(env_id, 4, env_kwargs=env_kwargs).to("meta")
    envs.reset(seed=0)
    config = tiny_config(f"env.id={env_id}")
    space = envs.single_observation_space
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    graph = RolloutGraph(policy.to("meta").eval(), envs, EagerRecorder(), warmup_calls=1)
    for _ in range(envs.min_episode_length):  # through a refill
        out = graph()
    assert {t.device.type for t in (*out, *graph.state, graph.starts)} == {"meta"}


def test_priming_leaves_only_replays_and_the_carry_to_continue_from():
    """:meth:`RolloutGraph.prime` takes the warm-up steps and the recording: every later step
    is a replay, continuing the rollout from where priming left the env, state and starts;
    priming a recorded graph takes no step."""
    env_id, env_kwargs = ENVS[0]
    envs = make_batched_env(env_id, 4, env_kwargs=env_kwargs)
    config = tiny_config(f"env.id={env_id}")
    space = envs.single_observation_space
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    carry = start_rollouts(policy, envs, seed=0, device=torch.device("cpu"))
    graph = RolloutGraph(policy, envs, EagerRecorder(), warmup_calls=2)
    carry = graph.prime(carry)
    assert graph.replays == 1 and envs._steps == 3
    assert carry.starts is graph.starts and carry.obs is envs.obs
    buffer = RolloutBuffer(obs_shapes(space), 8, 4, 8, policy.initial_state(4), envs.device)
    collect_with_returns(policy, envs, buffer, carry, config.agent, graph=graph)
    assert graph.replays == 1 + 8
    graph.prime(carry)  # recorded already: no step
    assert graph.replays == 9 and envs._steps == 3 + 8


BATCHED = (
    "env.id=memcores/PassiveVisualMatch-v0", "env.vector=batched", "env.n_envs=4",
    "env.kwargs.distractor_steps=3", "env.kwargs.max_steps=20",
    "agent.n_steps=32", "agent.seq_len=16", "train.total_steps=256",
)  # fmt: skip


def test_a_training_run_through_the_recorded_rollout_step_repeats_the_eager_run(
    tmp_path, monkeypatch
):
    """``train.graph_env_step=true`` on a (faked) CUDA learner with a batched env: every
    rollout step after the warm-up goes through the recording, and the run's losses are the
    eager run's, update for update."""
    from memcores.agents import rl_trainer

    eager = rl_trainer.train(tiny_config(*BATCHED), tmp_path / "eager")
    graphs: list[RolloutGraph] = []

    def eager_graph(policy, envs) -> RolloutGraph:  # noqa: ANN001
        graphs.append(RolloutGraph(policy, envs, EagerRecorder()))
        return graphs[-1]

    monkeypatch.setattr(rl_trainer, "RolloutGraph", eager_graph)
    # a (faked) CUDA learner for acting only: the update stays eager
    monkeypatch.setattr(rl_trainer, "graph_obstacles", lambda *args: ("not faked", None))
    graphed = rl_trainer.train(
        tiny_config(*BATCHED, "train.graph_env_step=true"), tmp_path / "graphed"
    )
    assert len(graphs) == 1 and graphs[0].replays == 2 * 32 - 3  # 3 warm-up steps
    assert [h["train/loss"] for h in graphed.history] == [h["train/loss"] for h in eager.history]
    assert graphed.ep_rew_mean == eager.ep_rew_mean


def _resolved(*overrides: str, device: str = "cuda", why_acting: str | None = None) -> bool:
    """``train.graph_env_step`` resolved as :func:`agents.rl_trainer.setup` does, on
    ``device`` (its reason against ``train.graph_acting`` is ``why_acting``, or the device's)."""
    config = tiny_config(*BATCHED, *overrides)
    why = why_acting or cuda_only(device)
    return graph_switch(
        config.train.graph_env_step, "train.graph_env_step", env_step_obstacle(config, why)
    )


def test_graph_env_step_is_off_by_default_and_refused_where_it_cannot_apply():
    """Off unless asked (no GPU has measured it); ``auto`` on where it can apply; ``true``
    refused, with the reason, on a CPU, with an env that does not step on the device, or where
    ``train.graph_acting`` cannot apply; a bad value names the choices."""
    assert not _resolved() and not _resolved("train.graph_env_step=false")
    assert _resolved("train.graph_env_step=true") and _resolved("train.graph_env_step=auto")
    assert not _resolved("train.graph_env_step=auto", "env.vector=sync")
    with pytest.raises(ValueError, match="graph_env_step=true cannot apply: the training device"):
        _resolved("train.graph_env_step=true", device="cpu")
    with pytest.raises(ValueError, match="env.vector is sync, not batched"):
        _resolved("train.graph_env_step=true", "env.vector=sync")
    overlap = "train.overlap acts in a second thread"
    with pytest.raises(ValueError, match=overlap):
        _resolved("train.graph_env_step=true", why_acting=overlap)
    with pytest.raises(ValueError, match="train.graph_env_step must be one of auto, true, false"):
        tiny_config(*BATCHED, "train.graph_env_step=maybe")
    s = setup(tiny_config(*BATCHED))
    s.envs.close()
    assert not s.graph_env_step


def _graph(recorder: EagerRecorder, warmup_calls: int = 1) -> tuple[RolloutGraph, BatchedEnv]:
    """A :class:`RolloutGraph` of 4 PassiveVisualMatch envs (reset, seed 0) and a tiny
    policy, on the CPU."""
    env_id, env_kwargs = ENVS[0]
    envs = make_batched_env(env_id, 4, env_kwargs=env_kwargs)
    envs.reset(seed=0)
    config = tiny_config(f"env.id={env_id}")
    space = envs.single_observation_space
    torch.manual_seed(0)
    policy = build_policy(config, int(envs.single_action_space.n), observation_shape(space))
    return RolloutGraph(policy, envs, recorder, warmup_calls=warmup_calls), envs


def test_loading_a_carry_copies_its_state_and_starts_into_the_static_tensors():
    """:meth:`RolloutGraph.load` writes the carry's state and starts into the tensors the
    recording reads (the same tensors, new values); a carry whose observation is a copy of
    the env's is refused in one line, the static tensors left as they were."""
    from memcores.agents.acting import RolloutCarry

    graph, envs = _graph(EagerRecorder())
    state, starts = graph.state, graph.starts
    values = tuple(torch.arange(s.numel(), dtype=s.dtype).view(s.shape) + 1 for s in state)
    flags = torch.tensor([False, True, False, True])
    graph.load(RolloutCarry(envs.obs, flags, values))
    assert graph.state is state and graph.starts is starts
    assert all(torch.equal(s, v) for s, v in zip(graph.state, values, strict=True))
    assert graph.starts.tolist() == [False, True, False, True]
    copied = {k: v.clone() for k, v in envs.obs.items()}
    zeros = tuple(torch.zeros_like(s) for s in state)
    with pytest.raises(ValueError, match="^the carry's observation is not the env's own tensors$"):
        graph.load(RolloutCarry(copied, torch.ones(4, dtype=torch.bool), zeros))
    assert all(torch.equal(s, v) for s, v in zip(graph.state, values, strict=True))
    assert graph.starts.tolist() == [False, True, False, True]


class _FailingRecorder(EagerRecorder):
    """A recorder whose recording raises (as a CUDA graph capture can)."""

    def record(self, fn, settings):  # noqa: ANN001, ANN201
        raise RuntimeError("capture refused here\nsecond line of the error")


def test_priming_refuses_a_failed_recording_after_the_warm_up_steps():
    """With a recording that fails, priming takes its warm-up steps and the eager step the
    failed recording falls back to, warns once, then raises naming the failure in one line;
    every later step is eager (no replay)."""
    from memcores.agents.acting import RolloutCarry

    graph, envs = _graph(_FailingRecorder(), warmup_calls=2)
    carry = RolloutCarry(envs.obs, torch.ones(4, dtype=torch.bool), graph.state)
    failure = "RuntimeError: capture refused here"
    with pytest.warns(RuntimeWarning, match="recording failed"):
        with pytest.raises(
            RuntimeError, match=rf"^train\.graph_env_step: recording failed \({failure}\)$"
        ):
            graph.prime(carry)
    assert graph.failure == failure and envs._steps == 3 and graph.replays == 0
    step = graph()
    assert graph.replays == 0 and envs._steps == 4
    assert torch.equal(graph.starts, step.done)
