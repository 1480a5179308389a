"""RelLSTM's whole sequence as one autograd function with a hand-written backward.

Why: a RelLSTM step is about ninety small operations (the LSTM on the macro-state, the key of
the new state, relevancy screening, attention over ``nu + rho`` slots). At the RL track's
shapes (a few sequences of 128 steps per minibatch) each costs more in dispatch and autograd
bookkeeping than in arithmetic, and the backward replays every recorded node.

Here every state the attention can see is a row of one *bank*, ``[B, N, 2H]`` payloads
``[m ; U_a m + b_a]``: row 0 is a zero payload, then the call's initial relevant set and
buffer, then ``h_0 .. h_{T-1}`` with their keys. The buffer is a sliding range of rows (which
of its slots hold a state depends only on the episode starts, so it is computed for the whole
call up front) and the relevant set a tensor of row indices, so screening moves integers, by
the rule of :func:`~cores.rel_lstm.screening_update` in fewer operations, and the forward runs
without autograd. The backward walks the sequence once: at step ``t`` the attention's gradient
is added into the bank rows it read, and since a step only reads states made at or before
it, the bank row of ``h_t`` is complete when step ``t`` is reached. The weight gradients are a
few large matmuls at the end.

The maths is exactly :meth:`cores.rel_lstm.RelLSTM._step` (tests compare values and gradients
with the reference loop in float64). Double backward is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from memcores.cores.base import reset_where


def buffer_mask(buffer_count: Tensor, nu: int) -> Tensor:
    """``[B, nu]`` bool: which of the last ``nu`` buffer slots hold a state (the last
    ``buffer_count`` ones)."""
    slots = torch.arange(nu, device=buffer_count.device)
    return slots >= (nu - buffer_count).unsqueeze(1)


def relevant_mask(relevant_count: Tensor, rho: int) -> Tensor:
    """``[B, rho]`` bool: which relevant-set slots hold a state (the first ``relevant_count``)."""
    return torch.arange(rho, device=relevant_count.device) < relevant_count.unsqueeze(1)


@dataclass(frozen=True)
class _Spec:
    hidden: int
    nu: int
    rho: int
    lag: int
    length: int  # L: buffer slots held in the state
    average: bool

    @property
    def first_step_row(self) -> int:  # bank row of h_0: after the zero row and the initial slots
        return 1 + self.length + self.rho


def _rows(bank: Tensor, idx: Tensor) -> Tensor:
    """Rows ``idx [B, K]`` (indices into ``bank`` flattened to ``[B N, n]``) -> ``[B, K, n]``.

    Whole-row copies (``index_select``) rather than ``gather``, which indexes every element and
    costs several times more at ``B = 64``.
    """
    n = bank.shape[2]
    return bank.view(-1, n).index_select(0, idx.reshape(-1)).view(*idx.shape, n)


class _FusedRelLSTM(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        xp: Tensor,
        w_rec: Tensor,
        w_query: Tensor,
        w_key: Tensor,
        b_key: Tensor,
        w_score: Tensor,
        c0: Tensor,
        s0: Tensor,
        buf0: Tensor,
        rel0: Tensor,
        buf_sc0: Tensor,
        buf_n0: Tensor,
        rel_sc0: Tensor,
        rel_n0: Tensor,
        starts: Tensor | None,
        resets: frozenset[int],
        spec: _Spec,
    ) -> tuple[Tensor, ...]:
        T, B, _ = xp.shape
        H, nu, rho, L, lag = spec.hidden, spec.nu, spec.rho, spec.length, spec.lag
        row0 = spec.first_step_row
        dev = xp.device
        bank = xp.new_zeros(B, row0 + T, 2 * H)
        bank[:, 1 : 1 + rho] = rel0
        bank[:, 1 + rho : row0] = buf0
        # attention received by every bank row; only rows still in the buffer are ever read
        received = xp.new_zeros(B, row0 + T)
        received[:, 1 + rho : row0] = buf_sc0
        counts, full, buf_bias = _buffer_schedule(buf_n0, starts, T, spec)
        # row indices into the bank flattened to [B (row0 + T), 2H]: row r of batch row b is
        # b (row0 + T) + r
        offsets = torch.arange(B, device=dev).unsqueeze(1) * (row0 + T)  # [B, 1]
        leave_rows = offsets + (row0 - lag)  # + t: the row of h_{t-lag}
        # relevant set: bank rows and final scores, -inf marking an empty slot, so that the
        # first minimum is the first free slot if any, else the lowest score (the rule of
        # screening_update, which the tests compare against through the reference loop)
        r_idx = torch.arange(1, 1 + rho, device=dev) + offsets
        r_sc = rel_sc0.masked_fill(~relevant_mask(rel_n0, rho), float("-inf"))
        # bank rows of the attended buffer at each step: [T, nu]
        windows = torch.arange(T, device=dev).unsqueeze(1) + torch.arange(nu, device=dev)
        windows += row0 - nu + 1
        windows = windows.unsqueeze(1) + offsets  # [T, B, nu]
        c, s = c0, s0
        gates = xp.new_empty(T, B, 4 * H)  # i, f, u, o after their activations
        tanh_c = xp.new_empty(T, B, H)
        c_prev = xp.new_empty(T, B, H)
        s_prev = xp.new_empty(T, B, H)
        queries = xp.new_empty(T, B, H)
        slots = torch.empty(T, B, nu + rho, dtype=torch.long, device=dev)
        alphas = xp.new_empty(T, B, nu + rho)
        y = xp.new_empty(T, B, H)
        w_rec_t, w_query_t, w_key_t = w_rec.t(), w_query.t(), w_key.t()
        v = w_score.reshape(H, 1)
        steps = zip(
            xp.unbind(0), gates.unbind(0), tanh_c.unbind(0), c_prev.unbind(0),
            s_prev.unbind(0), queries.unbind(0), slots.unbind(0), alphas.unbind(0),
            y.unbind(0), bank[:, row0:].unbind(1), full.unbind(0), buf_bias.unbind(0),
            windows.unbind(0), strict=True,
        )  # fmt: skip
        for t, (x_t, g, tc, c_p, s_p, q, idx, alpha_t, y_t, row, full_t, bias_t, win) in enumerate(
            steps
        ):
            if t in resets:
                m = starts[t].to(dev)
                c, s = reset_where((c, s), m)
                (r_sc,) = reset_where((r_sc,), m, (r_sc.new_full((), float("-inf")),))
            c_p.copy_(c)
            s_p.copy_(s)
            torch.addmm(x_t, s, w_rec_t, out=g)
            u = torch.tanh(g[:, 2 * H : 3 * H])
            g.sigmoid_()[:, 2 * H : 3 * H] = u
            i, f, u, o = g.split(H, dim=1)
            c = torch.addcmul(f * c, i, u)
            torch.mul(o, torch.tanh(c, out=tc), out=row[:, :H])
            torch.addmm(b_key, row[:, :H], w_key_t, out=row[:, H:])
            if rho > 0:  # screen h_{t-lag}: bank row row0 + t - lag
                leave = row0 + t - lag
                leave_sc = received[:, leave : leave + 1]  # [B, 1]
                target = r_sc.argmin(1, keepdim=True)
                target_sc = r_sc.gather(1, target)
                insert = (leave_sc > target_sc) & full_t
                r_sc.scatter_(1, target, torch.where(insert, leave_sc, target_sc))
                leave_row = leave_rows + t
                r_idx.scatter_(1, target, torch.where(insert, leave_row, r_idx.gather(1, target)))
            torch.cat([win, r_idx], 1, out=idx)
            payload = _rows(bank, idx)
            torch.mm(s, w_query_t, out=q)
            logits = torch.tanh(payload[..., H:] + q.unsqueeze(1)).matmul(v).squeeze(2)
            # 0 on filled slots, -inf on empty ones (relevant scores are >= 0 when filled)
            logits.add_(torch.cat([bias_t, r_sc.clamp(max=0.0)], 1))
            alpha = torch.softmax(logits, 1)
            alpha_t.copy_(alpha)
            context = torch.bmm(alpha.unsqueeze(1), payload[..., :H]).squeeze(1)
            received[:, row0 + t - nu + 1 : row0 + t + 1] += alpha[:, :nu]
            s = torch.add(row[:, :H], context, out=y_t)
            if spec.average:
                s.mul_(0.5)
        # the state's buffer: the last L rows, zero where empty (as the reference keeps it)
        filled = buffer_mask(counts[-1], L)  # [B, L]
        last = slice(row0 + T - L, row0 + T)
        buf = bank[:, last, :H] * filled.unsqueeze(2)
        b_sc = received[:, last] * filled
        r_filled = torch.isfinite(r_sc)
        rel = _rows(bank, r_idx)[..., :H] * r_filled.unsqueeze(2)
        r_sc = r_sc.masked_fill(~r_filled, 0.0)
        r_n = r_filled.sum(1).to(rel_n0.dtype)
        ctx.spec, ctx.resets = spec, resets
        ctx.save_for_backward(
            w_rec, w_query, w_key, w_score, b_key, bank, gates, tanh_c, c_prev, s_prev,
            queries, slots, alphas, filled, r_idx, r_filled, starts,
        )  # fmt: skip
        b_n = counts[-1].clone()
        ctx.mark_non_differentiable(b_sc, b_n, r_sc, r_n)
        h_last = bank[:, -1, :H].clone()
        return y, h_last, c, s.clone(), buf, b_sc, b_n, rel, r_sc, r_n

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh_last, dc_last, ds_last, dbuf, _b_sc, _b_n, drel, _r_sc, _r_n):
        (
            w_rec, w_query, w_key, w_score, b_key, bank, gates, tanh_c, c_prev, s_prev,
            queries, slots, alphas, filled, r_idx, r_filled, starts,
        ) = ctx.saved_tensors  # fmt: skip
        spec, resets = ctx.spec, ctx.resets
        H, L, rho, row0 = spec.hidden, spec.length, spec.rho, spec.first_step_row
        T, B, _ = gates.shape
        d_bank = torch.zeros_like(bank)
        if dbuf is not None:
            d_bank[:, row0 + T - L :, :H] += dbuf * filled.unsqueeze(2)
        if drel is not None:
            d_rel = torch.cat([drel * r_filled.unsqueeze(2), torch.zeros_like(drel)], 2)
            d_bank.view(-1, 2 * H).index_add_(0, r_idx.reshape(-1), d_rel.view(-1, 2 * H))
        zeros = bank.new_zeros(B, H)
        ds = zeros if ds_last is None else ds_last
        dc = zeros if dc_last is None else dc_last
        dy = torch.zeros_like(s_prev) if dy is None else dy
        K = slots.shape[2]
        # d(gates) and d(query) side by side, so one matmul per step gives the gradient into
        # s_{t-1} through both: [T, B, 4H + H] against [V; W_a] [5H, H]
        d_gq = gates.new_empty(T, B, 5 * H)
        w_s = torch.cat([w_rec, w_query])
        dc_factors, dh_factor, dc_through_h, forget = _lstm_factors(gates, tanh_c, c_prev)
        d_score = bank.new_zeros(B, 1, H)
        d_payload = bank.new_empty(B, K, 2 * H)
        scale = 0.5 if spec.average else 1.0
        steps = zip(
            dy.unbind(0), alphas.unbind(0), d_bank[:, row0:].unbind(1), d_gq.unbind(0),
            dc_factors.unbind(0), dh_factor.unbind(0), dc_through_h.unbind(0), forget.unbind(0),
            strict=True,
        )  # fmt: skip
        attention = _attention_factors(bank, slots, queries, w_score)
        for t, (dy_t, alpha, d_row, d_gq_t, dc_fac, dh_fac, dch_fac, f) in reversed(
            list(enumerate(steps))
        ):
            idx, values, a, slope = next(attention)
            d_context = dy_t + ds
            if spec.average:
                d_context.mul_(scale)
            d_alpha = torch.bmm(values, d_context.unsqueeze(2)).squeeze(2)  # [B, K]
            d_logits = alpha * (d_alpha - (alpha * d_alpha).sum(1, keepdim=True))
            d_score.baddbmm_(d_logits.unsqueeze(1), a)
            torch.mul(alpha.unsqueeze(2), d_context.unsqueeze(1), out=d_payload[..., :H])
            torch.mul(d_logits.unsqueeze(2), slope, out=d_payload[..., H:])  # into the keys
            d_bank.view(-1, 2 * H).index_add_(0, idx, d_payload.view(-1, 2 * H))
            torch.sum(d_payload[..., H:], 1, out=d_gq_t[:, 4 * H :])  # into the query
            # every read of h_t (and of its key) happens at step t or later: its row is final
            dh = torch.addmm(d_row[:, :H], d_row[:, H:], w_key).add_(d_context)
            if t == T - 1 and dh_last is not None:
                dh += dh_last
            dc = torch.addcmul(dc, dh, dch_fac)
            torch.mul(dc.unsqueeze(1), dc_fac, out=d_gq_t[:, : 3 * H].view(B, 3, H))
            torch.mul(dh, dh_fac, out=d_gq_t[:, 3 * H : 4 * H])
            dc = dc * f
            ds = d_gq_t.mm(w_s)
            if t in resets:  # the state before step t was zeroed for these rows
                ds, dc = reset_where((ds, dc), starts[t].to(ds.device))
        d_gates = d_gq[..., : 4 * H]
        d_rec, d_query = d_gq.flatten(0, 1).t().mm(s_prev.flatten(0, 1)).split([4 * H, H])
        d_score = d_score.sum(0)
        d_keys = d_bank[:, row0:, H:].reshape(-1, H)
        d_key = d_keys.t().mm(bank[:, row0:, :H].reshape(-1, H))
        d_key_bias = d_keys.sum(0) if ctx.needs_input_grad[4] else None
        return (
            d_gates, d_rec, d_query, d_key, d_key_bias, d_score.view_as(w_score), dc, ds,
            d_bank[:, 1 + rho : row0], d_bank[:, 1 : 1 + rho], None, None, None, None, None,
            None, None,
        )  # fmt: skip


def _lstm_factors(
    gates: Tensor, tanh_c: Tensor, c_prev: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What the backward multiplies the per-step gradients by, for the whole sequence at once.

    :param gates: ``[T, B, 4H]`` ``i, f, u, o`` after their activations.
    :return: ``[T, B, 3, H]`` d(pre-activation of i, f, u) / dc; ``[T, B, H]`` d(pre-activation
        of o) / dh; ``[T, B, H]`` dc / dh; ``[T, B, H]`` the forget gate (dc_{t-1} / dc_t).
    """
    i, f, u, o = gates.chunk(4, dim=2)
    slope = torch.addcmul(gates, gates, gates, value=-1.0)  # sigmoid's slope g (1 - g)
    s_i, s_f, _, s_o = slope.chunk(4, dim=2)
    dc_factors = torch.stack(
        [u * s_i, c_prev * s_f, torch.addcmul(i, i * u, u, value=-1.0)], dim=2
    )  # i (1 - u^2) for u = tanh
    return dc_factors, tanh_c * s_o, torch.addcmul(o, o * tanh_c, tanh_c, value=-1.0), f


