"""The power-law RNN of Ohno & Kumagai (cores/power_rnn.py), pinned by hand: its decay term
``|h|^r h``, its constructor's defaults, checks and initialisation, and steps of eq. 23-24
``h_t = h_{t-1} + alpha (tanh(U h_{t-1} + W x_t + b) - |h_{t-1}|^r h_{t-1})`` written out
number by number in float64 (hidden size 2)."""

from __future__ import annotations

import math

import pytest
import torch
from equation_helpers import assert_forward_checks_its_arguments

from memcores.cores import make_core
from memcores.cores.power_rnn import PowerRNN, power_decay

F64 = torch.float64


def _hand_core(r: float = 2.0) -> PowerRNN:
    """D = 1, H = 2, alpha = 0.5 exactly, W = [0.5, -1], b = [0.1, 0.2],
    U = [[0.2, 0], [0.4, -0.1]]."""
    core = PowerRNN(1, 2, r=r, alpha_init=0.5).double()
    with torch.no_grad():
        core.weight_ih.copy_(torch.tensor([[0.5], [-1.0]], dtype=F64))
        core.bias.copy_(torch.tensor([0.1, 0.2], dtype=F64))
        core.weight_hh.copy_(torch.tensor([[0.2, 0.0], [0.4, -0.1]], dtype=F64))
    return core


def _hand_step(h: tuple[float, float], x: float, r: float = 2.0) -> tuple[float, float]:
    """One step of :func:`_hand_core`, unit by unit with ``math``."""
    a0 = 0.5 * x + 0.1 + 0.2 * h[0]
    a1 = -1.0 * x + 0.2 + 0.4 * h[0] - 0.1 * h[1]
    return tuple(
        hj + 0.5 * (math.tanh(aj) - abs(hj) ** r * hj) for hj, aj in zip(h, (a0, a1), strict=True)
    )


def test_power_decay_is_x_times_abs_x_to_the_r_by_hand() -> None:
    """r = 0 is x, r = 2 exactly x^3, r = 1 x|x|, r = 1.5 sign(x)|x|^2.5, r = 3 x^4 sign(x)."""
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0], dtype=F64)
    assert torch.equal(power_decay(x, 0.0), x)
    assert torch.equal(power_decay(x, 2.0), x * x * x)
    torch.testing.assert_close(
        power_decay(x, 2.0), torch.tensor([-8.0, -0.125, 0.0, 0.125, 8.0], dtype=F64)
    )
    torch.testing.assert_close(
        power_decay(x, 1.0), torch.tensor([-4.0, -0.25, 0.0, 0.25, 4.0], dtype=F64)
    )
    torch.testing.assert_close(
        power_decay(x, 3.0), torch.tensor([-16.0, -0.0625, 0.0, 0.0625, 16.0], dtype=F64)
    )
    torch.testing.assert_close(
        power_decay(x, 1.5),
        torch.tensor([-(2.0**2.5), -(0.5**2.5), 0.0, 0.5**2.5, 2.0**2.5], dtype=F64),
    )


def test_power_decay_gradient_at_zero_is_one_for_r0_and_zero_for_r_positive() -> None:
    """r = 0 is the identity (gradient 1 everywhere, 0 included); for r > 0 the gradient at
    0 is finite and 0, and (r + 1)|x|^r elsewhere."""
    for r, expected in ((0.0, [1.0, 1.0, 1.0]), (2.0, [12.0, 0.0, 0.75]), (1.5, [0.0, 0.0, 0.0])):
        x = torch.tensor([-2.0, 0.0, 0.5], dtype=F64, requires_grad=True)
        (g,) = torch.autograd.grad(power_decay(x, r).sum(), x)
        if r == 1.5:
            expected = [2.5 * 2.0**1.5, 0.0, 2.5 * 0.5**1.5]
        torch.testing.assert_close(g, torch.tensor(expected, dtype=F64))
        assert torch.isfinite(g).all()


