"""sLSTM and mLSTM (Beck et al., "xLSTM: Extended Long Short-Term Memory", NeurIPS 2024,
arXiv:2405.04517) pinned by hand: head counts, the stabilised gates, the constructors'
defaults, checks and initialisation, and steps written out with ``math`` in float64
(H = 2) from warm states, the stabiliser ``m`` included, with episode resets inside the
sequence and across the mLSTM's chunk borders and padding."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from memcores.cores import make_core
from memcores.cores.xlstm import MLSTM, SLSTM, _chunk_stabilisers, _heads, stabilised_gates

F64 = torch.float64


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z))


def _gates(i_raw: float, f_raw: float, m: float) -> tuple[float, float, float]:
    """m' = max(log sigma(f~) + m, i~); i' = exp(i~ - m'); f' = exp(log sigma(f~) + m - m')."""
    log_f = _log_sigmoid(f_raw)
    m_new = max(log_f + m, i_raw)
    return math.exp(i_raw - m_new), math.exp(log_f + m - m_new), m_new


# ---------------------------------------------------------------------------- shared parts
def test_heads_default_and_checks() -> None:
    """Default: the largest of 4, 2, 1 dividing H; an explicit count must divide H."""
    assert [_heads(h, None) for h in (8, 12, 6, 10, 3, 5)] == [4, 4, 2, 2, 1, 1]
    assert _heads(6, 3) == 3 and _heads(6, 6) == 6 and _heads(4, 1) == 1
    for hidden, heads in ((8, 3), (8, 0), (8, -2), (6, 4)):
        with pytest.raises(
            ValueError, match=rf"^heads must divide hidden_size={hidden}, got heads={heads}$"
        ):
            _heads(hidden, heads)


def test_stabilised_gates_by_hand() -> None:
    """Both branches of the max: the input term wins (i~ = 2, m = 0) and the carried term
    wins (i~ = -3, m = 1.5)."""
    i_raw = torch.tensor([2.0, -3.0], dtype=F64)
    f_raw = torch.tensor([0.5, -1.0], dtype=F64)
    m_prev = torch.tensor([0.0, 1.5], dtype=F64)
    i_gate, f_gate, m = stabilised_gates(i_raw, f_raw, m_prev)
    want = [_gates(2.0, 0.5, 0.0), _gates(-3.0, -1.0, 1.5)]
    assert want[0][2] == 2.0 and want[1][2] == pytest.approx(1.5 + _log_sigmoid(-1.0))
    torch.testing.assert_close(i_gate, torch.tensor([w[0] for w in want], dtype=F64))
    torch.testing.assert_close(f_gate, torch.tensor([w[1] for w in want], dtype=F64))
    torch.testing.assert_close(m, torch.tensor([w[2] for w in want], dtype=F64))


# ---------------------------------------------------------------------------- sLSTM
_S_W = (0.5, -1.0, 1.0, 0.3, 0.8, -0.4, 0.2, 1.1)  # rows z, z, i, i, f, f, o, o (D = 1)
_S_B = (0.1, -0.2, 0.3, 0.0, 1.0, 2.0, -0.5, 0.4)
_S_R = tuple(((0.1 * (g + 1), 0.2), (-0.3, 0.05 * g + 0.1)) for g in range(4))
"""R[g][d][e]: unit d of h_{t-1} reaches unit e of gate g (one head, d = 2)."""


def _hand_slstm(impl: str = "fused") -> SLSTM:
    core = SLSTM(1, 2, heads=1, impl=impl).double()
    with torch.no_grad():
        core.input.weight.copy_(torch.tensor(_S_W, dtype=F64).unsqueeze(1))
        core.input.bias.copy_(torch.tensor(_S_B, dtype=F64))
        core.recurrent.copy_(torch.tensor(_S_R, dtype=F64).unsqueeze(1))
    return core


def _slstm_step(state: list[list[float]], x: float) -> list[list[float]]:
    """(h, c, n, m) -> the next (h, c, n, m): pre_g = W_g x + b_g + h R_g, then the
    stabilised sLSTM update, h = sigma(o~) c / max(n, 1e-6)."""
    h, c, n, m = state
    pre = [
        [
            _S_W[2 * g + e] * x + _S_B[2 * g + e] + sum(h[d] * _S_R[g][d][e] for d in range(2))
            for e in range(2)
        ]
        for g in range(4)
    ]
    out: list[list[float]] = [[], [], [], []]
    for e in range(2):
        i_gate, f_gate, m_e = _gates(pre[1][e], pre[2][e], m[e])
        c_e = f_gate * c[e] + i_gate * math.tanh(pre[0][e])
        n_e = f_gate * n[e] + i_gate
        out[0].append(_sigmoid(pre[3][e]) * c_e / max(n_e, 1e-6))
        out[1].append(c_e)
        out[2].append(n_e)
        out[3].append(m_e)
    return out


def test_slstm_defaults_shapes_and_initialisation() -> None:
    """impl 'fused', heads 4 for H = 8; input Linear(D, 4H) drawn first, then R ~
    N(0, 1/d) of shape [4, heads, d, d]; forget biases linspace(3, 6, H)."""
    torch.manual_seed(7)
    core = SLSTM(3, 8)
    assert core.impl == "fused" and core.has_fused and core.heads == 4
    assert core.state_arity == 4
    torch.manual_seed(7)
    linear = nn.Linear(3, 32)
    recurrent = torch.randn(4, 4, 2, 2) / math.sqrt(2)
    assert torch.equal(core.input.weight.detach(), linear.weight.detach())
    assert torch.equal(core.recurrent.detach(), recurrent)
    bias = linear.bias.detach().clone()
    bias[16:24] = torch.linspace(3, 6, 8)
    assert torch.equal(core.input.bias.detach(), bias)
    assert torch.equal(core.input.bias[16:24].detach()[[0, -1]], torch.tensor([3.0, 6.0]))
    loop = SLSTM(3, 6, impl="loop", heads=3)
    assert loop.impl == "loop" and not loop.has_fused and loop.heads == 3
    assert loop.recurrent.shape == (4, 3, 2, 2) and loop.input.weight.shape == (24, 3)
    assert SLSTM(3, 6, impl="triton").has_fused


def test_slstm_refuses_an_unknown_impl() -> None:
    with pytest.raises(ValueError, match=r"^unknown impl 'cuda'; valid: fused, triton, loop$"):
        SLSTM(3, 8, impl="cuda")
    with pytest.raises(ValueError, match=r"^heads must divide hidden_size=8, got heads=3$"):
        SLSTM(3, 8, heads=3)


def test_slstm_initial_state_is_four_zero_tensors() -> None:
    core = SLSTM(3, 2).double()
    state = core.initial_state(3)
    assert len(state) == 4
    for s in state:
        assert torch.equal(s, torch.zeros(3, 2, dtype=F64))
    assert all(s.device.type == "meta" and s.shape == (2, 2) for s in core.initial_state(2, "meta"))


@pytest.mark.parametrize("impl", ["fused", "loop", "triton"])
def test_slstm_steps_by_hand_with_carried_state_and_resets(impl: str) -> None:
    """Three steps, two rows from warm states (m nonzero): row 0 carries (h, c, n, m), row 1
    restarts from zeros at step 1; step() gives the same first step. impl 'triton' runs the
    kernels (under TRITON_INTERPRET=1 on a machine without CUDA, as conftest sets it)."""
    core = _hand_slstm(impl)
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25)]
    starts = [[False, False], [False, True], [False, False]]
    warm = [
        [[0.5, -0.3], [0.8, -0.6], [1.5, 0.9], [0.4, -0.2]],
        [[0.1, 0.2], [-0.4, 0.3], [0.7, 1.2], [1.0, 0.5]],
    ]
    rows = [[list(s) for s in warm[b]] for b in range(2)]
    ys = []
    for t, x_t in enumerate(xs):
        for b in range(2):
            if starts[t][b]:
                rows[b] = [[0.0, 0.0] for _ in range(4)]
            rows[b] = _slstm_step(rows[b], x_t[b])
        ys.append([rows[b][0] for b in range(2)])
    state = tuple(torch.tensor([warm[0][i], warm[1][i]], dtype=F64) for i in range(4))
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    y, final = core(x, state, torch.tensor(starts))
    torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
    for i in range(4):
        torch.testing.assert_close(final[i], torch.tensor([rows[0][i], rows[1][i]], dtype=F64))
    first = [_slstm_step(warm[b], xs[0][b]) for b in range(2)]
    y1, s1 = core.step(x[0], state)
    torch.testing.assert_close(y1, torch.tensor([first[0][0], first[1][0]], dtype=F64))
    for i in range(4):
        torch.testing.assert_close(s1[i], torch.tensor([first[0][i], first[1][i]], dtype=F64))


