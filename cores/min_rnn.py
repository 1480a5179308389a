"""minGRU and minLSTM (Feng et al., "Were RNNs All We Needed?", arXiv:2410.01201, 2024).

Both drop the hidden state from the gates, so one layer is a diagonal linear recurrence
``h_t = a_t * h_{t-1} + b_t`` whose coefficients depend on ``x_t`` only::

    minGRU:  z_t = sigma(W_z x_t),  h~_t = g(W_h x_t)
             h_t = (1 - z_t) h_{t-1} + z_t h~_t
    minLSTM: f_t = sigma(W_f x_t),  i_t = sigma(W_i x_t),  h~_t = g(W_h x_t)
             f'_t = f_t / (f_t + i_t),  i'_t = i_t / (f_t + i_t)
             h_t = f'_t h_{t-1} + i'_t h~_t

with ``g(x) = x + 1/2`` for ``x >= 0`` and ``sigma(x)`` otherwise (the paper's positive
candidate activation). The coefficients are computed in log space as in the paper's
log-space version (``log z = -softplus(-k)``, ``log f' = -softplus(log i - log f)``), so
saturated gates never round to exactly 0 or 1 through a sigmoid, and the whole sequence is
solved by :func:`cores.scan.linear_scan` (one autograd node, no step loop in the graph).
An episode start zeroes ``a_t`` (the initial state is zero), which is how ``starts`` resets
rows inside a sequence.

With ``layers > 1`` the layers are stacked as residual blocks, ``y <- y + cell(LayerNorm(y))``
after a first layer that maps ``input_size`` to ``hidden_size``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cores.base import MemoryCore, State, check_sequence
from cores.scan import METHODS, linear_scan


def candidate(x: Tensor) -> Tensor:
    """The paper's positive candidate activation ``g``: ``x + 1/2`` (x >= 0), ``sigma(x)``."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_candidate(x: Tensor) -> Tensor:
    """``log g(x)``, computed without forming ``g`` for the negative branch."""
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


class _MinCell(nn.Module):
    """One min-RNN layer: ``[..., input] -> log a, log b`` of its linear recurrence."""

    gates: int  # projections besides the candidate

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, (self.gates + 1) * hidden_size)

    def log_coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """``log a``, ``log b`` ``[..., H]`` with ``h_t = a_t h_{t-1} + b_t``."""
        raise NotImplementedError

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        """The paper's sequential form, in plain (not log) arithmetic: ``[B, H]`` -> ``[B, H]``."""
        raise NotImplementedError


class MinGRUCell(_MinCell):
    gates = 1

    def log_coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        k_z, k_h = self.proj(x).chunk(2, dim=-1)
        # log(1 - z) = -softplus(k), log z = -softplus(-k)
        return -F.softplus(k_z), -F.softplus(-k_z) + log_candidate(k_h)

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        k_z, k_h = self.proj(x_t).chunk(2, dim=-1)
        z = torch.sigmoid(k_z)
        return (1 - z) * h + z * candidate(k_h)


class MinLSTMCell(_MinCell):
    gates = 2

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        with torch.no_grad():  # forget bias 1, as for the LSTM baselines
            self.proj.bias[:hidden_size].fill_(1.0)

    def log_coefficients(self, x: Tensor) -> tuple[Tensor, Tensor]:
        k_f, k_i, k_h = self.proj(x).chunk(3, dim=-1)
        diff = F.softplus(-k_f) - F.softplus(-k_i)  # log i - log f
        return -F.softplus(diff), -F.softplus(-diff) + log_candidate(k_h)

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        k_f, k_i, k_h = self.proj(x_t).chunk(3, dim=-1)
        f, i = torch.sigmoid(k_f), torch.sigmoid(k_i)
        return f / (f + i) * h + i / (f + i) * candidate(k_h)


class _MinRNN(MemoryCore):
    """A stack of min-RNN layers (see the module docstring).

    :param layers: number of layers; 1 is the paper's single cell.
    :param scan: the :func:`cores.scan.linear_scan` kernel: ``auto`` | ``parallel`` |
        ``sequential`` (same values; ``auto`` picks by device).
    """

    cell: type[_MinCell]

    def __init__(
        self, input_size: int, hidden_size: int, *, layers: int = 1, scan: str = "auto"
    ) -> None:
        super().__init__(input_size, hidden_size)
        if layers <= 0:
            raise ValueError(f"layers must be positive, got {layers}")
        if scan not in METHODS:
            raise ValueError(f"unknown scan {scan!r}; valid: {', '.join(METHODS)}")
        self.scan = scan
        self.cells = nn.ModuleList(
            self.cell(input_size if i == 0 else hidden_size, hidden_size) for i in range(layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(hidden_size) for _ in range(layers - 1))

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """One zero ``[B, H]`` tensor per layer."""
        weight = self.cells[0].proj.weight
        device = weight.device if device is None else device
        return tuple(
            torch.zeros(batch_size, self.hidden_size, dtype=weight.dtype, device=device)
            for _ in self.cells
        )

    def _layer_input(self, i: int, y: Tensor) -> Tensor:
        return y if i == 0 else self.norms[i - 1](y)

    def _combine(self, i: int, y: Tensor, h: Tensor) -> Tensor:
        return h if i == 0 else y + h

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the per-layer ``[B, H]`` states."""
        check_sequence(self, x, state, starts)
        if len(state) != len(self.cells):
            raise ValueError(f"{type(self).__name__} expects {len(self.cells)} state tensors")
        y, new_state = x, []
        for i, (cell, h0) in enumerate(zip(self.cells, state, strict=True)):
            log_a, log_b = cell.log_coefficients(self._layer_input(i, y))
            a = torch.exp(log_a)
            if starts is not None:
                a = a * (~starts.bool()).to(a.dtype).unsqueeze(-1)
            h = linear_scan(a, torch.exp(log_b), h0, self.scan)  # [T, B, H]
            y = self._combine(i, y, h)
            new_state.append(h[-1])
        return y, tuple(new_state)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """One step in the paper's sequential form (what rollouts use): ``[B, D]`` -> ``[B, H]``."""
        y, new_state = x_t, []
        for i, (cell, h) in enumerate(zip(self.cells, state, strict=True)):
            h = cell.direct_step(self._layer_input(i, y), h)
            y = self._combine(i, y, h)
            new_state.append(h)
        return y, tuple(new_state)


class MinGRU(_MinRNN):
    """minGRU: ``h_t = (1 - z_t) h_{t-1} + z_t g(W_h x_t)``, ``z_t = sigma(W_z x_t)``."""

    cell = MinGRUCell


class MinLSTM(_MinRNN):
    """minLSTM: ``h_t = f'_t h_{t-1} + i'_t g(W_h x_t)`` with normalised input-only gates."""

    cell = MinLSTMCell
