"""The ordered/master-gate LSTMs (ON-LSTM and Gu et al.'s O-, OM-, UM-, OR-LSTM) checked
against their papers' equations, unit by unit in float64. Proposition 4 of Gu et al. (tied,
rescaled master gates equal a refine gate) is checked on the gate formula and on whole
sequences against ``r_lstm``."""

from __future__ import annotations

import math

import pytest
import torch
from equation_helpers import B, D, affine, build, inputs, sigmoid

from memcores.cores import gates, make_core
from memcores.cores.on_lstm import OrderedLSTM


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


# ---------------------------------------------------------------------------- ordered gates
def _reference_ordered(core: OrderedLSTM, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gu et al. App. B.4-B.5 written out unit by unit: O- (eqs. 28-29), OM- = ON-LSTM (eqs.
    19-23), UM- (eqs. 30-33 then 21-23), OR- (eqs. 34-37); LSTM eqs. 4-7 for u, c, o, h."""
    H = core.hidden_size
    h = torch.zeros(B, H, dtype=torch.float64)
    c = torch.zeros(B, H, dtype=torch.float64)
    ys = []
    for x_t in x:
        pre = {name: affine(core, core.rows(name), x_t, h) for name in core._rows}
        if core.main == "cumax":
            main_f = _cumax_rows(pre["mf" if core.aux == "master" else "f"])
            if "mi" in pre or core.aux == "none":
                cm = _cumax_rows(pre["mi" if core.aux == "master" else "i"])
                main_i = [[1.0 - v for v in row] for row in cm]
        else:  # UGI sigmoid gates; the -b_f of eq. 33 is in the stored bias
            main_f = [[sigmoid(v) for v in row] for row in pre["mf"].tolist()]
            main_i = [[sigmoid(v) for v in row] for row in pre["mi"].tolist()]
        new_h, new_c = torch.empty_like(h), torch.empty_like(c)
        for b in range(B):
            for j in range(H):
                if core.aux == "none":
                    f_hat, i_hat = main_f[b][j], main_i[b][j]
                elif core.aux == "refine":
                    f_t, r = main_f[b][j], sigmoid(pre["r"][b, j].item())
                    f_hat = r * (1 - (1 - f_t) ** 2) + (1 - r) * f_t**2
                    i_hat = 1 - f_hat
                else:
                    chunk = j // core.chunk_size
                    fm, im = main_f[b][chunk], main_i[b][chunk]
                    f, i = sigmoid(pre["f"][b, j].item()), sigmoid(pre["i"][b, j].item())
                    w = fm * im
                    f_hat, i_hat = f * w + (fm - w), i * w + (im - w)
                u = math.tanh(pre["u"][b, j].item())
                o = sigmoid(pre["o"][b, j].item())
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
    core = build(name, hidden, **options)
    x = inputs()
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
    x = inputs().requires_grad_(True)
    y, state = core(x, core.initial_state(B))
    y_twin, state_twin = other(x, other.initial_state(B))
    torch.testing.assert_close(y, y_twin, rtol=1e-13, atol=1e-13)
    for a, b in zip(state, state_twin, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_twin,) = torch.autograd.grad(y_twin.square().sum(), x)
    torch.testing.assert_close(g, g_twin, rtol=1e-12, atol=1e-12)