def test_slstm_normaliser_floor() -> None:
    """n is floored at 1e-6 in h = sigma(o~) c / max(n, 1e-6): with a tiny n the output is
    sigma(o~) c / 1e-6."""
    core = _hand_slstm()
    pre = torch.zeros(1, 4, 2, dtype=F64)
    pre[0, 1] = -80.0  # i' = exp(-80 - m') with m' = max(log f + m, -80)
    state = tuple(torch.zeros(1, 2, dtype=F64) for _ in range(3)) + (
        torch.full((1, 2), 0.0, dtype=F64),
    )
    h, (_, c, n, m) = core._cell(pre, state)
    assert (n < 1e-6).all()
    torch.testing.assert_close(h, 0.5 * c / 1e-6)


# ---------------------------------------------------------------------------- mLSTM
_M_W = (0.5, -1.0, 1.0, 0.3, 0.8, -0.4, 0.2, 1.1)  # rows q, q, k, k, v, v, o, o (D = 1)
_M_B = (0.1, -0.2, 0.3, 0.0, 1.0, 2.0, -0.5, 0.4)
_M_G = ((0.7, 0.2), (-0.3, 1.5))  # (weight, bias) of i~ and f~ (one head)


def _hand_mlstm(chunk_size: int = 64, scan: str = "auto") -> MLSTM:
    core = MLSTM(1, 2, heads=1, chunk_size=chunk_size, scan=scan).double()
    with torch.no_grad():
        core.qkvo.weight.copy_(torch.tensor(_M_W, dtype=F64).unsqueeze(1))
        core.qkvo.bias.copy_(torch.tensor(_M_B, dtype=F64))
        core.gates.weight.copy_(torch.tensor([[g[0]] for g in _M_G], dtype=F64))
        core.gates.bias.copy_(torch.tensor([g[1] for g in _M_G], dtype=F64))
    return core


