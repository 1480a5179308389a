"""Acting steps replayed from a recording (``train.graph_acting``, agents/acting_graph.py).

On a CPU the recording is the eager recorder (the same static inputs, run again at each
replay), which checks the bookkeeping; on a GPU (``pytest -m cuda``) the same tests record
CUDA graphs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rl_helpers import evaluate_chunks, tiny_config

from memcores.agents.acting import act
from memcores.agents.acting_graph import ActingGraph
from memcores.agents.device import acting_device, describe_acting
from memcores.agents.rl_trainer import acting_policy, graph_obstacles, setup
from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
from memcores.cores import CORES
from memcores.cores.graphed import CudaRecorder, EagerRecorder, graph_switch


def _rollout(device: str, graphed: bool, core: str = "ur_lstm"):
    """Two rollouts of 2 envs x 32 steps (episodes of at most 20 steps: resets inside),
    acting eagerly or through an :class:`ActingGraph`; the setup, buffer and graph."""
    s = setup(tiny_config(f"core.name={core}", f"train.device={device}"))
    n = s.config.env.n_envs
    state = s.policy.initial_state(n, s.device)
    buffer = RolloutBuffer(obs_shapes(s.envs.single_observation_space), 32, n, 8, state, s.device)
    graph = None
    if graphed:
        recorder = CudaRecorder() if device == "cuda" else EagerRecorder()
        graph = ActingGraph(s.policy, recorder, warmup_calls=2)
    torch.manual_seed(3)
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    carry = collect_rollout(s.policy, s.envs, buffer, carry, acting=graph)
    carry = collect_rollout(s.policy, s.envs, buffer, carry, acting=graph)
    s.envs.close()
    return s, buffer, graph


def test_replayed_acting_collects_what_the_policy_computes(device):
    """Through the replays (after two warm-up steps), every stored log-probability and value
    is what the policy computes for the stored actions over the chunks, resets included; on a
    CPU the rollout is the eager one, draw for draw."""
    s, buffer, graph = _rollout(device, graphed=True)
    assert graph.failure is None and graph.replays == 2 * 32 - 2
    assert buffer.starts[1:].any()  # episodes ended inside the rollout
    with torch.no_grad():
        batch = buffer.chunks()
        logprobs, _, values = evaluate_chunks(s.policy.eval(), batch)
    torch.testing.assert_close(logprobs, batch.logprobs, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(values, batch.values, atol=1e-5, rtol=1e-4)
    if device == "cpu":
        _, eager, _ = _rollout(device, graphed=False)
        for name in ("actions", "logprobs", "values", "rewards", "starts"):
            torch.testing.assert_close(getattr(buffer, name), getattr(eager, name), rtol=0, atol=0)
        for got, want in zip(buffer.chunk_states, eager.chunk_states, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_each_input_shape_gets_its_own_recording():
    """Env groups of two sizes: one recording each, each replaying its own inputs."""
    s = setup(tiny_config("core.name=lstm"))
    s.envs.close()
    policy = s.policy.eval()
    graph = ActingGraph(policy, EagerRecorder(), warmup_calls=1)
    rng = np.random.default_rng(0)
    for n in (2, 3, 2, 3):
        obs = {
            key: torch.from_numpy(rng.integers(0, 3, (1, n, *space.shape)).astype(space.dtype))
            for key, space in s.envs.single_observation_space.spaces.items()
        }
        state = tuple(torch.randn_like(t) for t in policy.initial_state(n))
        starts = torch.tensor([True] + [False] * (n - 1))
        torch.manual_seed(n)
        got = graph(obs, state, starts)
        torch.manual_seed(n)
        want = act(policy, obs, state, starts)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert len(graph._shapes) == 2 and graph.replays == 2


@pytest.mark.parametrize("core", sorted(CORES))
def test_every_cores_acting_step_reads_nothing_back_to_the_host(core):
    """The acting step (encoders with the mission, the core's step with its reset, heads,
    sampling) on ``meta`` tensors, which hold no values: ``.item()``, ``bool()`` or
    ``nonzero`` raise there, as a read of the device from the host breaks a recording."""
    s = setup(tiny_config(f"core.name={core}", "env.id=MiniGrid-MemoryS7-v0"))
    s.envs.close()
    policy = s.policy.to("meta").eval()
    n = 3
    obs = {
        key: torch.zeros(
            (1, n, *space.shape),
            device="meta",
            dtype=torch.from_numpy(np.zeros(0, space.dtype)).dtype,
        )
        for key, space in s.envs.single_observation_space.spaces.items()
    }
    out = act(
        policy,
        obs,
        policy.initial_state(n, "meta"),
        torch.zeros(n, dtype=torch.bool, device="meta"),
    )
    assert out.actions.shape == (n,) and out.values.shape == (n,)


def test_graph_acting_acts_on_the_gpu_learner_at_any_number_of_envs():
    assert acting_device("cuda", 8) == torch.device("cpu")
    assert acting_device("cuda", 8, graphed=True) == torch.device("cuda")
    assert acting_device("cpu", 8, graphed=True) == torch.device("cpu")
    assert describe_acting("cuda", 8, graphed=True) == "acting on cuda through CUDA graphs (8 envs)"
    s = setup(tiny_config("core.hidden_size=8"))
    s.envs.close()
    meta = s.policy.to("meta")  # a stand-in for a GPU learner: acting_policy only moves it
    assert acting_policy(meta, torch.device("meta"), n_envs=2, graphed=True) is meta


def _switch(config, device, policy) -> bool:
    """``train.graph_acting`` resolved as :func:`agents.rl_trainer.setup` does."""
    _, why_acting = graph_obstacles(config, device, policy, None)
    return graph_switch(config.train.graph_acting, "train.graph_acting", why_acting)


def test_graph_acting_is_on_by_default_for_a_cuda_learner_that_can_record_its_step():
    """``auto`` (the default): a CUDA learner without overlap acts through graphs, unless its
    core reads its state on the host (``mem_lstm``, whose step would fall back to eager GPU
    steps); a CPU learner never; ``false`` turns it off; ``true`` is refused, with the reason,
    where it cannot apply; a bad value names the choices."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def on(device, *overrides, core="lstm"):
        s = setup(tiny_config(f"core.name={core}", "core.hidden_size=8"))  # a CPU learner
        s.envs.close()
        config = tiny_config(f"core.name={core}", "core.hidden_size=8", *overrides)
        return _switch(config, device, s.policy)

    assert on(cuda) and not on(cpu)
    assert not on(cuda, "train.overlap=true") and not on(cuda, "train.graph_acting=false")
    assert not on(cuda, core="mem_lstm")
    assert on(cuda, "train.graph_acting=true")
    with pytest.raises(ValueError, match="train.graph_acting=true cannot apply: the training"):
        on(cpu, "train.graph_acting=true")
    with pytest.raises(ValueError, match="train.overlap acts in a second thread"):
        on(cuda, "train.graph_acting=true", "train.overlap=true")
    with pytest.raises(ValueError, match="MemLSTM reads its state on the host"):
        on(cuda, "train.graph_acting=true", core="mem_lstm")
    with pytest.raises(ValueError, match="train.graph_acting must be one of auto, true, false"):
        tiny_config("train.graph_acting=sometimes")


