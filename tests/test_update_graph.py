"""The PPO update replayed from a recording (``train.graph_update``, agents/update_graph.py).

On a CPU the recording is :class:`EagerRecorder` (the same static buffers, index and
optimiser settings as a CUDA graph, run again at each replay), which checks the bookkeeping;
on a GPU (``pytest -m cuda``) the same tests record real CUDA graphs. That a replay trains
as the eager update does is checked here, not in each training run.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents import ppo
from memcores.agents.ppo import update
from memcores.agents.rl_trainer import graph_obstacles, setup
from memcores.agents.rollout import RolloutBuffer, collect_rollout, obs_shapes, start_rollouts
from memcores.agents.update_graph import UpdateGraph, refusal
from memcores.cores.graphed import CudaRecorder, EagerRecorder, graph_switch

RATES = (2.0**-12, 2.0**-13)  # float32 numbers: the recorded rate is a float32 tensor


def _rollout(device: str, core: str = "ur_lstm", *extra: str):
    """A setup on ``device`` and a filled buffer with returns: 2 envs x 32 steps in chunks of
    8 (8 chunks; minibatches of 3 chunks, so each epoch ends with a smaller one)."""
    config = tiny_config(
        f"core.name={core}",
        f"train.device={device}",
        "agent.n_steps=32",
        "agent.seq_len=8",
        "agent.minibatch_size=24",
        "agent.n_epochs=2",
        *extra,
    )
    s = setup(config)
    n = config.env.n_envs
    state = s.policy.initial_state(n, s.device)
    buffer = RolloutBuffer(obs_shapes(s.envs.single_observation_space), 32, n, 8, state, s.device)
    carry = start_rollouts(s.policy, s.envs, 0, s.device)
    collect_rollout(s.policy, s.envs, buffer, carry)
    s.envs.close()
    buffer.compute_returns(
        torch.zeros(n, device=s.device),
        torch.zeros(n, dtype=torch.bool, device=s.device),
        0.99,
        0.95,
    )
    return s, buffer


def _recorder(device: str):
    return CudaRecorder() if device == "cuda" else EagerRecorder()


def _train(device: str, graph: UpdateGraph | None, monkeypatch, poison: bool = False):
    """Two updates at two learning rates; the weights, Adam's state and the stats."""
    monkeypatch.setattr(ppo, "rows_on_device", lambda _: True)  # the rows a graph returns
    s, buffer = _rollout(device)
    if poison:  # a non-finite return: the minibatches holding chunk 0 are skipped
        buffer.returns[0, 0] = float("nan")
    generator = torch.Generator().manual_seed(1)
    stats = []
    for lr in RATES:
        for group in s.optimizer.param_groups:
            group["lr"] = lr
        stats.append(update(s.policy, s.optimizer, buffer, s.config.agent, generator, graph))
    return s, stats


def _assert_same_training(a, b, exact: bool) -> None:
    tol = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": 1e-4, "atol": 1e-6}
    (sa, stats_a), (sb, stats_b) = a, b
    for key, value in sa.policy.state_dict().items():
        torch.testing.assert_close(sb.policy.state_dict()[key], value, **tol)
    state_a, state_b = sa.optimizer.state_dict()["state"], sb.optimizer.state_dict()["state"]
    for key, value in state_a.items():
        for name, tensor in value.items():
            torch.testing.assert_close(state_b[key][name], tensor, **tol)
    for x, y in zip(stats_a, stats_b, strict=True):
        assert (x.n_minibatches, x.skipped_updates) == (y.n_minibatches, y.skipped_updates)
        assert x.loss == pytest.approx(y.loss, rel=0 if exact else 1e-4, nan_ok=True)
        assert x.approx_kl == pytest.approx(y.approx_kl, rel=0 if exact else 1e-3, abs=1e-9)


@pytest.mark.parametrize("poison", [False, True])
def test_replayed_update_trains_as_the_eager_update(device, monkeypatch, poison):
    """Warm-up steps, one recording, replays at two learning rates and the smaller last
    minibatch of each epoch give the eager update's weights, Adam state and statistics
    (a non-finite minibatch skipped in both)."""
    eager = _train(device, None, monkeypatch, poison)
    graph = UpdateGraph(_recorder(device), warmup_steps=1)
    replayed = _train(device, graph, monkeypatch, poison)
    _assert_same_training(eager, replayed, exact=device == "cpu")
    assert graph.failure is None and graph.refused is None
    # per update: 2 epochs x (2 full minibatches + 1 smaller); the first full one warms up
    assert graph.replays == 2 * 4 - 1
    if poison:
        assert replayed[1][0].skipped_updates > 0


