"""JANET, NRU and the ordered/master-gate LSTMs checked against their papers' equations.

Each ``_reference_*`` function is a direct, step-by-step transcription of the paper's
equations in float64 (explicit loops over units, chunks and heads), sharing nothing with the
cores but their parameters. Proposition 4 of Gu et al. (tied, rescaled master gates equal a
refine gate) is checked on the gate formula and on whole sequences against ``r_lstm``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from rl_helpers import sb3_recurrent_ppo

import envs  # noqa: F401  (registers MiniGrid ids)
from cores import gates, make_core
from cores.on_lstm import OrderedLSTM

T, B, D = 9, 3, 4
NEW_CORES = ["janet", "nru", "o_lstm", "om_lstm", "um_lstm", "or_lstm"]


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _inputs(seed: int = 0, steps: int = T) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(steps, B, D, generator=gen, dtype=torch.float64)


def _build(name: str, hidden: int, seed: int = 0, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    core = make_core(name, D, hidden, **options).double()
    with torch.no_grad():  # random biases too, so no term of the equations hides at zero
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return core


def _affine(core, rows: slice, x_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``W x + U h + b`` restricted to the rows of one gate block: ``[B, len(rows)]``."""
    return x_t @ core.weight_ih[rows].T + h @ core.weight_hh[rows].T + core.bias[rows]


def _cumax_rows(z: torch.Tensor) -> list[list[float]]:
    """``cumsum(softmax(z))`` per row, written out with Python floats."""
    out = []
    for row in z.tolist():
        top = max(row)
        e = [math.exp(v - top) for v in row]
        total, acc, cum = sum(e), 0.0, []
        for v in e:
            acc += v / total
            cum.append(acc)
        out.append(cum)
    return out


