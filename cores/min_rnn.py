"""minGRU and minLSTM (Feng et al., "Were RNNs All We Needed?", arXiv:2410.01201, 2024).

Both drop the hidden state from the gates, so one layer is a diagonal linear recurrence
``h_t = a_t * h_{t-1} + b_t`` whose coefficients depend on ``x_t`` only::

    minGRU:  z_t = sigma(W_z x_t),  h~_t = g(W_h x_t)
             h_t = (1 - z_t) h_{t-1} + z_t h~_t                 a = 1 - z,  b = z h~
    minLSTM: f_t = sigma(W_f x_t),  i_t = sigma(W_i x_t),  h~_t = g(W_h x_t)
             f'_t = f_t / (f_t + i_t),  i'_t = i_t / (f_t + i_t)
             h_t = f'_t h_{t-1} + i'_t h~_t                     a = f',     b = i' h~

with ``g(x) = x + 1/2`` for ``x >= 0`` and ``sigma(x)`` otherwise (the paper's positive
candidate activation). Training solves the whole sequence with the shared scan of
:mod:`cores.scan` inside one fused autograd node (gates, scan and their hand-written
backward), so no step loop enters the graph; :meth:`step` is the paper's sequential form,
used by rollouts, and the tests check both agree.

The paper's log-space variant computes the same recurrence as ``log h_t`` with a
cumulative-sum (Heinsen) scan, which divides by cumulative products of ``a`` and would
under/overflow without logs. The scan used here only multiplies coefficients in ``(0, 1)``
(``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)``), so it stays in range in linear space and
needs no ``log``/``exp`` passes; an episode start is simply ``a_t = 0`` (the initial state
is zero), which log space could only express as ``-inf``.

With ``layers > 1`` the layers are stacked as residual blocks, ``y <- y + cell(LayerNorm(y))``
after a first layer that maps ``input_size`` to ``hidden_size``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from memcores.cores.base import MemoryCore, State, check_sequence, keep_mask
from memcores.cores.scan import METHODS, resolve_method, scan_adjoint, scan_values


def candidate(x: Tensor) -> Tensor:
    """The paper's positive candidate activation ``g``: ``x + 1/2`` (x >= 0), ``sigma(x)``."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def _candidate_parts(x: Tensor) -> tuple[Tensor, Tensor]:
    """``g(x)`` and ``g'(x)`` without ``torch.where`` (several times slower on CPU):
    with ``s = sigma(min(x, 0))``, ``g = relu(x) + s`` (``s = 1/2`` for ``x >= 0``) and
    ``g' = s (1 - s) + 3/4 [x >= 0]`` (``s (1 - s) = 1/4`` there)."""
    s = torch.sigmoid(x.clamp_max(0))
    slope = torch.addcmul(s * (1 - s), (x >= 0).to(x.dtype), torch.full_like(s[:1], 0.75))
    return torch.relu(x) + s, slope


CHUNK = 16
"""Steps per block of the fused layer with the ``sequential`` scan (the CPU's): gates, scan
and backward run block by block, so a block's temporaries stay small and in cache instead of
streaming ``[T, B, H]`` tensors through memory once per elementwise operation. The parallel
scans (``parallel``, ``triton``: accelerators) take the whole sequence as one block, so the
operations per call do not grow with ``T``: a Python loop over blocks would put ``T / CHUNK``
rounds of small launches back in front of the GPU."""


def _block(kind: str, k: Tensor) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
    """``a, b`` of one block from its projections ``k [L, B, G*H]`` and the factors the
    backward needs (no autograd; the reset mask is applied by the caller).

    minGRU: ``a = 1 - z``, ``b = z g``; saved ``(g, z (1 - z), z g')``.
    minLSTM: ``a = f'``, ``b = (1 - f') g``; saved ``(g, f' (1 - f'), 1 - f, 1 - i, i' g')``
    (``df'/dk_f = f' i' (1 - f)``, ``df'/dk_i = -f' i' (1 - i)``).
    """
    if kind == "gru":
        k_z, k_h = k.chunk(2, dim=-1)
        z = torch.sigmoid(k_z)
        cand, slope = _candidate_parts(k_h)
        a = 1 - z
        return a, z * cand, (cand, z * a, z * slope)
    k_f, k_i, k_h = k.chunk(3, dim=-1)
    f, i = torch.sigmoid(k_f), torch.sigmoid(k_i)
    cand, slope = _candidate_parts(k_h)
    a = f / (f + i)
    i_norm = 1 - a
    return a, i_norm * cand, (cand, a * i_norm, 1 - f, 1 - i, i_norm * slope)


def _block_grad(kind: str, g: Tensor, h_prev: Tensor, saved: tuple[Tensor, ...], out: Tensor):
    """Write ``dL/dk`` of one block into ``out [L, B, G*H]`` from ``g = dL/db [L, B, H]`` and
    the (reset-masked) previous states ``h_prev [L, B, H]``."""
    if kind == "gru":
        cand, z_a, z_slope = saved
        d_kz, d_kh = out.chunk(2, dim=-1)
        torch.mul(g * (cand - h_prev), z_a, out=d_kz)  # dL/dz = g (g~ - h_prev)
        torch.mul(g, z_slope, out=d_kh)
        return
    cand, fi, one_f, one_i, i_slope = saved
    d_kf, d_ki, d_kh = out.chunk(3, dim=-1)
    q = g * (h_prev - cand) * fi  # dL/df' times f' i'
    torch.mul(q, one_f, out=d_kf)
    torch.mul(-q, one_i, out=d_ki)
    torch.mul(g, i_slope, out=d_kh)