def test_a_recording_follows_the_rollout_and_a_replaced_optimiser_state(monkeypatch):
    """The rollout's new data reaches the replays (static buffers refilled); a resumed
    optimiser state (new tensors) or another minibatch size records again."""
    monkeypatch.setattr(ppo, "rows_on_device", lambda _: True)
    s, buffer = _rollout("cpu")
    agent = s.config.agent
    graph = UpdateGraph(EagerRecorder(), warmup_steps=1)
    update(s.policy, s.optimizer, buffer, agent, graph=graph)
    first = graph._recording
    assert first is not None and first.call.replay is not None
    buffer.advantages.mul_(-1.0)
    update(s.policy, s.optimizer, buffer, agent, graph=graph)
    assert graph._recording is first
    torch.testing.assert_close(first.static.advantages, buffer.chunks().advantages)
    s.optimizer.load_state_dict(copy.deepcopy(s.optimizer.state_dict()))  # a resume
    update(s.policy, s.optimizer, buffer, agent, graph=graph)
    assert graph._recording is not first
    second = graph._recording
    update(
        s.policy, s.optimizer, buffer, dataclasses.replace(agent, minibatch_size=16), graph=graph
    )
    assert graph._recording is not second and graph._recording.index.numel() == 2


def test_a_failed_recording_warns_once_and_trains_eagerly(monkeypatch):
    """A recording that raises (a host read inside the step on a GPU) leaves the update to
    the eager steps, with one warning, and the same training as never recording."""

    class Failing(EagerRecorder):
        def record(self, fn, settings):
            raise RuntimeError("operation not permitted when stream is capturing")

    eager = _train("cpu", None, monkeypatch)
    graph = UpdateGraph(Failing(), warmup_steps=1)
    with pytest.warns(RuntimeWarning, match="the update step: recording failed") as caught:
        failed = _train("cpu", graph, monkeypatch)
    assert len(caught) == 1 and graph.failure.startswith("RuntimeError: operation not")
    assert graph.replays == 0
    _assert_same_training(eager, failed, exact=True)
    for group in failed[0].optimizer.param_groups:  # the recording settings were undone
        assert isinstance(group["lr"], float) and group["capturable"] is False


class _Twice(EagerRecorder):
    """A recording whose replay takes the step twice: a replay that is not the eager step."""

    def record(self, fn, settings):
        def replay():
            with settings():
                fn()
                return fn()

        return replay


def test_a_replay_that_is_not_the_eager_step_fails_the_comparison(monkeypatch):
    """The comparison above has teeth: a recording whose replay computes something else than
    the eager step (here it takes the step twice, as a graph that froze a stale value would
    go astray) trains differently."""

    eager = _train("cpu", None, monkeypatch)
    twice = _train("cpu", UpdateGraph(_Twice(), warmup_steps=1), monkeypatch)
    with pytest.raises(AssertionError):
        _assert_same_training(eager, twice, exact=True)


def _switch(config, device, policy, optimizer) -> bool:
    """``train.graph_update`` resolved as :func:`agents.rl_trainer.setup` does."""
    why_update, _ = graph_obstacles(config, device, policy, optimizer)
    return graph_switch(config.train.graph_update, "train.graph_update", why_update)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (("agent.algo=a2c",), "A2C"),
        (("agent.optimizer=rmsprop",), "fused Adam"),
        (("agent.recon_coef=0.1",), "reconstruction"),
        (("core.name=hdetach_lstm",), "draws random numbers on the host"),
        (("core.name=mem_lstm",), "mem_lstm: its memory's width"),
    ],
)
def test_updates_a_graph_cannot_replay_are_refused(overrides, reason, monkeypatch):
    """Refused before anything is recorded; the update runs eagerly, and asking for it with
    ``train.graph_update=true`` is a one-line error."""
    config = tiny_config("core.hidden_size=8", *overrides)
    s = setup(config)
    s.envs.close()
    why = refusal(s.policy, s.optimizer, s.config.agent)
    assert why is not None and reason in why
    insist = tiny_config("core.hidden_size=8", *overrides, "train.graph_update=true")
    with pytest.raises(ValueError, match="train.graph_update=true cannot apply"):
        _switch(insist, torch.device("cuda"), s.policy, s.optimizer)


