"""NRU (Chandar et al., "Towards Non-saturating Recurrent Units for Modelling Long-term
Dependencies", AAAI 2019, arXiv:1902.06704) checked against its equations in float64."""

from __future__ import annotations

import pytest
import torch
from equation_helpers import B, D, assert_forward_checks_its_arguments, build, inputs

from memcores.cores import make_core
from memcores.cores.nru import NRU


def _pnorm_normalise(v: list[float], p: float) -> list[float]:
    norm = sum(abs(a) ** p for a in v) ** (1.0 / p)
    return [a / max(norm, 1e-12) for a in v]


def _reference_nru(core, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chandar et al. eqs. 1-2: h = relu(W_i x + W_h h + W_c m); k write and k erase heads with
    strengths alpha, beta and p-normalised outer-product vectors v, u; m += (1/k) sum_j
    (alpha_j v_j - beta_j u_j)."""
    H, M, k, s = core.hidden_size, core.memory_size, core.heads, core.side
    h = torch.zeros(B, H, dtype=torch.float64)
    m = torch.zeros(B, M, dtype=torch.float64)
    ys = []
    for x_t in x:
        h = torch.relu(
            x_t @ core.weight_ih.T + h @ core.weight_hh.T + m @ core.weight_mh.T + core.bias
        )
        z = torch.cat([h, m], dim=1) @ core.weight_head.T + core.bias_head  # [B, 2k + 4s]
        new_m = m.clone()
        for b in range(B):
            row = z[b].tolist()
            alpha, beta = row[:k], row[k : 2 * k]
            pv, qv = row[2 * k : 2 * k + s], row[2 * k + s : 2 * k + 2 * s]
            pu, qu = row[2 * k + 2 * s : 2 * k + 3 * s], row[2 * k + 3 * s :]
            flat_v = [a * c for a in pv for c in qv]  # outer product, row-major, k*M entries
            flat_u = [a * c for a in pu for c in qu]
            for j in range(k):
                v_j = _pnorm_normalise(flat_v[j * M : (j + 1) * M], core.p)
                u_j = _pnorm_normalise(flat_u[j * M : (j + 1) * M], core.p)
                for n in range(M):
                    new_m[b, n] += (alpha[j] * v_j[n] - beta[j] * u_j[n]) / k
        m = new_m
        ys.append(h)
    return torch.stack(ys), h, m


def test_nru_matches_its_equations() -> None:
    core = build("nru", 6, memory_size=16, heads=4)  # s = sqrt(4 * 16) = 8
    x = inputs(steps=5)
    y, (h, m) = core(x, core.initial_state(B))
    y_ref, h_ref, m_ref = _reference_nru(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m, m_ref, rtol=1e-12, atol=1e-12)
    assert m.abs().sum() > 0 and (y >= 0).all()  # the memory moved; the state is a ReLU


def test_nru_options_are_checked() -> None:
    core = make_core("nru", D, 8)
    assert (core.memory_size, core.heads, core.side) == (64, 4, 16)  # Ohno et al.'s memory 64
    assert [s.shape for s in core.initial_state(2)] == [(2, 8), (2, 64)]
    with pytest.raises(ValueError, match="perfect square"):
        make_core("nru", D, 8, memory_size=10)
    with pytest.raises(ValueError, match="positive"):
        make_core("nru", D, 8, heads=0)


# ------------------------------------------------------------------ pinned by hand
def _hand_nru(p: float = 2.0) -> NRU:
    """D = H = 1, M = 2, k = 2 (s = 2): W_i = 1, b = 0.5, W_h = 0.5, W_c = [1, -1]; the heads
    read alpha = (h, 0.5), beta = (0.2, m_0), p_v = (1, -2), q_v = (3, 4), p_u = (2, 1),
    q_u = (1, 0) (rows alpha, beta, p_v, q_v, p_u, q_u of the head map)."""
    core = NRU(1, 1, memory_size=2, heads=2, p=p).double()
    with torch.no_grad():
        core.weight_ih.fill_(1.0)
        core.bias.fill_(0.5)
        core.weight_hh.fill_(0.5)
        core.weight_mh.copy_(torch.tensor([[1.0, -1.0]]))
        core.weight_head.zero_()
        core.weight_head[0, 0] = 1.0  # alpha_1 = h
        core.weight_head[3, 1] = 1.0  # beta_2 = m_0
        core.bias_head.copy_(
            torch.tensor(
                [0.0, 0.5, 0.2, 0.0, 1.0, -2.0, 3.0, 4.0, 2.0, 1.0, 1.0, 0.0], dtype=torch.float64
            )
        )
    return core


def _hand_nru_step(h: float, m: tuple[float, float], x: float) -> tuple[float, list[float]]:
    """One step of :func:`_hand_nru` (p = 2): the write vectors are sign(p_v^j) q_v / |q_v| =
    +-(0.6, 0.8), the erase vectors sign(p_u^j) q_u / |q_u| = (1, 0)."""
    h = max(0.0, x + 0.5 + 0.5 * h + m[0] - m[1])
    alpha, beta = (h, 0.5), (0.2, m[0])
    v = ((0.6, 0.8), (-0.6, -0.8))
    u = ((1.0, 0.0), (1.0, 0.0))
    return h, [
        m[n] + sum(alpha[j] * v[j][n] - beta[j] * u[j][n] for j in range(2)) / 2 for n in range(2)
    ]


def test_nru_defaults_and_parameter_shapes() -> None:
    """NRU(D, H): M = 64, k = 4, p = 5.0, s = 16; the head map has 2k + 4s rows."""
    core = NRU(3, 2)
    assert (core.input_size, core.hidden_size) == (3, 2)
    assert (core.memory_size, core.heads, core.side) == (64, 4, 16)
    assert core.p == 5.0 and isinstance(core.p, float)
    assert core.weight_ih.shape == (2, 3) and core.weight_hh.shape == (2, 2)
    assert core.weight_mh.shape == (2, 64) and core.bias.shape == (2,)
    assert core.weight_head.shape == (8 + 64, 66) and core.bias_head.shape == (72,)
    assert repr(core) == "NRU(3, 2, memory_size=64, heads=4, p=5.0)"
    small = NRU(3, 2, memory_size=4, heads=1, p=2)
    assert (small.memory_size, small.heads, small.side) == (4, 1, 2)
    assert isinstance(small.p, float) and small.p == 2.0
    assert small.weight_head.shape == (2 + 8, 6)
    assert repr(small) == "NRU(3, 2, memory_size=4, heads=1, p=2.0)"


def test_nru_refuses_bad_options_with_exact_messages() -> None:
    """Positive sizes (either one zero or negative), a square k M, a positive p."""
    for memory_size, heads in ((0, 4), (4, 0), (-4, -1), (-1, 1)):
        with pytest.raises(
            ValueError,
            match=rf"^memory_size and heads must be positive, got {memory_size} and {heads}$",
        ):
            NRU(3, 2, memory_size=memory_size, heads=heads)
    message = (
        r"^memory_size \* heads must be a perfect square \(the write vectors are outer "
        r"products of two sqrt\(k M\)-vectors\), got 8 \* 4; e\.g\. memory_size=64 with "
        r"heads=1, 4 or 9$"
    )
    with pytest.raises(ValueError, match=message):
        NRU(3, 2, memory_size=8, heads=4)
    for p in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf"^p must be positive, got {p}$"):
            NRU(3, 2, p=p)
    assert NRU(3, 2, memory_size=1, heads=1).side == 1
    assert NRU(3, 2, memory_size=9, heads=1).side == 3
    assert NRU(3, 2, p=0.5).p == 0.5


def test_nru_initialisation_draws_by_hand() -> None:
    """W_i, W_h, W_c, b in turn ~ U(+-1/sqrt(D + H + M)), then the head map's weight and bias
    ~ U(+-1/sqrt(H + M)), from one stream. D = 7, H = 5, M = 4: bounds 1/4 and 1/3."""
    torch.manual_seed(11)
    core = NRU(7, 5, memory_size=4, heads=1)
    torch.manual_seed(11)
    expected = [
        torch.empty(5, 7).uniform_(-0.25, 0.25),
        torch.empty(5, 5).uniform_(-0.25, 0.25),
        torch.empty(5, 4).uniform_(-0.25, 0.25),
        torch.empty(5).uniform_(-0.25, 0.25),
        torch.empty(10, 9).uniform_(-1 / 3, 1 / 3),
        torch.empty(10).uniform_(-1 / 3, 1 / 3),
    ]
    params = (
        core.weight_ih,
        core.weight_hh,
        core.weight_mh,
        core.bias,
        core.weight_head,
        core.bias_head,
    )
    for got, want in zip(params, expected, strict=True):
        assert torch.equal(got.detach(), want)


def test_nru_initial_state_is_zero_h_and_m() -> None:
    """(h [B, H], m [B, M]) zeros of the core's dtype, on the requested device (the
    weights' by default)."""
    core = NRU(3, 2, memory_size=4, heads=1).double()
    h, m = core.initial_state(3)
    assert torch.equal(h, torch.zeros(3, 2, dtype=torch.float64))
    assert torch.equal(m, torch.zeros(3, 4, dtype=torch.float64))
    h_meta, m_meta = core.initial_state(2, "meta")
    assert h_meta.device.type == "meta" and m_meta.device.type == "meta"
    assert h_meta.shape == (2, 2) and m_meta.shape == (2, 4)
    assert h_meta.dtype == torch.float64 and m_meta.dtype == torch.float64
    # without a device, the weights' (meta here: no accelerator needed)
    h_w, m_w = core.to("meta").initial_state(2)
    assert h_w.device.type == "meta" and m_w.device.type == "meta"


def test_nru_one_step_by_hand() -> None:
    """h = 0.2, m = (0.3, 0.1), x = 0.4: h' = relu(0.4 + 0.5 + 0.1 + 0.3 - 0.1) = 1.2;
    write = (1.2 (0.6, 0.8), 0.5 (-0.6, -0.8)), erase = (0.2 (1, 0), 0.3 (1, 0)); their
    difference averaged over the heads is (-0.04, 0.28): m' = (0.26, 0.38)."""
    core = _hand_nru()
    state = (
        torch.tensor([[0.2]], dtype=torch.float64),
        torch.tensor([[0.3, 0.1]], dtype=torch.float64),
    )
    x = torch.tensor([[0.4]], dtype=torch.float64)
    h_hand, m_hand = _hand_nru_step(0.2, (0.3, 0.1), 0.4)
    assert h_hand == pytest.approx(1.2) and m_hand == pytest.approx([0.26, 0.38])
    y, (h, m) = core.step(x, state)
    torch.testing.assert_close(y, torch.tensor([[1.2]], dtype=torch.float64))
    torch.testing.assert_close(h, y)
    torch.testing.assert_close(m, torch.tensor([[0.26, 0.38]], dtype=torch.float64))
    y_seq, (h_seq, m_seq) = core(x.unsqueeze(0), state)
    torch.testing.assert_close(y_seq[0], y)
    torch.testing.assert_close(h_seq, h)
    torch.testing.assert_close(m_seq, m)


def test_nru_write_vectors_are_p_normalised() -> None:
    """With p = 5, write and erase vectors are divided by the 5-norm: q_v / |q_v|_5 with
    |(3, 4)|_5 = 1267^(1/5); the erase vectors stay (1, 0)."""
    core = _hand_nru(p=5.0)
    state = (
        torch.tensor([[0.2]], dtype=torch.float64),
        torch.tensor([[0.3, 0.1]], dtype=torch.float64),
    )
    _, (h, m) = core.step(torch.tensor([[0.4]], dtype=torch.float64), state)
    norm = 1267.0**0.2
    v = (3.0 / norm, 4.0 / norm)
    expected = [0.3 + (0.7 * v[0] - 0.5) / 2, 0.1 + 0.7 * v[1] / 2]
    torch.testing.assert_close(m, torch.tensor([expected], dtype=torch.float64))
    vectors = core._vectors(torch.tensor([[1.0, -2.0, 3.0, 4.0]], dtype=torch.float64))
    torch.testing.assert_close(
        vectors, torch.tensor([[[v[0], v[1]], [-v[0], -v[1]]]], dtype=torch.float64)
    )


def test_nru_carries_h_and_m_and_resets_rows_at_episode_starts() -> None:
    """Three steps, two rows from nonzero states: row 0 carries (h, m); row 1 restarts from
    zeros at step 1 (starts[1, 1]). Every value from :func:`_hand_nru_step`."""
    core = _hand_nru()
    xs = [(0.4, -0.3), (0.1, 0.6), (-0.2, 0.3)]
    x = torch.tensor(xs, dtype=torch.float64).unsqueeze(-1)
    starts = torch.tensor([[False, False], [False, True], [False, False]])
    h0 = torch.tensor([[0.2], [0.5]], dtype=torch.float64)
    m0 = torch.tensor([[0.3, 0.1], [-0.4, 0.2]], dtype=torch.float64)
    y, (h_last, m_last) = core(x, (h0, m0), starts)
    rows = [(0.2, (0.3, 0.1)), (0.5, (-0.4, 0.2))]
    for t in range(3):
        for b in range(2):
            h, m = (0.0, (0.0, 0.0)) if starts[t, b] else rows[b]
            rows[b] = _hand_nru_step(h, m, xs[t][b])
            assert y[t, b, 0].item() == pytest.approx(rows[b][0], abs=1e-12)
    torch.testing.assert_close(h_last, torch.tensor([[r[0]] for r in rows], dtype=torch.float64))
    torch.testing.assert_close(m_last, torch.tensor([r[1] for r in rows], dtype=torch.float64))
    _, (_, m_free) = core(x, (h0, m0))  # no starts: row 1 carries its state on
    assert not torch.allclose(m_free[1], m_last[1])


def test_nru_forward_checks_its_arguments() -> None:
    """check_sequence's messages for a wrong input size, a list state and wrong starts."""
    assert_forward_checks_its_arguments(NRU(1, 2, memory_size=4, heads=1), "NRU")
