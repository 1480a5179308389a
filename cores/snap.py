"""Dense recurrent layers in the LRU block, trained by BPTT or the multi-layer SnAp-1 rule.

Zucchet, Meier, Schug, Mujika and Sacramento, "Online learning of long-range dependencies"
(NeurIPS 2023, arXiv:2305.15947), Table 1, compare their online rule for the LRU with two
layers that are *not* made of independent recurrent modules, placed in the same block
(pre-LayerNorm -> layer -> GELU -> GLU -> residual, as :class:`cores.lru.LRUBlock`):

- **linear RNN** (:class:`LinearRecurrence`), a dense real linear recurrence::

      h_t = A h_{t-1} + B u_t          [B, N]
      y_t = C h_t + D * u_t            [B, H]   (D diagonal, as the LRU's)

  initialised as the paper's code: ``A ~ TruncNormal[-2, 2] / sqrt(N)``, ``B ~ N(0,1)/sqrt(H)``,
  ``C ~ N(0,1)/sqrt(N)``, ``D ~ N(0,1)``; no stability constraint.
- **GRU** (:class:`GRURecurrence`), ``torch.nn.GRU``'s equations (gate order r, z, n) with the
  paper's parameter set (input bias on every gate, recurrent bias on ``n`` only); its output is
  ``h_t`` (the state size equals the model width ``H``)::

      r = sigma(W_ir u + b_ir + W_hr h)      z = sigma(W_iz u + b_iz + W_hz h)
      n = tanh(W_in u + b_in + r * (W_hn h + b_hn))
      h_t = (1 - z) * n + z * h_{t-1}

Gradient modes (option ``grad``; the forward is identical in every mode and in eval):

- ``bptt``: autograd through time.
- ``snap1``: the paper's "SnAp-1 extended to multiple layers" (Menick et al., "Practical
  real time recurrent learning with a sparse approximation", ICLR 2021, arXiv:2006.07232).
  Each layer keeps, for every parameter, only the sensitivity of the unit that parameter
  enters directly, propagated through time by the *diagonal* of the state Jacobian::

      e_t = d_t * e_{t-1} + I_t,   d_t = diag(dh_t/dh_{t-1}),   I_t = immediate dh_t/dtheta

  and combines it with the error ``delta_t = dL_t/dh_t`` that reaches the layer by
  *instantaneous spatial* backpropagation (no error flows back in time, in any layer); the
  layer's input gets the instantaneous path only. For the LRU, whose Jacobian is diagonal, the
  same rule is the paper's exact in-layer online rule; for these dense layers it is an
  approximation even with one layer.
- ``truncated``: 1-step truncated BPTT (``d_t = 0``).
- ``spatial``: ``truncated`` with no gradient for the recurrent weights (``A``, ``W_h*``), the
  paper's spatial-backpropagation baseline.

As for the LRU's ``online`` mode the sequence-level backward evaluates ``sum_t delta_t e_t``
with one reverse scan per layer, ``R_t = delta_t + d_{t+1} R_{t+1}``, then one vectorised
backward of the cell at every step with ``h_{t-1}`` held constant and output gradient ``R_t``
(the immediate partials are row-local, so this equals the forward traces' sum exactly; the
tests check it against a direct transcription of the trace recursion). A plain
``loss.backward()`` over a sequence therefore yields the rule's gradients in any trainer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence
from memcores.cores.scan import scan_adjoint

GRAD_MODES = ("bptt", "snap1", "truncated", "spatial")


class LinearRecurrence(nn.Module):
    """Dense linear recurrent layer ``h_t = A h_{t-1} + B u_t``, ``y_t = C h_t + D * u_t``.

    :param hidden_size: ``H``, the size of ``u`` and ``y``.
    :param state_size: ``N``, the size of ``h``.
    """

    def __init__(self, hidden_size: int, state_size: int) -> None:
        super().__init__()
        h, n = hidden_size, state_size
        self.A = nn.Parameter(nn.init.trunc_normal_(torch.empty(n, n), a=-2.0, b=2.0) / n**0.5)
        self.B = nn.Parameter(torch.randn(n, h) / math.sqrt(h))
        self.C = nn.Parameter(torch.randn(h, n) / math.sqrt(n))
        self.D = nn.Parameter(torch.randn(h))

    @property
    def state_size(self) -> int:
        return self.A.shape[0]

    def scan_parameters(self) -> tuple[Tensor, ...]:
        """The parameters the state depends on (they get the SnAp-1 gradient)."""
        return (self.A, self.B)

    def recurrent_weights(self) -> tuple[Tensor, ...]:
        """The weights multiplying ``h_{t-1}`` (no gradient under ``spatial``)."""
        return (self.A,)

    def cell(self, u: Tensor, h_prev: Tensor) -> Tensor:
        """``u [..., H]``, ``h_prev [..., N]`` -> ``h [..., N]``."""
        return F.linear(h_prev, self.A) + F.linear(u, self.B)

    def jacobian_diag(self, u: Tensor, h_prev: Tensor) -> Tensor:
        """``diag(dh_t/dh_{t-1}) = diag(A)``, broadcast to ``h_prev``'s shape."""
        return torch.diagonal(self.A).expand_as(h_prev)

    def readout(self, h: Tensor, u: Tensor) -> Tensor:
        """``y = C h + D * u`` ``[..., H]``."""
        return F.linear(h, self.C) + self.D * u


