"""Linear Recurrent Unit (LRU) network with the online learning rule of Zucchet et al. (2023).

One LRU layer (complex diagonal recurrence, ``N`` complex units, ``H`` real features)::

    lambda = exp(-exp(nu_log) + i exp(theta_log))            [N] complex, |lambda| < 1
    gamma  = exp(gamma_log)       (initialised to sqrt(1 - |lambda|^2))
    h_t    = lambda * h_{t-1} + gamma * (B u_t)              [B, N] complex
    y_t    = Re(C h_t) + D * u_t                             [B, H] real, D diagonal

A block is pre-LayerNorm -> LRU -> GELU -> GLU -> residual; :class:`LRUCore` is a linear encoder
``input_size -> H`` followed by ``layers`` blocks and returns ``[T, B, H]`` (the decoder is the
trainer's readout, as for every core).

Gradient modes (option ``grad``; they only change what ``backward`` computes while
``self.training``; the forward is the same in every mode):

- ``bptt``: ordinary autograd through time.
- ``online``: the paper's rule. Within each layer the recurrent parameters (``nu_log``,
  ``theta_log``, ``gamma_log``, ``B``) receive the exact forward-mode (RTRL) gradient obtained
  from eligibility traces, combined with the error ``dL_t/dh_t`` that reaches the layer by
  *instantaneous spatial* backpropagation; errors never flow backwards through time, so the
  inputs of a layer only get the instantaneous path ``h_t <- gamma * B u_t``. Implemented as a
  custom autograd function, so a plain ``loss.backward()`` over a sequence yields the rule's
  gradients and any trainer can use it. The sequence-level backward evaluates
  ``sum_t G_t * e_t`` with one reverse scan per layer (``R_t = G_t + lambda R_{t+1}``), which
  is algebraically identical to running the traces forward (digest section 3.5) and avoids
  storing ``e^B`` for every step; the truly streaming version, which carries the traces and
  whose memory does not grow with T, is :meth:`LRUCore.online_step` /
  :class:`agents.online.StreamingOnlineTrainer`, and the tests check that both agree.
- ``truncated``: 1-step truncated BPTT, ``h_t = lambda * sg(h_{t-1}) + gamma B u_t``.
- ``spatial``: spatial backpropagation only, ``h_t = sg(lambda h_{t-1}) + gamma B u_t``
  (``nu_log``/``theta_log`` get zero gradient).

The state is one real tensor ``[B, N, 2]`` per layer (``torch.view_as_real`` of the complex
state), so it can be stored, masked and moved like any other core's state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence
from memcores.cores.scan import METHODS, linear_scan, scan_adjoint

GRAD_MODES = ("bptt", "online", "spatial", "truncated")


def _complex_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def _coefficients(lam: Tensor, like: Tensor, keep: Tensor | None) -> Tensor:
    """``a_t = lam * keep_t`` ``[T, B, N]`` (0 where a row restarts) for ``like [T, B, N]``."""
    return lam.expand_as(like) if keep is None else lam * keep.unsqueeze(-1)


def _linear_scan(
    lam: Tensor, v: Tensor, h0: Tensor, keep: Tensor | None, method: str = "auto"
) -> Tensor:
    """``h_t = lam * keep_t * h_{t-1} + v_t`` for ``v [T, B, N]``; returns ``h [T, B, N]``
    (the shared scan of :mod:`cores.scan`, kernel ``method``)."""
    return linear_scan(_coefficients(lam, v, keep), v, h0, method)


def _lambda(nu_log: Tensor, theta_log: Tensor) -> Tensor:
    """``lambda = exp(-exp(nu_log) + i exp(theta_log))`` as a complex ``[N]`` tensor."""
    return torch.exp(torch.complex(-torch.exp(nu_log), torch.exp(theta_log)))


def _recurrent_grads(
    nu_log: Tensor,
    theta_log: Tensor,
    gamma: Tensor,
    lam: Tensor,
    g_lam: Tensor,
    g_gam: Tensor,
    g_b: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Map trace sums to real parameter gradients (digest section 3.4).

    :param g_lam: ``sum G * e^lambda`` [N] complex; ``g_gam``: ``sum Re(G * e^gamma)`` [N] real;
        ``g_b``: ``sum G * e^B`` [N, H] complex (``e^B`` already includes gamma).
    :return: gradients for nu_log, theta_log, gamma_log, B_re, B_im.
    """
    d_nu = torch.real(g_lam * (-torch.exp(nu_log) * lam))
    d_theta = torch.real(g_lam * (1j * torch.exp(theta_log) * lam))
    d_gamma_log = gamma * g_gam
    return d_nu, d_theta, d_gamma_log, g_b.real, -g_b.imag


