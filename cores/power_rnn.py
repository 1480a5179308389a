"""Leaky and power-law RNNs (Ohno & Kumagai): polynomial instead of exponential memory decay.

Equations (eq. 23-24 of the paper)::

    h_t = h_{t-1} + alpha * (tanh(U h_{t-1} + W x_t + b) - |h_{t-1}|^r * h_{t-1})

``r = 0`` is exactly the leaky RNN ``h_t = (1 - alpha) h_{t-1} + alpha tanh(...)``; ``r > 0``
makes the decay of ``dh_t/dh_{t0}`` polynomial, ``~ t^{-(r+1)/r}`` (r = 2 in the paper).
``alpha`` is one learned scalar kept in (0, 1) as ``sigmoid(alpha_logit)``. ``U ~ N(0, (0.1 /
sqrt(H))^2)`` as in the paper; ``W ~ U(-1/sqrt(D), 1/sqrt(D))``, ``b = 0``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence


def power_decay(x: Tensor, r: float) -> Tensor:
    """``|x|^r x``, the power-law decay term, as ``sign(x) |x|^(r+1)`` so its gradient is finite
    at 0; ``r = 0`` is ``x`` and ``r = 2`` is ``x^3``. Shared with the gated cores' ``power``
    option (:mod:`cores.gated`, :mod:`cores.gru`)."""
    if r == 0.0:
        return x
    if r == 2.0:
        return x * x * x
    return torch.sign(x) * x.abs().pow(r + 1.0)


class PowerRNN(MemoryCore):
    """Power-law RNN; ``r=0`` gives the leaky RNN.

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of the state.
    :param r: the decay exponent (``>= 0``); the decay term is ``|h|^r h``.
    :param alpha_init: initial value of the learned step size ``alpha`` in (0, 1)
        (the paper picks it from ``{1, 5, 25} / T``).

    State: ``(h [B, H],)``, zero initially.
    """

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    def __init__(
        self, input_size: int, hidden_size: int, *, r: float = 2.0, alpha_init: float = 0.1
    ) -> None:
        super().__init__(input_size, hidden_size)
        if r < 0:
            raise ValueError(f"r must be >= 0, got {r}")
        if not 0.0 < alpha_init < 1.0:
            raise ValueError(f"alpha_init must be in (0, 1), got {alpha_init}")
        self.r = float(r)
        self.alpha_init = float(alpha_init)
        self.weight_ih = nn.Parameter(torch.empty(hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.alpha_logit = nn.Parameter(torch.zeros(1))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``U ~ N(0, 0.1/sqrt(H))``, ``W ~ U(+-1/sqrt(D))``, ``b = 0``, ``alpha = alpha_init``."""
        with torch.no_grad():
            self.weight_hh.normal_(0.0, 0.1 / math.sqrt(self.hidden_size))
            bound = 1.0 / math.sqrt(self.input_size)
            self.weight_ih.uniform_(-bound, bound)
            self.bias.zero_()
            self.alpha_logit.fill_(math.log(self.alpha_init / (1.0 - self.alpha_init)))

    @property
    def alpha(self) -> Tensor:
        """The step size ``alpha = sigmoid(alpha_logit)`` in (0, 1), shape ``[1]``."""
        return torch.sigmoid(self.alpha_logit)

    def decay(self, h: Tensor) -> Tensor:
        """``|h|^r h`` (:func:`power_decay`)."""
        return power_decay(h, self.r)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.zero_state(batch_size, device, self.weight_hh)

    def cell(self, a_x: Tensor, h: Tensor, alpha: Tensor) -> Tensor:
        """One step from the input projection ``a_x [B, H]`` and ``h [B, H]``."""
        h_tilde = torch.tanh(torch.addmm(a_x, h, self.weight_hh.t()))
        return h + alpha * (h_tilde - self.decay(h))

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        h = self.cell(F.linear(x_t, self.weight_ih, self.bias), state[0], self.alpha)
        return h, (h,)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and ``(h,)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, H], one matmul for all steps
        alpha = self.alpha

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h = self.cell(a_x, s[0], alpha)
            return h, (h,)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, r={self.r}"
