"""Tests of the streaming online trainer: same gradients as ``grad="online"``, resets, misuse."""

from __future__ import annotations

import json

import pytest
import torch

from memcores.agents.online import StreamingOnlineTrainer
from memcores.cores.lru import LRUCore

T, B, D_IN, H, N = 9, 3, 4, 8, 5


def _setup(layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    core = LRUCore(D_IN, H, state_size=N, layers=layers, r_min=0.4, grad="online").double()
    decoder = torch.nn.Linear(H, 2).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(T, B, D_IN, dtype=torch.float64, generator=g)
    target = torch.randn(T, B, 2, dtype=torch.float64, generator=g)
    return core, decoder, x, target


def _params(core, decoder):
    return [*core.named_parameters(), *(("dec." + n, p) for n, p in decoder.named_parameters())]


def _loss_at(target, t, out):
    # Targets only on the second half, like a copy task's recall phase.
    if t < T // 2:
        return None
    return ((out - target[t]) ** 2).mean(-1).sum()


@pytest.mark.parametrize("with_starts", [False, True])
def test_streaming_equals_online_mode(with_starts: bool) -> None:
    core, decoder, x, target = _setup()
    starts = torch.zeros(T, B, dtype=torch.bool)
    if with_starts:
        starts[3, 0] = starts[6, 2] = True
    # Sequence-level online mode with one loss.backward().
    core.train()
    y, _ = core(x, core.initial_state(B), starts)
    out = decoder(y)
    seq_loss = sum(_loss_at(target, t, out[t]) for t in range(T) if t >= T // 2)
    seq_loss.backward()
    ref = {n: p.grad.clone() for n, p in _params(core, decoder)}
    for _, p in _params(core, decoder):
        p.grad = None
    # Streaming, one step at a time.
    trainer = StreamingOnlineTrainer(core, decoder)
    total, state = trainer.accumulate(
        x, lambda t, o: _loss_at(target, t, o), trainer.initial_state(B), starts.unbind(0)
    )
    torch.testing.assert_close(total, seq_loss.detach())
    for name, p in _params(core, decoder):
        assert ref[name].abs().max() > 0, name
        err = ((p.grad - ref[name]).norm() / ref[name].norm()).item()
        assert err < 1e-10, (name, err)
    # The final core state equals the sequence-level one.
    _, last = core(x, core.initial_state(B), starts)
    for a, b in zip(state[: len(core.blocks)], last, strict=True):
        torch.testing.assert_close(a, b.detach())


def test_starts_reset_state_and_traces() -> None:
    core, decoder, x, _ = _setup(layers=1)
    trainer = StreamingOnlineTrainer(core, decoder)
    state = trainer.initial_state(B)
    with torch.no_grad():
        for x_t in x[:4].unbind(0):
            _, state = trainer.step(x_t, state)
        assert all(s.abs().max() > 0 for s in state)
        start = torch.tensor([True, False, False])
        out, state = trainer.step(x[4], state, start)
        # Row 0 equals a fresh one-step run; rows 1, 2 keep their history.
        fresh = trainer.initial_state(1)
        out_fresh, fresh = trainer.step(x[4, :1], fresh)
    torch.testing.assert_close(out[:1], out_fresh)
    for s, f in zip(state, fresh, strict=True):
        torch.testing.assert_close(s[:1], f)
    # e^lambda of a fresh first step is h_{-1} = 0; the continuing rows carry a nonzero trace.
    e_lam = state[1]
    assert e_lam[0].abs().max() == 0 and e_lam[1].abs().max() > 0
    # The explicit reset helper zeroes every state and trace row.
    reset = trainer.reset(state, torch.tensor([False, True, False]))
    assert all(r[1].abs().max() == 0 for r in reset)
    assert all(torch.equal(r[2], s[2]) for r, s in zip(reset, state, strict=True))


def test_late_backward_raises() -> None:
    core, decoder, x, target = _setup(layers=1)
    trainer = StreamingOnlineTrainer(core, decoder)
    state = trainer.initial_state(B)
    out0, state = trainer.step(x[0], state)
    _, state = trainer.step(x[1], state)  # updates the traces that step 0's graph saved
    with pytest.raises(RuntimeError):
        ((out0 - target[0]) ** 2).sum().backward()


def test_streaming_state_size_independent_of_length() -> None:
    core, decoder, x, target = _setup(layers=2)
    trainer = StreamingOnlineTrainer(core, decoder)
    state = trainer.initial_state(B)
    sizes = {sum(s.numel() for s in state)}
    for _ in range(3):
        _, state = trainer.accumulate(x, lambda t, o: _loss_at(target, t, o), state)
        sizes.add(sum(s.numel() for s in state))
    assert len(sizes) == 1


def test_rejects_other_cores() -> None:
    with pytest.raises(TypeError, match="LRUCore"):
        StreamingOnlineTrainer(torch.nn.LSTM(3, 4))  # type: ignore[arg-type]


# ---------------------------------------------------------------- bench memory lru (fast check)
def test_live_tensor_bytes_counts_allocations_and_frees() -> None:
    from memcores.experiments.bench.memory_lru import LiveTensorBytes

    tracker = LiveTensorBytes()
    with tracker:
        a = torch.zeros(1000)  # 4000 bytes
        b = a + 1
        view = a.view(10, 100)  # shares a's storage: not counted again
        assert tracker.current == 8000
        del b
        assert tracker.current == 4000 and tracker.peak == 8000
    assert view.numel() == 1000


def test_memory_bench_script_runs_and_streaming_is_flat(capsys, tmp_path) -> None:
    from memcores.experiments.bench import memory_lru

    results = memory_lru.run_bench([3, 9], 8, 4, 1, 2, report=lambda _: None)
    table = memory_lru.format_table(results)
    for method in memory_lru.METHODS:
        assert f"| {method} |" in table
    assert len(memory_lru.verdicts(results)) == 4
    # Streaming keeps nothing per step; BPTT keeps every step's activations.
    assert results["online-stream"][9]["total"] == results["online-stream"][3]["total"]
    assert results["bptt"][9]["total"] > 2 * results["bptt"][3]["total"]
    assert results["infer-seq"][9]["total"] > results["infer-stream"][9]["total"]
    # The command-line entry point (what `memcores bench memory lru` calls).
    argv = ["--lengths", "2", "--hidden-size", "4", "--state-size", "2", "--layers", "1"]
    out = tmp_path / "record"  # never the committed results/bench/memory_lru
    assert (
        memory_lru.main([*argv, "--methods", "online-stream", "infer-stream", "--out", str(out)])
        == 0
    )
    assert "| online-stream |" in capsys.readouterr().out
    record = json.loads((out / "record.json").read_text())
    assert record["command"].startswith("memcores bench memory lru --lengths 2")
    assert set(record["numbers"]) == {"online-stream", "infer-stream"}
    assert record["machine"]["cpus"] >= 1 and record["machine"]["cpu"]
    assert "| online-stream |" in (out / "REPORT.md").read_text()