def test_graph_update_needs_a_cuda_device():
    s = setup(tiny_config("core.hidden_size=8"))
    s.envs.close()
    assert refusal(s.policy, s.optimizer, s.config.agent) is None
    insist = tiny_config("core.hidden_size=8", "train.graph_update=true")
    with pytest.raises(ValueError, match="the training device is cpu, not CUDA"):
        _switch(insist, torch.device("cpu"), s.policy, s.optimizer)


def test_graph_update_is_on_by_default_for_a_cuda_learner_whose_update_can_be_recorded():
    """``auto`` (the default): on for a CUDA learner without overlap whose update has no
    :func:`refusal`; off on a CPU, with overlap, for A2C or ``hdetach_lstm``, and with
    ``false``; ``true`` is checked (overlap included); a bad value names the choices."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def on(device, *overrides, core="lstm"):
        algo = [o for o in overrides if o.startswith("agent.")]
        s = setup(tiny_config(f"core.name={core}", "core.hidden_size=8", *algo))  # on the CPU
        s.envs.close()
        config = tiny_config(f"core.name={core}", "core.hidden_size=8", *overrides)
        return _switch(config, device, s.policy, s.optimizer)

    assert on(cuda) and on(cuda, core="ur_lstm") and not on(cpu)
    assert not on(cuda, "train.overlap=true") and not on(cuda, "train.graph_update=false")
    assert not on(cuda, "agent.algo=a2c") and not on(cuda, core="hdetach_lstm")
    assert on(cuda, "train.graph_update=true")
    with pytest.raises(ValueError, match="train.graph_update=true cannot apply"):
        on(cuda, "train.graph_update=true", core="hdetach_lstm")
    with pytest.raises(ValueError, match="train.overlap acts in a second thread"):
        on(cuda, "train.graph_update=true", "train.overlap=true")
    with pytest.raises(ValueError, match="train.graph_update must be one of auto, true, false"):
        tiny_config("train.graph_update=sometimes")


@pytest.mark.parametrize(
    "overrides",
    [
        ["experiments/configs/memory_s7.yaml", "train.graph_update=true"],
        ["experiments/configs/passive_visual_match.yaml", "env.vector=batched",
         "train.graph_env_step=true"],
    ],
    ids=["graph_update", "graph_env_step"],
)  # fmt: skip
def test_train_refuses_a_cuda_graph_switch_on_the_cpu(tmp_path, overrides):
    """``memcores train ... train.graph_update=true`` (or ``train.graph_env_step=true``)
    without a GPU: exit 2, one line, no traceback, no run folder."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable, "-m", "memcores", "train", *overrides,
            "train.device=cpu", f"run.dir={run_dir}",
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{overrides[-1]} cannot apply: the training device is cpu" in proc.stderr
    assert "Traceback" not in proc.stderr and not run_dir.exists()


def test_a_training_run_replays_its_updates_and_ends_as_the_eager_run(tmp_path, monkeypatch):
    """``memcores train ... train.graph_update=true`` on a (faked) CUDA learner: every update
    goes through the recording, and the run ends with the eager run's weights (the recorded
    rate is float32, hence the tolerance)."""
    from memcores.agents import rl_trainer

    config = ("core.name=ur_lstm", "agent.minibatch_size=16", "train.checkpoint_every=1")
    rl_trainer.train(tiny_config(*config), tmp_path / "eager")
    graphs: list[UpdateGraph] = []

    def eager_graph() -> UpdateGraph:
        graphs.append(UpdateGraph(EagerRecorder()))
        return graphs[-1]

    monkeypatch.setattr(rl_trainer, "UpdateGraph", eager_graph)
    # a (faked) CUDA learner for the update only: acting stays eager
    monkeypatch.setattr(rl_trainer, "graph_obstacles", lambda *args: (None, "not faked"))
    rl_trainer.train(tiny_config(*config, "train.graph_update=true"), tmp_path / "graphed")
    # 2 updates x 2 epochs x 4 minibatches of 2 chunks, the first 3 steps warming up
    assert len(graphs) == 1 and graphs[0].replays == 2 * 2 * 4 - 3
    eager, graphed = (
        torch.load(tmp_path / run / "checkpoints/last.pt", weights_only=True)["model"]
        for run in ("eager", "graphed")
    )
    for key, value in eager.items():
        torch.testing.assert_close(graphed[key], value, msg=key)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="records CUDA graphs: needs a GPU")
