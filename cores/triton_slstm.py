"""xLSTM's sLSTM (:class:`cores.xlstm.SLSTM`) as two Triton kernels, one launch each way.

The design of :mod:`cores.triton_lstm`: the input projection of every step is one matmul
outside the kernel, one forward launch runs the whole time loop (a tile of ``BLOCK_B`` batch
rows per program; ``h, c, n, m`` in registers) and one reverse-time launch recomputes the
gates from the stored pre-activations and states. The head-wise (block-diagonal) recurrent
matrices enter as one dense ``[4H, H]`` matrix built outside the kernel with autograd, so the
gradient of the dense matrix flows back into the diagonal blocks alone.

Per step (gate blocks ``z, i, f, o``)::

    log f = logsigmoid(f~);  m = max(log f + m_{t-1}, i~)
    i' = exp(i~ - m);  f' = exp(log f + m_{t-1} - m)
    c = f' c_{t-1} + i' tanh(z~);  n = f' n_{t-1} + i';  h = sigma(o~) c / max(n, eps)

The backward differentiates every path the reference's autograd does, the stabiliser ``m``
included (``torch.maximum`` splits a tie's gradient in halves; so does the kernel).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cores import triton_gates as tg
from cores.base import reset_where
from cores.triton_gates import back, rec, sigmoid, tanh


@triton.jit
def _log_sigmoid(z):
    """log sigma(z) = min(z, 0) - log(1 + exp(-|z|)), finite for every finite z."""
    return tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def forward_kernel(
    a_ptr,  # [T, B, 4H] in: x W^T + b; out: the pre-activations z~, i~, f~, o~
    w_ptr,  # [4H, H] the dense recurrent matrix (gate block g maps h to its pre-activation)
    s0_ptr,  # [4, B, H] the initial h, c, n, m
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T, B, H] out: h_t
    c_ptr,  # [T, B, H] out: c_t
    n_ptr,  # [T, B, H] out: n_t
    m_ptr,  # [T, B, H] out: m_t
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < B
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    mask_w = col_ok[:, None] & col_ok[None, :]
    state_off = rows[:, None] * H + cols[None, :]
    gate_off = rows[:, None] * (4 * H) + cols[None, :]
    h = tl.load(s0_ptr + state_off, mask=mask, other=0.0)
    c = tl.load(s0_ptr + B * H + state_off, mask=mask, other=0.0)
    n = tl.load(s0_ptr + 2 * B * H + state_off, mask=mask, other=0.0)
    m = tl.load(s0_ptr + 3 * B * H + state_off, mask=mask, other=0.0)
    for t in range(T):
        if HAS_STARTS:  # reset_where: restarting rows take the zero initial state
            start = (tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0)[:, None]
            h = tl.where(start, 0.0, h)
            c = tl.where(start, 0.0, c)
            n = tl.where(start, 0.0, n)
            m = tl.where(start, 0.0, m)
        base = a_ptr + t * B * 4 * H + gate_off
        a_z = tl.load(base, mask=mask, other=0.0) + rec(h, w_ptr, 0, cols, cols, H, mask_w, PREC)
        a_i = tl.load(base + H, mask=mask, other=0.0)
        a_i += rec(h, w_ptr, 1, cols, cols, H, mask_w, PREC)
        a_f = tl.load(base + 2 * H, mask=mask, other=0.0)
        a_f += rec(h, w_ptr, 2, cols, cols, H, mask_w, PREC)
        a_o = tl.load(base + 3 * H, mask=mask, other=0.0)
        a_o += rec(h, w_ptr, 3, cols, cols, H, mask_w, PREC)
        tl.store(base, a_z, mask=mask)
        tl.store(base + H, a_i, mask=mask)
        tl.store(base + 2 * H, a_f, mask=mask)
        tl.store(base + 3 * H, a_o, mask=mask)
        log_f = _log_sigmoid(a_f)
        m_new = tl.maximum(log_f + m, a_i)
        i_gate = tl.exp(a_i - m_new)
        f_gate = tl.exp(log_f + m - m_new)
        c = f_gate * c + i_gate * tanh(a_z)
        n = f_gate * n + i_gate
        m = m_new
        h = sigmoid(a_o) * c / tl.maximum(n, EPS)
        out = t * B * H + state_off
        tl.store(y_ptr + out, h, mask=mask)
        tl.store(c_ptr + out, c, mask=mask)
        tl.store(n_ptr + out, n, mask=mask)
        tl.store(m_ptr + out, m, mask=mask)


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, 4H] the forward's pre-activations
    w_ptr,  # [4H, H]
    s0_ptr,  # [4, B, H] the initial h, c, n, m
    c_ptr,  # [T, B, H]
    n_ptr,  # [T, B, H]
    m_ptr,  # [T, B, H]
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    ds_ptr,  # [4, B, H] gradient of the final h, c, n, m
    da_ptr,  # [T, B, 4H] out: pre-activation gradients
    ds0_ptr,  # [4, B, H] out: gradient of the initial h, c, n, m
    T,
    B,
    H,
    EPS: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < B
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    mask_w = col_ok[:, None] & col_ok[None, :]
    state_off = rows[:, None] * H + cols[None, :]
    gate_off = rows[:, None] * (4 * H) + cols[None, :]
    dh = tl.load(ds_ptr + state_off, mask=mask, other=0.0)
    dc = tl.load(ds_ptr + B * H + state_off, mask=mask, other=0.0)
    dn = tl.load(ds_ptr + 2 * B * H + state_off, mask=mask, other=0.0)
    dm = tl.load(ds_ptr + 3 * B * H + state_off, mask=mask, other=0.0)
    for k in range(T):
        t = T - 1 - k
        dh += tl.load(dy_ptr + t * B * H + state_off, mask=mask, other=0.0)
        if t > 0:
            prev = (t - 1) * B * H + state_off
            c_prev = tl.load(c_ptr + prev, mask=mask, other=0.0)
            n_prev = tl.load(n_ptr + prev, mask=mask, other=0.0)
            m_prev = tl.load(m_ptr + prev, mask=mask, other=0.0)
        else:
            c_prev = tl.load(s0_ptr + B * H + state_off, mask=mask, other=0.0)
            n_prev = tl.load(s0_ptr + 2 * B * H + state_off, mask=mask, other=0.0)
            m_prev = tl.load(s0_ptr + 3 * B * H + state_off, mask=mask, other=0.0)
        start = tl.zeros([BLOCK_B, 1], dtype=tl.int1)
        if HAS_STARTS:
            start = (tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0)[:, None]
            c_prev = tl.where(start, 0.0, c_prev)
            n_prev = tl.where(start, 0.0, n_prev)
            m_prev = tl.where(start, 0.0, m_prev)
        base = a_ptr + t * B * 4 * H + gate_off
        a_z = tl.load(base, mask=mask, other=0.0)
        a_i = tl.load(base + H, mask=mask, other=0.0)
        a_f = tl.load(base + 2 * H, mask=mask, other=0.0)
        a_o = tl.load(base + 3 * H, mask=mask, other=0.0)
        c = tl.load(c_ptr + t * B * H + state_off, mask=mask, other=0.0)
        n = tl.load(n_ptr + t * B * H + state_off, mask=mask, other=0.0)
        # recompute the step's gates
        log_f = _log_sigmoid(a_f)
        a_keep = log_f + m_prev  # the first argument of the stabiliser's max
        m = tl.maximum(a_keep, a_i)
        i_gate = tl.exp(a_i - m)
        f_gate = tl.exp(a_keep - m)
        zt = tanh(a_z)
        so = sigmoid(a_o)
        nn = tl.maximum(n, EPS)
        # h = so c / nn (clamp_min passes the gradient where n >= eps)
        da_o = dh * c / nn * so * (1.0 - so)
        dcs = dc + dh * so / nn
        dns = dn + tl.where(n >= EPS, -dh * so * c / (nn * nn), 0.0)
        # c = f' c_prev + i' tanh(z~), n = f' n_prev + i'
        df_gate = dcs * c_prev + dns * n_prev
        di_gate = dcs * zt + dns
        da_z = dcs * i_gate * (1.0 - zt * zt)
        # i' = exp(i~ - m), f' = exp(a_keep - m), m = max(a_keep, i~): a tie splits in halves
        dms = dm - di_gate * i_gate - df_gate * f_gate
        w_keep = tl.where(a_keep > a_i, 1.0, tl.where(a_keep == a_i, 0.5, 0.0))
        da_i = di_gate * i_gate + dms * (1.0 - w_keep)
        d_keep = df_gate * f_gate + dms * w_keep  # gradient of log f + m_prev
        da_f = d_keep * sigmoid(-a_f)
        dbase = da_ptr + t * B * 4 * H + gate_off
        tl.store(dbase, da_z, mask=mask)
        tl.store(dbase + H, da_i, mask=mask)
        tl.store(dbase + 2 * H, da_f, mask=mask)
        tl.store(dbase + 3 * H, da_o, mask=mask)
        dc = tl.where(start, 0.0, dcs * f_gate)
        dn = tl.where(start, 0.0, dns * f_gate)
        dm = tl.where(start, 0.0, d_keep)
        dh = back(da_z, w_ptr, 0, cols, cols, H, mask_w, PREC)
        dh += back(da_i, w_ptr, 1, cols, cols, H, mask_w, PREC)
        dh += back(da_f, w_ptr, 2, cols, cols, H, mask_w, PREC)
        dh += back(da_o, w_ptr, 3, cols, cols, H, mask_w, PREC)
        dh = tl.where(start, 0.0, dh)
    tl.store(ds0_ptr + state_off, dh, mask=mask)
    tl.store(ds0_ptr + B * H + state_off, dc, mask=mask)
    tl.store(ds0_ptr + 2 * B * H + state_off, dn, mask=mask)
    tl.store(ds0_ptr + 3 * B * H + state_off, dm, mask=mask)


class _TritonSLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        s0: Tensor,
        starts: Tensor | None,
        meta: dict[str, Any],
    ) -> tuple[Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel completes it in place
        A = torch.addmm(bias, x.reshape(T * B, -1), weight_ih.t()).view(T, B, -1)
        Y, C, N, M = (x.new_empty(T, B, H) for _ in range(4))
        w, s0 = weight_hh.contiguous(), s0.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else s0
        tg.launch(
            forward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
            A, w, s0, starts8, Y, C, N, M, T, B, H,
            HAS_STARTS=starts is not None,
            **meta,
        )  # fmt: skip
        ctx.meta, ctx.has_starts = meta, starts is not None
        ctx.save_for_backward(x, weight_ih, w, s0, starts8, A, Y, C, N, M)
        return Y, torch.stack([Y[-1], C[-1], N[-1], M[-1]])

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dS: Tensor | None):
        x, weight_ih, w, s0, starts8, A, Y, C, N, M = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = torch.zeros_like(Y) if dY is None else dY.contiguous()
        dS = torch.zeros_like(s0) if dS is None else dS.contiguous()
        dA = torch.empty_like(A)  # the kernel writes every gate block
        dS0 = torch.empty_like(s0)
        tg.launch(
            backward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
            A, w, s0, C, N, M, starts8, dY, dS, dA, dS0, T, B, H,
            HAS_STARTS=ctx.has_starts,
            **ctx.meta,
        )  # fmt: skip
        h_prev = torch.cat([s0[:1], Y[:-1]], 0)  # [T, B, H], as step t read it
        if ctx.has_starts:
            (h_prev,) = reset_where((h_prev,), starts8.bool())
        dA_flat = dA.view(T * B, -1)
        d_weight_hh = dA_flat.t().mm(h_prev.reshape(T * B, H))
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dA_flat.mm(weight_ih).view_as(x) if need_x else None
        d_weight_ih = dA_flat.t().mm(x.reshape(T * B, -1)) if need_w else None
        d_bias = dA_flat.sum(0) if need_b else None
        return dx, d_weight_ih, d_bias, d_weight_hh, dS0, None, None


def dense_recurrent(recurrent: Tensor) -> Tensor:
    """The block-diagonal recurrence ``[4, heads, d, d]`` as one ``[4H, H]`` matrix whose gate
    block ``g`` maps ``h`` to that gate's pre-activation (``a_g = W_g h``), built with autograd
    so its gradient reaches only the diagonal blocks."""
    return torch.cat([torch.block_diag(*r).t() for r in recurrent.unbind(0)], 0)


def triton_slstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, eps: float
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run :class:`~cores.xlstm.SLSTM` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :param eps: the normaliser's floor.
    :return: ``y [T, B, H]`` and the final ``(h, c, n, m)``.
    """
    tg.check_device(x)
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    meta = dict(
        EPS=eps,
        BLOCK_B=tg.BLOCK_B,
        BLOCK_H=max(16, triton.next_power_of_2(core.hidden_size)),
        PREC="ieee",  # full float32 products (no TF32): the kernel matches the reference loop
    )
    y, final = _TritonSLSTM.apply(
        x.contiguous(),
        core.input.weight,
        core.input.bias,
        dense_recurrent(core.recurrent),
        torch.stack(state),
        starts,
        meta,
    )
    return y, tuple(final.unbind(0))