def _mlstm_step(state, x: float):
    """(C [2][2], n [2], m) -> h [2] and the next state: k scaled by 1/sqrt(2),
    C = f' C + i' v k^T, n = f' n + i' k, h = sigma(o) C q / max(|n . q|, exp(-m))."""
    c, n, m = state
    proj = [w * x + b for w, b in zip(_M_W, _M_B, strict=True)]
    q, k, v, o = proj[0:2], [p / math.sqrt(2) for p in proj[2:4]], proj[4:6], proj[6:8]
    i_gate, f_gate, m = _gates(_M_G[0][0] * x + _M_G[0][1], _M_G[1][0] * x + _M_G[1][1], m)
    c = [[f_gate * c[i][j] + i_gate * v[i] * k[j] for j in range(2)] for i in range(2)]
    n = [f_gate * n[j] + i_gate * k[j] for j in range(2)]
    den = max(abs(n[0] * q[0] + n[1] * q[1]), math.exp(-m))
    h = [_sigmoid(o[i]) * (c[i][0] * q[0] + c[i][1] * q[1]) / den for i in range(2)]
    return h, (c, n, m)


def test_mlstm_defaults_shapes_and_initialisation() -> None:
    """chunk_size 64, scan 'auto', heads 4 for H = 8 (d = 2); the i~ biases 0 and the f~
    biases linspace(3, 6, heads)."""
    torch.manual_seed(2)
    core = MLSTM(3, 8)
    assert (core.chunk_size, core.scan, core.heads, core.head_size) == (64, "auto", 4, 2)
    assert core.qkvo.weight.shape == (32, 3) and core.gates.weight.shape == (8, 3)
    torch.manual_seed(2)
    qkvo, gates = nn.Linear(3, 32), nn.Linear(3, 8)
    assert torch.equal(core.qkvo.weight.detach(), qkvo.weight.detach())
    assert torch.equal(core.qkvo.bias.detach(), qkvo.bias.detach())
    assert torch.equal(core.gates.weight.detach(), gates.weight.detach())
    assert torch.equal(core.gates.bias.detach(), torch.tensor([0, 0, 0, 0, 3, 4, 5, 6.0]))
    other = MLSTM(3, 6, heads=3, chunk_size=5, scan="parallel")
    assert (other.chunk_size, other.scan, other.heads, other.head_size) == (5, "parallel", 3, 2)
    assert torch.equal(other.gates.bias[3:].detach(), torch.tensor([3.0, 4.5, 6.0]))


def test_mlstm_refuses_bad_options() -> None:
    for size in (0, -1):
        with pytest.raises(ValueError, match=rf"^chunk_size must be positive, got {size}$"):
            MLSTM(3, 8, chunk_size=size)
    with pytest.raises(
        ValueError, match=r"^unknown scan 'fast'; valid: auto, parallel, sequential, triton$"
    ):
        MLSTM(3, 8, scan="fast")
    with pytest.raises(ValueError, match=r"^heads must divide hidden_size=8, got heads=3$"):
        MLSTM(3, 8, heads=3)
    assert MLSTM(3, 8, chunk_size=1).chunk_size == 1


def test_mlstm_initial_state_is_zero_c_n_and_m() -> None:
    core = MLSTM(3, 6, heads=3).double()
    c, n, m = core.initial_state(4)
    assert torch.equal(c, torch.zeros(4, 3, 2, 2, dtype=F64))
    assert torch.equal(n, torch.zeros(4, 3, 2, dtype=F64))
    assert torch.equal(m, torch.zeros(4, 3, dtype=F64))
    meta = core.initial_state(2, "meta")
    assert [s.shape for s in meta] == [(2, 3, 2, 2), (2, 3, 2), (2, 3)]
    assert all(s.device.type == "meta" and s.dtype == F64 for s in meta)
    # without a device, the weights' (meta here: no accelerator needed)
    assert all(s.device.type == "meta" for s in core.to("meta").initial_state(2))


