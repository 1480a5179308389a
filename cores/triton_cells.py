"""The pointwise maths of the fused recurrent kernels, as ``@triton.jit`` functions on tiles.

The gate functions of :mod:`cores.gates` (``ACT``), one cell and its backward per family
(``FAMILY``: :data:`LSTM` :class:`cores.gated.GatedLSTM`, :data:`GRU`
:class:`cores.gru.GatedGRU`, :data:`SLSTM` :class:`cores.xlstm.SLSTM`), and
:func:`forward_cell`/:func:`backward_cell`, which the kernels call. Every tensor here is a
``[BLOCK_B, BLOCK_N]`` tile; nothing reads or writes memory.

A family's step sees its gate blocks as five slots ``p0..p4`` in the order they are stored
(``NG`` blocks of ``weight_hh``; the slots past them are stand-ins nothing reads) and its state
as four tiles ``s0..s3`` (``h`` first; ``NS`` of them are real): the LSTM's blocks are
``o, f, [i], [r], u`` and its state ``h, c``; the GRU's ``z, [q], r, n`` and ``h``, with the
recurrent side of ``n``, ``U_n h + b_hn``, kept as one more saved block after them; sLSTM's
``z, i, f, o`` and ``h, c, n, m``.
"""

from __future__ import annotations

import triton
import triton.language as tl

LSTM = tl.constexpr(0)
GRU = tl.constexpr(1)
SLSTM = tl.constexpr(2)
"""``FAMILY``'s values."""


@triton.jit
def sigmoid(z):
    """sigma(z), from exp(-|z|) so it never overflows."""
    e = tl.exp(-tl.abs(z))
    return tl.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def tanh(z):
    """tanh z, from exp(-2|z|) so it never overflows (and keeps small |z| exact)."""
    e = tl.exp(-2.0 * tl.abs(z))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(z >= 0, t, -t)


@triton.jit
def sinh(z):
    """sinh z."""
    return 0.5 * (tl.exp(z) - tl.exp(-z))


@triton.jit
def cosh(z):
    """cosh z."""
    return 0.5 * (tl.exp(z) + tl.exp(-z))


@triton.jit
def gate(a, ACT: tl.constexpr, CLAMP: tl.constexpr):
    """phi(a) of cores.gates: 0 sigmoid, 1 fast, 2 fast2, 3 softsign."""
    if ACT == 0:
        f = sigmoid(a)
    elif ACT == 1:
        f = sigmoid(sinh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP)))
    elif ACT == 2:
        s = sinh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP))
        f = sigmoid(sinh(tl.minimum(tl.maximum(s, -CLAMP), CLAMP)))
    else:
        f = 0.5 + 0.5 * a / (2.0 + tl.abs(a))
    return f


@triton.jit
def gate_slope(a, f, ACT: tl.constexpr, CLAMP: tl.constexpr):
    """phi'(a) given f = phi(a), as cores.gates.gate_derivative (zero beyond the clamp)."""
    if ACT == 0:
        d = f * (1.0 - f)
    elif ACT == 1:
        inside = tl.abs(a) <= CLAMP
        d = tl.where(inside, f * (1.0 - f) * cosh(tl.minimum(tl.maximum(a, -CLAMP), CLAMP)), 0.0)
    elif ACT == 2:
        ac = tl.minimum(tl.maximum(a, -CLAMP), CLAMP)
        s = sinh(ac)
        inside = (tl.abs(a) <= CLAMP) & (tl.abs(s) <= CLAMP)
        sc = tl.minimum(tl.maximum(s, -CLAMP), CLAMP)
        d = tl.where(inside, f * (1.0 - f) * cosh(sc) * cosh(ac), 0.0)
    else:
        q = 1.0 / (2.0 + tl.abs(a))
        d = q * q
    return d


@triton.jit
def power_decay(x, POWER: tl.constexpr):
    """Ohno & Kumagai's decay term ``|x|^r x`` (``r = POWER > 0``, as
    :func:`cores.power_rnn.power_decay`) and its slope ``(r + 1) |x|^r``."""
    if POWER == 2.0:  # the presets' r: exactly the reference's x * x * x
        x2 = x * x
        decay = x2 * x
        slope = 3.0 * x2
    else:
        ax = tl.abs(x)
        nonzero = ax > 0.0
        # |x|^r through log2 and exp2, the log kept finite at 0, where both terms are 0
        x_r = tl.where(nonzero, tl.exp2(POWER * tl.log2(tl.where(nonzero, ax, 1.0))), 0.0)
        decay = x * x_r
        slope = (POWER + 1.0) * x_r
    return decay, slope


