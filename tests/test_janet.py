"""JANET (van der Westhuizen & Lasenby, "The unreasonable effectiveness of the forget gate",
arXiv:1804.04849) checked against its equations, written out unit by unit in float64."""

from __future__ import annotations

import math

import pytest
import torch
from equation_helpers import (
    B,
    D,
    affine,
    assert_forward_checks_its_arguments,
    build,
    inputs,
    sigmoid,
)

from memcores.cores import make_core
from memcores.cores.janet import JANET


def _reference_janet(core, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """van der Westhuizen & Lasenby: s = W_f x + U_f h + b_f; c = sigma(s) c + (1 - sigma(s -
    beta)) tanh(W_c x + U_c h + b_c); h = c."""
    H = core.hidden_size
    h = torch.zeros(B, H, dtype=torch.float64)
    ys = []
    for x_t in x:
        s = affine(core, slice(0, H), x_t, h)
        c_tilde = affine(core, slice(H, 2 * H), x_t, h)
        new = torch.empty_like(h)
        for b in range(B):
            for j in range(H):
                sv = s[b, j].item()
                keep, write = sigmoid(sv), 1.0 - sigmoid(sv - core.beta)
                new[b, j] = keep * h[b, j].item() + write * math.tanh(c_tilde[b, j].item())
        h = new
        ys.append(h)
    return torch.stack(ys), h


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_janet_matches_its_equations(beta: float) -> None:
    core = build("janet", 5, t_max=50, beta=beta)
    x = inputs()
    y, (h,) = core(x, core.initial_state(B))
    y_ref, h_ref = _reference_janet(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


def test_janet_has_two_affine_maps_and_chrono_forget_bias() -> None:
    H, t_max = 64, 100.0
    torch.manual_seed(0)
    core = make_core("janet", D, H, t_max=t_max)
    n = H * (D + H + 1)  # one affine map
    assert sum(p.numel() for p in core.parameters()) == 2 * n
    assert sum(p.numel() for p in make_core("tied_lstm", D, H).parameters()) == 3 * n
    b_f, b_c = core.bias[:H].detach(), core.bias[H:].detach()
    assert b_c.abs().max() == 0
    assert b_f.min() >= 0 and b_f.max() <= math.log(t_max - 1) + 1e-6
    # log U[1, t_max - 1]: the decay periods 1 + e^b spread over [2, t_max]
    assert b_f.max() > math.log(0.5 * t_max) and b_f.min() < math.log(0.5 * t_max)
    torch.testing.assert_close(
        core.forget_gate_timescales(), -1.0 / torch.log(torch.sigmoid(b_f.double()))
    )
    with pytest.raises(ValueError, match="t_max"):
        make_core("janet", D, H, t_max=2)


# ------------------------------------------------------------------ pinned by hand (H = 2)
_W_IH = (0.5, -1.0, 0.3, 0.8)
_B = (0.1, 0.2, -0.1, 0.05)
_W_HH = ((0.2, 0.0), (0.4, -0.1), (0.1, 0.3), (-0.2, 0.5))


def _hand_janet(beta: float = 0.5) -> JANET:
    """D = 1, H = 2, the weights above (rows 0-1 the forget gate, rows 2-3 the candidate)."""
    core = JANET(1, 2, t_max=10, beta=beta).double()
    with torch.no_grad():
        core.weight_ih.copy_(torch.tensor(_W_IH, dtype=torch.float64).unsqueeze(1))
        core.bias.copy_(torch.tensor(_B, dtype=torch.float64))
        core.weight_hh.copy_(torch.tensor(_W_HH, dtype=torch.float64))
    return core


def _hand_step(h: tuple[float, float], x: float, beta: float = 0.5) -> tuple[float, float]:
    """s_j = a_j, u_j = a_{2+j}; h_j' = sigma(s_j) h_j + sigma(beta - s_j) tanh(u_j)."""
    a = [_W_IH[k] * x + _B[k] + _W_HH[k][0] * h[0] + _W_HH[k][1] * h[1] for k in range(4)]
    return tuple(
        sigmoid(a[j]) * h[j] + sigmoid(beta - a[j]) * math.tanh(a[2 + j]) for j in range(2)
    )


def test_janet_defaults_and_parameter_shapes() -> None:
    """JANET(D, H): t_max = 1000.0 and beta = 1.0 (floats); weights [2H, D], [2H, H], [2H]."""
    core = JANET(3, 2)
    assert core.input_size == 3 and core.hidden_size == 2
    assert core.t_max == 1000.0 and isinstance(core.t_max, float)
    assert core.beta == 1.0 and isinstance(core.beta, float)
    assert core.weight_ih.shape == (4, 3) and core.weight_hh.shape == (4, 2)
    assert core.bias.shape == (4,)
    assert repr(core) == "JANET(3, 2, t_max=1000.0, beta=1.0)"
    named = JANET(3, 2, t_max=50, beta=0)
    assert isinstance(named.t_max, float) and isinstance(named.beta, float)
    assert repr(named) == "JANET(3, 2, t_max=50.0, beta=0.0)"


def test_janet_refuses_t_max_up_to_two() -> None:
    """The exact message at t_max = 2 and below; just above 2 is accepted."""
    for bad in (2, 1.5):
        with pytest.raises(ValueError, match=rf"^t_max must be > 2 \(chrono init\), got {bad}$"):
            JANET(3, 2, t_max=bad)
    assert JANET(3, 2, t_max=2.5).t_max == 2.5


def test_janet_initialisation_draws_by_hand() -> None:
    """W_ih then W_hh ~ U(-1/sqrt(H), 1/sqrt(H)), then u ~ U[0, 1) (float64) and
    b_f = log(1 + u (t_max - 2)); b_c = 0. H = 4: the bound is 1/2."""
    D, H, t_max = 3, 4, 20.0
    torch.manual_seed(5)
    core = JANET(D, H, t_max=t_max)
    torch.manual_seed(5)
    w_ih = torch.empty(2 * H, D).uniform_(-0.5, 0.5)
    w_hh = torch.empty(2 * H, H).uniform_(-0.5, 0.5)
    u = torch.rand(H, dtype=torch.float64)
    b_f = torch.log(1.0 + u * 18.0).float()
    assert torch.equal(core.weight_ih.detach(), w_ih)
    assert torch.equal(core.weight_hh.detach(), w_hh)
    torch.testing.assert_close(core.bias.detach()[:H], b_f, rtol=0, atol=1e-7)
    assert torch.equal(core.bias.detach()[H:], torch.zeros(H))
    assert core.bias.dtype == torch.float32


def test_janet_forget_gate_timescales_by_hand() -> None:
    """-1/log sigma(b_f): b_f = 0 gives 1/log 2, b_f = log 3 gives -1/log(3/4); b_f = 40 (a
    gate that rounds to 1) gives log tau = 40 to float64 precision. Float64 on the CPU, from
    the forget rows only."""
    core = JANET(1, 3, t_max=10)
    with torch.no_grad():
        core.bias.copy_(torch.tensor([0.0, math.log(3.0), 40.0, 5.0, 6.0, 7.0]))
    log_tau = core.forget_gate_log_timescales()
    assert log_tau.dtype == torch.float64 and log_tau.shape == (3,)
    expected = [-math.log(math.log(2.0)), -math.log(-math.log(0.75)), 40.0]
    torch.testing.assert_close(log_tau, torch.tensor(expected, dtype=torch.float64))
    tau = core.forget_gate_timescales()
    torch.testing.assert_close(
        tau[:2], torch.tensor([1 / math.log(2.0), -1 / math.log(0.75)]).double()
    )


def test_janet_initial_state_is_one_zero_tensor() -> None:
    """(h,) with h = 0 [B, H] of the core's dtype, on the requested device."""
    core = JANET(3, 2).double()
    state = core.initial_state(4)
    assert len(state) == 1 and state[0].dtype == torch.float64
    assert torch.equal(state[0], torch.zeros(4, 2, dtype=torch.float64))
    on_meta = core.initial_state(3, "meta")
    assert on_meta[0].device.type == "meta" and on_meta[0].shape == (3, 2)


def test_janet_one_step_by_hand() -> None:
    """From h = (0.5, -1), x = 2 and beta = 0.5: a = (1.2, -1.5, 0.25, 1.05);
    h' = sigma(s) h + sigma(beta - s) tanh(u), through step and forward."""
    core = _hand_janet()
    h = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    x = torch.tensor([[2.0]], dtype=torch.float64)
    expected = [
        sigmoid(1.2) * 0.5 + sigmoid(0.5 - 1.2) * math.tanh(0.25),
        sigmoid(-1.5) * -1.0 + sigmoid(0.5 + 1.5) * math.tanh(1.05),
    ]
    assert _hand_step((0.5, -1.0), 2.0) == pytest.approx(expected, abs=1e-15)
    y, (h1,) = core.step(x, (h,))
    torch.testing.assert_close(y, torch.tensor([expected], dtype=torch.float64))
    torch.testing.assert_close(h1, y)
    y_seq, (h_seq,) = core(x.unsqueeze(0), (h,))
    torch.testing.assert_close(y_seq[0], y)
    torch.testing.assert_close(h_seq, y)


def test_janet_carries_the_state_and_resets_rows_at_episode_starts() -> None:
    """Three steps, two rows from a nonzero h0: row 0 carries h; row 1 restarts from 0 at
    step 1 (starts[1, 1]). Every value from :func:`_hand_step`."""
    core = _hand_janet()
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25)]
    x = torch.tensor(xs, dtype=torch.float64).unsqueeze(-1)
    starts = torch.tensor([[False, False], [False, True], [False, False]])
    h0 = torch.tensor([[0.5, -1.0], [0.3, 0.7]], dtype=torch.float64)
    y, (h_last,) = core(x, (h0,), starts)
    rows = [(0.5, -1.0), (0.3, 0.7)]
    for t in range(3):
        for b in range(2):
            rows[b] = _hand_step((0.0, 0.0) if starts[t, b] else rows[b], xs[t][b])
            torch.testing.assert_close(y[t, b], torch.tensor(rows[b], dtype=torch.float64))
    torch.testing.assert_close(h_last, torch.tensor(rows, dtype=torch.float64))
    y_free, _ = core(x, (h0,))  # no starts: row 1 carries h0 on
    assert not torch.allclose(y_free[1, 1], y[1, 1])


def test_janet_forward_checks_its_arguments() -> None:
    """check_sequence's messages for a wrong input size, a list state and wrong starts."""
    assert_forward_checks_its_arguments(JANET(1, 2), "JANET")