_CHUNK = 16  # steps whose attention factors the backward computes at once


def _attention_factors(bank: Tensor, slots: Tensor, queries: Tensor, w_score: Tensor):
    """Yield, from the last step to the first, what step ``t``'s attention backward reads.

    Per step: the attended rows ``[B K]`` (flat bank indices), the attended values
    ``[B, K, H]``, the tanh activations ``a = tanh(W_a s_{t-1} + keys)`` ``[B, K, H]`` and
    ``v (1 - a^2)`` ``[B, K, H]`` (d logit / d key). Computed for ``_CHUNK`` steps at a time:
    a few large operations instead of many small ones, without holding ``[T, B, K, H]``.
    """
    T, B, K = slots.shape
    H = queries.shape[2]
    v = w_score.reshape(H)
    for t1 in range(T, 0, -_CHUNK):
        t0 = max(0, t1 - _CHUNK)
        n = t1 - t0
        payload = _rows(bank, slots[t0:t1].transpose(0, 1)).view(B, n, K, 2 * H)
        q = queries[t0:t1].transpose(0, 1).unsqueeze(2)  # [B, n, 1, H]
        a = torch.tanh(payload[..., H:] + q)
        slope = torch.addcmul(v, a * a, v, value=-1.0)
        idx = slots[t0:t1].view(n, B * K)
        views = zip(
            idx.unbind(0), payload[..., :H].unbind(1), a.unbind(1), slope.unbind(1), strict=True
        )
        yield from reversed(list(views))


