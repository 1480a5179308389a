"""sLSTM and mLSTM cells (Beck et al., "xLSTM: Extended Long Short-Term Memory", NeurIPS 2024,
arXiv:2405.04517), as memory cores without the paper's surrounding residual blocks.

Both use exponential input gates with a stabiliser state ``m`` so that ``exp`` never
overflows; the forget gate is ``sigma(f~)`` (the paper allows sigmoid or exp), used as
``log f = logsigmoid(f~)``::

    m_t  = max(log f_t + m_{t-1}, i~_t)
    i'_t = exp(i~_t - m_t),   f'_t = exp(log f_t + m_{t-1} - m_t)

sLSTM (scalar memory, normaliser, recurrent gates that are block-diagonal over ``heads``)::

    [z~, i~, f~, o~]_t = W x_t + R h_{t-1} + b        R block-diagonal, one block per head
    c_t = f'_t c_{t-1} + i'_t tanh(z~_t)
    n_t = f'_t n_{t-1} + i'_t
    h_t = sigma(o~_t) * c_t / n_t

mLSTM (matrix memory per head, covariance update, gates from the input only)::

    q_t = W_q x_t,  k_t = W_k x_t / sqrt(d),  v_t = W_v x_t        per head, size d
    C_t = f'_t C_{t-1} + i'_t v_t k_t^T
    n_t = f'_t n_{t-1} + i'_t k_t
    h_t = sigma(W_o x_t) * (C_t q_t) / max(|n_t . q_t|, exp(-m_t))

The stabilised state is ``(C, n, m)`` with the true memory ``exp(m) C``. Since the mLSTM's
gates do not read ``h``, a chunk of ``L`` steps has a parallel form: with
``F_t = sum_{r<=t} log f_r`` and the state ``(C_0, n_0, m_0)`` before the chunk,
``D_ts = F_t - F_s + i~_s`` (``s <= t`` in the same episode), ``m_t = max(F_t + m_0,
max_s D_ts)`` is exactly the recurrent stabiliser, and
``C_t q_t = sum_s exp(D_ts - m_t) (q_t . k_s) v_s + exp(F_t + m_0 - m_t) C_0 q_t``.
Training cuts the sequence into chunks of ``chunk_size`` steps and evaluates this form for
all chunks at once (O(T L) memory, the chunkwise form xLSTM's kernels use); the states
entering the chunks follow from two scans over chunks, so no Python loop runs over time:

- the stabiliser at chunk borders, ``m_{k+1} = max(A_k + m_k, M_k)``, is a scan in the
  (max, +) algebra (``log2`` of the chunk count vectorised rounds);
- given those, ``(C, n)`` at chunk borders is the diagonal linear recurrence
  ``(C, n)_{k+1} = a_k (C, n)_k + U_k`` over ``d^2 + d`` channels per head, solved by the
  shared scan of :mod:`cores.scan` (one Triton launch each way on CUDA).

Rollouts step the recurrent form; the tests check both agree, resets included.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memcores.cores.base import (
    MemoryCore,
    State,
    autocast_enabled,
    check_sequence,
    reset_where,
    step_loop,
    triton_available,
)
from memcores.cores.scan import METHODS, linear_scan

_EPS = 1e-6  # floor of the sLSTM normaliser: n is 0 only when every i' underflowed
IMPLS = ("fused", "triton", "loop")


def _heads(hidden_size: int, heads: int | None) -> int:
    """``heads``, or by default the largest of 4, 2, 1 that divides ``hidden_size``."""
    heads = math.gcd(4, hidden_size) if heads is None else int(heads)
    if heads <= 0 or hidden_size % heads:
        raise ValueError(f"heads must divide hidden_size={hidden_size}, got heads={heads}")
    return heads


def stabilised_gates(i_raw: Tensor, f_raw: Tensor, m_prev: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``i'``, ``f'`` and the new stabiliser ``m`` from the raw gates (same shapes)."""
    log_f = F.logsigmoid(f_raw)
    m = torch.maximum(log_f + m_prev, i_raw)
    return torch.exp(i_raw - m), torch.exp(log_f + m_prev - m), m