def _spatial_input_grad(grad_h: Tensor, gamma: Tensor, b_re: Tensor, b_im: Tensor) -> Tensor:
    """``dL/du`` through the instantaneous path ``h <- gamma * B u`` only.

    ``grad_h`` is PyTorch's complex gradient ``dL/dRe h + i dL/dIm h`` ``[..., N]``.
    """
    return (gamma * grad_h.real) @ b_re + (gamma * grad_h.imag) @ b_im


class _OnlineLRUScan(torch.autograd.Function):
    """Sequence-level online rule for one LRU layer (see the module docstring)."""

    @staticmethod
    def forward(ctx, u, h0, keep, nu_log, theta_log, gamma_log, b_re, b_im, method):
        lam = _lambda(nu_log, theta_log)
        gamma = torch.exp(gamma_log)
        v = torch.complex(u @ b_re.T, u @ b_im.T)  # B u  [T, B, N]
        h = _linear_scan(lam, gamma * v, h0, keep, method)
        ctx.save_for_backward(u, h0, h, nu_log, theta_log, gamma_log, b_re, b_im)
        ctx.keep, ctx.method = keep, method
        return h

    @staticmethod
    def backward(ctx, grad_h):
        u, h0, h, nu_log, theta_log, gamma_log, b_re, b_im = ctx.saved_tensors
        keep = ctx.keep
        lam = _lambda(nu_log, theta_log)
        gamma = torch.exp(gamma_log)
        # G_t = dL/dRe h - i dL/dIm h (the paper's 2 * delta_t) and
        # R_t = G_t + lambda keep_{t+1} R_{t+1}, the sum of future G seen through the traces:
        # the conjugate of the scan's adjoint g_t = grad_t + conj(lambda keep_{t+1}) g_{t+1}.
        a = _coefficients(lam, grad_h, keep)
        r = scan_adjoint(a, grad_h.contiguous(), ctx.method).conj()  # [T, B, N]
        h_prev = torch.cat([h0.unsqueeze(0), h[:-1]], 0)
        if keep is not None:
            h_prev = h_prev * keep.unsqueeze(-1)
        g_lam = (h_prev * r).sum((0, 1))
        bu = torch.complex(u @ b_re.T, u @ b_im.T)
        g_gam = torch.real(bu * r).sum((0, 1))
        flat_u = u.reshape(-1, u.shape[-1])
        g_b = gamma.unsqueeze(-1) * torch.complex(
            r.real.reshape(-1, r.shape[-1]).T @ flat_u, r.imag.reshape(-1, r.shape[-1]).T @ flat_u
        )
        grads = _recurrent_grads(nu_log, theta_log, gamma, lam, g_lam, g_gam, g_b)
        grad_u = _spatial_input_grad(grad_h, gamma, b_re, b_im)
        return (grad_u, None, None, *grads, None)