class _MinRNNScan(torch.autograd.Function):
    """``k [T, B, G*H], h0 [B, H] -> h [T, B, H]`` for one min-RNN layer (fused gates+scan),
    computed in blocks (see :data:`CHUNK`); the backward reuses the forward's gate factors
    (``3``-``5`` tensors of ``[T, B, H]``) instead of recomputing them."""

    @staticmethod
    def forward(ctx, k: Tensor, h0: Tensor, keep: Tensor | None, kind: str, method: str):
        steps, batch, size = k.shape[0], k.shape[1], h0.shape[-1]
        method = resolve_method(method, k.device)
        chunk = CHUNK if method == "sequential" else max(steps, 1)
        h = k.new_empty(steps, batch, size)
        coefficients = k.new_empty(steps, batch, size)  # a (reset mask applied)
        saved: list[Tensor] = []
        h_prev = h0
        with torch.no_grad():
            for lo in range(0, steps, chunk):
                block = slice(lo, lo + chunk)
                a, b, parts = _block(kind, k[block])
                if keep is not None:
                    a = a * keep[block]
                coefficients[block] = a
                if not saved:
                    saved = [k.new_empty(steps, batch, size) for _ in parts]
                for buffer, part in zip(saved, parts, strict=True):
                    buffer[block] = part
                h_prev = scan_values(a, b, h_prev, method, out=h[block])[-1]
        ctx.save_for_backward(h0, h, coefficients, keep, *saved)
        ctx.kind, ctx.method, ctx.chunk = kind, method, chunk
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor):
        h0, h, coefficients, keep, *saved = ctx.saved_tensors
        steps, kind, chunk = h.shape[0], ctx.kind, ctx.chunk
        grad_k = grad_h.new_empty(steps, h.shape[1], h.shape[2] * (3 if kind == "lstm" else 2))
        g_next = a_next = None  # g and a at the first step of the block after this one
        for lo in reversed(range(0, steps, chunk)):
            block = slice(lo, lo + chunk)
            a, grad = coefficients[block], grad_h[block]
            if g_next is not None:  # g_{hi-1} also collects a_hi g_hi from the next block
                grad = grad.clone()
                grad[-1] += a_next * g_next
            g = scan_adjoint(a, grad, ctx.method)  # dL/db
            h_prev = torch.empty_like(g)
            h_prev[0] = h0 if lo == 0 else h[lo - 1]
            h_prev[1:] = h[lo : lo + g.shape[0] - 1]
            if keep is not None:
                h_prev = h_prev * keep[block]  # what a multiplies: zero after a reset
            _block_grad(kind, g, h_prev, tuple(t[block] for t in saved), grad_k[block])
            g_next, a_next = g[0], a[0]
        return grad_k, a_next * g_next, None, None, None


class _MinCell(nn.Module):
    """One min-RNN layer's projection ``[..., input] -> [..., G*H]`` and its sequential form."""

    kind: str
    gates: int  # projections besides the candidate

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_size, (self.gates + 1) * hidden_size)

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        """The paper's sequential form: ``x_t [B, input]``, ``h [B, H]`` -> ``h_t [B, H]``."""
        raise NotImplementedError


class MinGRUCell(_MinCell):
    kind, gates = "gru", 1

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        k_z, k_h = self.proj(x_t).chunk(2, dim=-1)
        z = torch.sigmoid(k_z)
        return (1 - z) * h + z * candidate(k_h)


class MinLSTMCell(_MinCell):
    kind, gates = "lstm", 2

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__(input_size, hidden_size)
        with torch.no_grad():  # forget bias 1, as for the LSTM baselines
            self.proj.bias[:hidden_size].fill_(1.0)

    def direct_step(self, x_t: Tensor, h: Tensor) -> Tensor:
        k_f, k_i, k_h = self.proj(x_t).chunk(3, dim=-1)
        f, i = torch.sigmoid(k_f), torch.sigmoid(k_i)
        return f / (f + i) * h + i / (f + i) * candidate(k_h)


class _MinRNN(MemoryCore):
    """A stack of min-RNN layers (see the module docstring).

    :param layers: number of layers; 1 is the paper's single cell.
    :param scan: the :mod:`cores.scan` kernel: ``auto`` | ``parallel`` | ``sequential`` |
        ``triton`` (same values; ``auto`` takes ``sequential`` on CPU and ``triton`` on CUDA,
        see :func:`cores.scan.resolve_method`).
    """

    has_fused = True  # CUDA tensors take the Triton scan (cores.scan, method auto)

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

    @property
    def state_arity(self) -> int:  # type: ignore[override]
        """One state tensor per cell."""
        return len(self.cells)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """One zero ``[B, H]`` tensor per layer."""
        return self.zero_state(batch_size, device, self.cells[0].proj.weight, len(self.cells))

    def _layer_input(self, i: int, y: Tensor) -> Tensor:
        return y if i == 0 else self.norms[i - 1](y)

    def _combine(self, i: int, y: Tensor, h: Tensor) -> Tensor:
        return h if i == 0 else y + h

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]`` and the per-layer ``[B, H]`` states."""
        check_sequence(self, x, state, starts)
        keep = None
        # starts on a GPU are not read back (the host would wait for the device, and a CUDA
        # graph of the update could not be recorded): the mask is applied whatever they hold
        if starts is not None and (starts.device.type != "cpu" or bool(starts.any())):
            keep = keep_mask(starts, x.dtype)  # [T, B, 1]
        y, new_state = x, []
        for i, (cell, h0) in enumerate(zip(self.cells, state, strict=True)):
            k = cell.proj(self._layer_input(i, y))  # [T, B, G*H]
            h = _MinRNNScan.apply(k, h0, keep, cell.kind, self.scan)  # [T, B, H]
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
