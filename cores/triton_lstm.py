"""The gated LSTM family as two Triton kernels: the whole time loop in one launch each way.

Forward: the input projection of every step, ``G = x W^T + b`` (``[T, B, nH]``), is one matmul
outside the kernel. One kernel launch then runs all ``T`` steps: each program owns a tile of
``BLOCK_B`` batch rows and all ``H`` units, keeps ``h`` and ``c`` in registers, adds the
recurrent product ``h_{t-1} U_g^T`` per gate block with ``tl.dot``, applies the gates and
writes ``h_t``, ``c_t`` and the pre-activations ``a_t`` (what the backward needs).

Backward: one reverse-time launch recomputes every gate from ``a_t`` and ``c_{t-1}`` (the
pointwise work is recomputed, not stored), writes the pre-activation gradients ``dA_t`` and
carries ``dh``/``dc`` to the previous step (``dh_{t-1} = dA_t U`` by ``tl.dot``). The weight
and input gradients are matmuls over all steps outside the kernel: ``dU = dA^T h_prev``,
``dW = dA^T x``, ``db = sum dA``, ``dx = dA W``.

The gate functions are compile-time parameters of one kernel (``ACT``: sigmoid, fast,
fast2, softsign; ``TIED``; ``REFINE``), so every preset of :class:`cores.gated.GatedLSTM`
compiles its own specialisation of the same source. Episode starts reset ``h`` and ``c`` to
the zero initial state inside the loop, exactly as :func:`cores.base.reset_where` does in the
reference loop, and stop the gradient into the state a restarting row dropped. h-detach's
per-step draws enter the backward as a ``[T]`` mask: where set, no gradient flows from
``a_t`` into ``h_{t-1}`` (the reference's ``h_{t-1}.detach()``).

On a CPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` in the
environment before ``triton`` is imported): the tests compare them with the reference loop
there. The maths is :meth:`cores.gated.GatedLSTM.cell`.
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
    g_ptr,  # [T, B, NG*H] in: x W^T + b; out: the pre-activations a_t
    w_ptr,  # [NG*H, H] weight_hh
    h0_ptr,  # [B, H]
    c0_ptr,  # [B, H]
    starts_ptr,  # [T, B] int8 (unused without HAS_STARTS)
    y_ptr,  # [T, B, H] out: h_t
    c_ptr,  # [T, B, H] out: c_t
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,  # the refine gate's block: 2 (tied) or 3
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
    h = tl.load(h0_ptr + state_off, mask=mask, other=0.0)
    c = tl.load(c0_ptr + state_off, mask=mask, other=0.0)
    gate_off = rows[:, None] * (NG * H) + cols[None, :]
    for t in range(T):
        if HAS_STARTS:  # reset_where: restarting rows take the zero initial state
            start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
            h = tl.where(start[:, None], 0.0, h)
            c = tl.where(start[:, None], 0.0, c)
        base = g_ptr + t * B * NG * H + gate_off
        a_o = tl.load(base, mask=mask, other=0.0) + rec(h, w_ptr, 0, cols, cols, H, mask_w, PREC)
        a_f = tl.load(base + H, mask=mask, other=0.0) + rec(
            h, w_ptr, 1, cols, cols, H, mask_w, PREC
        )
        a_u = tl.load(base + (NG - 1) * H, mask=mask, other=0.0) + rec(
            h, w_ptr, NG - 1, cols, cols, H, mask_w, PREC
        )
        tl.store(base, a_o, mask=mask)
        tl.store(base + H, a_f, mask=mask)
        tl.store(base + (NG - 1) * H, a_u, mask=mask)
        f = gate(a_f, ACT, CLAMP)
        if REFINE:
            a_r = tl.load(base + R * H, mask=mask, other=0.0) + rec(
                h, w_ptr, R, cols, cols, H, mask_w, PREC
            )
            tl.store(base + R * H, a_r, mask=mask)
            r = sigmoid(a_r)
            g = f * (2.0 * r + (1.0 - 2.0 * r) * f)
        else:
            g = f
        if TIED:
            i = 1.0 - g
        else:
            a_i = tl.load(base + 2 * H, mask=mask, other=0.0) + rec(
                h, w_ptr, 2, cols, cols, H, mask_w, PREC
            )
            tl.store(base + 2 * H, a_i, mask=mask)
            i = sigmoid(a_i)
        c = g * c + i * tanh(a_u)
        h = sigmoid(a_o) * tanh(c)
        out = t * B * H + state_off
        tl.store(y_ptr + out, h, mask=mask)
        tl.store(c_ptr + out, c, mask=mask)


@triton.jit
def backward_kernel(
    a_ptr,  # [T, B, NG*H] the forward's pre-activations
    w_ptr,  # [NG*H, H] weight_hh
    c0_ptr,  # [B, H]
    c_ptr,  # [T, B, H] the forward's c_t
    starts_ptr,  # [T, B] int8
    detach_ptr,  # [T] int8: h-detach stops the gradient into h_{t-1} at step t
    dy_ptr,  # [T, B, H] gradient of the outputs
    dhT_ptr,  # [B, H] gradient of the final h
    dcT_ptr,  # [B, H] gradient of the final c
    da_ptr,  # [T, B, NG*H] out: pre-activation gradients
    dh0_ptr,  # [B, H] out
    dc0_ptr,  # [B, H] out
    T,
    B,
    H,
    NG: tl.constexpr,
    ACT: tl.constexpr,
    TIED: tl.constexpr,
    REFINE: tl.constexpr,
    R: tl.constexpr,  # the refine gate's block: 2 (tied) or 3
    HAS_STARTS: tl.constexpr,
    HAS_DETACH: tl.constexpr,
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
    dc = tl.load(dcT_ptr + state_off, mask=mask, other=0.0)
    for k in range(T):
        t = T - 1 - k
        dh += tl.load(dy_ptr + t * B * H + state_off, mask=mask, other=0.0)
        base = a_ptr + t * B * NG * H + gate_off
        o = sigmoid(tl.load(base, mask=mask, other=0.0))
        a_f = tl.load(base + H, mask=mask, other=0.0)
        f = gate(a_f, ACT, CLAMP)
        u = tanh(tl.load(base + (NG - 1) * H, mask=mask, other=0.0))
        c = tl.load(c_ptr + t * B * H + state_off, mask=mask, other=0.0)
        if t > 0:
            c_prev = tl.load(c_ptr + (t - 1) * B * H + state_off, mask=mask, other=0.0)
        else:
            c_prev = tl.load(c0_ptr + state_off, mask=mask, other=0.0)
        start = tl.zeros([BLOCK_B], dtype=tl.int1)
        if HAS_STARTS:
            start = tl.load(starts_ptr + t * B + rows, mask=row_ok, other=0) != 0
            c_prev = tl.where(start[:, None], 0.0, c_prev)
        if REFINE:
            r = sigmoid(tl.load(base + R * H, mask=mask, other=0.0))
            g = f * (2.0 * r + (1.0 - 2.0 * r) * f)
        else:
            g = f
        tc = tanh(c)
        da_o = dh * tc * o * (1.0 - o)
        dcs = dc + dh * o * (1.0 - tc * tc)  # gradient into c_t
        dg = dcs * c_prev
        if TIED:
            dg -= dcs * u
            i = 1.0 - g
        else:
            i = sigmoid(tl.load(base + 2 * H, mask=mask, other=0.0))
            da_i = dcs * u * i * (1.0 - i)
            tl.store(da_ptr + t * B * NG * H + gate_off + 2 * H, da_i, mask=mask)
        da_u = dcs * i * (1.0 - u * u)
        if REFINE:
            da_r = dg * 2.0 * f * (1.0 - f) * r * (1.0 - r)
            tl.store(da_ptr + t * B * NG * H + gate_off + R * H, da_r, mask=mask)
            df = dg * (2.0 * r + 2.0 * (1.0 - 2.0 * r) * f)
        else:
            df = dg
        da_f = df * gate_slope(a_f, f, ACT, CLAMP)
        dbase = da_ptr + t * B * NG * H + gate_off
        tl.store(dbase, da_o, mask=mask)
        tl.store(dbase + H, da_f, mask=mask)
        tl.store(dbase + (NG - 1) * H, da_u, mask=mask)
        dc = tl.where(start[:, None], 0.0, dcs * g)  # gradient into c_{t-1}
        # gradient into h_{t-1} through the gates: sum over blocks of dA_g W_g
        dh = back(da_o, w_ptr, 0, cols, cols, H, mask_w, PREC)
        dh += back(da_f, w_ptr, 1, cols, cols, H, mask_w, PREC)
        dh += back(da_u, w_ptr, NG - 1, cols, cols, H, mask_w, PREC)
        if not TIED:
            dh += back(da_i, w_ptr, 2, cols, cols, H, mask_w, PREC)
        if REFINE:
            dh += back(da_r, w_ptr, R, cols, cols, H, mask_w, PREC)
        if HAS_DETACH:  # the reference's h_{t-1}.detach() at this step
            dh = tl.where(tl.load(detach_ptr + t) != 0, 0.0, dh)
        dh = tl.where(start[:, None], 0.0, dh)
    tl.store(dh0_ptr + state_off, dh, mask=mask)
    tl.store(dc0_ptr + state_off, dc, mask=mask)


def _meta(spec: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Compile-time parameters of one preset."""
    return dict(
        NG=spec["n_gates"],
        ACT=ACTIVATIONS.index(spec["activation"]),
        TIED=spec["tied"],
        REFINE=spec["refine"],
        R=2 if spec["tied"] else 3,
        BLOCK_B=tg.BLOCK_B,
        BLOCK_H=max(16, triton.next_power_of_2(hidden)),
        # full float32 products (no TF32), so the kernel matches the reference loop
        PREC="ieee",
        CLAMP=FAST_CLAMP,
    )