class _OnlineLRUStep(torch.autograd.Function):
    """One streaming step: ``h_t = lambda h_prev + gamma B u_t`` whose backward turns the
    incoming ``dL/dh_t`` into parameter gradients with the eligibility traces at time t."""

    @staticmethod
    def forward(ctx, u, h_prev, e_lam, e_gam, e_b, nu_log, theta_log, gamma_log, b_re, b_im):
        lam = _lambda(nu_log, theta_log)
        gamma = torch.exp(gamma_log)
        h = lam * h_prev + gamma * torch.complex(u @ b_re.T, u @ b_im.T)
        # The traces are updated in place by the next step; save_for_backward's version check
        # raises if a step's loss is backpropagated after that (which would be wrong).
        ctx.save_for_backward(e_lam, e_gam, e_b, nu_log, theta_log, gamma_log, b_re, b_im)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        e_lam, e_gam, e_b, nu_log, theta_log, gamma_log, b_re, b_im = ctx.saved_tensors
        lam = _lambda(nu_log, theta_log)
        gamma = torch.exp(gamma_log)
        g = grad_h.conj()  # [B, N]
        g_lam = (g * e_lam).sum(0)
        g_gam = torch.real(g * e_gam).sum(0)
        g_b = torch.einsum("bn,bnh->nh", g, e_b)
        grads = _recurrent_grads(nu_log, theta_log, gamma, lam, g_lam, g_gam, g_b)
        grad_u = _spatial_input_grad(grad_h, gamma, b_re, b_im)
        return (grad_u, None, None, None, None, *grads)


