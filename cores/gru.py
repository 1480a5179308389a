"""Gated GRU whose update gate can use the fast/softsign activations, UGI and the refine gate.

Equations (``torch.nn.GRU``'s convention, in which the update gate ``z`` *keeps* the state)::

    z = phi(W_z x + U_z h + b_z)                   update gate  <- the gate that is changed
    z = 2 q z + (1 - 2q) z^2,  q = sigma(W_q x + U_q h + b_q)   (refine=True)
    r = sigma(W_r x + U_r h + b_r)                 reset gate   (always a plain sigmoid)
    n = tanh(W_n x + b_n + r * (U_n h + b_hn))
    h_t = (1 - z) * n + z * h_{t-1}
    h_t = h_{t-1} - (1 - z) * |h_{t-1}|^r h_{t-1} + (1 - z) * n      (power=r > 0)

``power`` is Ohno & Kumagai's gated power-law rule (forget gate ``z``, input gate ``1 - z``):
the decay ``(1 - z) h_{t-1}`` becomes ``(1 - z) |h_{t-1}|^r h_{t-1}``; ``power=0`` is the GRU.
As for the LSTM's ``power`` (:mod:`cores.gated`) the explicit step can overshoot when ``z`` is
near 0, so the new state is clipped to ``[-1, 1]``, the range of the GRU state.

**Which gate changed:** exactly the update gate ``z``. Because ``h_t = z h_{t-1} + (1 - z) n``,
``z`` plays the role of the LSTM forget gate (its complement ``1 - z`` is the tied input gate),
so ``activation``, ``refine`` and ``init`` act on ``z`` only: ``phi`` replaces the sigmoid of
``z``, the refine gate ``q`` refines ``z``, and the initialiser sets ``b_z`` (``constant``:
``phi(b_z) = sigma(1)``; ``uniform``: UGI with ``b_q = -b_z``; ``chrono``: chrono values). The
reset gate ``r`` and candidate ``n`` are those of ``torch.nn.GRU`` with zero biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores import cudnn, gates
from memcores.cores.base import (
    State,
    autocast_enabled,
    check_sequence,
    reset_uniform_,
    triton_available,
)
from memcores.cores.blocks import BlockGatedCore
from memcores.cores.power_rnn import power_decay

IMPLS = ("fused", "triton", "loop")


class GatedGRU(BlockGatedCore):
    """GRU with a configurable update gate (see the module docstring for the equations).

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of the state.
    :param activation: update-gate activation: ``sigmoid | fast | fast2 | softsign``.
    :param refine: add a refine gate ``q`` on the update gate (one extra ``H``-block).
    :param init: update-gate bias initialiser: ``constant | uniform | chrono``.
    :param t_max: the largest decay period of the ``chrono`` initialiser.
    :param power: the power-law decay exponent ``r >= 0`` (0: the ordinary GRU).
    :param impl: ``fused`` (on CUDA tensors cuDNN where the preset is ``nn.GRU``'s maths,
        :mod:`cores.cudnn`, else the Triton kernels of :mod:`cores.triton_engine`; the step loop
        on the CPU), ``triton`` (the kernels on any device; a CPU needs
        ``TRITON_INTERPRET=1``) or ``loop`` (the step loop everywhere; the reference).

    State: ``(h [B, H],)``, zero initially.
    """

    state_arity = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        activation: str = "sigmoid",
        refine: bool = False,
        init: str = "constant",
        t_max: float = 1000.0,
        power: float = 0.0,
        impl: str = "fused",
    ) -> None:
        super().__init__(input_size, hidden_size)
        if power < 0:
            raise ValueError(f"power must be >= 0, got {power}")
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
        self.power = float(power)
        self.impl = impl
        self.has_fused = impl != "loop"
        self.activation = activation
        self.refine = bool(refine)
        self.init = init
        self.t_max = float(t_max)
        self._init_blocks(("z",) + (("q",) if self.refine else ()) + ("r", "n"), activation, init)
        self.bias_hn = nn.Parameter(torch.zeros(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights ``U(-1/sqrt(H), 1/sqrt(H))``; ``b_z`` (and ``b_q``) from the initialiser."""
        reset_uniform_(self.weight_ih, self.weight_hh, self.bias)
        with torch.no_grad():
            self.bias_hn.zero_()
            b_z = gates.forget_bias(self.init, self.activation, self.hidden_size, self.t_max)
            self.bias[self._block("z")] = b_z.to(self.bias.dtype)
            if self.refine and self.init == "uniform":
                self.bias[self._block("q")] = -b_z.to(self.bias.dtype)

    def forget_gate_timescales(self) -> Tensor:
        """``[H]`` characteristic times ``-1/log z`` of the (refined) update gate at its bias."""
        return self._bias_timescales("z", "q" if self.refine else None)

    def forget_gate_log_timescales(self) -> Tensor:
        """``[H]`` natural logs of :meth:`forget_gate_timescales`, finite for saturated gates."""
        return self._bias_log_timescales("z", "q" if self.refine else None)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.zero_state(batch_size, device, self.weight_hh)

    def cell(self, a_x: Tensor, h: Tensor) -> Tensor:
        """One step from the input projection ``a_x [B, nH]`` and ``h [B, H]`` -> ``h_t [B, H]``."""
        H = self.hidden_size
        a_h = F.linear(h, self.weight_hh)
        nz = len(self.gate_names) - 1  # z, [q], r share one add; n needs the reset gate
        a = a_x[:, : nz * H] + a_h[:, : nz * H]
        z = gates.gate_fn(self.activation)(a[:, :H])
        if self.refine:
            z = gates.refine(z, torch.sigmoid(a[:, self._block("q")]))
        r = torch.sigmoid(a[:, self._block("r")])
        n = torch.tanh(a_x[:, self._block("n")] + r * (a_h[:, self._block("n")] + self.bias_hn))
        if self.power > 0.0:
            # clipped to [-1, 1] (the range of the GRU state), see the module docstring
            return (h - (1.0 - z) * (power_decay(h, self.power) - n)).clamp(-1.0, 1.0)
        return n + z * (h - n)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        h = self.cell(F.linear(x_t, self.weight_ih, self.bias), state[0])
        return h, (h,)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and ``(h,)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        # the kernels write into preallocated buffers, which autocast's dtype changes would
        # break; under autocast the step loop runs
        if self.has_fused and not autocast_enabled(x.device.type):
            if x.is_cuda and self.impl == "fused" and cudnn.gru_applies(self, starts):
                return cudnn.gru(self, x, state, starts)  # nn.GRU's maths: its kernels
            if self.impl == "triton" or (x.is_cuda and triton_available()):
                from memcores.cores.triton_engine import triton_gru

                return triton_gru(self, x, state, starts)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, nH], one matmul for all steps

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h = self.cell(a_x, s[0])
            return h, (h,)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, activation={self.activation}, "
            f"refine={self.refine}, init={self.init}"
            + (f", power={self.power}" if self.power else "")
        )