class SLSTM(MemoryCore):
    """sLSTM cell: exponential gating, normaliser state, head-wise recurrent matrices.

    :param heads: recurrent blocks (``hidden_size / heads`` units each); default: the largest
        of 4, 2, 1 dividing ``hidden_size``.
    :param impl: ``fused`` (the Triton kernels of :mod:`cores.triton_engine` on CUDA tensors,
        the step loop on the CPU), ``triton`` (the kernels on any device; a CPU needs
        ``TRITON_INTERPRET=1``) or ``loop`` (the step loop everywhere; the reference).
    """

    state_arity = 4

    def __init__(
        self, input_size: int, hidden_size: int, *, heads: int | None = None, impl: str = "fused"
    ) -> None:
        super().__init__(input_size, hidden_size)
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}; valid: {', '.join(IMPLS)}")
        self.impl = impl
        self.has_fused = impl != "loop"
        self.heads = _heads(hidden_size, heads)
        d = hidden_size // self.heads
        self.input = nn.Linear(input_size, 4 * hidden_size)  # rows: z, i, f, o
        self.recurrent = nn.Parameter(torch.randn(4, self.heads, d, d) / math.sqrt(d))
        with torch.no_grad():
            # forget biases spread over [3, 6] (the paper's init): long memory from the start
            self.input.bias[2 * hidden_size : 3 * hidden_size] = torch.linspace(3, 6, hidden_size)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """``(h, c, n, m)``, each a zero ``[B, H]`` tensor."""
        return self.zero_state(batch_size, device, self.input.weight, count=4)

    def _cell(self, pre: Tensor, state: State) -> tuple[Tensor, State]:
        """One step from the input part of the pre-activations ``pre [B, 4, H]``."""
        h, c, n, m = state
        b = h.shape[0]
        rec = torch.einsum("bnd,gnde->bgne", h.view(b, self.heads, -1), self.recurrent)
        z_raw, i_raw, f_raw, o_raw = (pre + rec.reshape(b, 4, -1)).unbind(1)
        i_gate, f_gate, m = stabilised_gates(i_raw, f_raw, m)
        c = f_gate * c + i_gate * torch.tanh(z_raw)
        n = f_gate * n + i_gate
        h = torch.sigmoid(o_raw) * c / n.clamp_min(_EPS)
        return h, (h, c, n, m)

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """``x_t [B, input_size]`` -> ``h_t [B, H]`` and ``(h, c, n, m)``."""
        return self._cell(self.input(x_t).view(x_t.shape[0], 4, -1), state)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]``; the input projection runs once for all
        steps, the recurrence step by step (its gates read ``h_{t-1}``)."""
        check_sequence(self, x, state, starts)
        # the kernels write into preallocated buffers, which autocast's dtype changes would
        # break; under autocast the step loop runs
        if self.has_fused and not autocast_enabled(x.device.type):
            if self.impl == "triton" or (x.is_cuda and triton_available()):
                from memcores.cores.triton_engine import triton_slstm

                return triton_slstm(self, x, state, starts, _EPS)
        pre = self.input(x).view(x.shape[0], x.shape[1], 4, -1)  # [T, B, 4, H]
        return step_loop(self._cell, pre, state, starts, reset_where)  # zero initial state


class MLSTM(MemoryCore):
    """mLSTM cell: matrix memory per head, trained in chunkwise-parallel form.

    :param heads: memory heads (``d = hidden_size / heads``; state ``[B, heads, d, d]``);
        default: the largest of 4, 2, 1 dividing ``hidden_size``.
    :param chunk_size: steps per parallel chunk in :meth:`forward` (memory ``O(T L)``).
    :param scan: the :mod:`cores.scan` kernel of the scan over chunk states: ``auto`` |
        ``parallel`` | ``sequential`` | ``triton`` (same values; ``auto`` takes ``sequential``
        on CPU, ``triton`` on CUDA).
    """

    has_fused = True  # CUDA tensors take the Triton scan (cores.scan, method auto)

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        heads: int | None = None,
        chunk_size: int = 64,
        scan: str = "auto",
    ) -> None:
        super().__init__(input_size, hidden_size)
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if scan not in METHODS:
            raise ValueError(f"unknown scan {scan!r}; valid: {', '.join(METHODS)}")
        self.scan = scan
        self.heads = _heads(hidden_size, heads)
        self.head_size = hidden_size // self.heads
        self.chunk_size = int(chunk_size)
        self.qkvo = nn.Linear(input_size, 4 * hidden_size)
        self.gates = nn.Linear(input_size, 2 * self.heads)  # i~, f~ per head
        with torch.no_grad():
            self.gates.bias[: self.heads].zero_()
            self.gates.bias[self.heads :] = torch.linspace(3, 6, self.heads)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        """``C [B, heads, d, d]``, ``n [B, heads, d]``, ``m [B, heads]``, all zero."""
        weight = self.qkvo.weight
        device = weight.device if device is None else device
        kw = dict(dtype=weight.dtype, device=device)
        nh, d = self.heads, self.head_size
        return (
            torch.zeros(batch_size, nh, d, d, **kw),
            torch.zeros(batch_size, nh, d, **kw),
            torch.zeros(batch_size, nh, **kw),
        )

    def _project(self, x: Tensor) -> tuple[Tensor, ...]:
        """``x [..., D]`` -> q, k, v ``[..., heads, d]``, o ``[..., H]``, i~ and f~
        ``[..., heads]``."""
        shape = (*x.shape[:-1], self.heads, self.head_size)
        q, k, v, o = self.qkvo(x).chunk(4, dim=-1)
        i_raw, f_raw = self.gates(x).chunk(2, dim=-1)
        k = k / math.sqrt(self.head_size)
        return q.reshape(shape), k.reshape(shape), v.reshape(shape), o, i_raw, f_raw

    def step(self, x_t: Tensor, state: State) -> tuple[Tensor, State]:
        """The recurrent form: ``x_t [B, input_size]`` -> ``h_t [B, H]`` and ``(C, n, m)``."""
        c, n, m = state
        q, k, v, o, i_raw, f_raw = self._project(x_t)
        i_gate, f_gate, m = stabilised_gates(i_raw, f_raw, m)
        outer = v[..., :, None] * k[..., None, :]  # v k^T  [B, heads, d, d]
        c = f_gate[..., None, None] * c + i_gate[..., None, None] * outer
        n = f_gate[..., None] * n + i_gate[..., None] * k
        num = torch.einsum("bhij,bhj->bhi", c, q)
        den = torch.maximum((n * q).sum(-1).abs(), torch.exp(-m))
        h = torch.sigmoid(o) * (num / den[..., None]).flatten(-2)
        return h, (c, n, m)

    def forward(
        self, x: Tensor, state: State, starts: Tensor | None = None
    ) -> tuple[Tensor, State]:
        """``x [T, B, input_size]`` -> ``y [T, B, H]``: every chunk at once in parallel form,
        the chunk-entry states by one scan over chunks (see the module docstring)."""
        check_sequence(self, x, state, starts)
        q, k, v, o, i_raw, f_raw = self._project(x)
        steps, batch = x.shape[:2]
        if starts is None:
            starts = torch.zeros(steps, batch, dtype=torch.bool, device=x.device)
        size = min(self.chunk_size, steps)
        chunks = -(-steps // size)
        log_f = F.logsigmoid(f_raw)
        pad = chunks * size - steps
        if pad:  # padding steps keep the state: f = 1 (log f = 0), no input (i~ = -inf)
            q, k, v, log_f = (
                torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) for t in (q, k, v, log_f)
            )
            i_raw = torch.cat([i_raw, i_raw.new_full((pad, *i_raw.shape[1:]), float("-inf"))])
            starts = torch.cat([starts.bool(), starts.new_zeros(pad, batch, dtype=torch.bool)])
        h, state = self._chunks(q, k, v, i_raw, log_f, starts.bool(), state, chunks)
        return torch.sigmoid(o) * h[:steps].flatten(-2), state

    def _chunks(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        i_raw: Tensor,
        log_f: Tensor,
        starts: Tensor,
        state: State,
        chunks: int,
    ) -> tuple[Tensor, State]:
        """Parallel form over ``chunks`` chunks of ``L`` steps, all at once.

        :param q, k, v: ``[NC L, B, heads, d]``; ``i_raw, log_f``: ``[NC L, B, heads]``;
            ``starts``: ``[NC L, B]`` bool.
        :return: ``h~ [NC L, B, heads, d]`` (before the output gate) and the state after the
            last step.
        """
        c0, n0, m0 = state
        steps, batch, heads, d = q.shape
        size = steps // chunks
        # chunk-major, time-last layout for the gate algebra: [NC, B, heads, L]
        log_f, i_raw = (
            t.view(chunks, size, batch, heads).permute(0, 2, 3, 1) for t in (log_f, i_raw)
        )
        starts = starts.view(chunks, size, batch).permute(0, 2, 1).unsqueeze(2)  # [NC, B, 1, L]
        qb, kb, vb = (
            t.view(chunks, size, batch, heads, d).permute(0, 2, 3, 1, 4) for t in (q, k, v)
        )
        cum = log_f.cumsum(-1)  # F_t inside each chunk
        idx = torch.arange(size, device=q.device)
        # r(t): the last episode start <= t in its chunk (0 if none); F before step r(t)
        first = torch.where(starts, idx, torch.zeros_like(idx)).cummax(-1).values
        cum_before = F.pad(cum, (1, 0)).gather(-1, first.expand_as(cum))
        carried = ~starts.gather(-1, first)  # the episode of t began before its chunk
        segment = starts.long().cumsum(-1)
        same = (segment.unsqueeze(-1) == segment.unsqueeze(-2)) & (idx[:, None] >= idx[None, :])
        log_d = cum.unsqueeze(-1) - cum.unsqueeze(-2) + i_raw.unsqueeze(-2)  # [NC, B, nh, L, L]
        log_d = log_d.masked_fill(~same, float("-inf"))
        local_max = log_d.amax(-1)  # [NC, B, nh, L]
        decay = cum - cum_before  # log of the forget product since r(t) (or the chunk start)
        m_entry = _chunk_stabilisers(decay[..., -1], local_max[..., -1], carried[..., -1], m0)
        log_w0 = decay + torch.where(carried, m_entry.unsqueeze(-1), torch.zeros_like(decay))
        m = torch.maximum(log_w0, local_max)  # the recurrent stabiliser at every step
        weights = torch.exp(log_d - m.unsqueeze(-1))  # [NC, B, nh, L(t), L(s)]
        w0 = torch.exp(log_w0 - m) * carried  # weight of the state entering the chunk
        # chunk-entry states: (C, n)_{k+1} = w0_last (C, n)_k + sum_s w_last,s (v_s k_s^T, k_s)
        w_last = weights[..., -1, :]
        inputs = torch.cat(
            [
                torch.einsum("cbhs,cbhsi,cbhsj->cbhij", w_last, vb, kb).flatten(-2),
                torch.einsum("cbhs,cbhsj->cbhj", w_last, kb),
            ],
            -1,
        )  # [NC, B, nh, d d + d]
        entry0 = torch.cat([c0.flatten(-2), n0], -1)
        exits = linear_scan(w0[..., -1:].expand_as(inputs), inputs, entry0, self.scan)
        entries = torch.cat([entry0.unsqueeze(0), exits[:-1]], 0)
        c_in = entries[..., : d * d].unflatten(-1, (d, d))
        n_in = entries[..., d * d :]
        scores = weights * (qb @ kb.transpose(-1, -2))
        num = scores @ vb + w0.unsqueeze(-1) * torch.einsum("cbhij,cbhtj->cbhti", c_in, qb)
        den = scores.sum(-1) + w0 * torch.einsum("cbhj,cbhtj->cbht", n_in, qb)
        h = num / torch.maximum(den.abs(), torch.exp(-m)).unsqueeze(-1)  # [NC, B, nh, L, d]
        h = h.permute(0, 3, 1, 2, 4).reshape(steps, batch, heads, d)
        last = exits[-1]
        return h, (last[..., : d * d].unflatten(-1, (d, d)), last[..., d * d :], m[-1, ..., -1])


def _chunk_stabilisers(decay: Tensor, local_max: Tensor, carried: Tensor, m0: Tensor) -> Tensor:
    """The stabiliser ``m`` entering every chunk, ``[NC, B, heads]``, from ``m0 [B, heads]``.

    Across chunk ``k``, ``m_{k+1} = max(A_k + m_k, M_k)`` (``A_k`` the chunk's log forget
    product, ``M_k`` its largest input term), or ``max(A_k, M_k)`` when an episode starts in
    it (the state restarts from ``m = 0``): an affine map in the (max, +) algebra. Composing
    ``(A1, M1)`` then ``(A2, M2)`` gives ``(A1 + A2, max(A2 + M1, M2))``, associative, so a
    Hillis-Steele scan finds every prefix in ``log2 NC`` vectorised rounds.

    :param decay, local_max: ``[NC, B, heads]`` at each chunk's last step;
        ``carried``: ``[NC, B, 1]`` bool, false where an episode starts in the chunk.
    """
    alpha = torch.where(carried, decay, torch.full_like(decay, float("-inf")))
    beta = torch.where(carried, local_max, torch.maximum(decay, local_max))
    shift = 1
    while shift < alpha.shape[0]:
        alpha, beta = (
            torch.cat([alpha[:shift], alpha[:-shift] + alpha[shift:]]),
            torch.cat([beta[:shift], torch.maximum(alpha[shift:] + beta[:-shift], beta[shift:])]),
        )
        shift *= 2
    m_exit = torch.maximum(alpha + m0, beta)
    return torch.cat([m0.unsqueeze(0), m_exit[:-1]], 0)
