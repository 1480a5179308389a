"""JANET: an LSTM with only a forget gate (van der Westhuizen & Lasenby 2018).

J. van der Westhuizen and J. Lasenby, "The unreasonable effectiveness of the forget gate",
arXiv:1804.04849. Equations (the paper's forget-only LSTM)::

    s_t = W_f x_t + U_f h_{t-1} + b_f
    c~_t = tanh(W_c x_t + U_c h_{t-1} + b_c)
    c_t = sigma(s_t) * c_{t-1} + (1 - sigma(s_t - beta)) * c~_t
    h_t = c_t

Two affine maps (``2N`` parameters in the notation of Ohno et al.'s App. E.2: the gate-tied
LSTM without an output gate). Choices, where the papers leave room:

- ``beta`` (default 1, the paper's value) shifts the input gate so that slightly more is kept
  than written; ``beta = 0`` ties the gates exactly, ``i = 1 - f``.
- ``h_t = c_t``: no output gate and no ``tanh`` on the output, as in the paper and the
  authors' code.
- Chrono initialisation (Tallec & Ollivier), as both JANET and Ohno et al. use it:
  ``b_f ~ log U[1, t_max - 1]``; the paper sets ``t_max`` to the dependency length (the
  sequence length), so set ``t_max`` to it. ``b_c = 0``.
- Weights ``U(-1/sqrt(H), 1/sqrt(H))`` like every gated core of this package (the authors use
  Glorot-uniform); the initial state is zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores import gates
from memcores.cores.base import MemoryCore, State, check_sequence, reset_uniform_


class JANET(MemoryCore):
    """Forget-gate-only LSTM (see the module docstring for the equations).

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of the state (and the output).
    :param t_max: the chrono initialiser's largest decay period (the dependency length).
    :param beta: shift of the input gate, ``i = 1 - sigma(s - beta)``; 0 ties it to ``1 - f``.

    State: ``(h [B, H],)`` with ``h = c``, zero initially. Parameters: ``weight_ih [2H, D]``,
    ``weight_hh [2H, H]``, ``bias [2H]``; rows ``[0, H)`` are the forget gate, ``[H, 2H)``
    the candidate.
    """

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    def __init__(
        self, input_size: int, hidden_size: int, *, t_max: float = 1000.0, beta: float = 1.0
    ) -> None:
        super().__init__(input_size, hidden_size)
        if t_max <= 2:
            raise ValueError(f"t_max must be > 2 (chrono init), got {t_max}")
        self.t_max = float(t_max)
        self.beta = float(beta)
        self.weight_ih = nn.Parameter(torch.empty(2 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(2 * hidden_size, hidden_size))
        self.bias = nn.Parameter(torch.zeros(2 * hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights ``U(-1/sqrt(H), 1/sqrt(H))``; chrono ``b_f``, ``b_c = 0``."""
        reset_uniform_(self.weight_ih, self.weight_hh, self.bias)
        with torch.no_grad():
            b_f = gates.chrono_bias("sigmoid", self.hidden_size, self.t_max)
            self.bias[: self.hidden_size] = b_f.to(self.bias.dtype)

    def forget_gate_timescales(self) -> Tensor:
        """``[H]`` characteristic times ``-1/log sigma(b_f)`` of the forget gate at its bias."""
        return torch.exp(self.forget_gate_log_timescales())

    def forget_gate_log_timescales(self) -> Tensor:
        """``[H]`` natural logs of :meth:`forget_gate_timescales` (float64)."""
        with torch.no_grad():
            b_f = self.bias.detach().double().cpu()[: self.hidden_size]
            return gates.log_timescale(gates.log_gate_complement("sigmoid", b_f))

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.zero_state(batch_size, device, self.weight_hh)

    def cell(self, a_x: Tensor, h: Tensor) -> Tensor:
        """One step from the input projection ``a_x [B, 2H]`` (bias included) and ``h [B, H]``."""
        a = torch.addmm(a_x, h, self.weight_hh.t())
        s, u = a.chunk(2, dim=-1)
        keep = torch.sigmoid(s)
        write = torch.sigmoid(self.beta - s)  # = 1 - sigma(s - beta), without cancellation
        return keep * h + write * torch.tanh(u)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """``x_t [B, D]`` -> ``h [B, H]`` and ``(h,)``."""
        h = self.cell(F.linear(x_t, self.weight_ih, self.bias), state[0])
        return h, (h,)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and ``(h,)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, 2H], one matmul for all steps

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h = self.cell(a_x, s[0])
            return h, (h,)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, t_max={self.t_max}, beta={self.beta}"
