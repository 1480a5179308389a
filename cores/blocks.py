"""Shared parameter layout of the gated cells (:mod:`cores.gated`, :mod:`cores.gru`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from memcores.cores import gates
from memcores.cores.base import MemoryCore


class BlockGatedCore(MemoryCore):
    """A gated cell whose gate pre-activations are stacked ``H``-row blocks of one affine map.

    ``weight_ih [n*H, D]``, ``weight_hh [n*H, H]`` and ``bias [n*H]`` hold one block per name
    in ``gate_names``; :meth:`_block` finds a gate's rows. The forget-role gate (LSTM ``f``,
    GRU ``z``) gets its bias from :func:`gates.forget_bias`.
    """

    def _init_blocks(self, gate_names: tuple[str, ...], activation: str, init: str) -> None:
        """Validate ``activation``/``init`` and create the stacked parameters."""
        gates.gate_fn(activation)  # validates the name
        if init not in gates.INITS:
            raise ValueError(f"unknown init {init!r}; valid: {', '.join(gates.INITS)}")
        self.gate_names = gate_names
        rows = len(gate_names) * self.hidden_size
        self.weight_ih = nn.Parameter(torch.empty(rows, self.input_size))
        self.weight_hh = nn.Parameter(torch.empty(rows, self.hidden_size))
        self.bias = nn.Parameter(torch.zeros(rows))

    def _block(self, name: str) -> slice:
        k = self.gate_names.index(name)
        return slice(k * self.hidden_size, (k + 1) * self.hidden_size)

    def _bias_timescales(self, forget: str, refine: str | None) -> Tensor:
        """``[H]`` time scales ``-1/log g`` of gate ``forget`` (refined by gate ``refine``) at
        its bias, with ``g = phi(b)`` for this cell's activation ``phi`` (float64; ``inf``
        only beyond ``1e308``)."""
        return torch.exp(self._bias_log_timescales(forget, refine))

    def _bias_log_timescales(self, forget: str, refine: str | None) -> Tensor:
        """``[H]`` natural logs of :meth:`_bias_timescales`, exact for saturated gates too."""
        with torch.no_grad():
            b = self.bias.detach().double().cpu()
            b_f = b[self._block(forget)]
            log_complement = gates.log_gate_complement(self.activation, b_f)
            if refine is not None:
                f = gates.gate_fn(self.activation)(b_f)
                log_one_minus_r = gates.log_gate_complement("sigmoid", b[self._block(refine)])
                log_complement = gates.log_refine_complement(log_complement, f, log_one_minus_r)
            return gates.log_timescale(log_complement)