@triton.jit
def clip_unit(x):
    """``x`` clipped to ``[-1, 1]``, the power-law cells' range."""
    return tl.minimum(tl.maximum(x, -1.0), 1.0)


@triton.jit
def inside_unit(x):
    """Where :func:`clip_unit` passes gradient (``torch.clamp``'s rule: bounds included)."""
    return (x >= -1.0) & (x <= 1.0)


@triton.jit
def _refined(f, a_r):
    """The UR-LSTM's refined gate ``f (2r + (1 - 2r) f)``, ``r = sigma(a_r)``, and ``r``."""
    r = sigmoid(a_r)
    return f * (2.0 * r + (1.0 - 2.0 * r) * f), r


@triton.jit
def lstm_cell(
    a_o, a_f, a_u, a_i, a_r, c_prev, ACT: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """One step of :meth:`cores.gated.GatedLSTM.cell` from its pre-activations: ``c_t, h_t``.
    ``POWER > 0`` is the power-law cell ``c_{t-1} - (1 - g) |c_{t-1}|^r c_{t-1} + i u``
    clipped to ``[-1, 1]``."""
    g = gate(a_f, ACT, CLAMP)  # the forget gate, refined by r where the preset has it
    if REFINE:
        g, _ = _refined(g, a_r)
    if TIED:
        i = 1.0 - g
    else:
        i = sigmoid(a_i)
    if POWER == 0.0:
        c = g * c_prev + i * tanh(a_u)
    else:
        decay, _ = power_decay(c_prev, POWER)
        c = clip_unit(c_prev - (1.0 - g) * decay + i * tanh(a_u))
    return c, sigmoid(a_o) * tanh(c)


@triton.jit
def lstm_cell_grads(
    a_o, a_f, a_u, a_i, a_r, c, c_prev, dh, dc, ACT: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """The backward of :func:`lstm_cell`, its gates recomputed from the pre-activations: given
    the gradients ``dh, dc`` into ``h_t, c_t``, returns those of ``a_o, a_f, a_u, a_i, a_r``
    and of ``c_{t-1}`` (a block the preset lacks gets a stand-in that nothing stores)."""
    o = sigmoid(a_o)
    f = gate(a_f, ACT, CLAMP)
    u = tanh(a_u)
    g = f
    r = f  # a stand-in without REFINE
    if REFINE:
        g, r = _refined(f, a_r)
    tc = tanh(c)
    da_o = dh * tc * o * (1.0 - o)
    dcs = dc + dh * o * (1.0 - tc * tc)  # gradient into c_t
    if TIED:
        i = 1.0 - g
    else:
        i = sigmoid(a_i)
    if POWER == 0.0:
        dg = dcs * c_prev
        dc_prev = dcs * g
    else:  # c_t = clip(c_{t-1} - (1 - g) decay(c_{t-1}) + i u): the unclipped value recomputed
        decay, slope = power_decay(c_prev, POWER)
        dcs = tl.where(inside_unit(c_prev - (1.0 - g) * decay + i * u), dcs, 0.0)
        dg = dcs * decay
        dc_prev = dcs * (1.0 - (1.0 - g) * slope)
    da_i = da_o
    if TIED:
        dg -= dcs * u
    else:
        da_i = dcs * u * i * (1.0 - i)
    da_r = da_o
    if REFINE:
        da_r = dg * 2.0 * f * (1.0 - f) * r * (1.0 - r)
        dg = dg * (2.0 * r + 2.0 * (1.0 - 2.0 * r) * f)
    da_f = dg * gate_slope(a_f, f, ACT, CLAMP)
    return da_o, da_f, dcs * i * (1.0 - u * u), da_i, da_r, dc_prev


@triton.jit
def gru_cell(
    a_z, a_q, a_n, h_prev, ACT: tl.constexpr, REFINE: tl.constexpr, CLAMP: tl.constexpr,
    POWER: tl.constexpr,
):  # fmt: skip
    """One step of :meth:`cores.gru.GatedGRU.cell` from its pre-activations (``a_n`` with the
    reset gate applied): ``h_t = n + z (h_{t-1} - n)``, or with ``POWER > 0`` the power-law
    rule ``h_{t-1} - (1 - z)(|h_{t-1}|^r h_{t-1} - n)`` clipped to ``[-1, 1]``; ``a_q`` is not
    read without ``REFINE``."""
    z = gate(a_z, ACT, CLAMP)
    if REFINE:
        z, _ = _refined(z, a_q)
    n = tanh(a_n)
    if POWER == 0.0:
        h = n + z * (h_prev - n)
    else:
        decay, _ = power_decay(h_prev, POWER)
        h = clip_unit(h_prev - (1.0 - z) * (decay - n))
    return h


@triton.jit
def gru_cell_grads(
    a_z, a_q, a_r, a_n, hn, h_prev, dh, ACT: tl.constexpr, REFINE: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr,
):  # fmt: skip
    """The backward of :func:`gru_cell`, its gates recomputed from the pre-activations: given
    the gradient ``dh`` into ``h_t``, returns those of ``a_z, a_q, a_r, a_n``, of
    ``U_n h + b_hn`` (``hn``) and the direct part of ``h_{t-1}``'s (``z dh`` for the GRU;
    ``a_q``'s is a stand-in that nothing stores without ``REFINE``)."""
    zf = gate(a_z, ACT, CLAMP)
    z = zf
    q = zf  # a stand-in without REFINE
    if REFINE:
        z, q = _refined(zf, a_q)
    r = sigmoid(a_r)
    n = tanh(a_n)
    if POWER == 0.0:
        dz = dh * (h_prev - n)
        direct = dh * z
    else:  # h_t = clip(h_{t-1} - (1 - z)(decay(h_{t-1}) - n)): the unclipped value recomputed
        decay, slope = power_decay(h_prev, POWER)
        dh = tl.where(inside_unit(h_prev - (1.0 - z) * (decay - n)), dh, 0.0)
        dz = dh * (decay - n)
        direct = dh * (1.0 - (1.0 - z) * slope)
    da_n = dh * (1.0 - z) * (1.0 - n * n)
    da_q = da_n
    if REFINE:
        da_q = dz * 2.0 * zf * (1.0 - zf) * q * (1.0 - q)
        dz = dz * (2.0 * q + 2.0 * (1.0 - 2.0 * q) * zf)
    da_z = dz * gate_slope(a_z, zf, ACT, CLAMP)
    return da_z, da_q, da_n * hn * r * (1.0 - r), da_n, da_n * r, direct


@triton.jit
def _log_sigmoid(z):
    """log sigma(z) = min(z, 0) - log(1 + exp(-|z|)), finite for every finite z."""
    return tl.minimum(z, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(z)))


@triton.jit
def slstm_cell(a_z, a_i, a_f, a_o, c, n, m, EPS: tl.constexpr):
    """One sLSTM step from its pre-activations and the previous ``c, n, m``: the new ``c, n,
    m`` and ``h`` (``log f = logsigmoid(f~)``, ``m = max(log f + m_{t-1}, i~)``,
    ``i' = exp(i~ - m)``, ``f' = exp(log f + m_{t-1} - m)``, ``c = f' c + i' tanh z~``,
    ``n = f' n + i'``, ``h = sigma(o~) c / max(n, eps)``)."""
    log_f = _log_sigmoid(a_f)
    m_new = tl.maximum(log_f + m, a_i)
    i_gate = tl.exp(a_i - m_new)
    f_gate = tl.exp(log_f + m - m_new)
    c = f_gate * c + i_gate * tanh(a_z)
    n = f_gate * n + i_gate
    return c, n, m_new, sigmoid(a_o) * c / tl.maximum(n, EPS)


@triton.jit
def slstm_cell_grads(
    a_z, a_i, a_f, a_o, c_prev, n_prev, m_prev, c, n, dh, dc, dn, dm, EPS: tl.constexpr
):  # fmt: skip
    """The backward of :func:`slstm_cell`, its gates recomputed: given the gradients into the
    new ``h, c, n, m``, returns those of ``a_z, a_i, a_f, a_o`` and of the previous ``c, n,
    m``. Every path the reference's autograd takes, the stabiliser ``m`` included
    (``torch.maximum`` splits a tie's gradient in halves; so does this)."""
    a_keep = _log_sigmoid(a_f) + m_prev  # the first argument of the stabiliser's max
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
    # i' = exp(i~ - m), f' = exp(a_keep - m), m = max(a_keep, i~): a tie splits in halves
    dms = dm - di_gate * i_gate - df_gate * f_gate
    w_keep = tl.where(a_keep > a_i, 1.0, tl.where(a_keep == a_i, 0.5, 0.0))
    d_keep = df_gate * f_gate + dms * w_keep  # gradient of log f + m_prev
    da_z = dcs * i_gate * (1.0 - zt * zt)
    da_i = di_gate * i_gate + dms * (1.0 - w_keep)
    da_f = d_keep * sigmoid(-a_f)
    return da_z, da_i, da_f, da_o, dcs * f_gate, dns * f_gate, d_keep


@triton.jit
def pick(p0, p1, p2, p3, p4, I: tl.constexpr):
    """Slot ``I`` of five."""
    if I == 0:
        v = p0
    elif I == 1:
        v = p1
    elif I == 2:
        v = p2
    elif I == 3:
        v = p3
    else:
        v = p4
    return v


@triton.jit
def forward_cell(
    p0, p1, p2, p3, p4, g_n, s0, s1, s2, s3, FAMILY: tl.constexpr, NG: tl.constexpr,
    ACT: tl.constexpr, TIED: tl.constexpr, REFINE: tl.constexpr, R: tl.constexpr,
    CLAMP: tl.constexpr, POWER: tl.constexpr, EPS: tl.constexpr,
):  # fmt: skip
    """One step of ``FAMILY``'s cell from its gate blocks ``p0..p4`` (input side plus
    recurrent product; the GRU's last is ``U_n h + b_hn``, its input side ``g_n`` apart) and
    its previous state ``s0..s3`` (zero where a row restarts): the slots the backward reads
    (the LSTM's and sLSTM's pre-activations; the GRU's with ``n``'s reset gate applied, then
    ``U_n h + b_hn``) and the new state ``h, s1, s2, s3``."""
    if FAMILY == LSTM:
        a_u = pick(p0, p1, p2, p3, p4, NG - 1)
        a_r = pick(p0, p1, p2, p3, p4, R)
        c, h = lstm_cell(p0, p1, a_u, p2, a_r, s1, ACT, TIED, REFINE, CLAMP, POWER)
        s1 = c
    elif FAMILY == GRU:
        a_r = pick(p0, p1, p2, p3, p4, NG - 2)
        hn = pick(p0, p1, p2, p3, p4, NG - 1)
        a_n = g_n + sigmoid(a_r) * hn
        h = gru_cell(p0, p1, a_n, s0, ACT, REFINE, CLAMP, POWER)
        if NG == 3:  # z, r, n, then U_n h + b_hn
            p2, p3 = a_n, hn
        else:  # z, q, r, n, then U_n h + b_hn
            p3, p4 = a_n, hn
    else:
        s1, s2, s3, h = slstm_cell(p0, p1, p2, p3, s1, s2, s3, EPS)
    return p0, p1, p2, p3, p4, h, s1, s2, s3


@triton.jit
def backward_cell(
    a0, a1, a2, a3, a4, s0, s1, s2, s3, c_now, n_now, dh, d1, d2, d3,
    FAMILY: tl.constexpr, NG: tl.constexpr, ACT: tl.constexpr, TIED: tl.constexpr,
    REFINE: tl.constexpr, R: tl.constexpr, CLAMP: tl.constexpr, POWER: tl.constexpr,
    EPS: tl.constexpr,
):  # fmt: skip
    """The backward of :func:`forward_cell` from its saved slots ``a0..a4``, the previous state
    ``s0..s3`` (zero where a row restarted), the new ``c`` and ``n`` and the gradients ``dh,
    d1, d2, d3`` into the new state: the gradients of the saved slots, the part of
    ``h_{t-1}``'s that skips the recurrent products (the GRU's ``z dh``; zero elsewhere) and
    those of ``s1, s2, s3``."""
    direct = tl.zeros_like(dh)
    if FAMILY == LSTM:
        a_u = pick(a0, a1, a2, a3, a4, NG - 1)
        a_r = pick(a0, a1, a2, a3, a4, R)
        da_o, da_f, da_u, da_i, da_r, d1 = lstm_cell_grads(
            a0, a1, a_u, a2, a_r, c_now, s1, dh, d1, ACT, TIED, REFINE, CLAMP, POWER
        )
        # o, f, then i (untied) and r (refine; at 2 when tied, else 3), u last
        a0, a1, a2, a3, a4 = da_o, da_f, da_u, da_u, da_u
        if NG > 3:
            if TIED:
                a2 = da_r
            else:
                a2 = da_i
        if NG == 5:
            a3 = da_r
    elif FAMILY == GRU:
        a_r = pick(a0, a1, a2, a3, a4, NG - 2)
        a_n = pick(a0, a1, a2, a3, a4, NG - 1)
        hn = pick(a0, a1, a2, a3, a4, NG)
        da_z, da_q, da_r, da_n, dhn, direct = gru_cell_grads(
            a0, a1, a_r, a_n, hn, s0, dh, ACT, REFINE, CLAMP, POWER
        )
        if NG == 3:
            a0, a1, a2, a3, a4 = da_z, da_r, da_n, dhn, dhn
        else:
            a0, a1, a2, a3, a4 = da_z, da_q, da_r, da_n, dhn
    else:
        a0, a1, a2, a3, d1, d2, d3 = slstm_cell_grads(
            a0, a1, a2, a3, s1, s2, s3, c_now, n_now, dh, d1, d2, d3, EPS
        )
    return a0, a1, a2, a3, a4, direct, d1, d2, d3
