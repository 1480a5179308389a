"""GTrXL and TrXL-I (cores/gtrxl.py): exactness against step loops, episodes and a reference
written out term by term; gradients by finite differences; the gate's identity start."""

from __future__ import annotations

import math

import pytest
import torch

from memcores.cores import gtrxl as module
from memcores.cores import make_core
from memcores.cores.gtrxl import GRUGate, TransformerXL, relative_sinusoid

D, H = 3, 8
NAMES = ["gtrxl", "trxl"]


def build(name: str, seed: int = 0, **options) -> TransformerXL:
    torch.manual_seed(seed)
    options = {"layers": 2, "heads": 2, "memory_len": 3, **options}
    core = make_core(name, D, H, **options).double().eval()
    # u, v and the gate biases start at constants: draw them so every term is exercised
    with torch.no_grad():
        for param_name, p in core.named_parameters():
            if param_name.endswith(("content_bias", "position_bias")):
                p.normal_()
    return core


def xs(T: int, B: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(T, B, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def assert_states_close(a, b) -> None:
    assert len(a) == len(b)
    for s, t in zip(a, b, strict=True):
        torch.testing.assert_close(s, t)


@pytest.mark.parametrize("name", NAMES)
def test_a_chunk_equals_single_steps(name: str) -> None:
    """T = 9 steps in one call equal 9 calls of one step, through a memory of 3 that slides,
    in both layers, with a reset in one row."""
    core = build(name)
    x = xs(9, 2)
    starts = torch.zeros(9, 2, dtype=torch.bool)
    starts[5, 1] = True
    with torch.no_grad():
        y, final = core(x, core.initial_state(2), starts)
        state, steps = core.initial_state(2), []
        for t in range(9):
            state = core.reset_state(state, starts[t])
            y_t, state = core.step(x[t], state)
            steps.append(y_t)
    torch.testing.assert_close(y, torch.stack(steps))
    assert_states_close(final, state)


@pytest.mark.parametrize("name", NAMES)
def test_query_blocks_do_not_change_the_result(name: str, monkeypatch) -> None:
    core = build(name)
    x = xs(11, 2)
    with torch.no_grad():
        whole, _ = core(x, core.initial_state(2))
        monkeypatch.setattr(module, "QUERY_BLOCK", 4)  # blocks of 4, 4, 3 queries
        blocked, _ = core(x, core.initial_state(2))
    torch.testing.assert_close(blocked, whole)


@pytest.mark.parametrize("name", NAMES)
def test_resets_inside_a_chunk_equal_separate_episodes(name: str) -> None:
    core = build(name)
    x = xs(10, 2)
    starts = torch.zeros(10, 2, dtype=torch.bool)
    starts[[2, 7], 0] = True  # row 0: episodes [0, 2), [2, 7), [7, 10)
    with torch.no_grad():
        _, warm = core(xs(4, 2, seed=5), core.initial_state(2))
        y, final = core(x, warm, starts)
        first, _ = core(x[:2], warm)
        second, _ = core(x[2:7], core.initial_state(2))
        third, third_state = core(x[7:], core.initial_state(2))
        plain, plain_state = core(x, warm)
    torch.testing.assert_close(y[:, 0], torch.cat([first, second, third])[:, 0])
    torch.testing.assert_close(y[:, 1], plain[:, 1])
    for s, fresh, carried in zip(final, third_state, plain_state, strict=True):
        torch.testing.assert_close(s[0], fresh[0])
        torch.testing.assert_close(s[1], carried[1])


def test_the_memory_holds_the_last_inputs_of_each_layer_and_counts_them() -> None:
    core = build("gtrxl")
    x = xs(5, 2)
    starts = torch.zeros(5, 2, dtype=torch.bool)
    starts[3, 1] = True
    with torch.no_grad():
        _, (memory0, count0, memory1, count1) = core(x, core.initial_state(2), starts)
        embedded = core.embed(x)  # layer 0's inputs [T, B, d]
    assert count0.tolist() == [3.0, 2.0] and count1.tolist() == [3.0, 2.0]
    torch.testing.assert_close(memory0[0], embedded[2:, 0])  # the last 3 steps
    torch.testing.assert_close(memory0[1, 1:], embedded[3:, 1])  # the episode's 2 steps
    assert memory0[1, 0].abs().sum() == 0 and memory1[1, 0].abs().sum() == 0
    assert memory1[0].abs().sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_empty_slots_are_hidden(name: str) -> None:
    """What an empty slot holds never reaches the output."""
    core = build(name)
    state = core.initial_state(2)
    _, state = core(xs(2, 2, seed=3), state)  # 2 of 3 slots filled
    noisy = tuple(
        s.clone().index_fill_(1, torch.tensor([0]), 7.0) if s.dim() == 3 else s for s in state
    )
    with torch.no_grad():
        torch.testing.assert_close(core(xs(4, 2), noisy)[0], core(xs(4, 2), state)[0])


def test_relative_sinusoid_by_hand() -> None:
    r = relative_sinusoid(3, 4)  # frequencies 1 and 1/100
    expected = [
        [0.0, 0.0, 1.0, 1.0],
        [math.sin(1), math.sin(0.01), math.cos(1), math.cos(0.01)],
        [math.sin(2), math.sin(0.02), math.cos(2), math.cos(0.02)],
    ]
    torch.testing.assert_close(r, torch.tensor(expected))
    assert relative_sinusoid(2, 5).shape == (2, 5)  # odd width: the last cosine dropped


def _reference_core(core: TransformerXL, x: torch.Tensor) -> torch.Tensor:
    """One layer of GTrXL/TrXL-I from an empty memory, written with explicit loops over batch
    rows, steps, heads and keys: Dai et al.'s four terms and Parisotto et al.'s gate."""
    (block,) = core.blocks
    att = block.attention
    M, h, dh = core.memory_len, core.heads, core.head_size
    T, B = x.shape[:2]
    Wq, Wkv, Wr, Wo = (att.query.weight, att.key_value.weight, att.position.weight, att.out.weight)
    Wk, Wv = Wkv[: h * dh], Wkv[h * dh :]
    u, v = att.content_bias, att.position_bias
    R = relative_sinusoid(M + 1, core.hidden_size).double()

    def norm(ln, e):
        return (e - e.mean()) / torch.sqrt(e.var(unbiased=False) + ln.eps) * ln.weight + ln.bias

    def gate(g, a, b):  # g(x=a, y=b)
        d = core.hidden_size
        Wy, Ux, Ug = g.from_y.weight, g.from_x.weight, g.reset_x.weight
        r = torch.sigmoid(Wy[:d] @ b + g.from_y.bias[:d] + Ux[:d] @ a)
        z = torch.sigmoid(Wy[d : 2 * d] @ b + g.from_y.bias[d : 2 * d] + Ux[d:] @ a)
        cand = torch.tanh(Wy[2 * d :] @ b + g.from_y.bias[2 * d :] + Ug @ (r * a))
        return (1 - z) * a + z * cand

    out = torch.zeros(T, B, core.hidden_size, dtype=x.dtype)
    for b in range(B):
        seen = []  # this row's layer inputs so far
        for t in range(T):
            e = core.embed.weight @ x[t, b] + core.embed.bias
            seen.append(e)
            window = list(range(max(0, t - M), t + 1))  # itself and M steps back
            zs = {j: norm(block.attention_norm, seen[j]) for j in window}
            heads_out = []
            for hd in range(h):
                rows = slice(hd * dh, (hd + 1) * dh)
                q = Wq[rows] @ zs[t]
                scores = []
                for j in window:
                    k = Wk[rows] @ zs[j]
                    rel = Wr[rows] @ R[t - j]  # W_R R_{i-j}
                    a_term = q @ k
                    b_term = q @ rel
                    c_term = u[hd] @ k
                    d_term = v[hd] @ rel
                    scores.append((a_term + b_term + c_term + d_term) / math.sqrt(dh))
                weights = torch.softmax(torch.stack(scores), 0)
                heads_out.append(
                    sum(w * (Wv[rows] @ zs[j]) for w, j in zip(weights, window, strict=True))
                )
            att_out = torch.relu(Wo @ torch.cat(heads_out))
            y = (
                e + att_out
                if block.attention_gate is None
                else gate(block.attention_gate, e, att_out)
            )
            mlp = torch.relu(block.mlp(norm(block.mlp_norm, y)))
            out[t, b] = y + mlp if block.mlp_gate is None else gate(block.mlp_gate, y, mlp)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_core_equals_a_reference_with_the_relative_terms_spelled_out(name: str) -> None:
    core = build(name, layers=1, heads=2, memory_len=2, head_size=3)
    x = xs(5, 2)
    with torch.no_grad():
        y, _ = core(x, core.initial_state(2))
        torch.testing.assert_close(y, _reference_core(core, x))


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_finite_differences(name: str) -> None:
    """Inputs, a carried memory and the parameters of the relative attention (``W_R``, ``u``,
    ``v``) and of the second block's first join, through two layers with a reset."""
    core = build(name, layers=2, heads=2, memory_len=2, head_size=2, ff_size=3).train()
    with torch.no_grad():
        _, warm = core(xs(3, 2, seed=4), core.initial_state(2))
    starts = torch.zeros(4, 2, dtype=torch.bool)
    starts[2, 0] = True
    checked = [
        "blocks.0.attention.position.weight",
        "blocks.0.attention.content_bias",
        "blocks.0.attention.position_bias",
        "blocks.1.attention.out.weight",
        *(["blocks.1.attention_gate.from_y.bias"] if name == "gtrxl" else []),
    ]
    params = dict(core.named_parameters())

    def run(x, memory, *values):
        state = (memory, *warm[1:])
        y, final = torch.func.functional_call(
            core, {**params, **dict(zip(checked, values, strict=True))}, (x, state, starts)
        )
        return y, final[0], final[2]

    inputs = (
        xs(4, 2).requires_grad_(True),
        warm[0].clone().requires_grad_(True),
        *(params[n].detach().clone().requires_grad_(True) for n in checked),
    )
    # fast mode: finite differences along random directions of every input at once
    assert torch.autograd.gradcheck(run, inputs, fast_mode=True)


def test_the_gate_starts_near_the_identity() -> None:
    gate = GRUGate(4, 2.0)
    with torch.no_grad():
        for lin in (gate.from_y, gate.from_x, gate.reset_x):
            lin.weight.zero_()
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    # r = 1/2, z = sigma(-2), candidate tanh(0) = 0: g = (1 - sigma(-2)) x = 0.880797 x
    torch.testing.assert_close(gate(x, y), 0.880797 * x, rtol=1e-5, atol=1e-6)
    torch.manual_seed(0)
    gate = GRUGate(64, 2.0)  # default weights: the update gate is about sigma(-2) everywhere
    wz = gate.from_y(torch.randn(256, 64))[:, 64:128] + gate.from_x(torch.randn(256, 64))[:, 64:]
    z = torch.sigmoid(wz)
    assert 0.08 < z.mean() < 0.2 and (z > 0.5).float().mean() < 0.01


def test_with_a_large_gate_bias_each_block_is_the_identity() -> None:
    """b_g -> infinity closes every gate: the output is the embedded input, which TrXL-I's
    residual sums never give."""
    torch.manual_seed(0)
    x = torch.randn(4, 2, D)
    for name, options, identity in (("gtrxl", {"gate_bias": 40.0}, True), ("trxl", {}, False)):
        core = make_core(name, D, H, layers=2, **options)
        with torch.no_grad():
            y, _ = core(x, core.initial_state(2))
            assert torch.allclose(y, core.embed(x), atol=1e-6) == identity, name


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("gtrxl", {"layers": 0}, "layers must be a positive integer, got 0"),
        ("gtrxl", {"heads": 0}, "heads must be a positive integer, got 0"),
        ("trxl", {"memory_len": -1}, "memory_len must be a positive integer, got -1"),
        ("gtrxl", {"head_size": 2.5}, "head_size must be a positive integer, got 2.5"),
        ("gtrxl", {"ff_size": 0}, "ff_size must be a positive integer, got 0"),
        ("gtrxl", {"gate_bias": "high"}, "gate_bias must be a number"),
        ("trxl", {"gate_bias": 2.0}, "'gate_bias' is fixed to None by core 'trxl'"),
        ("trxl", {"window": 2}, "valid options: ff_size, head_size, heads, layers, memory_len"),
    ],
)
def test_bad_options_are_refused_by_name(name, options, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make_core(name, D, H, **options)


def test_defaults_suit_rl_at_hidden_64() -> None:
    core = make_core("gtrxl", 16, 64)
    assert (core.layers, core.heads, core.head_size, core.memory_len) == (1, 4, 16, 64)
    assert core.ff_size == 256 and core.gate_bias == 2.0
    assert [tuple(s.shape) for s in core.initial_state(8)] == [(8, 64, 64), (8,)]
    assert make_core("gtrxl", 4, 5).head_size == 2  # ceil(5 / 4): any width works


def test_bench_cores_times_acting_steps_and_checks_the_target(capsys) -> None:
    from memcores.experiments.bench import cores as bench

    assert bench.main(["--quick", "--acting", "--cores", "lstm,gtrxl", "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "16 acting steps (no grad, warm state)" in out
    (row,) = [ln.split() for ln in out.splitlines() if ln.startswith("gtrxl ") and "/" not in ln]
    assert row[-1] == "lstm"  # compared with lstm, no 1.5x LSTM-family target
    assert "gtrxl / lstm per acting step (wall) = " in out and "<=3x" in out
    samples = {"lstm": [(1.0, 1.0)] * 3, "gtrxl": [(2.9, 2.9)] * 3}
    assert bench.format_acting_target(samples).endswith("= 2.90x: ok <=3x")
    samples["gtrxl"] = [(3.5, 3.5)] * 3
    assert bench.format_acting_target(samples).endswith("= 3.50x: MISS <=3x")


def test_bench_memory_runs_gtrxl_at_two_memory_lengths(capsys) -> None:
    from memcores.experiments.bench import memory_rel

    rows = memory_rel.run([8, 16], 2, 8, 3, 2, 2, 1.0, ("gtrxl", "gtrxl:memory_len=2"))
    by = {(r.core, r.T): r.graph_bytes for r in rows}
    # a longer memory saves more for backward (keys, values, scores over more slots)
    assert by["gtrxl", 16] > by["gtrxl:memory_len=2", 16] > 0
    with pytest.raises(SystemExit):
        memory_rel.main(["--quick", "--cores", "gtrxl,nope", "--no-record"])
    assert "valid cores" in capsys.readouterr().err
