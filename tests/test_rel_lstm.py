"""RelLSTM / MemLSTM: screening bookkeeping, state contract, gradients, and the memory bench."""

from __future__ import annotations

import io

import pytest
import torch

from memcores.cores import make_core
from memcores.cores._fused_rel_lstm import buffer_mask
from memcores.cores.rel_lstm import MemLSTM, RelLSTM, screening_update
from memcores.experiments.bench import memory_rel

D, H = 3, 8


def _rand_seq(T: int, B: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, B, D, generator=g)


def _cores() -> list[torch.nn.Module]:
    torch.manual_seed(0)
    return [RelLSTM(D, H, nu=3, rho=2), RelLSTM(D, H, nu=2, rho=0), MemLSTM(D, H, max_len=64)]


# ----------------------------------------------------------------- screening bookkeeping
# Hand-made attention: every state is labelled by its value (H=1) and receives a fixed amount
# of attention per step while buffered, so with nu=2 its relevance score is beta = 2 * table.
PATTERNS = [
    # row 0: 1 and 2 fill the set; 3 beats 2; 4 is too weak; 5 beats 3; 6 is too weak.
    {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.2, 5: 0.95, 6: 0.0, 7: 0.3, 8: 0.3},
    # row 1: 3 ties with the minimum (1.0) and is dropped (strictly greater needed); 4 replaces
    # the first lowest (1); 5 is too weak; 6 replaces 2.
    {1: 0.5, 2: 0.5, 3: 0.5, 4: 0.6, 5: 0.1, 6: 0.7, 7: 0.3, 8: 0.3},
]


def _attention(labels: torch.Tensor) -> torch.Tensor:
    """``[B, K]`` hand-made attention for states labelled ``labels [B, K]`` (row b: PATTERNS[b])."""
    table = [[p.get(int(v), 0.0) for v in row] for p, row in zip(PATTERNS, labels, strict=True)]
    return torch.tensor(table, dtype=labels.dtype)


def _screen_by_hand(labels: range, nu: int = 2, rho: int = 2):
    B = len(PATTERNS)
    z = torch.zeros
    buf, buf_sc, buf_n = z(B, nu, 1, dtype=torch.float64), z(B, nu, dtype=torch.float64), z(B)
    rel, rel_sc, rel_n = z(B, rho, 1, dtype=torch.float64), z(B, rho, dtype=torch.float64), z(B)
    buf_n, rel_n = buf_n.double(), rel_n.double()
    for k in labels:
        new = torch.full((B, 1), float(k), dtype=torch.float64)
        buf, buf_sc, buf_n, rel, rel_sc, rel_n = screening_update(
            buf, buf_sc, buf_n, rel, rel_sc, rel_n, new
        )
        # attention this step: each buffered state gets its table value (empty slots get 0)
        buf_sc = buf_sc + _attention(buf[..., 0]) * buffer_mask(buf_n, nu)
    return buf, buf_sc, buf_n, rel, rel_sc, rel_n


def test_screening_keeps_highest_scores_and_evicts_the_rest() -> None:
    buf, buf_sc, buf_n, rel, rel_sc, rel_n = _screen_by_hand(range(1, 9))
    assert rel[0, :, 0].tolist() == [1.0, 5.0]
    assert rel_sc[0].tolist() == pytest.approx([1.8, 1.9])
    assert rel[1, :, 0].tolist() == [4.0, 6.0]
    assert rel_sc[1].tolist() == pytest.approx([1.2, 1.4])
    assert buf[:, :, 0].tolist() == [[7.0, 8.0], [7.0, 8.0]]
    assert buf_n.tolist() == [2.0, 2.0] and rel_n.tolist() == [2.0, 2.0]
    kept = [set(buf[b, :, 0].tolist()) | set(rel[b, :, 0].tolist()) for b in range(2)]
    assert set(range(1, 9)) - kept[0] == {2, 3, 4, 6}  # evicted
    assert set(range(1, 9)) - kept[1] == {1, 2, 3, 5}


