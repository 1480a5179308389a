"""Diagnostics used by the papers: gate time scales and gradient-vs-lag profiles.

- :func:`timescales`: per-unit characteristic time ``-1/log phi(b_f)`` of a gated core, computed
  from the forget-gate bias only (Tallec & Ollivier; Ohno et al. Sec. 6.1).
- :func:`input_gradient_profile`: ``||dL/dx_t||`` for every time step (Ohno & Kumagai Sec.
  IV-A): exponential decay as ``t`` goes back from the loss means the gates set the memory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def timescales(core: nn.Module) -> Tensor:
    """Per-unit characteristic time ``-1 / log phi(b_f)`` of a gated core, shape ``[H]``.

    For a core with a refine gate the effective gate ``g(phi(b_f), sigma(b_r))`` is used; for the
    GRU family the update gate ``z`` (which keeps the state) plays the forget gate's role.

    :param core: a core exposing ``forget_gate_timescales()`` (every gated core does).
    :raises ValueError: for a core without a forget gate (e.g. ``power_rnn``, ``rel_lstm``).
    """
    method = getattr(core, "forget_gate_timescales", None)
    if method is None:
        raise ValueError(
            f"{type(core).__name__} has no forget gate, so it has no gate time scales; "
            "timescales() supports the gated LSTM/GRU cores (lstm, fast_lstm, ur_lstm, gru, ...)"
        )
    return method().float()


def log_timescales(core: nn.Module) -> Tensor:
    """Natural logs of :func:`timescales`, shape ``[H]``, float64 and finite for saturated gates.

    A fast-gate unit with bias 5 has ``tau ~ e^74``: its gate is 1 in float32 and float64, so
    :func:`timescales` gives ``inf`` while this gives ``74.2``. Use it to average time scales
    that span many orders of magnitude (fast-gate paper Fig. 5).

    :raises ValueError: for a core without a forget gate.
    """
    method = getattr(core, "forget_gate_log_timescales", None)
    if method is None:  # a core with only forget_gate_timescales(), or none (ValueError)
        return torch.log(timescales(core).double())
    return method()


def input_gradient_profile(
    model_fn: Callable[[Tensor], object], x: Tensor, loss_fn: Callable[[object], Tensor]
) -> Tensor:
    """``||dL/dx_t||_2`` for every time step ``t``, shape ``[T]``.

    :param model_fn: maps ``x [T, B, D]`` to outputs (anything ``loss_fn`` accepts).
    :param x: inputs ``[T, B, D]``; not modified (a detached copy is differentiated).
    :param loss_fn: maps the outputs to a scalar loss ``L`` (e.g. cross-entropy at step T).
    :return: the Euclidean norm of ``dL/dx_t`` over the batch and feature dimensions.
    """
    if x.dim() != 3:
        raise ValueError(f"x must have shape [T, B, D], got {tuple(x.shape)}")
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(model_fn(x))
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        (grad,) = torch.autograd.grad(loss.reshape(()), x, allow_unused=True)
    if grad is None:
        return torch.zeros(x.shape[0], dtype=x.dtype)
    return grad.flatten(1).norm(dim=1).detach()