def test_constructor_defaults_r2_and_alpha_one_tenth() -> None:
    """PowerRNN(D, H): r = 2.0 (a float), alpha = 0.1, sizes and parameter shapes."""
    core = PowerRNN(3, 2)
    assert core.input_size == 3 and core.hidden_size == 2
    assert core.r == 2.0 and isinstance(core.r, float)
    assert core.alpha_init == 0.1
    assert core.alpha.shape == (1,)
    assert core.alpha.item() == pytest.approx(0.1, abs=1e-7)
    assert core.weight_ih.shape == (2, 3) and core.weight_hh.shape == (2, 2)
    assert core.bias.shape == (2,) and core.alpha_logit.shape == (1,)
    assert repr(core) == "PowerRNN(3, 2, r=2.0)"
    named = PowerRNN(3, 2, r=1, alpha_init=0.25)
    assert named.r == 1.0 and isinstance(named.r, float) and named.alpha_init == 0.25
    assert repr(named) == "PowerRNN(3, 2, r=1.0)"


def test_constructor_refuses_negative_r_and_alpha_outside_the_open_unit_interval() -> None:
    """Exact messages; r = 0 and alpha_init just inside (0, 1) are accepted."""
    with pytest.raises(ValueError, match=r"^r must be >= 0, got -0\.5$"):
        PowerRNN(3, 2, r=-0.5)
    for bad in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match=rf"^alpha_init must be in \(0, 1\), got {bad}$"):
            PowerRNN(3, 2, alpha_init=bad)
    assert PowerRNN(3, 2, r=0.0).r == 0.0
    assert PowerRNN(3, 2, r=0.5).r == 0.5
    assert PowerRNN(3, 2, alpha_init=0.999).alpha.item() == pytest.approx(0.999, abs=1e-6)
    assert PowerRNN(3, 2, alpha_init=0.001).alpha.item() == pytest.approx(0.001, abs=1e-7)


def test_reset_parameters_draws_u_then_w_and_sets_b_and_alpha() -> None:
    """U ~ N(0, (0.1/sqrt(H))^2) then W ~ U(-1/sqrt(D), 1/sqrt(D)) from the same stream,
    b = 0 and alpha_logit = log(alpha_init / (1 - alpha_init))."""
    D, H = 4, 9
    torch.manual_seed(3)
    core = PowerRNN(D, H, alpha_init=0.2)
    torch.manual_seed(3)
    u = torch.empty(H, H).normal_(0.0, 0.1 / 3.0)
    w = torch.empty(H, D).uniform_(-0.5, 0.5)
    torch.testing.assert_close(core.weight_hh.detach(), u, rtol=0, atol=0)
    torch.testing.assert_close(core.weight_ih.detach(), w, rtol=0, atol=0)
    assert torch.equal(core.bias.detach(), torch.zeros(H))
    assert core.alpha_logit.item() == pytest.approx(math.log(0.25), abs=1e-7)
    assert core.alpha.item() == pytest.approx(0.2, abs=1e-7)
    # reset_parameters restores all of them after a change
    with torch.no_grad():
        for p in core.parameters():
            p.fill_(7.0)
    torch.manual_seed(3)
    core.reset_parameters()
    torch.testing.assert_close(core.weight_hh.detach(), u, rtol=0, atol=0)
    torch.testing.assert_close(core.weight_ih.detach(), w, rtol=0, atol=0)
    assert torch.equal(core.bias.detach(), torch.zeros(H))
    assert core.alpha_logit.item() == pytest.approx(math.log(0.25), abs=1e-7)


def test_weight_scales_over_many_draws() -> None:
    """U's spread is 0.1/sqrt(H) around 0; W fills (-1/sqrt(D), 1/sqrt(D))."""
    torch.manual_seed(0)
    core = PowerRNN(16, 300)
    u, w = core.weight_hh.detach(), core.weight_ih.detach()
    assert u.std().item() == pytest.approx(0.1 / math.sqrt(300), rel=0.02)
    assert abs(u.mean().item()) < 1e-4
    assert w.abs().max().item() <= 0.25 and w.abs().max().item() > 0.249
    assert w.min().item() < -0.249


def test_initial_state_is_one_zero_tensor_of_the_cores_dtype() -> None:
    """(h,) with h = 0 [B, H], float64 after .double(), on the requested device (the weights'
    by default)."""
    core = PowerRNN(3, 2).double()
    state = core.initial_state(4)
    assert len(state) == 1
    assert state[0].shape == (4, 2) and state[0].dtype == F64
    assert torch.equal(state[0], torch.zeros(4, 2, dtype=F64))
    on_cpu = core.initial_state(1, "cpu")
    assert on_cpu[0].device.type == "cpu" and on_cpu[0].shape == (1, 2)
    # a device other than the weights' (meta: no accelerator needed) is honoured
    on_meta = core.initial_state(3, "meta")
    assert on_meta[0].device.type == "meta" and on_meta[0].shape == (3, 2)


