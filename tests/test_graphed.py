"""Recording and replaying a call (:mod:`cores.graphed`), and the step-loop cores through it.

Without a GPU the bookkeeping is checked with the eager recorder (which replays by running
the call again): warm-up, one recording, replays, the one-line fallback; which cores declare
themselves capturable, and that those cores' forward and backward read nothing back to the
host while a capture is under way (run on ``meta`` tensors, which hold no values: any host
read fails). Replaying real graphs is checked where CUDA is present (``pytest -m cuda``).
"""

from __future__ import annotations

import pytest
import torch

import memcores.cores.rel_lstm  # noqa: F401  (before a test patches cores.base.capturing, see below)
from memcores.cores import CORES, make_core
from memcores.cores.graphed import (
    EagerRecorder,
    GraphedCore,
    RecordedCall,
    maybe_graphed,
    recorded_call,
)

T, B, D, H = 9, 3, 4, 8
GRAPH_SAFE = [
    "block_gru",
    "janet",
    "leaky_rnn",
    "linear_rnn",
    "mem_lstm",
    "nru",
    "o_lstm",
    "om_lstm",
    "or_lstm",
    "power_rnn",
    "rel_lstm",
    "rel_rnn",
    "um_lstm",
]


def _inputs(device: str = "cpu", dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, D, generator=gen, dtype=dtype).to(device)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[4, 0] = starts[0, 2] = True
    return x, starts.to(device)


def _capturing(monkeypatch) -> None:
    """The host as it sees a CUDA capture: ``cores.base.capturing`` says yes, and so does
    ``cores.rel_lstm``'s copy of it. ``cores.rel_lstm`` is imported at the top of this file:
    imported first while ``cores.base.capturing`` is patched, it would bind the patch as its
    own, and keep it after the test."""
    monkeypatch.setattr("memcores.cores.base.capturing", lambda like: True)
    monkeypatch.setattr("memcores.cores.rel_lstm.capturing", lambda like: True)


class _Counting(EagerRecorder):
    """The eager recorder, counting the recordings (by their samples' shapes)."""

    def __init__(self) -> None:
        self.recorded: list[tuple] = []

    def record_autograd(self, module, samples, settings):
        self.recorded.append(tuple(s.shape for s in samples))
        return super().record_autograd(module, samples, settings)


def _run(core, x, state, starts):
    core.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_(True)
    y, final = core(x, state, starts)
    (y.square().sum() + sum(f.float().sum() for f in final if f.is_floating_point())).backward()
    return [y.detach(), x.grad, *(p.grad for p in core.parameters() if p.grad is not None)]


def test_the_capturable_cores_are_the_step_loop_cores_without_a_fused_path() -> None:
    declared = sorted(n for n in CORES if make_core(n, D, H).graph_safe)
    assert declared == GRAPH_SAFE


def test_wrapping_an_uncapturable_core_is_refused_or_left_as_it_is() -> None:
    with pytest.raises(ValueError, match="MemLSTM cannot be captured in a CUDA graph"):
        GraphedCore(make_core("mem_lstm", D, H, on_full="error"))
    core = make_core("min_gru", D, H)
    assert maybe_graphed(core, "cuda") is core
    assert isinstance(maybe_graphed(make_core("janet", D, H), "cuda"), GraphedCore)
    wrapped = maybe_graphed(make_core("block_gru", D, H, layers=2), "cuda")
    assert (wrapped.has_step, wrapped.state_arity) == (False, 2)


@pytest.mark.parametrize("name", ["janet", "rel_lstm"])
def test_on_cpu_the_wrapper_is_the_core(name) -> None:
    torch.manual_seed(0)
    core = make_core(name, D, H).double()
    wrapped = GraphedCore(core)
    x, starts = _inputs()
    state = core.initial_state(B)
    assert not wrapped.graphable(x)
    for got, want in zip(
        _run(wrapped, x, state, starts), _run(core, x, state, starts), strict=True
    ):
        torch.testing.assert_close(got, want)
    assert [t.shape for t in wrapped.initial_state(B)] == [t.shape for t in state]
    y, _ = wrapped.step(x[0], state)
    assert y.shape == (B, H)


