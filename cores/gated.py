"""One gated LSTM cell whose options produce every LSTM variant in the registry.

Equations (``a = W x_t + U h_{t-1} + b``, split into gate blocks; ``phi`` from
:mod:`cores.gates` is applied to the forget gate only)::

    f = phi(a_f)                                  forget gate
    g = f                      (refine=False)     effective forget gate
    g = 2 r f + (1 - 2r) f^2   (refine=True, r = sigma(a_r), Gu et al. eq. 16)
    i = sigma(a_i)             (tied=False)       input gate
    i = 1 - g                  (tied=True)
    u = tanh(a_u);  o = sigma(a_o)
    c_t = g * c_{t-1} + i * u;  h_t = o * tanh(c_t)
    c_t = c_{t-1} - (1 - g) * |c_{t-1}|^r c_{t-1} + i * u      (power=r > 0)

``power`` is the gated form of Ohno & Kumagai's power-law decay (see :mod:`cores.power_rnn`):
the decay term ``(1 - g) c_{t-1}`` hidden in ``g * c_{t-1}`` is replaced by
``(1 - g) |c_{t-1}|^r c_{t-1}``; ``power=0`` is the ordinary cell. The paper writes the rule
for a gated state ``h_t = f h_{t-1} + i h~_t`` without saying, for an LSTM, whether that state
is the cell or the output; here it is the **cell** ``c``, the state that the forget gate
multiplies (the output ``h = o tanh(c)`` has no decay term to replace). With ``power > 0``
CUDA tensors take the Triton kernels (``r`` is one of their compile-time parameters) and CPU
tensors the reference loop (the CPU fused function knows only the linear decay). The rule is
an explicit Euler step of ``dc/dt = -(1 - g)|c|^r c``, unstable once
``(1 - g)(r + 1)|c|^r > 2`` (with ``g`` near 0 it overshoots from ``|c| <= 1`` to 1.39 and then
diverges); the new cell is therefore clipped to ``[-1, 1]``, the range of the gate-tied cell,
inside which the paper's rule applies unchanged.

Bias initialisation (``init``): ``b_f`` from :func:`cores.gates.forget_bias`; for ``uniform``
and ``chrono`` the untied input gate gets ``b_i = -b_f``; with ``uniform`` the refine gate gets
``b_r = -b_f`` (the same sample, as in Gu et al.'s listing); all other biases start at 0.
Weights are ``U(-1/sqrt(H), 1/sqrt(H))`` as in ``torch.nn.LSTM``.

h-detach (``hdetach=True``, Kanuparthi et al.): while training, at each time step one
Bernoulli(p) draw shared by the batch decides whether the ``h_{t-1}`` entering the gates is
detached. The cell path ``c_{t-1} -> c_t`` and the output ``y_{t-1} = h_{t-1}`` keep their
gradients; forward values are identical to the plain LSTM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

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


class GatedLSTM(BlockGatedCore):
    """Gated LSTM with a choice of forget-gate activation, gate tying, refine gate and bias init.

    :param input_size: size ``D`` of each input vector.
    :param hidden_size: size ``H`` of ``h`` and ``c``.
    :param activation: forget-gate activation: ``sigmoid | fast | fast2 | softsign``.
    :param tied: tie the input gate to the effective forget gate, ``i = 1 - g``.
    :param refine: add Gu et al.'s refine gate ``r`` modulating the forget gate.
    :param init: forget-bias initialiser: ``constant | uniform | chrono``.
    :param t_max: the largest decay period of the ``chrono`` initialiser.
    :param hdetach: stochastically detach the ``h_{t-1}`` entering the gates while training.
    :param p: probability of detaching at a time step (only with ``hdetach=True``).
    :param impl: ``fused`` (the whole sequence as one autograd function with a hand-written
        backward: cuDNN where the preset is ``nn.LSTM``'s maths (:mod:`cores.cudnn`), else the
        Triton kernels of :mod:`cores.triton_engine` on CUDA tensors, the
        :mod:`cores._fused_lstm` function on the CPU), ``triton`` (the Triton kernels on any
        device; a CPU needs ``TRITON_INTERPRET=1``) or ``loop`` (a plain per-step autograd
        loop; the reference).
    :param power: the power-law decay exponent ``r >= 0`` on the cell (0: the ordinary LSTM).

    State: ``(h [B, H], c [B, H])``, both zero initially.
    """

    state_arity = 2

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        activation: str = "sigmoid",
        tied: bool = False,
        refine: bool = False,
        init: str = "constant",
        t_max: float = 1000.0,
        hdetach: bool = False,
        p: float = 0.25,
        impl: str = "fused",
        power: float = 0.0,
    ) -> None:
        super().__init__(input_size, hidden_size)
        if power < 0:
            raise ValueError(f"power must be >= 0, got {power}")
        self.power = float(power)
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.activation = activation
        self.tied = bool(tied)
        self.refine = bool(refine)
        self.init = init
        self.t_max = float(t_max)
        self.hdetach = bool(hdetach)
        self.p = float(p)
        self.impl = impl
        self.has_fused = impl != "loop"
        # Gate blocks o, f, [i], [r], u: the sigmoid gates are contiguous (one sigmoid call) and
        # so are the gates whose gradient is a multiple of dc (the fused backward relies on it)
        names = ["o", "f"] + ([] if self.tied else ["i"]) + (["r"] if self.refine else []) + ["u"]
        self._init_blocks(tuple(names), activation, init)
        self.reset_parameters()

    # ------------------------------------------------------------------ parameters
    def reset_parameters(self) -> None:
        """Weights ``U(-1/sqrt(H), 1/sqrt(H))``; gate biases from the chosen initialiser."""
        reset_uniform_(self.weight_ih, self.weight_hh, self.bias)
        with torch.no_grad():
            b_f = gates.forget_bias(self.init, self.activation, self.hidden_size, self.t_max)
            self.bias[self._block("f")] = b_f.to(self.bias.dtype)
            if "i" in self.gate_names and self.init in ("uniform", "chrono"):
                self.bias[self._block("i")] = -b_f.to(self.bias.dtype)
            if "r" in self.gate_names and self.init == "uniform":
                self.bias[self._block("r")] = -b_f.to(self.bias.dtype)

    def forget_gate_timescales(self) -> Tensor:
        """``[H]`` characteristic times ``-1/log g`` of the effective forget gate at its bias.

        With a refine gate, ``g = 2 r f + (1 - 2r) f^2`` with ``f = phi(b_f)``, ``r = sigma(b_r)``.
        """
        return self._bias_timescales("f", "r" if self.refine else None)

    def forget_gate_log_timescales(self) -> Tensor:
        """``[H]`` natural logs of :meth:`forget_gate_timescales`, finite for saturated gates."""
        return self._bias_log_timescales("f", "r" if self.refine else None)

    # ------------------------------------------------------------------ contract
    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        return self.zero_state(batch_size, device, self.weight_hh, count=2)

    def cell(self, a: Tensor, c_prev: Tensor) -> tuple[Tensor, Tensor]:
        """Gate arithmetic of one step: pre-activations ``a [B, nH]``, ``c_prev [B, H]``.

        :return: ``h [B, H]`` and ``c [B, H]``.
        """
        H = self.hidden_size
        n_sig = len(self.gate_names) - 1
        sig = torch.sigmoid(a[:, : n_sig * H])
        if self.activation == "sigmoid":
            f = sig[:, self._block("f")]
        else:
            f = gates.gate_fn(self.activation)(a[:, self._block("f")])
        g = gates.refine(f, sig[:, self._block("r")]) if self.refine else f
        i = 1.0 - g if self.tied else sig[:, self._block("i")]
        o = sig[:, self._block("o")]
        u = torch.tanh(a[:, self._block("u")])
        if self.power > 0.0:
            # clipped to [-1, 1] (the range of the gate-tied cell), see the module docstring
            c = (c_prev - (1.0 - g) * power_decay(c_prev, self.power) + i * u).clamp(-1.0, 1.0)
        else:
            c = g * c_prev + i * u
        return o * torch.tanh(c), c

    def _gate_input(self, h_prev: Tensor, detach: bool) -> Tensor:
        return h_prev.detach() if detach else h_prev

    def draws_on_host(self) -> bool:
        """h-detach's per-step draws, while training (see :meth:`_draw_detach`)."""
        return self.hdetach and self.p > 0.0

    def _draw_detach(self, steps: int) -> list[bool]:
        """One Bernoulli(p) draw per time step, shared by the batch, only while training."""
        if not (self.hdetach and self.training and self.p > 0.0):
            return [False] * steps
        return (torch.rand(steps) < self.p).tolist()

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """Reference step: ``x_t [B, D]`` -> ``h [B, H]`` and ``(h, c)``."""
        h_prev, c_prev = state
        detach = self._draw_detach(1)[0]
        a = F.linear(x_t, self.weight_ih, self.bias) + F.linear(
            self._gate_input(h_prev, detach), self.weight_hh
        )
        h, c = self.cell(a, c_prev)
        return h, (h, c)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, D]`` -> ``y [T, B, H]`` and the final ``(h, c)``; see :class:`MemoryCore`."""
        check_sequence(self, x, state, starts)
        detach = self._draw_detach(x.shape[0])
        # the fused paths write into preallocated buffers, which autocast's dtype changes
        # would break; under autocast (and on the CPU with the power-law cell) the reference
        # loop runs
        if self.has_fused and not autocast_enabled(x.device.type):
            if x.is_cuda and self.impl == "fused" and cudnn.lstm_applies(self, starts):
                return cudnn.lstm(self, x, state, starts)  # nn.LSTM's maths: its kernels
            if self.impl == "triton" or (x.is_cuda and triton_available()):
                from memcores.cores.triton_engine import triton_lstm

                return triton_lstm(self, x, state, starts, detach)
            if self.power == 0.0:
                from memcores.cores._fused_lstm import fused_lstm

                return fused_lstm(self, x, state, starts, detach)
        xproj = F.linear(x, self.weight_ih, self.bias)  # [T, B, nH]: one matmul for all steps
        w_hh_t = self.weight_hh.t()
        draws = iter(detach)  # one h-detach draw per step, consumed in order

        def step(a_x: Tensor, s: State) -> tuple[Tensor, State]:
            h, c = s
            h, c = self.cell(torch.addmm(a_x, self._gate_input(h, next(draws)), w_hh_t), c)
            return h, (h, c)

        return self.scan_zero_reset(xproj, state, starts, step)

    def extra_repr(self) -> str:
        return (
            f"{self.input_size}, {self.hidden_size}, activation={self.activation}, "
            f"tied={self.tied}, refine={self.refine}, init={self.init}, hdetach={self.hdetach}"
            + (f", power={self.power}" if self.power else "")
        )
