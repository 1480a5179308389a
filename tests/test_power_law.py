"""The gated power-law decay of Ohno & Kumagai on the gate-tied LSTM and the GRU (``power=r``
of cores/gated.py and cores/gru.py; presets ``power_lstm``, ``power_gru``), checked against a
step-by-step transcription in float64."""

from __future__ import annotations

import math

import pytest
import torch

from memcores.cores import make_core

F64 = torch.float64


def _tied_lstm_step(core, x, h, c, r):
    """Transcription: gate-tied LSTM with the gated power rule on the cell."""
    H = core.hidden_size
    a = x @ core.weight_ih.T + core.bias + h @ core.weight_hh.T
    blocks = dict(zip(core.gate_names, a.split(H, dim=-1), strict=True))
    f = torch.sigmoid(blocks["f"])
    o = torch.sigmoid(blocks["o"])
    u = torch.tanh(blocks["u"])
    c = (c - (1 - f) * c.abs() ** r * c + (1 - f) * u).clamp(-1, 1)
    return o * torch.tanh(c), c


def _gru_step(core, x, h, r):
    H = core.hidden_size
    ax = x @ core.weight_ih.T + core.bias
    ah = h @ core.weight_hh.T
    blocks = dict(zip(core.gate_names, range(len(core.gate_names)), strict=True))

    def blk(t, name):
        return t[..., blocks[name] * H : (blocks[name] + 1) * H]

    z = torch.sigmoid(blk(ax, "z") + blk(ah, "z"))
    rr = torch.sigmoid(blk(ax, "r") + blk(ah, "r"))
    n = torch.tanh(blk(ax, "n") + rr * (blk(ah, "n") + core.bias_hn))
    return (h - (1 - z) * h.abs() ** r * h + (1 - z) * n).clamp(-1, 1)


@pytest.mark.parametrize("r", [2.0, 1.5])
def test_power_lstm_and_gru_equal_their_transcription(r) -> None:
    torch.manual_seed(0)
    lstm = make_core("tied_lstm", 3, 5, power=r).double()
    gru = make_core("gru", 3, 5, power=r).double()
    x = 3 * torch.randn(9, 2, 3, dtype=F64)  # large inputs: gates near 0 and 1, the clip acts
    starts = torch.zeros(9, 2, dtype=torch.bool)
    starts[4, 1] = True
    y, (h_last, c_last) = lstm(x, lstm.initial_state(2), starts)
    yg, (hg_last,) = gru(x, gru.initial_state(2), starts)
    h = c = hg = torch.zeros(2, 5, dtype=F64)
    for t in range(9):
        keep = (~starts[t]).to(F64).unsqueeze(1)
        h, c, hg = h * keep, c * keep, hg * keep
        h, c = _tied_lstm_step(lstm, x[t], h, c, r)
        hg = _gru_step(gru, x[t], hg, r)
        torch.testing.assert_close(y[t], h)
        torch.testing.assert_close(yg[t], hg)
    torch.testing.assert_close(c_last, c)
    torch.testing.assert_close(hg_last, hg)


def test_power_presets_and_zero_power_is_the_ordinary_cell() -> None:
    assert make_core("power_lstm", 3, 4).power == 2.0 and make_core("power_gru", 3, 4).power == 2.0
    with pytest.raises(ValueError, match="fixed"):
        make_core("power_lstm", 3, 4, power=1.0)
    with pytest.raises(ValueError, match="power must be >= 0"):
        make_core("gru", 3, 4, power=-1.0)
    x = torch.randn(6, 2, 3, dtype=F64)
    for name in ("tied_lstm", "gru"):
        torch.manual_seed(1)
        plain = make_core(name, 3, 4).double()
        torch.manual_seed(1)
        zero = make_core(name, 3, 4, power=0.0).double()
        y_zero = zero(x, zero.initial_state(2))[0]
        torch.testing.assert_close(y_zero, plain(x, plain.initial_state(2))[0])


def test_power_decay_is_polynomial_without_input() -> None:
    """Free decay (candidate u = 0, constant forget gate f): the linear cell decays as f^t,
    the power cell as ~ t^(-1/r)."""
    core = make_core("power_lstm", 1, 1).double()
    with torch.no_grad():
        core.weight_ih.zero_()
        core.weight_hh.zero_()
        core.bias.zero_()
        core.bias[core._block("f")] = 2.0  # f = sigma(2) ~ 0.88
        core.bias[core._block("u")] = 0.0  # u = 0: no new input
    h0 = (torch.zeros(1, 1, dtype=F64), torch.full((1, 1), 0.9, dtype=F64))
    _, (_, c) = core(torch.zeros(2000, 1, 1, dtype=F64), h0)
    k = 1 - 1 / (1 + math.exp(-2.0))
    assert c.item() == pytest.approx((2 * k * 2000) ** -0.5, rel=0.05)  # c ~ (2 k t)^(-1/2)
    assert c.item() > 1e3 * (1 - k) ** 2000
