"""Gate activations and gate-bias initialisers shared by every gated core.

Activations ``phi: R -> (0, 1)`` (all satisfy ``phi(-z) = 1 - phi(z)`` and ``phi'(0) = 1/4``):

- ``sigmoid``: ``sigma(z)``; saturates as ``O(e^-z)``.
- ``softsign``: normalised softsign ``(softsign(z / 2) + 1) / 2``; saturates as ``O(1/z)``.
- ``fast``: the fast gate ``sigma(sinh z)`` (Ohno et al.); saturates as ``O(exp(-e^z))``.
- ``fast2``: the iterated fast gate ``sigma(sinh(sinh z))``.

The fast gates are evaluated on a clamped argument. ``sinh`` overflows near ``|z| = 89`` in
float32 and the naive backward then multiplies ``0 * inf = nan``; clamping ``z`` to
``[-FAST_CLAMP, FAST_CLAMP]`` before ``sinh`` changes no value (``sigma(sinh 10)`` is exactly 1
even in float64) and gives an exact zero gradient beyond the clamp, where the true gradient is
below ``exp(-11000)``. The result is finite in forward and backward for every finite input.

Bias initialisers return the forget-gate bias ``b_f [H]`` for a given activation:

- ``constant``: ``phi(b_f) = sigma(1)`` for every activation, so every gate starts with the same
  value (``b_f = 1, asinh(1), e - 1, asinh(asinh(1))``) and time scale ``-1/log sigma(1)``.
- ``chrono(t_max)``: gate values as Tallec & Ollivier's chrono init for the sigmoid,
  ``sigma(b) with b ~ log U[1, t_max - 1]``; for the sigmoid ``b_f = b`` exactly.
- ``uniform`` (UGI, Gu et al.): gate values ``u ~ U[1/H, 1 - 1/H]``, ``b_f = phi^-1(u)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

ACTIVATIONS = ("sigmoid", "fast", "fast2", "softsign")
INITS = ("constant", "uniform", "chrono")

FAST_CLAMP = 10.0
"""|z| beyond which the fast gates are exactly 0 or 1 (``sinh(10) ~ 1.1e4``, fp16-safe)."""


# ---------------------------------------------------------------------------- activations
def sigmoid_gate(z: Tensor) -> Tensor:
    """``sigma(z)``."""
    return torch.sigmoid(z)


def softsign_gate(z: Tensor) -> Tensor:
    """Normalised softsign ``(softsign(z/2) + 1) / 2 = (z / (2 + |z|) + 1) / 2``."""
    return 0.5 + 0.5 * z / (2.0 + z.abs())


def fast_gate(z: Tensor) -> Tensor:
    """Fast gate ``sigma(sinh z)``, finite in forward and backward for any finite ``z``."""
    return torch.sigmoid(torch.sinh(z.clamp(-FAST_CLAMP, FAST_CLAMP)))


def fast2_gate(z: Tensor) -> Tensor:
    """Iterated fast gate ``sigma(sinh(sinh z))``, finite in forward and backward."""
    inner = torch.sinh(z.clamp(-FAST_CLAMP, FAST_CLAMP))
    return torch.sigmoid(torch.sinh(inner.clamp(-FAST_CLAMP, FAST_CLAMP)))


GATE_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": sigmoid_gate,
    "fast": fast_gate,
    "fast2": fast2_gate,
    "softsign": softsign_gate,
}


def gate_fn(activation: str) -> Callable[[Tensor], Tensor]:
    """The gate function called ``activation``; ``ValueError`` lists the valid names."""
    if activation not in GATE_FUNCTIONS:
        raise ValueError(f"unknown gate activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
    return GATE_FUNCTIONS[activation]


def gate_derivative(activation: str, z: Tensor, value: Tensor | None = None) -> Tensor:
    """``phi'(z)`` in closed form (used by the fused cell's hand-written backward).

    :param z: pre-activations, any shape.
    :param value: ``phi(z)`` when already known (saves recomputing it).
    """
    if activation == "softsign":
        return (2.0 + z.abs()).reciprocal().square()
    phi = gate_fn(activation)(z) if value is None else value
    sig_slope = phi * (1.0 - phi)
    if activation == "sigmoid":
        return sig_slope
    inside = (z.abs() <= FAST_CLAMP).to(z.dtype)
    zc = z.clamp(-FAST_CLAMP, FAST_CLAMP)
    if activation == "fast":
        return sig_slope * torch.cosh(zc) * inside
    # fast2: d/dz sigma(sinh(s)) with s = sinh z: sigma' * cosh(s) * cosh(z)
    s = torch.sinh(zc)
    inside = inside * (s.abs() <= FAST_CLAMP).to(z.dtype)
    return sig_slope * torch.cosh(s.clamp(-FAST_CLAMP, FAST_CLAMP)) * torch.cosh(zc) * inside


def gate_inverse(activation: str, value: Tensor | float) -> Tensor:
    """``phi^-1(value)`` for ``value`` in (0, 1) (float64 for accuracy)."""
    u = torch.as_tensor(value, dtype=torch.float64)
    if activation == "softsign":
        s = 2.0 * u - 1.0  # phi = (s + 1) / 2 with s = z / (2 + |z|)
        return 2.0 * s / (1.0 - s.abs())
    logit = torch.log(u) - torch.log1p(-u)
    if activation == "sigmoid":
        return logit
    if activation == "fast":
        return torch.asinh(logit)
    if activation == "fast2":
        return torch.asinh(torch.asinh(logit))
    raise ValueError(f"unknown gate activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")


# ---------------------------------------------------------------------------- initialisers
def constant_bias(activation: str, hidden_size: int) -> Tensor:
    """``b_f [H]`` with ``phi(b_f) = sigma(1)`` (b_f = 1 for the sigmoid)."""
    if activation == "sigmoid":
        return torch.ones(hidden_size, dtype=torch.float64)
    target = 1.0 / (1.0 + math.exp(-1.0))
    return gate_inverse(activation, target).expand(hidden_size).clone()


def chrono_bias(
    activation: str, hidden_size: int, t_max: float, generator: torch.Generator | None = None
) -> Tensor:
    """Chrono init: ``b ~ log U[1, t_max - 1]``; ``b_f = phi^-1(sigma(b))`` (= b for sigmoid).

    The decay period ``1 / (1 - f)`` of the sigmoid gate is then uniform on ``[2, t_max]``.
    """
    if t_max <= 2:
        raise ValueError(f"chrono init needs t_max > 2, got {t_max}")
    u = torch.rand(hidden_size, dtype=torch.float64, generator=generator)
    b = torch.log(1.0 + u * (t_max - 2.0))
    if activation == "sigmoid":
        return b
    return gate_inverse(activation, torch.sigmoid(b))


def uniform_bias(
    activation: str, hidden_size: int, generator: torch.Generator | None = None
) -> Tensor:
    """UGI: gate values ``u ~ U[1/H, 1 - 1/H]``, ``b_f = phi^-1(u)`` (one sample per unit).

    Sampling inside ``[1/H, 1 - 1/H]`` keeps ``phi^-1`` finite (Gu et al., App. D.5).
    """
    lo = 1.0 / hidden_size if hidden_size > 2 else 0.25
    u = lo + (1.0 - 2.0 * lo) * torch.rand(hidden_size, dtype=torch.float64, generator=generator)
    return gate_inverse(activation, u)


def forget_bias(
    init: str,
    activation: str,
    hidden_size: int,
    t_max: float = 1000.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The forget-gate bias ``[H]`` (float64) for initialiser ``init``."""
    if init == "constant":
        return constant_bias(activation, hidden_size)
    if init == "uniform":
        return uniform_bias(activation, hidden_size, generator)
    if init == "chrono":
        return chrono_bias(activation, hidden_size, t_max, generator)
    raise ValueError(f"unknown gate init {init!r}; valid: {', '.join(INITS)}")


