"""First-order linear recurrences ``h_t = a_t * h_{t-1} + b_t`` solved in parallel over time.

One module shared by every core whose state update is a diagonal linear recurrence: the LRU
(complex ``a``), minGRU and minLSTM (real ``a`` in ``(0, 1)``). An episode start inside a
sequence is a zero coefficient at that step (``a_t = 0`` drops everything before it), so
resets need no special case as long as the core's initial state is zero.

Two forward kernels compute the same values; both run as one autograd node whose backward is
the same recurrence in reverse (the adjoint of a linear recurrence is a linear recurrence):
``g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}``, then ``dL/db_t = g_t``, ``dL/da_t = g_t conj(h_{t-1})``
and, for the state ``h0`` before step 0, ``dL/dh0 = conj(a_0) g_0`` (:func:`scan_adjoint`).
Only ``a`` and ``h`` are kept, so memory is ``O(T)``.

- ``parallel``: a chunked Hillis-Steele scan. Inside chunks of ``C ~ sqrt(T)`` steps,
  ``log2 C`` vectorised rounds of the associative operator
  ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)`` run on all chunks at once; the ``T / C`` chunk
  carries are chained and broadcast back: ``O(log C + T / C)`` sequential rounds. The operator
  only multiplies coefficients (no division by cumulative products, which underflow), so it is
  stable in linear space for any ``|a_t| <= 1``, real or complex.
- ``sequential``: one fused multiply-add per step written into a preallocated output, outside
  autograd. On a CPU the recurrence is memory-bound and the parallel scan's ``log C`` extra
  passes over ``[T, B, H]`` cost more than they save: at T=1024, B=64, H=128 the sequential
  kernel is about 7x faster than the parallel one on one CPU thread (docs/cores.md).

- ``triton``: one Triton kernel launch per direction (:mod:`cores.triton_scan`): tiles of
  time scanned in parallel inside the kernel, the carry between tiles kept in registers, so
  the launches per call do not grow with ``T``. Needs a GPU, or Triton's interpreter
  (``TRITON_INTERPRET=1``) on CPU tensors.

``method="auto"`` (the default) resolves per call (:func:`resolve_method`): ``sequential`` on
CPU; on a CUDA device ``triton`` when Triton is installed, else ``parallel``.
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import Tensor


def _chunk_size(steps: int) -> int:
    """A power of two near ``sqrt(T)``: balances the ``log C`` rounds inside chunks against the
    ``T / C`` sequential chunk carries."""
    return max(1, 2 ** round(math.log2(max(1.0, math.sqrt(steps)))))


METHODS = ("auto", "parallel", "sequential", "triton")


def resolve_method(method: str, device: torch.device) -> str:
    """The concrete kernel ``method`` stands for on ``device`` (``auto`` resolved; see the
    module docstring); raises ``ValueError`` for an unknown method."""
    if method not in METHODS:
        raise ValueError(f"unknown scan method {method!r}; valid: {', '.join(METHODS)}")
    if method != "auto":
        return method
    if device.type == "cpu":
        return "sequential"
    if device.type == "cuda" and _HAS_TRITON:
        return "triton"
    return "parallel"


_HAS_TRITON = importlib.util.find_spec("triton") is not None


@torch.no_grad()
def scan_values(
    a: Tensor, b: Tensor, h0: Tensor, method: str = "auto", out: Tensor | None = None
) -> Tensor:
    """``h [T, ...]`` with ``h_t = a_t h_{t-1} + b_t`` from ``h0 [...]``, no autograd.

    :param a: ``[T, ...]`` coefficients (broadcast to ``b``'s shape).
    :param b: ``[T, ...]`` inputs.
    :param h0: ``[...]`` the state before step 0.
    :param method: one of :data:`METHODS` (see the module docstring).
    :param out: optional ``[T, ...]`` tensor to write ``h`` into (returned).
    """
    method = resolve_method(method, b.device)
    a = a.expand_as(b)
    if method == "sequential":
        return _sequential(a, b, h0, torch.empty_like(b) if out is None else out)
    if method == "triton":
        from memcores.cores import triton_scan  # imports triton: only where the kernel is asked for

        h = triton_scan.scan_values(a, b, h0)
    else:
        h = _parallel(a, b, h0)
    return h if out is None else out.copy_(h)


def _sequential(a: Tensor, b: Tensor, h0: Tensor, out: Tensor) -> Tensor:
    h = h0.to(b.dtype).expand_as(b[0])
    for a_t, b_t, out_t in zip(a.unbind(0), b.unbind(0), out.unbind(0), strict=True):
        h = torch.addcmul(b_t, a_t, h, out=out_t)
    return out


def _parallel(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    steps = b.shape[0]
    size = _chunk_size(steps)
    chunks = -(-steps // size)
    pad = chunks * size - steps
    if pad:
        a = torch.cat([a, a.new_ones((pad, *a.shape[1:]))], 0)
        b = torch.cat([b, b.new_zeros((pad, *b.shape[1:]))], 0)
    acc_a = a.reshape(chunks, size, *a.shape[1:]).clone()
    acc_b = b.reshape(chunks, size, *b.shape[1:]).clone()
    shift = 1
    while shift < size:  # inclusive scan inside every chunk at once
        acc_b[:, shift:] = acc_a[:, shift:] * acc_b[:, :-shift] + acc_b[:, shift:]
        acc_a[:, shift:] = acc_a[:, shift:] * acc_a[:, :-shift]
        shift *= 2
    carries = []  # the state entering each chunk
    h = h0.to(acc_b.dtype).expand_as(acc_b[0, 0])
    for last_a, last_b in zip(acc_a[:, -1].unbind(0), acc_b[:, -1].unbind(0), strict=True):
        carries.append(h)
        h = last_a * h + last_b
    carry = torch.stack(carries, 0).unsqueeze(1)  # [chunks, 1, ...]
    h_all = (acc_a * carry + acc_b).reshape(chunks * size, *b.shape[1:])
    return h_all[:steps]


@torch.no_grad()
def scan_adjoint(a: Tensor, grad_h: Tensor, method: str = "auto") -> Tensor:
    """The backward recurrence ``g_t = grad_t + conj(a_{t+1}) g_{t+1}`` (``g_{T-1} = grad``),
    i.e. ``dL/db`` of :func:`linear_scan`, for ``a, grad_h [T, ...]``; no autograd."""
    method = resolve_method(method, grad_h.device)
    a = a.expand_as(grad_h)
    if method == "triton":
        from memcores.cores import triton_scan

        return triton_scan.scan_adjoint(a, grad_h)
    if method == "sequential":
        out = torch.empty_like(grad_h)
        g = out[-1]
        g.copy_(grad_h[-1])
        for t in range(grad_h.shape[0] - 2, -1, -1):
            a_next = a[t + 1].conj() if a.is_complex() else a[t + 1]
            g = torch.addcmul(grad_h[t], a_next, g, out=out[t])
        return out
    a_next = torch.cat([a[1:], torch.zeros_like(a[:1])], 0).conj()
    return _parallel(a_next.flip(0), grad_h.flip(0), torch.zeros_like(grad_h[0])).flip(0)


def previous_states(h: Tensor, h0: Tensor) -> Tensor:
    """``h_{t-1}`` for every ``t``: ``[h0, h_0, ..., h_{T-2}]`` ``[T, ...]``."""
    out = torch.empty_like(h)
    out[0] = h0
    out[1:] = h[:-1]
    return out


class _LinearScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, h0: Tensor, method: str) -> Tensor:
        h = scan_values(a, b, h0, method)
        ctx.save_for_backward(a, h0, h)
        ctx.method = method
        return h

    @staticmethod
    def backward(ctx, grad_h: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        a, h0, h = ctx.saved_tensors
        g = scan_adjoint(a, grad_h, ctx.method)
        grad_a = g * previous_states(h, h0.to(h.dtype)).conj()
        grad_h0 = (a[0].conj() * g[0]).sum_to_size(h0.shape)
        return grad_a, g, grad_h0, None


def linear_scan(a: Tensor, b: Tensor, h0: Tensor, method: str = "auto") -> Tensor:
    """Solve ``h_t = a_t * h_{t-1} + b_t`` for all ``t`` in parallel, differentiably.

    :param a: ``[T, ...]`` coefficients, real or complex, same shape as ``b`` (expand a
        shared coefficient before calling; autograd sums its gradient back).
    :param b: ``[T, ...]`` inputs.
    :param h0: ``[...]`` the state before step 0 (broadcastable to ``b[0]``).
    :param method: one of :data:`METHODS`; all give the same values.
    :return: ``h [T, ...]``, ``h[t]`` being the state after step ``t``.
    """
    if method not in METHODS:
        raise ValueError(f"unknown scan method {method!r}; valid: {', '.join(METHODS)}")
    if a.shape != b.shape:
        a = a.expand_as(b)
    return _LinearScan.apply(a.contiguous(), b.contiguous(), h0, method)


def linear_scan_loop(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """The same recurrence as a plain step loop (the reference the tests compare with)."""
    h, outs = h0, []
    for a_t, b_t in zip(a.expand_as(b).unbind(0), b.unbind(0), strict=True):
        h = a_t * h + b_t
        outs.append(h)
    return torch.stack(outs, 0)
