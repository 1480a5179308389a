"""The linear recurrence ``h_t = a_t h_{t-1} + b_t`` as one Triton kernel per direction.

The GPU tier of :func:`cores.scan.linear_scan` (method ``triton``). One program owns a block
of channels of ``[T, C]`` time-major buffers and walks the sequence in tiles of ``BLOCK_T``
steps: inside a tile ``tl.associative_scan`` applies ``(a1, b1) . (a2, b2) = (a1 a2, a2 b1 +
b2)`` in ``log2 BLOCK_T`` parallel rounds, then adds the carried state as ``A_t h_carry``. So
each direction is ONE launch whatever ``T`` is. Complex coefficients (the LRU) are
real/imaginary pairs; the backward is the same kernel over reversed time, reading ``a`` one
step ahead; episode resets are zero coefficients (:mod:`cores.scan`'s convention).
Arithmetic runs in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
BLOCK_T = 64  # steps per tile: log2 BLOCK_T parallel rounds, T / BLOCK_T tiles in turn


@triton.jit
def _combine_real(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _combine_complex(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    # (a1, b1) then (a2, b2): a = a2 a1, b = a2 b1 + b2, with complex products
    return (
        ar2 * ar1 - ai2 * ai1,
        ar2 * ai1 + ai2 * ar1,
        ar2 * br1 - ai2 * bi1 + br2,
        ar2 * bi1 + ai2 * br1 + bi2,
    )


@triton.jit
def _last_row(x, rows, last: tl.constexpr):
    """Row ``last`` of a ``[BLOCK_T, BLOCK_C]`` tile as ``[BLOCK_C]``."""
    return tl.sum(tl.where(rows[:, None] == last, x, 0.0), axis=0)


@triton.jit
def _scan_kernel(
    a_ptr, b_ptr, h0_ptr, out_ptr, steps, channels, REVERSE: tl.constexpr,
    COMPLEX: tl.constexpr, WIDTH: tl.constexpr, HAS_H0: tl.constexpr, ACC: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """Forward (``REVERSE=False``): ``out_t = a_t out_{t-1} + b_t`` from ``h0``.
    Reverse: ``out_t = conj(a_{t+1}) out_{t+1} + b_t`` from zero after the last step.

    ``a, b, out`` are ``[T, C]`` (``[T, C, 2]`` when ``COMPLEX``, ``WIDTH = 2``), ``h0`` is
    ``[C]`` (``[C, 2]``).
    """
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < channels
    rows = tl.arange(0, BLOCK_T)
    carry_re = tl.zeros([BLOCK_C], dtype=ACC)
    carry_im = tl.zeros([BLOCK_C], dtype=ACC)
    if HAS_H0:
        carry_re = tl.load(h0_ptr + cols * WIDTH, mask=col_ok, other=0.0).to(ACC)
        if COMPLEX:
            carry_im = tl.load(h0_ptr + cols * WIDTH + 1, mask=col_ok, other=0.0).to(ACC)
    for tile in range(0, tl.cdiv(steps, BLOCK_T)):
        pos = tile * BLOCK_T + rows  # position in scan order
        if REVERSE:
            t = steps - 1 - pos
            t_a = t + 1  # g_t reads a_{t+1}
        else:
            t = pos
            t_a = t
        ok = (pos < steps)[:, None] & col_ok[None, :]
        ok_a = ((pos < steps) & (t_a < steps))[:, None] & col_ok[None, :]
        # 64-bit offsets: T * C * WIDTH passes 2^31 at long sequences of wide states
        at = (t_a[:, None].to(tl.int64) * channels + cols[None, :]) * WIDTH
        bt = (t[:, None].to(tl.int64) * channels + cols[None, :]) * WIDTH
        # past the end in reverse: a_T = 0 (nothing follows the last step); outside the
        # sequence: a = 1, b = 0, so padding rows carry the state through unchanged
        a_re = tl.load(a_ptr + at, mask=ok_a, other=0.0).to(ACC)
        a_re = tl.where(pos[:, None] < steps, a_re, 1.0)
        b_re = tl.load(b_ptr + bt, mask=ok, other=0.0).to(ACC)
        if COMPLEX:
            a_im = tl.load(a_ptr + at + 1, mask=ok_a, other=0.0).to(ACC)
            if REVERSE:
                a_im = -a_im  # the adjoint multiplies by conj(a)
            b_im = tl.load(b_ptr + bt + 1, mask=ok, other=0.0).to(ACC)
            a_re, a_im, b_re, b_im = tl.associative_scan(
                (a_re, a_im, b_re, b_im), axis=0, combine_fn=_combine_complex
            )
            # h = A h_carry + B (complex product)
            h_re = b_re + a_re * carry_re[None, :] - a_im * carry_im[None, :]
            h_im = b_im + a_re * carry_im[None, :] + a_im * carry_re[None, :]
            tl.store(out_ptr + bt, h_re.to(out_ptr.dtype.element_ty), mask=ok)
            tl.store(out_ptr + bt + 1, h_im.to(out_ptr.dtype.element_ty), mask=ok)
            carry_re = _last_row(h_re, rows, BLOCK_T - 1)
            carry_im = _last_row(h_im, rows, BLOCK_T - 1)
        else:
            a_re, b_re = tl.associative_scan((a_re, b_re), axis=0, combine_fn=_combine_real)
            h_re = b_re + a_re * carry_re[None, :]
            tl.store(out_ptr + bt, h_re.to(out_ptr.dtype.element_ty), mask=ok)
            carry_re = _last_row(h_re, rows, BLOCK_T - 1)


def _real(x: Tensor) -> Tensor:
    """A contiguous real view: ``[T, C]`` for real ``x``, ``[T, C, 2]`` for complex."""
    x = x.contiguous()
    return torch.view_as_real(x) if x.is_complex() else x


def _launch(a: Tensor, b: Tensor, h0: Tensor | None, reverse: bool) -> Tensor:
    """One kernel launch over ``a, b [T, ...]`` (same shape and dtype); returns ``[T, ...]``."""
    if b.device.type != "cuda" and not _INTERPRETED:
        raise ValueError(
            f"the triton scan runs on CUDA tensors (got {b.device.type}), or on CPU tensors "
            "with TRITON_INTERPRET=1 set before triton is imported; valid scans here: "
            "auto, parallel, sequential"
        )
    steps = b.shape[0]
    channels = b[0].numel()
    out = torch.empty(b.shape, dtype=b.dtype, device=b.device)  # contiguous, whatever b is
    if steps == 0 or channels == 0:
        return out
    real_dtype = b.real.dtype if b.is_complex() else b.dtype
    acc = tl.float64 if real_dtype == torch.float64 else tl.float32
    # 16 channels per program already fill a 64-byte row; wider blocks once there are
    # enough programs to occupy every multiprocessor; short sequences and narrow states get
    # smaller tiles (acting steps one step at a time; the interpreter's cost is per element)
    block_c = 16 if channels < 8192 else 32
    block_c = min(block_c, max(4, triton.next_power_of_2(channels)))
    block_t = min(BLOCK_T, max(16, triton.next_power_of_2(steps)))
    grid = (triton.cdiv(channels, block_c),)
    out_real = _real(out)
    h0_real = _real(h0) if h0 is not None else out_real  # unread without HAS_H0
    _scan_kernel[grid](
        _real(a), _real(b), h0_real, out_real, steps, channels, REVERSE=reverse,
        COMPLEX=b.is_complex(), WIDTH=2 if b.is_complex() else 1, HAS_H0=h0 is not None,
        ACC=acc, BLOCK_T=block_t, BLOCK_C=block_c,
    )  # fmt: skip
    return out


@torch.no_grad()
def scan_values(a: Tensor, b: Tensor, h0: Tensor) -> Tensor:
    """``h [T, ...]`` with ``h_t = a_t h_{t-1} + b_t`` from ``h0 [...]`` (one launch).

    :param a: ``[T, ...]`` coefficients, broadcastable to ``b``; complex if ``b`` is.
    :param b: ``[T, ...]`` inputs (float32/float64, or complex64/complex128).
    :param h0: ``[...]``, broadcastable to ``b[0]``.
    """
    a = a.to(b.dtype).expand_as(b)
    h0 = h0.to(b.dtype).expand_as(b[0]).contiguous()
    return _launch(a, b, h0, reverse=False)


@torch.no_grad()
def scan_adjoint(a: Tensor, grad_h: Tensor) -> Tensor:
    """``g_t = grad_t + conj(a_{t+1}) g_{t+1}`` (``g_{T-1} = grad_{T-1}``), one launch.

    :param a: ``[T, ...]`` the forward coefficients, broadcastable to ``grad_h``.
    :param grad_h: ``[T, ...]`` ``dL/dh``.
    :return: ``g = dL/db`` ``[T, ...]``.
    """
    return _launch(a.to(grad_h.dtype).expand_as(grad_h), grad_h, None, reverse=True)
