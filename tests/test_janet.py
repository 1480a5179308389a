"""JANET (van der Westhuizen & Lasenby, "The unreasonable effectiveness of the forget gate",
arXiv:1804.04849) checked against its equations, written out unit by unit in float64."""

from __future__ import annotations

import math

import pytest
import torch
from equation_helpers import B, D, affine, build, inputs, sigmoid

from memcores.cores import make_core


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