def test_a_recorded_call_warms_up_records_once_and_replays() -> None:
    """Eager warm-up calls in the recorder's context, one recording under its settings, then
    every call replays it."""
    events: list[str] = []

    class Logged(EagerRecorder):
        def warmup(self):
            events.append("warmup")
            return super().warmup()

        def record(self, fn, settings):
            events.append("record")
            return super().record(fn, settings)

    counter = torch.zeros(())

    def step() -> torch.Tensor:
        return counter.add_(1)

    call = recorded_call(step, Logged(), "the step", warmup_calls=2)
    for _ in range(5):
        call()
    assert events == ["warmup", "warmup", "record"]
    assert call.replays == 3 and call.failure is None and float(counter) == 5


def test_a_failed_recording_warns_once_in_one_line_and_the_call_runs_eagerly() -> None:
    def fail():
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    values = iter(range(10))
    call = RecordedCall(lambda: next(values), fail, "the step", warmup_calls=1)
    assert call() == 0  # warm-up
    with pytest.warns(RuntimeWarning, match="the step: recording failed") as caught:
        assert call() == 1
    assert [call(), call()] == [2, 3]  # eager from now on, no further warning
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert call.failure == "RuntimeError: operation not permitted when stream is capturing"
    assert call.replays == 0


def test_one_recording_per_shape_and_mode_and_the_oldest_dropped() -> None:
    """The wrapper's bookkeeping, through the eager recorder: one recording per (shape, dtype,
    grad flags, starts given, training), reused after, at most ``MAX_GRAPHS`` kept, and values
    and gradients those of the core."""
    from memcores.cores import graphed as graphed_module

    torch.manual_seed(0)
    core = make_core("janet", D, H).double()
    recorder = _Counting()
    wrapped = GraphedCore(core, recorder)
    captured = recorder.recorded
    x, starts = _inputs()
    state = core.initial_state(B)
    for got, want in zip(
        _run(wrapped, x, state, starts), _run(core, x, state, starts), strict=True
    ):
        torch.testing.assert_close(got, want)
    _run(wrapped, x + 1, state, ~starts)  # same shapes: replayed, not recorded again
    assert len(captured) == 1
    _run(wrapped, x, state, None)  # no starts: another recording
    wrapped.eval()
    _run(wrapped, x, state, starts)  # evaluation mode: another recording
    assert len(captured) == 3
    most = graphed_module.MAX_GRAPHS
    long_x = torch.randn(T + most, B, D, dtype=torch.float64)
    long_starts = torch.zeros(T + most, B, dtype=torch.bool)
    for steps in range(T + 1, T + 1 + most):  # one new shape each
        _run(wrapped, long_x[:steps], state, long_starts[:steps])
    assert len(wrapped._graphs) == graphed_module.MAX_GRAPHS
    assert len(captured) == 3 + graphed_module.MAX_GRAPHS
    wrapped.train()
    _run(wrapped, x, state, starts)  # the first recording was dropped: recorded again
    assert len(captured) == 4 + graphed_module.MAX_GRAPHS
    with torch.no_grad():  # acting: the core as it is, nothing recorded
        wrapped(x, state, starts)
    assert len(captured) == 4 + graphed_module.MAX_GRAPHS


@pytest.mark.parametrize("name", GRAPH_SAFE)
def test_capturable_cores_give_the_same_values_with_a_reset_at_every_step(
    name, monkeypatch
) -> None:
    """While capturing, the host cannot read ``starts``, so the masked reset runs at every
    step: values and gradients must not change."""
    torch.manual_seed(0)
    core = make_core(name, D, H).double()
    x, starts = _inputs()
    state = core.initial_state(B)
    want = _run(core, x, state, starts)
    key = core.graph_key(state)  # read before a capture, as GraphedCore does
    _capturing(monkeypatch)
    with core.recording(key):
        got = _run(core, x, state, starts)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("name", GRAPH_SAFE)