_WARM = (
    ([[0.5, -0.3], [0.2, 0.8]], [0.6, -0.4], 0.7),
    ([[-0.1, 0.4], [0.9, 0.3]], [0.2, 0.5], -0.5),
)


def _mlstm_hand_run(xs, starts):
    """Outputs and final states of the two rows from :data:`_WARM`."""
    rows = [_WARM[0], _WARM[1]]
    ys = []
    for t, x_t in enumerate(xs):
        out = []
        for b in range(2):
            if starts is not None and starts[t][b]:
                rows[b] = ([[0.0, 0.0], [0.0, 0.0]], [0.0, 0.0], 0.0)
            h, rows[b] = _mlstm_step(rows[b], x_t[b])
            out.append(h)
        ys.append(out)
    return ys, rows


def _warm_state() -> tuple[torch.Tensor, ...]:
    c = torch.tensor([w[0] for w in _WARM], dtype=F64).unsqueeze(1)
    n = torch.tensor([w[1] for w in _WARM], dtype=F64).unsqueeze(1)
    m = torch.tensor([[w[2]] for w in _WARM], dtype=F64)
    return c, n, m


def test_mlstm_one_step_by_hand() -> None:
    """x = 2 from the warm states, through step() and the parallel forward."""
    core = _hand_mlstm()
    x = torch.tensor([[2.0], [-1.0]], dtype=F64)
    ys, rows = _mlstm_hand_run([(2.0, -1.0)], None)
    for y, (c, n, m) in (core.step(x, _warm_state()), core(x.unsqueeze(0), _warm_state())):
        torch.testing.assert_close(y.reshape(2, 2), torch.tensor(ys[0], dtype=F64))
        torch.testing.assert_close(c, torch.tensor([[r[0]] for r in rows], dtype=F64))
        torch.testing.assert_close(n, torch.tensor([[r[1]] for r in rows], dtype=F64))
        torch.testing.assert_close(m, torch.tensor([[r[2]] for r in rows], dtype=F64))


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 64])
@pytest.mark.parametrize("scan", ["sequential", "parallel"])
def test_mlstm_sequence_by_hand_across_chunks_and_resets(chunk_size: int, scan: str) -> None:
    """Seven steps from warm states: chunks of 2 and 3 (padding at the end), a reset on a
    chunk's first step (row 0 at step 2), one inside a chunk (row 1 at step 4), one at step
    0 (row 1); without starts the warm state carries through."""
    core = _hand_mlstm(chunk_size, scan)
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25), (1.2, -0.7), (0.3, 0.9), (-2.0, 1.1), (0.6, 0.0)]
    starts = [[False] * 2 for _ in xs]
    starts[2][0] = starts[4][1] = starts[0][1] = True
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    for flags in (starts, None):
        ys, rows = _mlstm_hand_run(xs, flags)
        mask = None if flags is None else torch.tensor(flags)
        y, (c, n, m) = core(x, _warm_state(), mask)
        torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
        torch.testing.assert_close(c, torch.tensor([[r[0]] for r in rows], dtype=F64))
        torch.testing.assert_close(n, torch.tensor([[r[1]] for r in rows], dtype=F64))
        torch.testing.assert_close(m, torch.tensor([[r[2]] for r in rows], dtype=F64))


def test_chunk_stabilisers_by_hand() -> None:
    """m entering each chunk: m_{k+1} = max(A_k + m_k, M_k) over carried chunks and
    max(A_k, M_k) where an episode starts; five chunks (three rounds of the scan)."""
    decay = torch.tensor([-0.5, -1.0, -0.2, -0.3, -2.0], dtype=F64)
    local_max = torch.tensor([0.3, 2.0, -4.0, 1.0, -1.0], dtype=F64)
    carried = torch.tensor([True, True, False, True, True])
    m0 = 1.5
    want, m = [m0], m0
    for a, mx, keep in zip(decay.tolist(), local_max.tolist(), carried.tolist(), strict=True):
        m = max(a + m, mx) if keep else max(a, mx)
        want.append(m)
    assert want == pytest.approx([1.5, 1.0, 2.0, -0.2, 1.0, -1.0])
    got = _chunk_stabilisers(
        decay.view(5, 1, 1), local_max.view(5, 1, 1), carried.view(5, 1, 1), torch.tensor([[m0]])
    )
    torch.testing.assert_close(got.flatten(), torch.tensor(want[:5], dtype=F64))


def test_the_registry_builds_both() -> None:
    assert type(make_core("slstm", 3, 4)) is SLSTM
    assert type(make_core("mlstm", 3, 4)) is MLSTM