def test_screening_partial_fill_and_empty_buffer() -> None:
    # after 3 pushes only state 1 has left the buffer: one relevant slot used, one free
    buf, buf_sc, buf_n, rel, rel_sc, rel_n = _screen_by_hand(range(1, 4))
    assert rel_n.tolist() == [1.0, 1.0]
    assert rel[:, 0, 0].tolist() == [1.0, 1.0] and rel[:, 1, 0].tolist() == [0.0, 0.0]
    # after 1 push nothing has left: relevant set empty, buffer holds one state (last slot)
    buf, buf_sc, buf_n, rel, rel_sc, rel_n = _screen_by_hand(range(1, 2))
    assert rel_n.tolist() == [0.0, 0.0] and buf_n.tolist() == [1.0, 1.0]
    assert buffer_mask(buf_n, 2).tolist() == [[False, True], [False, True]]


def test_model_uses_attention_received_in_buffer_as_relevance(monkeypatch) -> None:
    """Wiring: with h_t = label and the hand-made attention, RelLSTM's relevant set matches."""
    core = RelLSTM(1, 1, nu=2, rho=2, impl="loop").double()  # the fused path has no hooks
    monkeypatch.setattr(core, "_lstm", lambda xp, s, c: (xp[:, :1], c))

    def attend(s_prev, keys, values, mask):
        return _attention(values[..., 0]) * mask

    monkeypatch.setattr(core, "_attend", attend)
    with torch.no_grad():
        core.input_proj.weight.fill_(1.0)
        core.input_proj.bias.zero_()
    x = torch.arange(1, 9, dtype=torch.float64).view(8, 1, 1).expand(8, 2, 1)
    _, state = core(x, core.initial_state(2))
    rel = state[RelLSTM.STATE_NAMES.index("relevant")]
    assert rel[:, :, 0].tolist() == [[1.0, 5.0], [4.0, 6.0]]


# ----------------------------------------------------------------- fused sequence function
FUSED_OPTIONS = [
    dict(nu=5, rho=5),
    dict(nu=3, rho=2, average=True),
    dict(nu=2, rho=4),  # screen=rho with rho > nu: extra unattended buffer slots
    dict(nu=4, rho=2, screen="exit"),
    dict(nu=3, rho=0, key_bias=False),
]


@pytest.mark.parametrize("options", FUSED_OPTIONS, ids=lambda o: str(o))
def test_fused_matches_the_reference_loop(options) -> None:
    """Values, final state and every gradient (inputs, weights, initial state) agree in float64,
    from a state carried over from an earlier call, with episode starts inside the sequence."""
    torch.manual_seed(0)
    fused = RelLSTM(D, H, **options).double()
    loop = RelLSTM(D, H, impl="loop", **options).double()
    loop.load_state_dict(fused.state_dict())
    T, B = 40, 5
    with torch.no_grad():
        _, warm = loop(torch.randn(9, B, D, dtype=torch.float64), loop.initial_state(B))
    differentiable = {"c", "s", "buffer", "relevant"}
    names = RelLSTM.STATE_NAMES
    x = torch.randn(T, B, D, dtype=torch.float64, requires_grad=True)
    starts = torch.rand(T, B, generator=torch.Generator().manual_seed(1)) < 0.08
    starts[:, 0] = False  # row 0 runs long enough to fill its relevant set and replace in it
    outputs, grads = [], []
    for core in (fused, loop):
        pairs = zip(names, warm, strict=True)
        state = tuple(v.clone().requires_grad_(n in differentiable) for n, v in pairs)
        y, final = core(x, state, starts)
        outputs.append((y, *final))
        # every differentiable output feeds the loss, so each backward path is exercised
        pairs = zip(names, final, strict=True)
        loss = y.pow(2).sum() + sum(v.sin().sum() for n, v in pairs if n != "h")
        loss = loss + final[0].pow(3).sum()
        wrt = [x, *core.parameters(), *(v for v in state if v.requires_grad)]
        grads.append(torch.autograd.grad(loss, wrt))
    for a, b in zip(*outputs, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)
    if options["rho"]:
        assert outputs[1][1 + names.index("relevant_count")].eq(options["rho"]).any()