@pytest.mark.parametrize(
    "core",
    [
        "ur_lstm",  # the fused Triton LSTM kernel
        "lstm",  # cuDNN
        "slstm",  # the fused Triton sLSTM kernel
        "janet",  # a step loop, itself graphed (core.cuda_graph) outside the update's capture
        "rel_lstm",  # relevancy screening over a window of past states
        "min_gru",  # a parallel scan
    ],
)
def test_a_cuda_training_run_with_both_graphs_records_them_without_falling_back(
    core, tmp_path, monkeypatch
):
    """On a GPU, by default (``train.graph_acting`` and ``train.graph_update`` ``auto``): a
    run acts and updates through CUDA graphs, records both, replays the update's steps, never
    warns that one fell back to eager steps, and learns finite numbers."""
    from memcores.agents import rl_trainer

    graphs: list[UpdateGraph] = []

    def tracked(*args, **kwargs):
        graphs.append(UpdateGraph(*args, **kwargs))
        return graphs[-1]

    monkeypatch.setattr(rl_trainer, "UpdateGraph", tracked)
    config = tiny_config(f"core.name={core}", "train.device=cuda", "agent.minibatch_size=16")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*recording failed")
        result = rl_trainer.train(config, tmp_path / "run")
    assert result.global_step == 128
    assert all(math.isfinite(row["train/loss"]) for row in result.history)
    assert len(graphs) == 1 and graphs[0].failure is None and graphs[0].replays > 0


@pytest.mark.parametrize(
    ("env_id", "core"),
    [
        ("MiniGrid-MemoryS7-v0", "janet"),  # image, direction and mission; a step-loop core
        ("MiniGrid-MemoryS7-v0", "min_gru"),  # a scan core
        ("popgym/RepeatPreviousEasy-v0", "lru"),  # vector observations
    ],
)
def test_the_recorded_step_reads_nothing_back_to_the_host(env_id, core, monkeypatch):
    """What a recording holds besides the core's kernel and Adam (PyTorch's, capturable):
    encoders, heads, the PPO loss, backward and clipping, run on ``meta`` tensors, which hold
    no values (``.item()``, ``bool()``, ``nonzero`` raise), as the host sees a GPU while a
    graph records (the step loops take every step as a reset step, as during a capture)."""
    import numpy as np

    import memcores.cores.rel_lstm  # noqa: F401  (imported before the patch, it keeps the real one)
    from memcores.agents.ppo import _backward, loss_row, minibatch_loss, ppo_loss
    from memcores.agents.rollout import ChunkBatch

    monkeypatch.setattr("memcores.cores.base.capturing", lambda like: True)
    kwargs = "env.kwargs={}" if env_id.startswith("popgym") else "env.kwargs.max_steps=20"
    config = tiny_config(f"env.id={env_id}", kwargs, f"core.name={core}", "core.cuda_graph=false")
    s = setup(config)
    s.envs.close()
    policy = s.policy.to("meta")
    L, M = 8, 3
    obs = {
        key: torch.zeros(
            (L, M, *space.shape),
            device="meta",
            dtype=torch.from_numpy(np.zeros(0, space.dtype)).dtype,
        )
        for key, space in s.envs.single_observation_space.spaces.items()
    }

    def zeros(dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(L, M, dtype=dtype, device="meta")

    state = policy.initial_state(M, "meta")
    mb = ChunkBatch(obs, zeros(torch.bool), zeros(torch.long), *(zeros() for _ in range(4)), state)
    terms = minibatch_loss(policy, mb, config.agent, ppo_loss)
    params = list(policy.parameters())
    grad_norm = _backward(s.optimizer, terms.loss, params, config.agent.max_grad_norm)
    row = loss_row(terms, grad_norm, on_device=True)
    assert row.shape == (8,) and all(p.grad is not None for p in params)