class GRURecurrence(nn.Module):
    """GRU layer ``u [..., H] -> h [..., H]`` (see the module docstring for the equations).

    Weights ``U(-1/sqrt(H), 1/sqrt(H))`` as ``torch.nn.GRU``, biases zero.

    :param hidden_size: ``H``, the size of ``u``, ``h`` and ``y``.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        h = hidden_size
        bound = 1.0 / math.sqrt(h)
        self.weight_ih = nn.Parameter(torch.empty(3 * h, h).uniform_(-bound, bound))
        self.bias_ih = nn.Parameter(torch.zeros(3 * h))
        self.weight_hh = nn.Parameter(torch.empty(3 * h, h).uniform_(-bound, bound))
        self.bias_hn = nn.Parameter(torch.zeros(h))

    @property
    def state_size(self) -> int:
        return self.bias_hn.shape[0]

    def scan_parameters(self) -> tuple[Tensor, ...]:
        return (self.weight_ih, self.bias_ih, self.weight_hh, self.bias_hn)

    def recurrent_weights(self) -> tuple[Tensor, ...]:
        return (self.weight_hh, self.bias_hn)

    def _gates(self, u: Tensor, h_prev: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        a_ir, a_iz, a_in = F.linear(u, self.weight_ih, self.bias_ih).chunk(3, dim=-1)
        a_hr, a_hz, a_hn = F.linear(h_prev, self.weight_hh).chunk(3, dim=-1)
        r = torch.sigmoid(a_ir + a_hr)
        z = torch.sigmoid(a_iz + a_hz)
        m = a_hn + self.bias_hn
        n = torch.tanh(a_in + r * m)
        return r, z, n, m

    def cell(self, u: Tensor, h_prev: Tensor) -> Tensor:
        """``u [..., H]``, ``h_prev [..., H]`` -> ``h [..., H]``."""
        _, z, n, _ = self._gates(u, h_prev)
        return n + z * (h_prev - n)

    def jacobian_diag(self, u: Tensor, h_prev: Tensor) -> Tensor:
        """``diag(dh_t/dh_{t-1}) [..., H]`` in closed form.

        ``dh_i/dh_prev_i = z_i + (h_prev_i - n_i) z_i (1 - z_i) W_hz[i,i] + (1 - z_i)(1 - n_i^2)
        (r_i W_hn[i,i] + m_i r_i (1 - r_i) W_hr[i,i])`` with ``m = W_hn h_prev + b_hn``.
        """
        r, z, n, m = self._gates(u, h_prev)
        w_r, w_z, w_n = (torch.diagonal(w) for w in self.weight_hh.chunk(3, dim=0))
        dn = (1 - n * n) * (r * w_n + m * r * (1 - r) * w_r)
        return z + (h_prev - n) * z * (1 - z) * w_z + (1 - z) * dn

    def readout(self, h: Tensor, u: Tensor) -> Tensor:
        """The GRU's output is its state."""
        return h