def test_fused_is_used_for_sequences_and_the_loop_for_single_steps(monkeypatch) -> None:
    core = RelLSTM(D, H)
    calls = []
    monkeypatch.setattr(core, "_step", lambda *a: calls.append(1) or RelLSTM._step(core, *a))
    core(_rand_seq(6, 2), core.initial_state(2))
    assert calls == []
    core(_rand_seq(1, 2), core.initial_state(2))
    assert calls == [1]


# ----------------------------------------------------------------- state contract
@pytest.mark.parametrize("core", _cores(), ids=["rel", "rel_rho0", "mem"])
def test_chunked_and_stepwise_calls_equal_one_call(core) -> None:
    """Everything the step needs lives in the state: splitting the sequence changes nothing."""
    x = _rand_seq(17, 4)
    y, state = core(x, core.initial_state(4))
    y1, s1 = core(x[:6], core.initial_state(4))
    y2, s2 = core(x[6:], s1)
    torch.testing.assert_close(torch.cat([y1, y2]), y)
    s = core.initial_state(4)
    ys = []
    for t in range(17):
        y_t, s = core.step(x[t], s)
        ys.append(y_t)
    torch.testing.assert_close(torch.stack(ys), y)
    for a, b in zip(s, state, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("core", _cores(), ids=["rel", "rel_rho0", "mem"])
def test_starts_reset_equals_fresh_start(core) -> None:
    T, k = 14, 6
    x = _rand_seq(T, 3, seed=1)
    starts = torch.zeros(T, 3, dtype=torch.bool)
    starts[k, 0] = True  # row 0 resets mid-sequence, row 2 at t=0 (no-op), row 1 never
    starts[0, 2] = True
    y, state = core(x, core.initial_state(3), starts)
    y_plain, _ = core(x, core.initial_state(3))
    y_half, s_half = core(x[k:, :1], core.initial_state(1))
    torch.testing.assert_close(y[k:, 0], y_half[:, 0])
    torch.testing.assert_close(y[:, 1:], y_plain[:, 1:])
    for a, b in zip(state, s_half, strict=True):
        torch.testing.assert_close(a[:1], b)


@pytest.mark.parametrize("core", _cores(), ids=["rel", "rel_rho0", "mem"])
def test_state_round_trip_through_storage(core) -> None:
    x = _rand_seq(12, 4, seed=2)
    _, state = core(x[:8], core.initial_state(4))
    y_ref, _ = core(x[8:], state)
    buf = io.BytesIO()
    torch.save(tuple(s.detach() for s in state), buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    torch.testing.assert_close(core(x[8:], loaded)[0], y_ref)
    # rollout storage: slice rows per environment, re-stack them in another order
    order = torch.tensor([2, 0, 3, 1])
    rows = [tuple(s[i : i + 1] for s in state) for i in order.tolist()]
    restacked = tuple(torch.cat(parts) for parts in zip(*rows, strict=True))
    torch.testing.assert_close(core(x[8:, order], restacked)[0], y_ref[:, order])


def test_state_contents_are_filled_and_counted() -> None:
    core = RelLSTM(D, H, nu=3, rho=2)
    _, state = core(_rand_seq(10, 2), core.initial_state(2))
    named = dict(zip(RelLSTM.STATE_NAMES, state, strict=True))
    assert named["buffer_count"].tolist() == [3.0, 3.0]
    assert named["relevant_count"].tolist() == [2.0, 2.0]
    # the newest buffer slot is h_t; scores are attention sums: positive, no gradient
    torch.testing.assert_close(named["buffer"][:, -1], named["h"])
    assert (named["buffer_scores"] > 0).all() and not named["buffer_scores"].requires_grad
    assert (named["relevant_scores"] > 0).all() and not named["relevant_scores"].requires_grad


def test_rho_zero_buffer_only() -> None:
    core = make_core("rel_lstm", D, H, nu=4, rho=0)
    x = _rand_seq(9, 2).requires_grad_()
    y, state = core(x, core.initial_state(2))
    y.sum().backward()
    assert y.shape == (9, 2, H) and state[6].shape == (2, 0, H)
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_mem_lstm_equals_rel_lstm_with_a_buffer_as_long_as_the_sequence() -> None:
    torch.manual_seed(0)
    rel = RelLSTM(D, H, nu=16, rho=0)
    mem = MemLSTM(D, H, max_len=16)
    mem.load_state_dict(rel.state_dict())
    x = _rand_seq(16, 3, seed=3)
    torch.testing.assert_close(mem(x, mem.initial_state(3))[0], rel(x, rel.initial_state(3))[0])


def test_mem_lstm_full_memory_drops_oldest_or_raises() -> None:
    torch.manual_seed(0)
    mem = MemLSTM(D, H, max_len=4)
    window = RelLSTM(D, H, nu=4, rho=0)  # sliding window of the last 4 states
    window.load_state_dict(mem.state_dict())
    x = _rand_seq(11, 2, seed=4)
    y, state = mem(x, mem.initial_state(2))
    torch.testing.assert_close(y, window(x, window.initial_state(2))[0])
    assert state[4].tolist() == [4.0, 4.0] and state[3].shape == (2, 4, H)
    strict = MemLSTM(D, H, max_len=4, on_full="error")
    with pytest.raises(RuntimeError, match="max_len=4"):
        strict(x, strict.initial_state(2))


def test_make_core_options_and_errors() -> None:
    core = make_core("rel_lstm", D, H, nu=10, rho=10, average=True)
    assert (core.nu, core.rho, core.average) == (10, 10, True)
    assert make_core("mem_lstm", D, H, max_len=32).max_len == 32
    with pytest.raises(ValueError, match="valid options"):
        make_core("rel_lstm", D, H, max_len=3)
    with pytest.raises(ValueError, match="nu"):
        RelLSTM(D, H, nu=0)
    with pytest.raises(ValueError, match="drop, error"):
        MemLSTM(D, H, on_full="wrap")


# ----------------------------------------------------------------- gradients
def _isolated_core(rho: int, nu: int = 3, attract: bool = True) -> RelLSTM:
    """A RelLSTM whose only path from x_i to a later output is attention to stored h_i.

    Forget gate -> 0 (no cell path), recurrent and query weights -> 0 (no path through s): so
    d y_t / d x_i is exactly zero unless h_i is in M_t. The input at step 2 is special; v is
    scaled so that h_2 receives much more (attract=True) or less attention than the others.
    """
    torch.manual_seed(0)
    # screen=exit: every state is screened with its complete score (with Algorithm 2's
    # screen=rho and rho=1, h_0 enters first with the full attention it got alone, see
    # tests/test_rel_rnn.py)
    core = RelLSTM(1, 4, nu=nu, rho=rho, screen="exit").double()
    with torch.no_grad():
        core.recurrent.weight.zero_()
        core.query.weight.zero_()
        core.input_proj.bias[4:8].fill_(-1e4)  # forget gate sigma(-1e4) == 0 exactly
        x = torch.zeros(2, 1, 1, dtype=torch.float64)
        x[1] = 3.0
        h = core._lstm(core.input_proj(x[:, 0]), torch.zeros(2, 4).double(), 0)[0]
        e = core.score(torch.tanh(core.key(h)))[:, 0]  # logits of (ordinary, special) state
        # logit gap of +-10: h_2 takes (almost) all or none of the attention while buffered
        core.score.weight.mul_((10.0 if attract else -10.0) / (e[1] - e[0]))
    return core


def _grad_of_late_loss_wrt_x2(core, T: int = 50) -> torch.Tensor:
    x = torch.zeros(T, 1, 1, dtype=torch.float64)
    x[2] = 3.0
    x.requires_grad_()
    y, state = core(x, core.initial_state(1))
    y[-1].sum().backward()
    return x.grad[2].abs().sum(), state


def test_gradient_reaches_a_state_kept_in_the_relevant_set() -> None:
    core = _isolated_core(rho=1, attract=True)
    g, state = _grad_of_late_loss_wrt_x2(core)
    h2 = core(torch.tensor([0.0, 0.0, 3.0], dtype=torch.float64).view(3, 1, 1),
              core.initial_state(1))[1][0]  # fmt: skip
    torch.testing.assert_close(state[6][:, 0], h2)  # h_2 is the one stored state
    assert g > 1e-6

    # the same model where h_2 gets little attention: it is screened out, gradient exactly 0
    g_evicted, state = _grad_of_late_loss_wrt_x2(_isolated_core(rho=1, attract=False))
    assert not torch.allclose(state[6][:, 0], h2)
    assert g_evicted == 0.0
    # buffer only: h_2 leaves the buffer after nu steps and is gone
    assert _grad_of_late_loss_wrt_x2(_isolated_core(rho=0))[0] == 0.0


def test_scores_carry_no_gradient_and_stored_states_do() -> None:
    core = RelLSTM(D, H, nu=2, rho=2)
    _, state = core(_rand_seq(8, 2), core.initial_state(2))
    named = dict(zip(RelLSTM.STATE_NAMES, state, strict=True))
    assert named["relevant"].requires_grad and named["buffer"].requires_grad
    for key in ("buffer_scores", "relevant_scores", "buffer_count", "relevant_count"):
        assert not named[key].requires_grad, key


# ----------------------------------------------------------------- devices and dtypes
@pytest.mark.cuda  # and the CPU: pytest -m cuda runs it on a GPU machine too
@pytest.mark.parametrize("cls", [RelLSTM, MemLSTM])
def test_dtype_and_device_moves(cls) -> None:
    core = cls(D, H).double()
    x = _rand_seq(5, 2).double()
    y, state = core(x, core.initial_state(2))
    assert y.dtype == torch.float64 and all(s.dtype == torch.float64 for s in state)
    # a state moved to float32 (e.g. float32 rollout storage) works with a float32 core
    core32 = cls(D, H)
    core32.load_state_dict({k: v.float() for k, v in core.state_dict().items()})
    y32, _ = core32(x[:, :].float(), tuple(s.detach().float() for s in core.initial_state(2)))
    torch.testing.assert_close(y32, y.float(), rtol=1e-4, atol=1e-5)
    # masked reset works on every state tensor, counts included
    reset = core.reset_state(state, torch.tensor([True, False]))
    assert all((r[0] == 0).all() for r in reset)
    assert all(torch.equal(r[1], s[1]) for r, s in zip(reset, state, strict=True))
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        moved = core.to(dev)
        st = tuple(s.detach().to(dev) for s in state)
        y2, _ = moved(x.to(dev), st)
        assert y2.device.type == dev


# ----------------------------------------------------------------- memory benchmark
def test_meta_accounting_equals_real_tensors() -> None:
    for name in ("rel_lstm", "mem_lstm"):  # the cores the bench measures on meta
        core = memory_rel.build_core(name, 4, 8, 12, 3, 2)
        assert memory_rel.graph_bytes(core, 12, 2, "meta") == memory_rel.graph_bytes(
            core, 12, 2, "cpu"
        ), name


def test_bench_quick_prints_table(capsys) -> None:
    assert memory_rel.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for name in memory_rel.CORE_NAMES:
        assert f"\n{name}" in out
    assert "mem/rel" in out and "growth" in out


def test_average_option_halves_the_first_macro_state() -> None:
    """First step: only h_1 is attended (alpha = 1), so s_1 = 2 h_1 (sum) or h_1 (average)."""
    torch.manual_seed(0)
    plain, avg = RelLSTM(D, H), RelLSTM(D, H, average=True)
    avg.load_state_dict(plain.state_dict())
    x = _rand_seq(1, 2)
    y_sum, state = plain(x, plain.initial_state(2))
    y_avg, _ = avg(x, avg.initial_state(2))
    torch.testing.assert_close(y_sum[0], 2 * state[0])
    torch.testing.assert_close(y_avg[0], state[0])
