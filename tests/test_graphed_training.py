"""The trainers' CUDA-graph switch (``core.cuda_graph``, :func:`cores.graphed.maybe_graphed`).

Without a GPU the rule is tested with the device given as a string (``"cuda"`` builds no CUDA
tensor) and the capture replaced by the eager module it would record, as in
``tests/test_graphed.py``: which cores get wrapped, that bad values stop before anything is
written, and that a wrapped model's checkpoints are an unwrapped model's (same keys, same
values), so a run trained with graphs on a GPU resumes or evaluates on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents import rl_trainer, supervised
from memcores.agents.checkpoint import load_checkpoint
from memcores.agents.policy import ActorCriticCores, RecurrentActorCritic
from memcores.agents.supervised_config import SupervisedConfig
from memcores.cores import CORES, make_core
from memcores.cores.graphed import GraphedCore, maybe_graphed
from memcores.experiments.cli import main
from memcores.experiments.config import ConfigError, load_config

SMALL_COPY = [
    "task.name=copy",
    "task.length=4",
    "task.n_tokens=2",
    "task.alphabet=3",
    "core.name=janet",
    "core.hidden_size=8",
    "train.batch_size=8",
    "train.eval_size=8",
    "train.eval_every=2",
    "train.log_every=1",
    "train.threads=1",
    "train.progress=false",
    "run.tensorboard=false",
]


@pytest.fixture
def fake_capture(monkeypatch) -> list[tuple]:
    """Capture replaced by the eager module (shapes recorded), ``graphable`` as on CUDA:
    with autograd on and more than one step."""
    captured: list[tuple] = []

    def capture(module, samples, allow_unused_input=False):
        captured.append(tuple(s.shape for s in samples))
        return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    monkeypatch.setattr(
        GraphedCore, "graphable", lambda self, x: torch.is_grad_enabled() and x.shape[0] > 1
    )
    return captured


@pytest.mark.parametrize("value", ["auto", "true", "false", True, False, "FALSE"])
def test_the_switch_takes_auto_true_false(value) -> None:
    config = load_config(SupervisedConfig, None, [f"core.cuda_graph={value}"])
    assert str(config.core.cuda_graph).lower() == str(value).lower()


@pytest.mark.parametrize("value", ["sometimes", "2", "[1]"])
def test_a_bad_switch_value_names_the_choices(value) -> None:
    with pytest.raises(ConfigError, match="core.cuda_graph must be one of auto, true, false"):
        load_config(SupervisedConfig, None, [f"core.cuda_graph={value}"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("core.cuda_graph=maybe", "core.cuda_graph must be one of auto, true, false, got 'maybe'"),
        ("core.cuda_graph=true", "core.cuda_graph=true cannot apply: the training device is cpu"),
    ],
)
def test_the_command_stops_on_the_switch_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, override: str, message: str
) -> None:
    run = tmp_path / "run"
    args = [
        "supervised",
        "experiments/configs/demo_copy.yaml",
        f"run.dir={run}",
        "train.device=cpu",
    ]
    assert main([*args, override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not run.exists()


@pytest.mark.parametrize("name", sorted(CORES))
def test_only_capturable_cores_on_cuda_are_wrapped(name) -> None:
    core = make_core(name, 4, 8)
    wrapped = maybe_graphed(core, "cuda")
    assert isinstance(wrapped, GraphedCore) == core.graph_safe
    if core.graph_safe:
        assert wrapped.core is core
        assert maybe_graphed(wrapped, "cuda") is wrapped  # never wrapped twice
    else:
        assert wrapped is core
    for device, choice in (("cpu", "auto"), ("cpu", "false"), ("cuda", "false"), ("meta", "auto")):
        assert maybe_graphed(core, device, choice) is core


def test_true_insists_and_says_why_it_cannot() -> None:
    with pytest.raises(ValueError, match="cannot apply: the training device is cpu, not CUDA"):
        maybe_graphed(make_core("janet", 4, 8), "cpu", True)
    with pytest.raises(ValueError, match="GatedLSTM cannot be captured in a CUDA graph"):
        maybe_graphed(make_core("lstm", 4, 8), "cuda", "true")
    assert isinstance(
        maybe_graphed(make_core("nru", 4, 8), torch.device("cuda:0"), True), GraphedCore
    )


def test_the_actor_and_critic_cores_are_wrapped_in_place() -> None:
    pair = ActorCriticCores("rel_lstm", 6, 8, {})
    assert maybe_graphed(pair, "cuda") is pair
    assert isinstance(pair.actor_core, GraphedCore) and isinstance(pair.critic_core, GraphedCore)
    fused = ActorCriticCores("lstm", 6, 8, {})
    assert maybe_graphed(fused, "cuda") is fused and not isinstance(fused.actor_core, GraphedCore)


@pytest.mark.parametrize("separate_critic", [False, True])
def test_a_wrapped_policy_keeps_its_state_dict_keys(separate_critic) -> None:
    torch.manual_seed(0)
    plain = RecurrentActorCritic(5, "janet", 8, separate_critic=separate_critic)
    torch.manual_seed(1)
    wrapped = RecurrentActorCritic(5, "janet", 8, separate_critic=separate_critic)
    wrapped.core = maybe_graphed(wrapped.core, "cuda")
    assert any(isinstance(m, GraphedCore) for m in wrapped.modules())
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    wrapped.load_state_dict(plain.state_dict())  # strict, both ways
    for (key, a), b in zip(wrapped.state_dict().items(), plain.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=key)
    plain.load_state_dict(wrapped.state_dict())
    # the parameters the optimiser sees are the same tensors, in the same order
    assert [p.shape for p in wrapped.parameters()] == [p.shape for p in plain.parameters()]


def test_diagnostics_read_through_the_wrapper() -> None:
    core = make_core("janet", 4, 8)
    torch.testing.assert_close(
        supervised.forget_log_timescales(maybe_graphed(core, "cuda")),
        supervised.forget_log_timescales(core),
    )


def _train(run: Path, steps: int, resume: bool = False) -> dict:
    config = load_config(
        SupervisedConfig, None, [*SMALL_COPY, f"run.dir={run}", f"train.steps={steps}"]
    )
    supervised.train(config, resume=resume)
    return load_checkpoint(next(p for p in sorted(run.rglob("*.pt")) if "init" not in p.name))


def test_a_run_trained_through_graphs_resumes_without_them(
    tmp_path: Path, monkeypatch, fake_capture
) -> None:
    """The supervised trainer on a (faked) CUDA device wraps the core, trains through the
    capture, and writes the checkpoint an eager run writes: a CPU resume continues it to the
    same weights as an eager run of the same length."""
    straight = _train(tmp_path / "eager", 4)
    assert fake_capture == []  # on the CPU nothing is wrapped

    real = maybe_graphed
    wrapped_cores = []

    def on_cuda(core, device, choice="auto"):
        out = real(core, "cuda", choice)
        wrapped_cores.append(out)
        return out

    monkeypatch.setattr(supervised, "maybe_graphed", on_cuda)
    first = _train(tmp_path / "graphed", 2)
    assert isinstance(wrapped_cores[0], GraphedCore) and fake_capture  # trained through it
    assert list(first["model"]) == list(straight["model"])

    monkeypatch.setattr(supervised, "maybe_graphed", real)  # the resume: eager, on the CPU
    resumed = _train(tmp_path / "graphed", 4, resume=True)
    for key, value in straight["model"].items():
        torch.testing.assert_close(resumed["model"][key], value, msg=key)


def test_rl_setup_refuses_true_on_the_cpu() -> None:
    with pytest.raises(ValueError, match="core.cuda_graph=true cannot apply: the training device"):
        rl_trainer.setup(tiny_config("core.name=janet", "core.cuda_graph=true"))


def test_an_rl_run_updates_through_the_graphs_and_saves_the_eager_layout(
    tmp_path: Path, monkeypatch, fake_capture
) -> None:
    """PPO on a (faked) CUDA learner: the update's fixed ``[seq_len, chunks]`` calls go
    through the capture, acting stays eager, and the run ends with the weights and the
    checkpoint keys of the same run without graphs."""
    config = ("core.name=janet", "train.checkpoint_every=1")
    rl_trainer.train(tiny_config(*config), tmp_path / "eager")
    assert fake_capture == []
    real = maybe_graphed
    monkeypatch.setattr(
        rl_trainer, "maybe_graphed", lambda core, device, choice: real(core, "cuda", choice)
    )
    rl_trainer.train(tiny_config(*config), tmp_path / "graphed")
    assert fake_capture and all(shape[0][0] == 8 for shape in fake_capture)  # seq_len steps
    eager, graphed = (
        torch.load(tmp_path / run / "checkpoints/last.pt", weights_only=True)["model"]
        for run in ("eager", "graphed")
    )
    assert list(graphed) == list(eager)
    for key, value in eager.items():
        torch.testing.assert_close(graphed[key], value, msg=key)


def test_a_failed_capture_warns_once_and_the_core_runs_eagerly(monkeypatch) -> None:
    """A capture that fails on the GPU (an operation CUDA graphs refuse) does not stop a
    training run: one warning names the core and the error, and every later call is eager."""
    attempts = []

    def failing(module, samples, allow_unused_input=False):
        attempts.append(1)
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", failing)
    monkeypatch.setattr(GraphedCore, "graphable", lambda self, x: True)
    torch.manual_seed(0)
    core = make_core("um_lstm", 4, 8)
    wrapped = maybe_graphed(core, "cuda")
    x = torch.randn(5, 3, 4)
    with pytest.warns(
        RuntimeWarning, match="OrderedLSTM: the step loop: recording failed .*runs eagerly"
    ):
        y, _ = wrapped(x, wrapped.initial_state(3))
    torch.testing.assert_close(y, core(x, core.initial_state(3))[0])
    assert wrapped.capture_error.startswith("RuntimeError: CUDA error")
    y.sum().backward()
    wrapped(x[:2], wrapped.initial_state(3))  # another shape: not tried again
    assert len(attempts) == 1