def _buffer_schedule(
    buf_n0: Tensor, starts: Tensor | None, T: int, spec: _Spec
) -> tuple[Tensor, Tensor, Tensor]:
    """The buffer's fill over the call, which depends only on the episode starts.

    :return: ``counts [T, B]`` filled slots after step ``t``'s push (``buf_n0``'s dtype),
        ``full [T, B, 1]`` whether ``h_{t-lag}`` is buffered when step ``t`` screens, and
        ``bias [T, B, nu]`` 0 on the attended slots that hold a state, ``-inf`` on empty ones.
    """
    dev, L, nu = buf_n0.device, spec.length, spec.nu
    steps = torch.arange(T, device=dev).unsqueeze(1)  # [T, 1]
    if starts is None:
        restarted = torch.zeros(T, len(buf_n0), dtype=torch.bool, device=dev)
    else:
        restarted = starts.to(dev).bool()
    last = torch.where(restarted, steps, -1).cummax(0).values  # latest start at or before t
    since = torch.where(last >= 0, steps - last + 1, buf_n0 + steps + 1)
    counts = since.clamp(max=L).to(buf_n0.dtype)
    before = torch.cat([buf_n0.unsqueeze(0), counts[:-1]]).masked_fill(restarted, 0.0)
    full = (before >= spec.lag).unsqueeze(2)
    filled = torch.arange(nu, device=dev) >= (nu - counts).unsqueeze(2)
    bias = torch.zeros(filled.shape, dtype=buf_n0.dtype, device=dev)
    return counts, full, bias.masked_fill_(~filled, float("-inf"))