Recurrence = LinearRecurrence | GRURecurrence


def _previous(h0: Tensor, h: Tensor, keep: Tensor | None) -> Tensor:
    """``h_{t-1}`` as the step at ``t`` reads it (zero after a reset): ``[T, B, N]``."""
    h_prev = torch.cat([h0.unsqueeze(0), h[:-1]], 0)
    return h_prev if keep is None else h_prev * keep.unsqueeze(-1)


def _run(layer: Recurrence, u: Tensor, h0: Tensor, keep: Tensor | None) -> Tensor:
    """``h [T, B, N]`` by the plain recurrence (autograd through time)."""
    h, outs = h0, []
    keeps = [None] * u.shape[0] if keep is None else keep.unbind(0)
    for u_t, k_t in zip(u.unbind(0), keeps, strict=True):
        h = layer.cell(u_t, h if k_t is None else h * k_t.unsqueeze(-1))
        outs.append(h)
    return torch.stack(outs, 0)


def sensitivity_scan(delta: Tensor, d: Tensor) -> Tensor:
    """``R_t = delta_t + d_{t+1} R_{t+1}`` (``R_{T+1} = 0``) over ``[T, B, N]`` tensors.

    ``sum_t delta_t e_t = sum_t R_t I_t`` for traces ``e_t = d_t e_{t-1} + I_t``. This is the
    adjoint recurrence of the shared scan (:func:`cores.scan.scan_adjoint`; real ``d``): a
    step loop on CPU, one Triton launch on CUDA.
    """
    return scan_adjoint(d, delta.contiguous())


class _SnAp1Scan(torch.autograd.Function):
    """Sequence-level SnAp-1 / truncated / spatial rule for one dense layer (module docstring)."""

    @staticmethod
    def forward(ctx, layer, mode, u, h0, keep, *params):
        with torch.no_grad():
            h = _run(layer, u, h0, keep)
        ctx.layer, ctx.mode, ctx.keep = layer, mode, keep
        ctx.save_for_backward(u, h0, h)
        return h

    @staticmethod
    def backward(ctx, delta):
        u, h0, h = ctx.saved_tensors
        layer, mode, keep = ctx.layer, ctx.mode, ctx.keep
        h_prev = _previous(h0, h, keep).detach()
        if mode == "snap1":
            with torch.no_grad():
                d = layer.jacobian_diag(u, h_prev)
                if keep is not None:  # a reset cuts the dependence on h_{t-1}
                    d = d * keep.unsqueeze(-1)
            r = sensitivity_scan(delta, d)
        else:  # truncated / spatial: one transition only
            r = delta
        params = layer.scan_parameters()
        with torch.enable_grad():
            u_ = u.detach().requires_grad_(True)
            h_new = layer.cell(u_, h_prev)  # every step at once, h_{t-1} held constant
            grads = torch.autograd.grad(h_new, params, grad_outputs=r, retain_graph=True)
            (grad_u,) = torch.autograd.grad(h_new, (u_,), grad_outputs=delta)
        if mode == "spatial":
            frozen = {id(p) for p in layer.recurrent_weights()}
            grads = tuple(
                torch.zeros_like(g) if id(p) in frozen else g
                for p, g in zip(params, grads, strict=True)
            )
        return (None, None, grad_u, None, None, *grads)


class RecurrentBlock(nn.Module):
    """Pre-LayerNorm -> recurrent layer -> GELU -> GLU -> residual (the LRU paper's block)."""

    def __init__(self, hidden_size: int, layer: Recurrence) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.layer = layer
        self.glu = nn.Linear(hidden_size, 2 * hidden_size)

    def forward(
        self, x: Tensor, h0: Tensor, keep: Tensor | None, mode: str
    ) -> tuple[Tensor, Tensor]:
        """``x [T, B, H]``, ``h0 [B, N]`` -> ``out [T, B, H]`` and the last state ``[B, N]``.

        :param mode: a gradient mode or ``"eval"`` (plain recurrence, like ``bptt``).
        """
        u = self.norm(x)
        if mode in ("bptt", "eval"):
            h = _run(self.layer, u, h0, keep)
        else:
            h = _SnAp1Scan.apply(self.layer, mode, u, h0, keep, *self.layer.scan_parameters())
        a, b = self.glu(F.gelu(self.layer.readout(h, u))).chunk(2, dim=-1)
        return x + a * torch.sigmoid(b), h[-1]