class LRULayer(nn.Module):
    """One LRU: ``u [T, B, H] -> h [T, B, N]`` (complex) and the readout ``y [T, B, H]``.

    :param hidden_size: H, the size of ``u`` and ``y``.
    :param state_size: N, the number of complex units.
    :param r_min, r_max: ``|lambda|`` is initialised so that ``|lambda|^2 ~ U[r_min^2, r_max^2]``
        (uniform over the ring's area).
    :param max_phase: ``arg(lambda) ~ U[0, max_phase]``.
    :param scan: the :mod:`cores.scan` kernel (``auto``: sequential on CPU, Triton on CUDA).
    """

    def __init__(
        self,
        hidden_size: int,
        state_size: int,
        r_min: float,
        r_max: float,
        max_phase: float,
        scan: str = "auto",
    ) -> None:
        super().__init__()
        self.scan_method = scan
        h, n = hidden_size, state_size
        u1, u2 = torch.rand(n), torch.rand(n)
        nu = -0.5 * torch.log(u1 * (r_max**2 - r_min**2) + r_min**2)
        theta = max_phase * u2
        self.nu_log = nn.Parameter(torch.log(nu))
        self.theta_log = nn.Parameter(torch.log(theta.clamp_min(1e-8)))
        mod = torch.exp(-nu)
        self.gamma_log = nn.Parameter(torch.log(torch.sqrt(1 - mod**2).clamp_min(1e-8)))
        self.B_re = nn.Parameter(torch.randn(n, h) / math.sqrt(2 * h))
        self.B_im = nn.Parameter(torch.randn(n, h) / math.sqrt(2 * h))
        self.C_re = nn.Parameter(torch.randn(h, n) / math.sqrt(n))
        self.C_im = nn.Parameter(torch.randn(h, n) / math.sqrt(n))
        self.D = nn.Parameter(torch.randn(h))
        self._acting_cache: tuple | None = None

    def lam(self) -> Tensor:
        """The complex eigenvalues ``lambda`` ``[N]``."""
        return _lambda(self.nu_log, self.theta_log)

    def drive(self, u: Tensor) -> Tensor:
        """``gamma * (B u)``: complex ``[..., N]`` for real ``u [..., H]``."""
        gamma = torch.exp(self.gamma_log)
        return gamma * torch.complex(u @ self.B_re.T, u @ self.B_im.T)

    def readout(self, h: Tensor, u: Tensor) -> Tensor:
        """``y = Re(C h) + D * u`` ``[..., H]``."""
        return h.real @ self.C_re.T - h.imag @ self.C_im.T + self.D * u

    def acting_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """The layer as three real/complex blocks for one gradient-free step (acting).

        :return: ``lambda [N]`` complex; ``W_in [2N, H]`` real with rows interleaved
            (re, im) so that ``view_as_complex((u @ W_in.T).view(B, N, 2)) = gamma * B u``;
            ``W_out [H, 2N]`` real with ``view_as_real(h).view(B, 2N) @ W_out.T = Re(C h)``.
        """
        # A rollout acts hundreds of times between two optimiser steps: rebuild the blocks only
        # when a parameter changed (every in-place update bumps its version counter).
        key = tuple((p.data_ptr(), p._version) for p in self._acting_params())
        if self._acting_cache is None or self._acting_cache[0] != key:
            with torch.no_grad():
                gamma = torch.exp(self.gamma_log).unsqueeze(-1)
                h = self.D.numel()
                w_in = torch.stack([gamma * self.B_re, gamma * self.B_im], 1).reshape(-1, h)
                w_out = torch.stack([self.C_re, -self.C_im], -1).reshape(h, -1)
                self._acting_cache = (key, (self.lam(), w_in, w_out))
        return self._acting_cache[1]

    def _acting_params(self) -> tuple[Tensor, ...]:
        return (
            self.nu_log,
            self.theta_log,
            self.gamma_log,
            self.B_re,
            self.B_im,
            self.C_re,
            self.C_im,
        )

    def scan(self, u: Tensor, h0: Tensor, keep: Tensor | None, mode: str) -> Tensor:
        """States ``h [T, B, N]`` for inputs ``u [T, B, H]`` from ``h0 [B, N]`` (complex).

        :param keep: ``[T, B]`` 0/1; 0 resets the state before step t.
        :param mode: a gradient mode, or ``"eval"`` (plain autograd, same as ``bptt``).
        """
        method = self.scan_method
        if mode in ("bptt", "eval"):
            return _linear_scan(self.lam(), self.drive(u), h0, keep, method)
        if mode == "online":
            return _OnlineLRUScan.apply(
                u,
                h0,
                keep,
                self.nu_log,
                self.theta_log,
                self.gamma_log,
                self.B_re,
                self.B_im,
                method,
            )
        # truncated / spatial: the values are the exact recurrence; only the gradient paths
        # differ, so the previous states come from a gradient-free scan (vectorised in time).
        lam = self.lam()
        v = self.drive(u)
        with torch.no_grad():
            h_full = _linear_scan(lam, v, h0, keep, method)
            h_prev = torch.cat([h0.detach().unsqueeze(0), h_full[:-1]], 0)
            if keep is not None:
                h_prev = h_prev * keep.unsqueeze(-1)
        if mode == "truncated":
            return lam * h_prev + v
        if mode == "spatial":
            return (lam * h_prev).detach() + v
        raise ValueError(f"unknown grad mode {mode!r}; valid: {', '.join(GRAD_MODES)}")

    def online_step(
        self, u: Tensor, h_prev: Tensor, traces: tuple[Tensor, Tensor, Tensor], keep: Tensor | None
    ) -> Tensor:
        """One streaming online step; updates ``traces`` IN PLACE and returns ``h_t [B, N]``.

        :param u: ``[B, H]`` layer input at time t.
        :param h_prev: ``[B, N]`` complex state after step t-1 (treated as a constant).
        :param traces: complex ``e^lambda [B, N]``, ``e^gamma [B, N]``, ``e^B [B, N, H]``
            (``e^B`` includes gamma: ``e^B_t = lambda e^B_{t-1} + gamma u_t^T``).
        :param keep: ``[B]`` 0/1, 0 where the state and traces reset before this step.
        """
        e_lam, e_gam, e_b = traces
        with torch.no_grad():
            lam = self.lam()
            gamma = torch.exp(self.gamma_log)
            u_ = u.detach()
            h_prev = h_prev.detach()
            if keep is not None:
                h_prev = h_prev * keep.unsqueeze(-1)
                lam_b = lam * keep.unsqueeze(-1)  # [B, N]
            else:
                lam_b = lam.expand_as(h_prev)
            bu = torch.complex(u_ @ self.B_re.T, u_ @ self.B_im.T)
            e_lam.mul_(lam_b).add_(h_prev)
            e_gam.mul_(lam_b).add_(bu)
            e_b.mul_(lam_b.unsqueeze(-1)).add_(gamma.unsqueeze(-1) * u_.unsqueeze(1))
        return _OnlineLRUStep.apply(
            u,
            h_prev,
            e_lam,
            e_gam,
            e_b,
            self.nu_log,
            self.theta_log,
            self.gamma_log,
            self.B_re,
            self.B_im,
        )


