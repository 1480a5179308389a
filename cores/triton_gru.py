"""The gated GRU family (:class:`cores.gru.GatedGRU`) as two Triton kernels, one launch each way.

The same design as :mod:`cores.triton_lstm`: the input projection ``x W^T + b`` of every step
is one matmul outside the kernel; one forward launch runs the whole time loop (a tile of
``BLOCK_B`` batch rows per program, ``h`` in registers, ``h U_g^T`` per gate block by
``tl.dot``) and stores the gate pre-activations; one reverse-time launch recomputes the gates
from them and writes the pre-activation gradients, the weight and input gradients being
matmuls over all steps outside it. The update gate's activation (``ACT``) and its refine gate
(``REFINE``) are compile-time parameters. Gate blocks: ``z, [q], r, n``; the candidate reads
``n = tanh(a_n + r (U_n h + b_hn))``, so the forward also keeps ``U_n h + b_hn``.
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
from cores.gates import ACTIVATIONS, FAST_CLAMP
from cores.triton_gates import back, gate, gate_slope, rec, sigmoid, tanh


@triton.jit
def forward_kernel(
    a_ptr,  # [T, B, NG*H] in: x W^T + b; out: pre-activations of z, [q], r and n (pre-tanh)
    hn_ptr,  # [T, B, H] out: U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    bhn_ptr,  # [H] bias_hn
    h0_ptr,  # [B, H]
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T, B, H] out: h_t
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < B
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    mask_w = col_ok[:, None] & col_ok[None, :]
    state_off = rows[:, None] * H + cols[None, :]
    gate_off = rows[:, None] * (NG * H) + cols[None, :]
    h = tl.load(h0_ptr + state_off, mask=mask, other=0.0)
    b_hn = tl.load(bhn_ptr + cols, mask=col_ok, other=0.0)[None, :]
    for t in range(T):
        if HAS_STARTS:  # reset_where: restarting rows take the zero initial state
            start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
            h = tl.where(start[:, None], 0.0, h)
        base = a_ptr + t * B * NG * H + gate_off
        a_z = tl.load(base, mask=mask, other=0.0) + rec(h, w_ptr, 0, cols, cols, H, mask_w, PREC)
        tl.store(base, a_z, mask=mask)
        z = gate(a_z, ACT, CLAMP)
        if REFINE:
            a_q = tl.load(base + H, mask=mask, other=0.0)
            a_q += rec(h, w_ptr, 1, cols, cols, H, mask_w, PREC)
            tl.store(base + H, a_q, mask=mask)
            q = sigmoid(a_q)
            z = z * (2.0 * q + (1.0 - 2.0 * q) * z)
        a_r = tl.load(base + (NG - 2) * H, mask=mask, other=0.0)
        a_r += rec(h, w_ptr, NG - 2, cols, cols, H, mask_w, PREC)
        tl.store(base + (NG - 2) * H, a_r, mask=mask)
        hn = rec(h, w_ptr, NG - 1, cols, cols, H, mask_w, PREC) + b_hn
        a_n = tl.load(base + (NG - 1) * H, mask=mask, other=0.0) + sigmoid(a_r) * hn
        tl.store(base + (NG - 1) * H, a_n, mask=mask)
        tl.store(hn_ptr + t * B * H + state_off, hn, mask=mask)
        n = tanh(a_n)
        h = n + z * (h - n)
        tl.store(y_ptr + t * B * H + state_off, h, mask=mask)


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    hn_ptr,  # [T, B, H] the forward's U_n h_{t-1} + b_hn
    w_ptr,  # [NG*H, H] weight_hh
    h0_ptr,  # [B, H]
    y_ptr,  # [T, B, H] the forward's h_t
    starts_ptr,  # [T, B] int8
    dy_ptr,  # [T, B, H] gradient of the outputs
    dhT_ptr,  # [B, H] gradient of the final h
    da_ptr,  # [T, B, NG*H] out: gradients of the input-side pre-activations
    dhn_ptr,  # [T, B, H] out: gradient of U_n h_{t-1} + b_hn
    dh0_ptr,  # [B, H] out
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    REFINE: tl.constexpr,
    HAS_STARTS: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PREC: tl.constexpr,
    CLAMP: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_H)
    row_ok = rows < B
    col_ok = cols < H
    mask = row_ok[:, None] & col_ok[None, :]
    mask_w = col_ok[:, None] & col_ok[None, :]
    state_off = rows[:, None] * H + cols[None, :]
    gate_off = rows[:, None] * (NG * H) + cols[None, :]
    dh = tl.load(dhT_ptr + state_off, mask=mask, other=0.0)
    for k in range(T):
        t = T - 1 - k
        dh += tl.load(dy_ptr + t * B * H + state_off, mask=mask, other=0.0)
        if t > 0:
            h_prev = tl.load(y_ptr + (t - 1) * B * H + state_off, mask=mask, other=0.0)
        else:
            h_prev = tl.load(h0_ptr + state_off, mask=mask, other=0.0)
        start = tl.zeros([BLOCK_B], dtype=tl.int1)
        if HAS_STARTS:
            start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
            h_prev = tl.where(start[:, None], 0.0, h_prev)
        base = a_ptr + t * B * NG * H + gate_off
        dbase = da_ptr + t * B * NG * H + gate_off
        a_z = tl.load(base, mask=mask, other=0.0)
        zf = gate(a_z, ACT, CLAMP)
        z = zf
        if REFINE:
            q = sigmoid(tl.load(base + H, mask=mask, other=0.0))
            z = zf * (2.0 * q + (1.0 - 2.0 * q) * zf)
        r = sigmoid(tl.load(base + (NG - 2) * H, mask=mask, other=0.0))
        n = tanh(tl.load(base + (NG - 1) * H, mask=mask, other=0.0))
        hn = tl.load(hn_ptr + t * B * H + state_off, mask=mask, other=0.0)
        # h_t = n + z (h_{t-1} - n)
        da_n = dh * (1.0 - z) * (1.0 - n * n)
        dz = dh * (h_prev - n)
        da_r = da_n * hn * r * (1.0 - r)
        dhn = da_n * r
        if REFINE:
            da_q = dz * 2.0 * zf * (1.0 - zf) * q * (1.0 - q)
            tl.store(dbase + H, da_q, mask=mask)
            dz = dz * (2.0 * q + 2.0 * (1.0 - 2.0 * q) * zf)
        da_z = dz * gate_slope(a_z, zf, ACT, CLAMP)
        tl.store(dbase, da_z, mask=mask)
        tl.store(dbase + (NG - 2) * H, da_r, mask=mask)
        tl.store(dbase + (NG - 1) * H, da_n, mask=mask)
        tl.store(dhn_ptr + t * B * H + state_off, dhn, mask=mask)
        # gradient into h_{t-1}: the direct path z and every gate block's dA_g W_g
        dh = dh * z + back(da_z, w_ptr, 0, cols, cols, H, mask_w, PREC)
        if REFINE:
            dh += back(da_q, w_ptr, 1, cols, cols, H, mask_w, PREC)
        dh += back(da_r, w_ptr, NG - 2, cols, cols, H, mask_w, PREC)
        dh += back(dhn, w_ptr, NG - 1, cols, cols, H, mask_w, PREC)
        dh = tl.where(start[:, None], 0.0, dh)
    tl.store(dh0_ptr + state_off, dh, mask=mask)


def _meta(core: Any) -> dict[str, Any]:
    """Compile-time parameters of one preset."""
    return dict(
        NG=len(core.gate_names),
        ACT=ACTIVATIONS.index(core.activation),
        REFINE=core.refine,
        BLOCK_B=tg.BLOCK_B,
        BLOCK_H=max(16, triton.next_power_of_2(core.hidden_size)),
        PREC="ieee",  # full float32 products (no TF32): the kernel matches the reference loop
        CLAMP=FAST_CLAMP,
    )


class _TritonGRU(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        bias_hn: Tensor,
        h0: Tensor,
        starts: Tensor | None,
        meta: dict[str, Any],
    ) -> tuple[Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel completes it in place
        A = torch.addmm(bias, x.reshape(T * B, -1), weight_ih.t()).view(T, B, -1)
        HN = x.new_empty(T, B, H)
        Y = x.new_empty(T, B, H)
        w, h0c = weight_hh.contiguous(), h0.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else h0c
        tg.launch(
            forward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
            A, HN, w, bias_hn.contiguous(), h0c, starts8, Y, T, B, H,
            HAS_STARTS=starts is not None,
            **meta,
        )  # fmt: skip
        ctx.meta, ctx.has_starts = meta, starts is not None
        ctx.save_for_backward(x, weight_ih, w, h0c, starts8, A, HN, Y)
        return Y, Y[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dhT: Tensor | None):
        x, weight_ih, w, h0, starts8, A, HN, Y = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = torch.zeros_like(Y) if dY is None else dY.contiguous()
        dhT = torch.zeros_like(h0) if dhT is None else dhT.contiguous()
        dA = torch.empty_like(A)  # the kernel writes every gate block
        dHN = torch.empty_like(HN)
        dh0 = torch.empty_like(h0)
        tg.launch(
            backward_kernel, (tg.cdiv(B, tg.BLOCK_B),),
            A, HN, w, h0, Y, starts8, dY, dhT, dA, dHN, dh0, T, B, H,
            HAS_STARTS=ctx.has_starts,
            **ctx.meta,
        )  # fmt: skip
        # the recurrent side's gradient is dA with its n block replaced by dHN
        h_prev = torch.cat([h0.unsqueeze(0), Y[:-1]], 0)  # [T, B, H], as step t read it
        if ctx.has_starts:
            (h_prev,) = reset_where((h_prev,), starts8.bool())
        dA_flat, h_flat = dA.view(T * B, -1), h_prev.reshape(T * B, H)
        dA_rec = torch.cat([dA_flat[:, : w.shape[0] - H], dHN.view(T * B, H)], 1)
        d_weight_hh = dA_rec.t().mm(h_flat)
        d_bias_hn = dHN.sum((0, 1))
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dA_flat.mm(weight_ih).view_as(x) if need_x else None
        d_weight_ih = dA_flat.t().mm(x.reshape(T * B, -1)) if need_w else None
        d_bias = dA_flat.sum(0) if need_b else None
        return dx, d_weight_ih, d_bias, d_weight_hh, d_bias_hn, dh0, None, None


def triton_gru(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None
) -> tuple[Tensor, tuple[Tensor]]:
    """Run :class:`~cores.gru.GatedGRU` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :return: ``y [T, B, H]`` and the final ``(h,)``.
    """
    tg.check_device(x)
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    (h0,) = state
    y, h = _TritonGRU.apply(
        x.contiguous(),
        core.weight_ih,
        core.bias,
        core.weight_hh,
        core.bias_hn,
        h0,
        starts,
        _meta(core),
    )
    return y, (h,)
