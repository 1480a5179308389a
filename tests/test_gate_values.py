"""Gate derivatives and bias initialisers against values computed in the test.

The initialisers draw from a seeded generator; the expected bias is the documented formula
applied to the same draws (``torch.rand`` in float64 from a generator with the same seed).
"""

from __future__ import annotations

import math

import pytest
import torch

from cores.gates import (
    ACTIVATIONS,
    FAST_CLAMP,
    chrono_bias,
    gate_derivative,
    gate_fn,
    gate_inverse,
    uniform_bias,
)


def _draws(n: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("activation", ["sigmoid", "fast", "fast2"])
def test_gate_derivative_uses_the_given_gate_value(activation):
    """``value`` stands in for ``phi(z)``: with ``phi = 1/2`` the sigmoid factor is 1/4."""
    z = torch.tensor([0.3, -0.2], dtype=torch.float64)
    phi = gate_fn(activation)(z)
    torch.testing.assert_close(gate_derivative(activation, z, phi), gate_derivative(activation, z))
    half = gate_derivative(activation, z, torch.full_like(z, 0.5))
    inner = {
        "sigmoid": 1.0,
        "fast": torch.cosh(z),
        "fast2": torch.cosh(torch.sinh(z)) * torch.cosh(z),
    }
    torch.testing.assert_close(half, 0.25 * inner[activation] * torch.ones_like(z))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gate_derivative_matches_autograd_at_and_beyond_the_clamp(activation):
    """The closed form is the reference's autograd gradient everywhere, the clamp's edges
    included (torch's clamp passes the gradient at its bounds)."""
    z = torch.tensor(
        [-FAST_CLAMP - 1, -FAST_CLAMP, -3.0, 0.0, 0.5, 3.0, FAST_CLAMP, FAST_CLAMP + 1],
        dtype=torch.float64,
        requires_grad=True,
    )
    (grad,) = torch.autograd.grad(gate_fn(activation)(z).sum(), z)
    torch.testing.assert_close(gate_derivative(activation, z.detach()), grad, rtol=1e-12, atol=0)


def test_fast2_derivative_at_the_inner_clamp():
    """fast2 clamps ``s = sinh z`` too: at ``s = FAST_CLAMP`` exactly the gradient passes."""
    z = torch.tensor([math.asinh(FAST_CLAMP)], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(gate_fn("fast2")(z).sum(), z)
    assert torch.sinh(z.detach()).item() <= FAST_CLAMP  # on or just inside the edge
    torch.testing.assert_close(gate_derivative("fast2", z.detach()), grad, rtol=1e-12, atol=0)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_chrono_bias_by_hand(activation):
    """``b = log(1 + u (t_max - 2))``, ``u ~ U[0, 1)``: gate values ``sigma(b)``; for the
    sigmoid ``b_f = b`` exactly."""
    t_max = 50.0
    b = torch.log(1.0 + _draws(16) * (t_max - 2.0))
    got = chrono_bias(activation, 16, t_max, _gen())
    if activation == "sigmoid":
        assert torch.equal(got, b)
    torch.testing.assert_close(gate_fn(activation)(got), torch.sigmoid(b), rtol=1e-9, atol=1e-12)


def test_chrono_bias_needs_t_max_above_2():
    with pytest.raises(ValueError, match="chrono init needs t_max > 2, got 2"):
        chrono_bias("sigmoid", 4, 2.0)
    assert chrono_bias("sigmoid", 4, 2.5, _gen()).shape == (4,)


@pytest.mark.parametrize("hidden_size, lo", [(2, 0.25), (3, 1 / 3), (8, 1 / 8)])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_uniform_bias_by_hand(activation, hidden_size, lo):
    """UGI: gate values ``u = lo + (1 - 2 lo) r`` with ``lo = 1/H`` (1/4 for H <= 2)."""
    u = lo + (1.0 - 2.0 * lo) * _draws(hidden_size, seed=3)
    got = uniform_bias(activation, hidden_size, _gen(3))
    torch.testing.assert_close(got, gate_inverse(activation, u), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gate_fn(activation)(got), u, rtol=1e-9, atol=1e-12)
