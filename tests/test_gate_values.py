"""Gate derivatives and bias initialisers against values computed in the test.

The initialisers draw from a seeded generator; the expected bias is the documented formula
applied to the same draws (``torch.rand`` in float64 from a generator with the same seed).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from memcores.cores.gates import (
    ACTIVATIONS,
    FAST_CLAMP,
    chrono_bias,
    forget_bias,
    gate_derivative,
    gate_fn,
    gate_inverse,
    log_gate_complement,
    log_refine_complement,
    log_timescale,
    refine,
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


@pytest.mark.parametrize(
    "activation, z, inner",
    [
        ("fast", -FAST_CLAMP, math.cosh(FAST_CLAMP)),
        ("fast", FAST_CLAMP, math.cosh(FAST_CLAMP)),
        # sinh(asinh(10)) is exactly 10.0 in float64: fast2's inner clamp edge
        ("fast2", math.asinh(FAST_CLAMP), math.cosh(FAST_CLAMP) * math.cosh(math.asinh(10.0))),
    ],
)
def test_gate_derivative_with_a_given_value_passes_at_the_clamp_edges(activation, z, inner):
    """``phi'(z) = value (1 - value) * d/dz inner(z)``: on a clamp's bound the inner derivative
    passes, as torch's clamp passes the gradient at its bounds."""
    zt = torch.tensor([z], dtype=torch.float64)
    assert torch.sinh(zt).abs().item() == FAST_CLAMP or abs(z) == FAST_CLAMP
    got = gate_derivative(activation, zt, torch.full_like(zt, 0.5))
    torch.testing.assert_close(got, torch.tensor([0.25 * inner], dtype=torch.float64))


def test_forget_bias_dispatches_with_the_generator_and_default_t_max():
    """``forget_bias`` is the named initialiser with the caller's generator; chrono's default
    ``t_max`` is 1000."""
    for activation in ACTIVATIONS:
        torch.testing.assert_close(
            forget_bias("uniform", activation, 8, generator=_gen(5)),
            uniform_bias(activation, 8, _gen(5)),
            rtol=0,
            atol=0,
        )
        torch.testing.assert_close(
            forget_bias("chrono", activation, 8, generator=_gen(5)),
            chrono_bias(activation, 8, 1000.0, _gen(5)),
            rtol=0,
            atol=0,
        )
        torch.testing.assert_close(
            forget_bias("chrono", activation, 8, 40.0, _gen(5)),
            chrono_bias(activation, 8, 40.0, _gen(5)),
            rtol=0,
            atol=0,
        )
    # the same generator seed gives the same bias twice: no draw from the global generator
    for init in ("uniform", "chrono"):
        first = forget_bias(init, "sigmoid", 8, generator=_gen(6))
        assert torch.equal(first, forget_bias(init, "sigmoid", 8, generator=_gen(6)))


_VALID_ACTIVATIONS = "valid: sigmoid, fast, fast2, softsign"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: gate_fn("tanh"), f"unknown gate activation 'tanh'; {_VALID_ACTIVATIONS}"),
        (
            lambda: gate_inverse("tanh", 0.5),
            f"unknown gate activation 'tanh'; {_VALID_ACTIVATIONS}",
        ),
        (
            lambda: log_gate_complement("tanh", torch.zeros(1)),
            f"unknown gate activation 'tanh'; {_VALID_ACTIVATIONS}",
        ),
        (
            lambda: forget_bias("zeros", "sigmoid", 4),
            "unknown gate init 'zeros'; valid: constant, uniform, chrono",
        ),
    ],
)
def test_unknown_names_are_refused_with_the_valid_choices(call, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call()


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_log_gate_complement_is_log_of_one_minus_the_gate(activation):
    """``log(1 - phi(z)) = log phi(-z)`` (the gates' symmetry), formed directly."""
    z = torch.tensor([-2.5, -1.0, -0.3, 0.0, 0.4, 1.2, 2.0], dtype=torch.float64)
    expected = torch.log(gate_fn(activation)(-z))
    got = log_gate_complement(activation, z)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("activation", ["fast", "fast2"])
def test_log_gate_complement_of_the_fast_gates_uses_the_clamped_argument(activation):
    """Saturated: ``log(1 - sigma(x)) = -x - log1p(e^-x)`` with ``x`` the clamped ``sinh``
    (``x = sinh(FAST_CLAMP)`` at and beyond the clamp); below it the gate's complement is 1."""
    z = torch.tensor([5.0, 2.5, FAST_CLAMP, 30.0, 1000.0], dtype=torch.float64)
    x = torch.sinh(z.clamp(max=FAST_CLAMP))
    if activation == "fast2":
        x = torch.sinh(x.clamp(max=FAST_CLAMP))
    expected = -x - torch.log1p(torch.exp(-x))
    torch.testing.assert_close(log_gate_complement(activation, z), expected, rtol=1e-13, atol=0)
    low = torch.tensor([-5.0, -FAST_CLAMP, -1000.0], dtype=torch.float64)
    assert torch.all(log_gate_complement(activation, low).abs() < 1e-30)


@pytest.mark.parametrize("activation", ["fast", "fast2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_gate_complement_gradient_is_finite_for_any_finite_input(activation, dtype):
    """The clamps make the backward finite too (no ``0 * inf``) at and beyond the bounds."""
    z = torch.tensor(
        [-1000.0, -100.0, -FAST_CLAMP, -5.0, 0.0, 5.0, FAST_CLAMP, 100.0, 1000.0],
        dtype=dtype,
        requires_grad=True,
    )
    (grad,) = torch.autograd.grad(log_gate_complement(activation, z).sum(), z)
    assert torch.isfinite(grad).all(), grad


def test_log_refine_complement_is_log_of_one_minus_the_refine_gate():
    f = torch.tensor([0.1, 0.5, 0.9, 0.99, 0.3], dtype=torch.float64)
    r = torch.tensor([0.2, 0.5, 0.7, 0.05, 0.95], dtype=torch.float64)
    got = log_refine_complement(torch.log1p(-f), f, torch.log1p(-r))
    torch.testing.assert_close(got, torch.log1p(-refine(f, r)), rtol=1e-12, atol=1e-14)


def test_log_timescale_is_the_log_of_minus_one_over_log_g():
    """``log(-1 / log g)`` from ``log(1 - g)``; exactly ``-log(1 - g)`` below ``-20``, where
    ``exp`` would underflow, and the exact formula at ``-20`` itself; finite at ``g = 0``."""
    g = torch.tensor([0.05, 0.3, 0.5, 0.9, 0.999, 1 - 1e-7], dtype=torch.float64)
    got = log_timescale(torch.log1p(-g))
    torch.testing.assert_close(got, torch.log(-1.0 / torch.log(g)), rtol=1e-9, atol=1e-12)
    deep = torch.tensor([-20.5, -30.0, -800.0], dtype=torch.float64)
    assert torch.equal(log_timescale(deep), -deep)
    edge = torch.tensor([-20.0], dtype=torch.float64)
    exact = -torch.log(-torch.log1p(-torch.exp(edge)))
    torch.testing.assert_close(log_timescale(edge), exact, rtol=1e-15, atol=0)
    assert exact.item() != 20.0  # -log(-log1p(-u)) = -log u - u/2 - ...: 20 is off
    assert torch.isfinite(log_timescale(torch.zeros(1, dtype=torch.float64))).all()
