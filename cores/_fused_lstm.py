"""The whole-sequence gated LSTM as one autograd function with a hand-written backward.

Why: a per-step autograd loop records ~20 nodes per step, runs two small matmuls per step in
backward (``dh_{t-1}`` and ``dU``) and pays autograd bookkeeping for every gate operation. Here
the forward writes every gate into preallocated ``[T, B, nH]`` buffers, the backward walks the
sequence once with only the work the recurrence needs (one ``[B, nH] x [nH, H]`` matmul per
step) and computes ``dU`` for all steps with one large matmul at the end.

The math is exactly :meth:`cores.gated.GatedLSTM.cell` (tests compare values and gradients
with the reference loop in float64). The gate layout is that of :class:`GatedLSTM`:
``o, f, [i], [r], u`` blocks of ``H`` columns. Double backward is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


@dataclass(frozen=True)
class _Spec:
    hidden: int
    n_gates: int
    activation: str
    tied: bool
    refine: bool

    def block(self, k: int) -> slice:
        return slice(k * self.hidden, (k + 1) * self.hidden)

    @property
    def o(self) -> slice:
        return self.block(0)

    @property
    def f(self) -> slice:
        return self.block(1)

    @property
    def i(self) -> slice:
        return self.block(2)

    @property
    def r(self) -> slice:
        return self.block(2 if self.tied else 3)

    @property
    def u(self) -> slice:
        return self.block(self.n_gates - 1)

    @property
    def sig(self) -> slice:  # o, f, [i], [r]: every gate before u
        return slice(0, (self.n_gates - 1) * self.hidden)


class _FusedLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        xproj: Tensor,
        weight_hh: Tensor,
        h0: Tensor,
        c0: Tensor,
        keep: Tensor | None,
        spec: _Spec,
        resets: frozenset[int],
        detached: frozenset[int],
    ) -> tuple[Tensor, Tensor, Tensor]:
        T, B, _ = xproj.shape
        H = spec.hidden
        A = torch.empty_like(xproj)  # pre-activations (f block: sinh'ed for the fast gates)
        G = torch.empty_like(xproj)  # gate values
        Y = xproj.new_empty(T, B, H)
        C = xproj.new_empty(T, B, H)
        TC = xproj.new_empty(T, B, H)
        D = xproj.new_empty(T, B, H) if spec.tied else None  # c_{t-1} - u_t
        Geff = xproj.new_empty(T, B, H) if spec.refine else None  # refined forget gate
        w_t = weight_hh.t()
        h, c = h0, c0
        for t, (x_t, a, g_t, y_t, c_t, tc_t) in enumerate(
            zip(
                xproj.unbind(0),
                A.unbind(0),
                G.unbind(0),
                Y.unbind(0),
                C.unbind(0),
                TC.unbind(0),
                strict=True,
            )
        ):
            if t in resets:  # rows starting an episode restart from the zero initial state
                h, c = h * keep[t], c * keep[t]
            torch.addmm(x_t, h, w_t, out=a)
            if spec.activation == "fast":
                a[:, spec.f].sinh_()
            elif spec.activation == "fast2":
                a[:, spec.f].sinh_().sinh_()
            torch.sigmoid(a[:, spec.sig], out=g_t[:, spec.sig])
            torch.tanh(a[:, spec.u], out=g_t[:, spec.u])
            if spec.activation == "softsign":
                a_f = a[:, spec.f]
                torch.div(a_f, a_f.abs().add_(2.0), out=g_t[:, spec.f]).mul_(0.5).add_(0.5)
            f, u = g_t[:, spec.f], g_t[:, spec.u]
            if spec.refine:  # g = f (f + 2 r (1 - f))
                r = g_t[:, spec.r]
                g = torch.mul(f, torch.addcmul(f, r, 1.0 - f, value=2.0), out=Geff[t])
            else:
                g = f
            if spec.tied:  # c = g c + (1 - g) u = u + g (c - u)
                torch.addcmul(u, g, torch.sub(c, u, out=D[t]), out=c_t)
            else:
                torch.mul(g, c, out=c_t).addcmul_(g_t[:, spec.i], u)
            torch.mul(g_t[:, spec.o], torch.tanh(c_t, out=tc_t), out=y_t)
            h, c = y_t, c_t
        ctx.spec, ctx.resets, ctx.detached = spec, resets, detached
        ctx.save_for_backward(weight_hh, h0, c0, keep, A, G, Y, C, TC, D, Geff)
        return Y, Y[-1].clone(), C[-1].clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor | None, dhT: Tensor | None, dcT: Tensor | None):
        weight_hh, h0, c0, keep, A, G, Y, C, TC, D, Geff = ctx.saved_tensors
        spec: _Spec = ctx.spec
        resets, detached = ctx.resets, ctx.detached
        T, B, _ = G.shape
        dA = torch.empty_like(G)
        ones = G.new_ones(B, spec.hidden)
        dh_rec = torch.zeros_like(h0) if dhT is None else dhT.clone()
        dc = torch.zeros_like(c0) if dcT is None else dcT.clone()
        for t in range(T - 1, -1, -1):
            g_t, tc, da = G[t], TC[t], dA[t]
            o, f, u = g_t[:, spec.o], g_t[:, spec.f], g_t[:, spec.u]
            dh = dh_rec if dY is None else dY[t] + dh_rec
            # h = o tanh(c): output gate and the cell gradient through tanh
            torch.mul(torch.addcmul(o, o, o, value=-1.0).mul_(tc), dh, out=da[:, spec.o])
            dcs = torch.addcmul(dc, dh, torch.addcmul(ones, tc, tc, value=-1.0).mul_(o))
            g = Geff[t] if spec.refine else f
            dc_prev = dcs * g
            if spec.tied:  # c = u + g (c_prev - u): du = dcs (1 - g), dg = dcs (c_prev - u)
                du = dcs - dc_prev
                dg = dcs * D[t]
            else:
                c_prev = C[t - 1] if t > 0 else c0
                if t in resets:
                    c_prev = c_prev * keep[t]
                i = g_t[:, spec.i]
                du = dcs * i
                torch.mul(torch.addcmul(i, i, i, value=-1.0).mul_(u), dcs, out=da[:, spec.i])
                dg = dcs * c_prev
            torch.mul(du, torch.addcmul(ones, u, u, value=-1.0), out=da[:, spec.u])
            f_slope = torch.addcmul(f, f, f, value=-1.0)  # f (1 - f)
            if spec.refine:  # g = 2 r f + (1 - 2r) f^2
                r = g_t[:, spec.r]
                r_slope = torch.addcmul(r, r, r, value=-1.0)
                torch.mul(r_slope.mul_(f_slope).mul_(2.0), dg, out=da[:, spec.r])
                # dg/df = 2 (f + r (1 - 2f))
                dg = dg * torch.addcmul(f, r, torch.add(ones, f, alpha=-2.0)).mul_(2.0)
            torch.mul(
                dg,
                _forget_slope(spec.activation, A[t][:, spec.f], f_slope, ones),
                out=da[:, spec.f],
            )
            dc = dc_prev
            if t in detached:  # h-detach: no gradient into the h_{t-1} that fed the gates
                dh_rec = torch.zeros_like(dh_rec)
            else:
                dh_rec = torch.mm(da, weight_hh)
            if t in resets:
                dh_rec, dc = dh_rec * keep[t], dc * keep[t]
        # dU = sum_t dA_t^T h_{t-1}: one large matmul instead of T small ones
        h_prev = torch.cat([h0.unsqueeze(0), Y[:-1]], 0)
        if keep is not None:
            h_prev = h_prev * keep
        d_weight = dA.flatten(0, 1).t().mm(h_prev.flatten(0, 1))
        return dA, d_weight, dh_rec, dc, None, None, None, None


def _forget_slope(activation: str, a_f: Tensor, f_slope: Tensor, ones: Tensor) -> Tensor:
    """``phi'(a)`` from what the forward stored for the forget block.

    ``a_f`` holds ``a`` (sigmoid, softsign), ``sinh a`` (fast) or ``sinh sinh a`` (fast2);
    ``f_slope = f (1 - f)`` is the sigmoid's slope at the last ``sinh``. The ``cosh`` factors
    are ``sqrt(1 + sinh^2)``, capped where ``f_slope`` is already exactly 0 so that the product
    stays 0 instead of ``0 * inf``.
    """
    if activation == "sigmoid":
        return f_slope
    if activation == "softsign":
        return a_f.abs().add_(2.0).pow_(-2.0)
    if activation == "fast":
        # cosh a = hypot(sinh a, 1); sinh a = inf only where f_slope == 0 exactly (0 * inf)
        return torch.hypot(a_f, ones).mul_(f_slope).nan_to_num_(nan=0.0)
    # fast2: a_f = sinh(s) with s = sinh(a); phi' = sigma' * cosh(s) * cosh(a). Beyond
    # |sinh s| = 1e4 the sigmoid slope is exactly 0, so clamping there changes nothing.
    s2 = a_f.clamp(-1e4, 1e4)
    s1 = torch.asinh(s2)
    cosh_s = torch.addcmul(ones, s2, s2).sqrt_()
    cosh_a = torch.addcmul(ones, s1, s1).sqrt_()
    return f_slope * cosh_s * cosh_a


def fused_lstm(
    core, xproj: Tensor, state: tuple[Tensor, ...], keep: Tensor | None, detach: list[bool]
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Run :class:`~cores.gated.GatedLSTM` over ``xproj [T, B, nH]`` with the fused function.

    :param keep: ``[T, B, 1]`` 0/1 multipliers (0 where a row restarts) or ``None``.
    :param detach: per step, whether h-detach blocks the gradient into ``h_{t-1}``.
    """
    spec = _Spec(
        hidden=core.hidden_size,
        n_gates=len(core.gate_names),
        activation=core.activation,
        tied=core.tied,
        refine=core.refine,
    )
    resets: frozenset[int] = frozenset()
    if keep is not None:
        resets = frozenset(torch.nonzero((keep == 0).any(dim=1).flatten()).flatten().tolist())
    detached = frozenset(t for t, d in enumerate(detach) if d)
    h0, c0 = state
    y, h, c = _FusedLSTM.apply(
        xproj.contiguous(), core.weight_hh, h0, c0, keep, spec, resets, detached
    )
    return y, (h, c)