def test_one_step_by_hand() -> None:
    """From h = (0.5, -1) and x = 2: a = (1.2, -1.5), h' = h + 0.5 (tanh a - h^3)."""
    core = _hand_core()
    h = torch.tensor([[0.5, -1.0]], dtype=F64)
    x = torch.tensor([[2.0]], dtype=F64)
    expected = torch.tensor(
        [[0.5 + 0.5 * (math.tanh(1.2) - 0.125), -1.0 + 0.5 * (math.tanh(-1.5) + 1.0)]], dtype=F64
    )
    assert _hand_step((0.5, -1.0), 2.0) == pytest.approx(expected[0].tolist(), abs=1e-15)
    y, (h1,) = core.step(x, (h,))
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(h1, expected, rtol=0, atol=1e-15)
    y_seq, (h_seq,) = core(x.unsqueeze(0), (h,))
    torch.testing.assert_close(y_seq[0], expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(h_seq, expected, rtol=0, atol=1e-15)


def test_cell_uses_the_given_alpha_and_projection() -> None:
    """cell(a_x, h, alpha) = h + alpha (tanh(a_x + U h) - h^3) for an alpha other than the
    core's own."""
    core = _hand_core()
    a_x = torch.tensor([[0.3, -0.2]], dtype=F64)
    h = torch.tensor([[0.5, -1.0]], dtype=F64)
    alpha = torch.tensor([0.25], dtype=F64)
    a = (0.3 + 0.1, -0.2 + 0.2 + 0.1)
    expected = [0.5 + 0.25 * (math.tanh(a[0]) - 0.125), -1.0 + 0.25 * (math.tanh(a[1]) + 1.0)]
    out = core.cell(a_x, h, alpha)
    torch.testing.assert_close(out, torch.tensor([expected], dtype=F64), rtol=0, atol=1e-15)


@pytest.mark.parametrize("r", [2.0, 0.0, 1.5])
def test_sequence_carries_the_state_and_resets_rows_at_episode_starts(r: float) -> None:
    """Three steps, two rows: row 0 carries h from step to step (from a nonzero h0); row 1
    restarts from h = 0 at step 1 (starts[1, 1]). Every value from :func:`_hand_step`."""
    core = _hand_core(r)
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25)]
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)  # [T=3, B=2, D=1]
    starts = torch.tensor([[False, False], [False, True], [False, False]])
    h0 = torch.tensor([[0.5, -1.0], [0.3, 0.7]], dtype=F64)
    y, (h_last,) = core(x, (h0,), starts)
    rows = [(0.5, -1.0), (0.3, 0.7)]
    for t in range(3):
        for b in range(2):
            if starts[t, b]:
                rows[b] = (0.0, 0.0)
            rows[b] = _hand_step(rows[b], xs[t][b], r)
            torch.testing.assert_close(
                y[t, b], torch.tensor(rows[b], dtype=F64), rtol=0, atol=1e-14
            )
    torch.testing.assert_close(h_last, torch.tensor(rows, dtype=F64), rtol=0, atol=1e-14)
    # without starts no row resets: row 1 carries its h0 through step 1
    y_free, _ = core(x, (h0,))
    assert not torch.allclose(y_free[1, 1], y[1, 1])
    torch.testing.assert_close(y_free[:, 0], y[:, 0], rtol=0, atol=0)


def test_forward_checks_its_arguments() -> None:
    """check_sequence's messages for a wrong input size, a state that is not a tuple and
    starts of the wrong shape."""
    assert_forward_checks_its_arguments(PowerRNN(1, 2), "PowerRNN")


def test_the_registry_builds_leaky_and_power_rnns() -> None:
    """make_core('power_rnn') is r = 2; 'leaky_rnn' is r = 0."""
    assert make_core("power_rnn", 3, 2).r == 2.0
    assert make_core("leaky_rnn", 3, 2).r == 0.0