class LRUBlock(nn.Module):
    """Pre-LayerNorm -> LRU -> GELU -> GLU -> residual (the paper's code, no dropout)."""

    def __init__(
        self,
        hidden_size: int,
        state_size: int,
        r_min: float,
        r_max: float,
        max_phase: float,
        scan: str = "auto",
    ) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.lru = LRULayer(hidden_size, state_size, r_min, r_max, max_phase, scan)
        self.glu = nn.Linear(hidden_size, 2 * hidden_size)

    def post(self, x: Tensor, u: Tensor, h: Tensor) -> Tensor:
        """Block output from its input ``x``, the normalised input ``u`` and the LRU states."""
        g = F.gelu(self.lru.readout(h, u))
        a, b = self.glu(g).chunk(2, dim=-1)
        return x + a * torch.sigmoid(b)

    def forward(
        self, x: Tensor, h0: Tensor, keep: Tensor | None, mode: str
    ) -> tuple[Tensor, Tensor]:
        """``x [T, B, H]``, complex ``h0 [B, N]`` -> ``out [T, B, H]``, last state ``[B, N]``."""
        u = self.norm(x)
        h = self.lru.scan(u, h0, keep, mode)
        return self.post(x, u, h), h[-1]


class LRUCore(MemoryCore):
    """Stack of LRU blocks trained with BPTT or the online rule (see module docstring).

    :param input_size: size of ``x[t, b]``.
    :param hidden_size: H, the model width and the output size.
    :param state_size: N, complex units per layer.
    :param layers: number of blocks (the paper's copy task uses 4).
    :param r_min: smallest initial ``|lambda|``.
    :param r_max: largest initial ``|lambda|``.
    :param max_phase: initial phases are uniform in ``[0, max_phase]``.
    :param grad: ``bptt`` | ``online`` | ``spatial`` | ``truncated``; used only in training mode.
    :param scan: the :mod:`cores.scan` kernel: ``auto`` | ``parallel`` | ``sequential`` |
        ``triton`` (same values; ``auto`` takes ``sequential`` on CPU, ``triton`` on CUDA).
    """

    has_fused = True  # CUDA tensors take the Triton scan (cores.scan, method auto)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        state_size: int = 64,
        layers: int = 4,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
        grad: str = "bptt",
        scan: str = "auto",
    ) -> None:
        super().__init__(input_size, hidden_size)
        if grad not in GRAD_MODES:
            raise ValueError(f"unknown grad mode {grad!r}; valid: {', '.join(GRAD_MODES)}")
        if scan not in METHODS:
            raise ValueError(f"unknown scan {scan!r}; valid: {', '.join(METHODS)}")
        if state_size <= 0 or layers <= 0:
            raise ValueError(f"state_size and layers must be positive, got {state_size}, {layers}")
        if not 0.0 <= r_min < r_max <= 1.0:
            raise ValueError(f"need 0 <= r_min < r_max <= 1, got r_min={r_min}, r_max={r_max}")
        if max_phase <= 0:
            raise ValueError(f"max_phase must be positive, got {max_phase}")
        self.state_size = int(state_size)
        self.grad = grad
        self.encoder = nn.Linear(input_size, hidden_size)
        self.blocks = nn.ModuleList(
            LRUBlock(hidden_size, state_size, r_min, r_max, max_phase, scan) for _ in range(layers)
        )

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
        """One zero ``[B, N, 2]`` tensor (real/imaginary parts) per layer."""
        dtype = self.encoder.weight.dtype
        device = self.encoder.weight.device if device is None else device
        return tuple(
            torch.zeros(batch_size, self.state_size, 2, dtype=dtype, device=device)
            for _ in self.blocks
        )

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the state after step T."""
        check_sequence(self, x, state, starts)
        if x.shape[0] == 1 and not torch.is_grad_enabled():
            return self._act(x, state, starts)
        keep = None if starts is None else (~starts.bool()).to(x.dtype)
        z = self.encoder(x)
        new_state = []
        for block, s in zip(self.blocks, state, strict=True):
            z, h_last = block(z, torch.view_as_complex(s.contiguous()), keep, self.mode)
            new_state.append(torch.view_as_real(h_last))
        return z, tuple(new_state)

    def _act(self, x: Tensor, state: State, starts: Tensor | None) -> tuple[Tensor, State]:
        """One step without autograd, as a rollout acts: ``x [1, B, input_size]``.

        The same values as the scan path with far fewer small operations: each layer's
        projections are one real matrix product each way, built once per parameter update
        (:meth:`LRULayer.acting_weights`), and the recurrence is one complex multiply-add."""
        z = self.encoder(x[0])
        keep = None if starts is None else ~starts[0].bool()
        new_state = []
        for block, s in zip(self.blocks, state, strict=True):
            lam, w_in, w_out = block.lru.acting_weights()
            u = block.norm(z)
            h_prev = torch.view_as_complex(s.contiguous())
            if keep is not None:
                h_prev = h_prev * keep.unsqueeze(-1)
            drive = torch.view_as_complex((u @ w_in.T).view(*h_prev.shape, 2))
            h = torch.addcmul(drive, lam, h_prev)
            y = torch.addcmul(torch.view_as_real(h).flatten(1) @ w_out.T, block.lru.D, u)
            a, b = block.glu(F.gelu(y)).chunk(2, dim=-1)
            z = z + a * torch.sigmoid(b)
            new_state.append(torch.view_as_real(h))
        return z.unsqueeze(0), tuple(new_state)

    # ------------------------------------------------------------------ streaming online
    def initial_traces(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """Zero eligibility traces per layer: ``e^lambda [B, N, 2]``, ``e^gamma [B, N, 2]``,
        ``e^B [B, N, H, 2]`` (real views of complex tensors)."""
        dtype = self.encoder.weight.dtype
        device = self.encoder.weight.device if device is None else device
        b, n, h = batch_size, self.state_size, self.hidden_size
        out = []
        for _ in self.blocks:
            out += [
                torch.zeros(b, n, 2, dtype=dtype, device=device),
                torch.zeros(b, n, 2, dtype=dtype, device=device),
                torch.zeros(b, n, h, 2, dtype=dtype, device=device),
            ]
        return tuple(out)

    def online_step(
        self, x_t: Tensor, state: State, traces: State, start: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """One streaming step of the online rule.

        :param x_t: ``[B, input_size]``.
        :param state: as from :meth:`initial_state` (detached: no gradient flows back in time).
        :param traces: as from :meth:`initial_traces`; updated IN PLACE. Backpropagate the loss
            of step t (if any) before calling step t+1.
        :param start: ``[B]`` bool; resets state and traces of those rows before reading x_t.
        :return: ``y_t [B, H]`` (with a one-step graph) and the new detached state.
        """
        keep = None if start is None else (~start.bool()).to(x_t.dtype)
        z = self.encoder(x_t)
        new_state = []
        for i, (block, s) in enumerate(zip(self.blocks, state, strict=True)):
            tr = tuple(torch.view_as_complex(e) for e in traces[3 * i : 3 * i + 3])
            u = block.norm(z)
            h = block.lru.online_step(u, torch.view_as_complex(s.contiguous()), tr, keep)
            z = block.post(z, u, h)
            new_state.append(torch.view_as_real(h.detach()))
        return z, tuple(new_state)