def fused_rel_lstm(
    core, xp: Tensor, carry: tuple[Tensor, ...], starts: Tensor | None, resets: frozenset[int]
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run :class:`~cores.rel_lstm.RelLSTM` over projected inputs ``xp [T, B, 4H]``.

    :param carry: the state with payloads: ``h, c, s [B, H]``, buffer ``[B, L, 2H]``, its scores
        ``[B, L]`` and count ``[B]``, relevant set ``[B, rho, 2H]``, its scores and count.
    :return: ``y [T, B, H]`` and the state (values only, as :meth:`RelLSTM.forward`).
    """
    spec = _Spec(core.hidden_size, core.nu, core.rho, core.lag, core.length, core.average)
    _h, c, s, buf, buf_sc, buf_n, rel, rel_sc, rel_n = carry
    b_key = core.key.bias
    if b_key is None:
        b_key = core.key.weight.new_zeros(core.hidden_size)
    y, *state = _FusedRelLSTM.apply(
        xp.contiguous(),
        core.recurrent.weight,
        core.query.weight,
        core.key.weight,
        b_key,
        core.score.weight,
        c,
        s,
        buf,
        rel,
        buf_sc,
        buf_n,
        rel_sc,
        rel_n,
        starts,
        resets,
        spec,
    )
    return y, tuple(state)