def refine(f: Tensor, r: Tensor) -> Tensor:
    """Refine gate (Gu et al. eq. 16): ``g = r (1 - (1 - f)^2) + (1 - r) f^2 = 2rf + (1-2r)f^2``.

    ``g`` lies in the band ``[f^2, 1 - (1 - f)^2]``; ``r = 1/2`` gives ``g = f``.
    """
    return f * (2.0 * r + (1.0 - 2.0 * r) * f)


def log_gate_complement(activation: str, z: Tensor) -> Tensor:
    """``log(1 - phi(z))`` computed without forming ``1 - phi(z)``, finite for any finite ``z``.

    A saturated gate rounds to exactly 1 (``sigma(37)`` in float64, ``sigma(sinh 4.3)`` for the
    fast gate), so ``-1/log phi`` becomes infinite long before the time scale stops being
    meaningful; in log space the fast gate's ``log(1 - phi) ~ -sinh z`` stays exact. The fast
    gates use the same clamped argument as :func:`fast_gate`.
    """
    if activation == "softsign":  # 1 - phi(z) = phi(-z) = (2 + |z| - z) / (2 (2 + |z|))
        return torch.log(2.0 + z.abs() - z) - torch.log(2.0 * (2.0 + z.abs()))
    if activation == "sigmoid":
        x = z
    elif activation == "fast":
        x = torch.sinh(z.clamp(-FAST_CLAMP, FAST_CLAMP))
    elif activation == "fast2":
        x = torch.sinh(torch.sinh(z.clamp(-FAST_CLAMP, FAST_CLAMP)).clamp(-FAST_CLAMP, FAST_CLAMP))
    else:
        raise ValueError(f"unknown gate activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
    return torch.nn.functional.logsigmoid(-x)


def log_refine_complement(log_one_minus_f: Tensor, f: Tensor, log_one_minus_r: Tensor) -> Tensor:
    """``log(1 - g)`` of the refine gate :func:`refine` from ``log(1 - f)``, ``f``, ``log(1 - r)``.

    ``1 - g = (1 - f) ((1 - f) + 2 f (1 - r))``: both factors stay in log space, so a gate with
    ``f`` and ``r`` rounded to 1 still gets its ``~3 (1 - f)^2``.
    """
    second = torch.logaddexp(log_one_minus_f, math.log(2.0) + torch.log(f) + log_one_minus_r)
    return log_one_minus_f + second


def log_timescale(log_one_minus_g: Tensor) -> Tensor:
    """Natural log of the time scale ``-1/log g`` from ``log(1 - g)``; finite while ``g < 1``.

    With ``u = 1 - g``: ``log tau = -log(-log1p(-u))``; below ``u = e^-20`` this equals
    ``-log u`` to float64 precision (``-log1p(-u) = u (1 + u/2 + ...)``), which never overflows.
    """
    u = torch.exp(log_one_minus_g)
    direct = -torch.log(-torch.log1p(-u.clamp(max=1.0 - 1e-16)))
    return torch.where(log_one_minus_g < -20.0, -log_one_minus_g, direct)


# ---------------------------------------------------------------------------- ordered gates
def cumax(z: Tensor) -> Tensor:
    """``cumax = cumsum o softmax`` over the last dimension (Shen et al., ON-LSTM Sec. 4.1).

    The result is non-decreasing along the last dimension, in ``[0, 1]``, and its last entry
    is exactly 1. With equal logits over ``n`` entries, entry ``j`` (1-based) is ``j / n``.
    """
    return torch.cumsum(torch.softmax(z, dim=-1), dim=-1)


def master_gates(
    f_master: Tensor, i_master: Tensor, f: Tensor, i: Tensor, scale: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Effective forget/input gates of master gates (Gu et al., App. B.4 eqs. 21-23, 26-27).

    ``w = f_master * i_master``; ``f_hat = scale * f * w + (f_master - w)`` and
    ``i_hat = scale * i * w + (i_master - w)``. ``scale=1`` is ON-LSTM (Shen et al. Sec. 4.2);
    ``scale=2`` with tied gates (``i_master = 1 - f_master``, ``i = 1 - f``) is the rescaled
    form of Gu et al.'s Proposition 4, for which ``f_hat = refine(f_master, f)``.

    :return: ``(f_hat, i_hat)``, shaped like the broadcast of the inputs.
    """
    w = f_master * i_master
    return scale * f * w + (f_master - w), scale * i * w + (i_master - w)