class _TritonLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        weight_ih: Tensor,
        bias: Tensor,
        weight_hh: Tensor,
        h0: Tensor,
        c0: Tensor,
        starts: Tensor | None,
        detach: Tensor | None,
        spec: dict[str, Any],
    ) -> tuple[Tensor, Tensor, Tensor]:
        T, B, _ = x.shape
        H = weight_hh.shape[1]
        # every step's input projection in one matmul; the kernel adds h U^T in place
        A = torch.addmm(bias, x.reshape(T * B, -1), weight_ih.t()).view(T, B, -1).contiguous()
        Y = x.new_empty(T, B, H)
        C = x.new_empty(T, B, H)
        w = weight_hh.contiguous()
        h0c, c0c = h0.contiguous(), c0.contiguous()
        starts8 = starts.to(torch.int8).contiguous() if starts is not None else h0c
        meta = _meta(spec, H)
        grid = (tg.cdiv(B, tg.BLOCK_B),)
        tg.launch(
            forward_kernel, grid, A, w, h0c, c0c, starts8, Y, C, T, B, H,
            HAS_STARTS=starts is not None,
            **meta,
        )  # fmt: skip
        ctx.spec = spec
        ctx.has_starts = starts is not None
        ctx.has_detach = detach is not None
        ctx.save_for_backward(x, weight_ih, w, h0c, c0c, starts8, detach, A, Y, C)
        return Y, Y[-1].clone(), C[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dhT: Tensor | None, dcT: Tensor | None):
        x, weight_ih, w, h0, c0, starts8, detach, A, Y, C = ctx.saved_tensors
        T, B, _ = x.shape
        H = w.shape[1]
        dY = torch.zeros_like(Y) if dY is None else dY.contiguous()
        dhT = torch.zeros_like(h0) if dhT is None else dhT.contiguous()
        dcT = torch.zeros_like(c0) if dcT is None else dcT.contiguous()
        dA = torch.empty_like(A)  # the kernel writes every gate block
        dh0, dc0 = torch.empty_like(h0), torch.empty_like(c0)
        detach8 = detach if detach is not None else starts8
        meta = _meta(ctx.spec, H)
        tg.launch(
            backward_kernel,
            (tg.cdiv(B, tg.BLOCK_B),),
            A, w, c0, C, starts8, detach8, dY, dhT, dcT, dA, dh0, dc0, T, B, H,
            HAS_STARTS=ctx.has_starts,
            HAS_DETACH=ctx.has_detach,
            **meta,
        )  # fmt: skip
        # weight and input gradients: one matmul each over all steps
        h_prev = torch.cat([h0.unsqueeze(0), Y[:-1]], 0)  # [T, B, H], as step t read it
        if ctx.has_starts:
            (h_prev,) = reset_where((h_prev,), starts8.bool())
        dA_flat = dA.view(T * B, -1)
        d_weight_hh = dA_flat.t().mm(h_prev.reshape(T * B, H))
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dA_flat.mm(weight_ih).view_as(x) if need_x else None
        d_weight_ih = dA_flat.t().mm(x.reshape(T * B, -1)) if need_w else None
        d_bias = dA_flat.sum(0) if need_b else None
        return dx, d_weight_ih, d_bias, d_weight_hh, dh0, dc0, None, None, None


def triton_lstm(
    core: Any, x: Tensor, state: tuple[Tensor, ...], starts: Tensor | None, detach: list[bool]
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Run :class:`~cores.gated.GatedLSTM` over ``x [T, B, D]`` with the Triton kernels.

    :param starts: ``[T, B]`` bool episode starts or ``None``.
    :param detach: per step, whether h-detach blocks the gradient into ``h_{t-1}``.
    :return: ``y [T, B, H]`` and the final ``(h, c)``.
    """
    tg.check_device(x)
    spec = dict(
        n_gates=len(core.gate_names),
        activation=core.activation,
        tied=core.tied,
        refine=core.refine,
    )
    if starts is not None:
        starts = starts.to(device=x.device, dtype=torch.bool)
    mask = None
    if any(detach):
        mask = torch.tensor(detach, dtype=torch.int8, device=x.device)
    h0, c0 = state
    y, h, c = _TritonLSTM.apply(
        x.contiguous(), core.weight_ih, core.bias, core.weight_hh, h0, c0, starts, mask, spec
    )
    return y, (h, c)