def test_a_training_run_acts_through_the_graph_and_ends_as_the_eager_run(tmp_path, monkeypatch):
    """``train.graph_acting=true`` on a (faked) CUDA learner: every acting step goes through
    the recording and the run ends with the eager run's weights."""
    from memcores.agents import rl_trainer

    config = ("core.name=ur_lstm", "train.checkpoint_every=1")
    rl_trainer.train(tiny_config(*config), tmp_path / "eager")
    graphs: list[ActingGraph] = []

    def eager_graph(policy):
        graphs.append(ActingGraph(policy, EagerRecorder()))
        return graphs[-1]

    monkeypatch.setattr(rl_trainer, "ActingGraph", eager_graph)
    # a (faked) CUDA learner for acting only: the update stays eager
    monkeypatch.setattr(rl_trainer, "graph_obstacles", lambda *args: ("not faked", None))
    rl_trainer.train(tiny_config(*config, "train.graph_acting=true"), tmp_path / "graphed")
    # 2 updates x 32 steps, the first 3 warming up
    assert len(graphs) == 1 and graphs[0].replays == 2 * 32 - 3
    eager, graphed = (
        torch.load(tmp_path / run / "checkpoints/last.pt", weights_only=True)["model"]
        for run in ("eager", "graphed")
    )
    for key, value in eager.items():
        torch.testing.assert_close(graphed[key], value, rtol=0, atol=0, msg=key)