# ---------------------------------------------------------------------------- JANET
def _reference_janet(core, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """van der Westhuizen & Lasenby: s = W_f x + U_f h + b_f; c = sigma(s) c + (1 - sigma(s -
    beta)) tanh(W_c x + U_c h + b_c); h = c."""
    H = core.hidden_size
    h = torch.zeros(B, H, dtype=torch.float64)
    ys = []
    for x_t in x:
        s = _affine(core, slice(0, H), x_t, h)
        c_tilde = _affine(core, slice(H, 2 * H), x_t, h)
        new = torch.empty_like(h)
        for b in range(B):
            for j in range(H):
                sv = s[b, j].item()
                keep, write = _sigmoid(sv), 1.0 - _sigmoid(sv - core.beta)
                new[b, j] = keep * h[b, j].item() + write * math.tanh(c_tilde[b, j].item())
        h = new
        ys.append(h)
    return torch.stack(ys), h


@pytest.mark.parametrize("beta", [1.0, 0.0])
def test_janet_matches_its_equations(beta: float) -> None:
    core = _build("janet", 5, t_max=50, beta=beta)
    x = _inputs()
    y, (h,) = core(x, core.initial_state(B))
    y_ref, h_ref = _reference_janet(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)


def test_janet_has_two_affine_maps_and_chrono_forget_bias() -> None:
    H, t_max = 64, 100.0
    torch.manual_seed(0)
    core = make_core("janet", D, H, t_max=t_max)
    n = H * (D + H + 1)  # one affine map
    assert sum(p.numel() for p in core.parameters()) == 2 * n
    assert sum(p.numel() for p in make_core("tied_lstm", D, H).parameters()) == 3 * n
    b_f, b_c = core.bias[:H].detach(), core.bias[H:].detach()
    assert b_c.abs().max() == 0
    assert b_f.min() >= 0 and b_f.max() <= math.log(t_max - 1) + 1e-6
    # log U[1, t_max - 1]: the decay periods 1 + e^b spread over [2, t_max]
    assert b_f.max() > math.log(0.5 * t_max) and b_f.min() < math.log(0.5 * t_max)
    torch.testing.assert_close(
        core.forget_gate_timescales(), -1.0 / torch.log(torch.sigmoid(b_f.double()))
    )
    with pytest.raises(ValueError, match="t_max"):
        make_core("janet", D, H, t_max=2)


# ---------------------------------------------------------------------------- NRU
def _pnorm_normalise(v: list[float], p: float) -> list[float]:
    norm = sum(abs(a) ** p for a in v) ** (1.0 / p)
    return [a / max(norm, 1e-12) for a in v]


def _reference_nru(core, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chandar et al. eqs. 1-2: h = relu(W_i x + W_h h + W_c m); k write and k erase heads with
    strengths alpha, beta and p-normalised outer-product vectors v, u; m += (1/k) sum_j
    (alpha_j v_j - beta_j u_j)."""
    H, M, k, s = core.hidden_size, core.memory_size, core.heads, core.side
    h = torch.zeros(B, H, dtype=torch.float64)
    m = torch.zeros(B, M, dtype=torch.float64)
    ys = []
    for x_t in x:
        h = torch.relu(
            x_t @ core.weight_ih.T + h @ core.weight_hh.T + m @ core.weight_mh.T + core.bias
        )
        z = torch.cat([h, m], dim=1) @ core.weight_head.T + core.bias_head  # [B, 2k + 4s]
        new_m = m.clone()
        for b in range(B):
            row = z[b].tolist()
            alpha, beta = row[:k], row[k : 2 * k]
            pv, qv = row[2 * k : 2 * k + s], row[2 * k + s : 2 * k + 2 * s]
            pu, qu = row[2 * k + 2 * s : 2 * k + 3 * s], row[2 * k + 3 * s :]
            flat_v = [a * c for a in pv for c in qv]  # outer product, row-major, k*M entries
            flat_u = [a * c for a in pu for c in qu]
            for j in range(k):
                v_j = _pnorm_normalise(flat_v[j * M : (j + 1) * M], core.p)
                u_j = _pnorm_normalise(flat_u[j * M : (j + 1) * M], core.p)
                for n in range(M):
                    new_m[b, n] += (alpha[j] * v_j[n] - beta[j] * u_j[n]) / k
        m = new_m
        ys.append(h)
    return torch.stack(ys), h, m


def test_nru_matches_its_equations() -> None:
    core = _build("nru", 6, memory_size=16, heads=4)  # s = sqrt(4 * 16) = 8
    x = _inputs(steps=5)
    y, (h, m) = core(x, core.initial_state(B))
    y_ref, h_ref, m_ref = _reference_nru(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h, h_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m, m_ref, rtol=1e-12, atol=1e-12)
    assert m.abs().sum() > 0 and (y >= 0).all()  # the memory moved; the state is a ReLU


def test_nru_options_are_checked() -> None:
    core = make_core("nru", D, 8)
    assert (core.memory_size, core.heads, core.side) == (64, 4, 16)  # Ohno et al.'s memory 64
    assert [s.shape for s in core.initial_state(2)] == [(2, 8), (2, 64)]
    with pytest.raises(ValueError, match="perfect square"):
        make_core("nru", D, 8, memory_size=10)
    with pytest.raises(ValueError, match="positive"):
        make_core("nru", D, 8, heads=0)


# ---------------------------------------------------------------------------- ordered gates
def _reference_ordered(core: OrderedLSTM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gu et al. App. B.4-B.5 written out unit by unit: O- (eqs. 28-29), OM- = ON-LSTM (eqs.
    19-23), UM- (eqs. 30-33 then 21-23), OR- (eqs. 34-37); LSTM eqs. 4-7 for u, c, o, h."""
    H = core.hidden_size
    h = torch.zeros(B, H, dtype=torch.float64)
    c = torch.zeros(B, H, dtype=torch.float64)
    ys = []
    for x_t in x:
        pre = {name: _affine(core, core.rows(name), x_t, h) for name in core._rows}
        if core.main == "cumax":
            main_f = _cumax_rows(pre["mf" if core.aux == "master" else "f"])
            if "mi" in pre or core.aux == "none":
                cm = _cumax_rows(pre["mi" if core.aux == "master" else "i"])
                main_i = [[1.0 - v for v in row] for row in cm]
        else:  # UGI sigmoid gates; the -b_f of eq. 33 is in the stored bias
            main_f = [[_sigmoid(v) for v in row] for row in pre["mf"].tolist()]
            main_i = [[_sigmoid(v) for v in row] for row in pre["mi"].tolist()]
        new_h, new_c = torch.empty_like(h), torch.empty_like(c)
        for b in range(B):
            for j in range(H):
                if core.aux == "none":
                    f_hat, i_hat = main_f[b][j], main_i[b][j]
                elif core.aux == "refine":
                    f_t, r = main_f[b][j], _sigmoid(pre["r"][b, j].item())
                    f_hat = r * (1 - (1 - f_t) ** 2) + (1 - r) * f_t**2
                    i_hat = 1 - f_hat
                else:
                    chunk = j // core.chunk_size
                    fm, im = main_f[b][chunk], main_i[b][chunk]
                    f, i = _sigmoid(pre["f"][b, j].item()), _sigmoid(pre["i"][b, j].item())
                    w = fm * im
                    f_hat, i_hat = f * w + (fm - w), i * w + (im - w)
                u = math.tanh(pre["u"][b, j].item())
                o = _sigmoid(pre["o"][b, j].item())
                new_c[b, j] = f_hat * c[b, j].item() + i_hat * u
                new_h[b, j] = o * math.tanh(new_c[b, j].item())
        h, c = new_h, new_c
        ys.append(h)
    return torch.stack(ys), c


@pytest.mark.parametrize(
    "name, hidden, options",
    [
        ("o_lstm", 6, {}),
        ("or_lstm", 6, {}),
        ("om_lstm", 12, {"chunk_size": 4}),  # three chunks of 4
        ("om_lstm", 10, {"chunk_size": 4}),  # chunks of 4, 4 and 2
        ("um_lstm", 10, {"chunk_size": 3}),
    ],
)
def test_ordered_cores_match_their_equations(name: str, hidden: int, options: dict) -> None:
    core = _build(name, hidden, **options)
    x = _inputs()
    y, (_, c) = core(x, core.initial_state(B))
    y_ref, c_ref = _reference_ordered(core, x)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, c_ref, rtol=1e-12, atol=1e-12)


def test_cumax_is_an_ordered_gate() -> None:
    z = torch.randn(4, 7, dtype=torch.float64)
    g = gates.cumax(z)
    assert (g.diff(dim=-1) >= 0).all() and (g > 0).all()
    torch.testing.assert_close(g[:, -1], torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(gates.cumax(torch.zeros(5)), torch.arange(1, 6) / 5)


def test_master_gates_cost_one_over_2c_more_parameters() -> None:
    H, C = 64, 16
    n = H * (D + H + 1)  # one H-row affine map
    lstm = sum(p.numel() for p in make_core("lstm", D, H).parameters())
    assert lstm == 4 * n
    for name in ("o_lstm", "or_lstm"):
        assert sum(p.numel() for p in make_core(name, D, H).parameters()) == lstm
    for name in ("om_lstm", "um_lstm"):
        count = sum(p.numel() for p in make_core(name, D, H, chunk_size=C).parameters())
        assert count == lstm + 2 * (H // C) * (D + H + 1)
        assert (count - lstm) / lstm == pytest.approx(1 / (2 * C), rel=0.02)


def test_ordered_options_are_checked() -> None:
    assert make_core("om_lstm", D, 64).chunk_size == 16  # Gu et al.'s C on synthetic tasks
    assert make_core("om_lstm", D, 64, chunk_size=8).n_chunks == 8
    assert make_core("om_lstm", D, 5).n_chunks >= 2  # one cumax chunk would be constant
    with pytest.raises(ValueError, match="fixed"):
        make_core("or_lstm", D, 8, tied_master=True)
    with pytest.raises(ValueError, match="chunk_size"):
        make_core("om_lstm", D, 8, chunk_size=0)
    with pytest.raises(ValueError, match="master, refine"):
        OrderedLSTM(D, 8, aux="nope")
    with pytest.raises(ValueError, match="cumax, uniform"):
        OrderedLSTM(D, 8, main="nope")
    with pytest.raises(ValueError, match="aux='master'"):
        OrderedLSTM(D, 8, aux="refine", tied_master=True)


def test_ugi_master_gates_start_uniform_and_opposite() -> None:
    torch.manual_seed(0)
    core = make_core("um_lstm", D, 256, chunk_size=2)  # 128 master units
    b_f, b_i = core.bias[core.rows("mf")].detach(), core.bias[core.rows("mi")].detach()
    torch.testing.assert_close(b_i, -b_f)
    u = torch.sigmoid(b_f)
    assert u.min() >= 1 / 128 - 1e-6 and u.max() <= 1 - 1 / 128 + 1e-6
    assert 0.4 < u.mean() < 0.6 and u.std() > 0.2  # U(0, 1) has std 0.29
    for block in ("f", "i", "o", "u"):  # fine gates and the rest start at zero bias
        assert core.bias[core.rows(block)].abs().max() == 0


def test_proposition_3_on_lstm_gates_sum_to_five_sixths_at_init() -> None:
    """With neutral pre-activations (zero weights and biases) the ON-LSTM's effective gates sum
    to 1 - w per unit; averaged over n chunks, 1 - (n^2 - 1) / (6 n^2) -> 5/6 (Gu et al.)."""
    n = 60
    core = make_core("om_lstm", D, n, chunk_size=1).double()
    f_hat, i_hat = core.effective_gates(torch.zeros(1, core.bias.numel(), dtype=torch.float64))
    mean = (f_hat + i_hat).mean().item()
    assert mean == pytest.approx(1 - (n * n - 1) / (6 * n * n), abs=1e-12)
    assert abs(mean - 5 / 6) < 1e-3


# ---------------------------------------------------------------------------- Proposition 4
def test_proposition_4_rescaled_tied_master_gate_is_a_refine_gate() -> None:
    gen = torch.Generator().manual_seed(0)
    f_master = torch.rand(1000, generator=gen, dtype=torch.float64)
    f = torch.rand(1000, generator=gen, dtype=torch.float64)
    f_hat, i_hat = gates.master_gates(f_master, 1 - f_master, f, 1 - f, scale=2.0)
    # the master gate plays the forget gate, the fine forget gate plays the refine gate
    torch.testing.assert_close(f_hat, gates.refine(f_master, f), rtol=0, atol=1e-15)
    torch.testing.assert_close(i_hat, gates.refine(1 - f_master, 1 - f), rtol=0, atol=1e-15)
    torch.testing.assert_close(f_hat + i_hat, torch.ones_like(f), rtol=0, atol=1e-15)
    # without the rescaling (ON-LSTM as published) the gates sum to 1 - w, not 1
    f_on, i_on = gates.master_gates(f_master, 1 - f_master, f, 1 - f)
    w = f_master * (1 - f_master)
    torch.testing.assert_close(f_on + i_on, 1 - w, rtol=0, atol=1e-15)
    assert (f_on + i_on - 1).abs().max() > 0.2


def _copy_blocks(src, dst, mapping: dict[str, str]) -> None:
    """Copy the weight and bias rows of block ``src_name`` to ``dst``'s ``dst_name``."""

    def rows(core, name: str) -> slice:
        return core.rows(name) if isinstance(core, OrderedLSTM) else core._block(name)

    with torch.no_grad():
        for s_name, d_name in mapping.items():
            for attr in ("weight_ih", "weight_hh", "bias"):
                getattr(dst, attr)[rows(dst, d_name)] = getattr(src, attr)[rows(src, s_name)]


@pytest.mark.parametrize(
    "ordered, twin, mapping",
    [
        # Proposition 4: tied rescaled UGI master gates (one chunk per unit) = the R-LSTM, with
        # the master gate as its forget gate and the fine forget gate as its refine gate
        (
            dict(main="uniform", aux="master", chunk_size=1, tied_master=True),
            "r_lstm",
            {"mf": "f", "f": "r", "o": "o", "u": "u"},
        ),
        # the remaining cells of Gu et al.'s Table 1: UGI main gates without / with refine
        (dict(main="uniform", aux="none"), "u_lstm", {"f": "f", "i": "i", "o": "o", "u": "u"}),
        (dict(main="uniform", aux="refine"), "ur_lstm", {"f": "f", "r": "r", "o": "o", "u": "u"}),
    ],
)
def test_ordered_lstm_reproduces_the_gated_cell(ordered: dict, twin: str, mapping: dict) -> None:
    H = 6
    torch.manual_seed(0)
    core = OrderedLSTM(D, H, **ordered).double()
    other = make_core(twin, D, H, impl="loop").double()
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    _copy_blocks(core, other, mapping)
    x = _inputs().requires_grad_(True)
    y, state = core(x, core.initial_state(B))
    y_twin, state_twin = other(x, other.initial_state(B))
    torch.testing.assert_close(y, y_twin, rtol=1e-13, atol=1e-13)
    for a, b in zip(state, state_twin, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_twin,) = torch.autograd.grad(y_twin.square().sum(), x)
    torch.testing.assert_close(g, g_twin, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- RL interop
@pytest.mark.parametrize("core", NEW_CORES)
def test_recurrent_ppo_trains_with_new_core(core: str) -> None:
    """sb3-contrib RecurrentPPO runs each new core unchanged through CorePolicy."""
    model = sb3_recurrent_ppo(core, max_steps=16)
    vec = model.get_env()
    adapter = model.policy.lstm_actor
    before = [p.detach().clone() for p in adapter.parameters()]
    model.learn(32)
    assert any(not torch.equal(a, b) for a, b in zip(before, adapter.parameters(), strict=True))
    actions, state = model.predict(vec.reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,) and state[0].shape == (1, 2, adapter.hidden_size)
    vec.close()