class _BlockStack(MemoryCore):
    """Linear encoder ``input_size -> H`` and ``layers`` :class:`RecurrentBlock` s."""

    graph_safe = True  # no host reads inside forward: CUDA-graph capturable (cores.graphed)

    def __init__(self, input_size: int, hidden_size: int, layers: int, grad: str) -> None:
        super().__init__(input_size, hidden_size)
        if grad not in GRAD_MODES:
            raise ValueError(f"unknown grad mode {grad!r}; valid: {', '.join(GRAD_MODES)}")
        if layers <= 0:
            raise ValueError(f"layers must be positive, got {layers}")
        self.grad = grad
        self.encoder = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(
            RecurrentBlock(hidden_size, self._make_layer()) for _ in range(layers)
        )

    def _make_layer(self) -> Recurrence:
        raise NotImplementedError

    @property
    def mode(self) -> str:
        """The gradient mode in effect: ``self.grad`` in training, ``"eval"`` otherwise."""
        return self.grad if self.training else "eval"

    has_step = False  # whole sequences only: acting calls forward with T = 1

    @property
    def state_arity(self) -> int:  # type: ignore[override]
        """One state tensor per block."""
        return len(self.blocks)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """One zero ``[B, N]`` tensor per layer."""
        w = self.encoder.weight
        device = w.device if device is None else device
        return tuple(
            torch.zeros(batch_size, b.layer.state_size, dtype=w.dtype, device=device)
            for b in self.blocks
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the state after step T."""
        check_sequence(self, x, state, starts)
        keep = None if starts is None else (~starts.bool()).to(x.dtype)
        z = self.encoder(x)
        new_state = []
        for block, s in zip(self.blocks, state, strict=True):
            z, h_last = block(z, s, keep, self.mode)
            new_state.append(h_last)
        return z, tuple(new_state)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, layers={len(self.blocks)}, grad={self.grad}"


class LinearRNNCore(_BlockStack):
    """Stack of dense linear-RNN blocks (the LRU paper's "Linear RNN" column of Table 1).

    :param input_size: size of ``x[t, b]``.
    :param hidden_size: ``H``, model width and output size (the paper matches the LRU's
        parameter count with ``H = 146``, ``N = 64``, 4 layers).
    :param state_size: ``N``, the size of each layer's state.
    :param layers: number of blocks.
    :param grad: ``bptt | snap1 | truncated | spatial`` (training only).
    """

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        state_size: int = 64,
        layers: int = 4,
        grad: str = "bptt",
    ) -> None:
        if state_size <= 0:
            raise ValueError(f"state_size must be positive, got {state_size}")
        self.state_size = int(state_size)
        super().__init__(input_size, hidden_size, layers, grad)

    def _make_layer(self) -> Recurrence:
        return LinearRecurrence(self.hidden_size, self.state_size)


class BlockGRUCore(_BlockStack):
    """Stack of GRU blocks (the LRU paper's 4-layer "GRU" column of Table 1).

    :param input_size: size of ``x[t, b]``.
    :param hidden_size: ``H``, model width, GRU state size and output size (the paper matches
        the LRU's parameter count with ``H = 91``, 4 layers).
    :param layers: number of blocks.
    :param grad: ``bptt | snap1 | truncated | spatial`` (training only).
    """

    def __init__(
        self, input_size: int, hidden_size: int, *, layers: int = 4, grad: str = "bptt"
    ) -> None:
        super().__init__(input_size, hidden_size, layers, grad)

    def _make_layer(self) -> Recurrence:
        return GRURecurrence(self.hidden_size)