def test_capturable_cores_read_nothing_back_to_the_host(name, monkeypatch) -> None:
    """Forward and backward on ``meta`` tensors (no values: ``.item()``, ``bool()`` or
    ``.tolist()`` of a tensor raise) while a capture is simulated."""
    _capturing(monkeypatch)
    core = make_core(name, D, H).to("meta")
    x, starts = (t.to("meta") for t in _inputs(dtype=torch.float32))
    state = core.initial_state(B, "meta")
    with core.recording(5):  # a width for mem_lstm: meta tensors hold no count to read
        y, final = core(x.requires_grad_(True), state, starts)
    y.sum().backward()
    assert y.shape == (T, B, H) and x.grad.shape == x.shape


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="replaying a CUDA graph needs CUDA")
@pytest.mark.parametrize("name", ["janet", "o_lstm", "rel_lstm", "block_gru"])
def test_graph_replays_match_eager_on_cuda(name) -> None:
    """Two replays with different inputs and resets: values and gradients as eager."""
    torch.manual_seed(0)
    core = make_core(name, D, H).cuda()
    wrapped = GraphedCore(core)
    for seed in range(3):
        x, starts = _inputs("cuda", torch.float32)
        x = x + seed
        starts = starts.roll(seed, 0)
        state = core.initial_state(B, "cuda")
        assert wrapped.graphable(x)
        got = _run(wrapped, x, state, starts)
        want = _run(core, x, state, starts)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert len(wrapped._graphs) == 1


def test_capture_runs_with_the_collector_paused_after_collecting_dead_graphs(monkeypatch) -> None:
    """A dead object held in a reference cycle (as a dropped CUDA graph can be) is collected
    before the capture starts, the cyclic collector stays off while it records (destroying a
    graph mid-capture breaks the capture), and is back on afterwards, also when the capture
    fails."""
    import gc
    import weakref

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    seen = []

    def fake_capture(module, samples, allow_unused_input=False):
        seen.append((gc.isenabled(), dead()))
        if len(seen) == 2:
            raise RuntimeError("capture failed")
        return module

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_capture)
    monkeypatch.setattr(GraphedCore, "graphable", lambda self, x: True)
    assert gc.isenabled()
    wrapped = GraphedCore(make_core("janet", D, H).double())
    x, starts = _inputs()
    gc.disable()  # keep the cycle alive until the capture's own collection
    dead = weakref.ref(Cycle())
    gc.enable()
    assert dead() is not None
    _run(wrapped, x, wrapped.initial_state(B), starts)
    assert seen == [(False, None)]
    assert gc.isenabled()
    with pytest.warns(RuntimeWarning, match="the step loop: recording failed"):
        _run(wrapped, x[:3], wrapped.initial_state(B), starts[:3])
    assert seen[1][0] is False and gc.isenabled()


def test_mem_lstm_records_one_graph_per_memory_width(monkeypatch) -> None:
    """Recorded, ``mem_lstm`` attends to its fullest row's stored columns rounded up to a power
    of two, read on the host once per call: one graph per width, each giving the eager values
    (which attend to the exact columns) for every state up to it; a recording without its
    width is an error."""
    captured = []

    class Capturing(EagerRecorder):
        """A "graph" that runs the module as a capture would, at every replay: the host
        cannot read the state, so the core takes the width recorded with it."""

        def record_autograd(self, module, samples, settings):
            with settings():
                captured.append(module.core._recorded_columns)

            def replay(*args):
                with monkeypatch.context() as m, settings():
                    _capturing(m)
                    return module(*args)

            replay(*samples)
            return replay

    torch.manual_seed(0)
    core = make_core("mem_lstm", D, H, max_len=16).double()
    wrapped = GraphedCore(core, Capturing())
    x, starts = _inputs()
    empty = core.initial_state(B)
    for steps, width in ((0, 0), (3, 4), (4, 4), (5, 8), (9, 16), (20, 16)):
        state = empty
        if steps:  # a memory holding `steps` states in its fullest row
            with torch.no_grad():
                _, state = core(torch.randn(steps, B, D, dtype=torch.float64), empty)
        assert core.graph_key(state) == width
        for got, want in zip(
            _run(wrapped, x, state, starts), _run(core, x, state, starts), strict=True
        ):
            torch.testing.assert_close(got, want)
    assert captured == [0, 4, 8, 16]  # widths 4 and 16 recorded once each
    with monkeypatch.context() as m:
        m.setattr("memcores.cores.rel_lstm.capturing", lambda like: True)
        with pytest.raises(RuntimeError, match="reads its memory's width on the host"):
            core(x, empty, starts)
