"""NRU: the non-saturating recurrent unit (Chandar et al. 2019).

S. Chandar, C. Sankar, E. Vorontsov, S. E. Kahou and Y. Bengio, "Towards Non-saturating
Recurrent Units for Modelling Long-term Dependencies", AAAI 2019, arXiv:1902.06704.
A ReLU hidden state reads a memory vector ``m`` that is written and erased additively by
``k`` heads with unbounded (non-saturating) strengths::

    h_t = relu(W_i x_t + W_h h_{t-1} + W_c m_{t-1} + b)                     (paper eq. 1)
    z_t = [h_t; m_{t-1}]
    alpha_t = A z_t + a,   beta_t = B z_t + b'          [k] write / erase strengths
    v_t = normalise_p(outer(p_v, q_v)),  [p_v; q_v] = V z_t + c_v     [k, M] write vectors
    u_t = normalise_p(outer(p_u, q_u)),  [p_u; q_u] = U z_t + c_u     [k, M] erase vectors
    m_t = m_{t-1} + (1/k) sum_j (alpha_t^j v_t^j - beta_t^j u_t^j)       (paper eq. 2)

``outer(p, q)`` of two ``sqrt(k M)``-vectors is reshaped to ``[k, M]`` (the paper's trick to
generate ``k`` memory-sized vectors with few parameters), and ``normalise_p`` divides each of
the ``k`` rows by its ``p``-norm (``p = 5``, the authors' code). The core outputs ``h_t``.

Choices, where the paper leaves room (all as in the authors' released code):

- the heads are averaged (``1/k``), not summed: the same model with ``alpha, beta`` scaled;
- one head count ``k`` for writing and erasing (``k_1 = k_2 = k = 4``), no activation on
  ``alpha``, ``beta``, ``v``, ``u``, no layer normalisation;
- every affine map starts like ``torch.nn.Linear``: weights and biases ``U(-1/sqrt(fan_in),
  1/sqrt(fan_in))``; the initial ``h`` and ``m`` are zero.

``memory_size`` ``M`` is 64 in Ohno et al.'s synthetic tasks; ``M * heads`` must be a perfect
square.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence


class NRU(MemoryCore):
    """Non-saturating recurrent unit (see the module docstring for the equations).

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of the ReLU state ``h`` (the output).
    :param memory_size: size ``M`` of the memory vector ``m``.
    :param heads: number ``k`` of write heads and of erase heads.
    :param p: the norm that normalises each write/erase vector.

    State: ``(h [B, H], m [B, M])``, zero initially. Parameters: ``weight_ih [H, D]``,
    ``weight_hh [H, H]``, ``weight_mh [H, M]``, ``bias [H]`` (eq. 1) and ``weight_head
    [2k + 4s, H + M]``, ``bias_head`` with ``s = sqrt(k M)``; the head rows are ``alpha [k]``,
    ``beta [k]``, ``[p_v; q_v] [2s]``, ``[p_u; q_u] [2s]`` in that order.
    """

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        memory_size: int = 64,
        heads: int = 4,
        p: float = 5.0,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if memory_size <= 0 or heads <= 0:
            raise ValueError(
                f"memory_size and heads must be positive, got {memory_size} and {heads}"
            )
        side = math.isqrt(memory_size * heads)
        if side * side != memory_size * heads:
            raise ValueError(
                f"memory_size * heads must be a perfect square (the write vectors are outer "
                f"products of two sqrt(k M)-vectors), got {memory_size} * {heads}; "
                "e.g. memory_size=64 with heads=1, 4 or 9"
            )
        if p <= 0:
            raise ValueError(f"p must be positive, got {p}")
        self.memory_size = int(memory_size)
        self.heads = int(heads)
        self.p = float(p)
        self.side = side
        H, M, k = hidden_size, self.memory_size, self.heads
        self.weight_ih = nn.Parameter(torch.empty(H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(H, H))
        self.weight_mh = nn.Parameter(torch.empty(H, M))
        self.bias = nn.Parameter(torch.empty(H))
        self.weight_head = nn.Parameter(torch.empty(2 * k + 4 * side, H + M))
        self.bias_head = nn.Parameter(torch.empty(2 * k + 4 * side))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``torch.nn.Linear``'s init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, biases too."""
        with torch.no_grad():
            bound = 1.0 / math.sqrt(self.input_size + self.hidden_size + self.memory_size)
            for w in (self.weight_ih, self.weight_hh, self.weight_mh, self.bias):
                w.uniform_(-bound, bound)
            bound = 1.0 / math.sqrt(self.hidden_size + self.memory_size)
            self.weight_head.uniform_(-bound, bound)
            self.bias_head.uniform_(-bound, bound)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        device = self.weight_hh.device if device is None else device
        dtype = self.weight_hh.dtype
        return (
            torch.zeros(batch_size, self.hidden_size, dtype=dtype, device=device),
            torch.zeros(batch_size, self.memory_size, dtype=dtype, device=device),
        )

    def _vectors(self, pq: Tensor) -> Tensor:
        """``[B, 2s]`` -> ``[B, k, M]``: the outer product of the halves, rows p-normalised."""
        a, b = pq.chunk(2, dim=-1)  # [B, s] each
        outer = (a.unsqueeze(-1) * b.unsqueeze(-2)).reshape(-1, self.heads, self.memory_size)
        return F.normalize(outer, p=self.p, dim=-1)

    def cell(self, a_x: Tensor, h: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        """One step from the input projection ``a_x [B, H]`` (bias included), ``h``, ``m``.

        :return: the new ``h [B, H]`` and ``m [B, M]``.
        """
        h = torch.relu(a_x + F.linear(h, self.weight_hh) + F.linear(m, self.weight_mh))
        k, s = self.heads, self.side
        heads = F.linear(torch.cat([h, m], dim=-1), self.weight_head, self.bias_head)
        alpha, beta, pq_v, pq_u = heads.split([k, k, 2 * s, 2 * s], dim=-1)
        write = alpha.unsqueeze(-1) * self._vectors(pq_v)  # [B, k, M]
        erase = beta.unsqueeze(-1) * self._vectors(pq_u)
        return h, m + (write - erase).mean(dim=1)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """``x_t [B, D]`` -> ``h [B, H]`` and ``(h, m)``."""
        h, m = self.cell(F.linear(x_t, self.weight_ih, self.bias), *state)
        return h, (h, m)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and ``(h, m)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, H], one matmul for all steps

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h, m = self.cell(a_x, *s)
            return h, (h, m)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, memory_size={self.memory_size}, "
            f"heads={self.heads}, p={self.p}"
        )
