"""cores.diagnostics: gate time scales and input-gradient profiles."""

from __future__ import annotations

import math

import pytest
import torch

from memcores.cores import gates, make_core
from memcores.cores.diagnostics import input_gradient_profile, log_timescales, timescales

CONSTANT_TIMESCALE = -1.0 / math.log(1.0 / (1.0 + math.exp(-1.0)))  # ~3.19 steps


@pytest.mark.parametrize(
    "name", ["lstm", "tied_lstm", "fast_lstm", "fast2_lstm", "softsign_lstm", "gru", "fast_gru"]
)
def test_constant_init_gives_the_same_timescale_for_every_activation(name: str) -> None:
    ts = timescales(make_core(name, 3, 12))
    assert ts.shape == (12,)
    torch.testing.assert_close(ts, torch.full((12,), CONSTANT_TIMESCALE), atol=1e-4, rtol=0)


def test_chrono_timescales_span_up_to_t_max() -> None:
    torch.manual_seed(0)
    ts = timescales(make_core("c_lstm", 3, 256, t_max=500))
    # f = x / (1 + x) with x ~ U[1, t_max - 1]: -1/log f lies in [1/log 2, ~t_max]
    assert ts.min() >= 1.0 / math.log(2.0) - 1e-4
    assert ts.max() <= 500.0
    assert ts.max() > 200.0  # the spread really reaches long time scales


def test_refine_timescales_use_the_effective_gate() -> None:
    torch.manual_seed(0)
    core = make_core("ur_lstm", 3, 64)
    b = core.bias.detach().double()
    g = gates.refine(torch.sigmoid(b[core._block("f")]), torch.sigmoid(b[core._block("r")]))
    torch.testing.assert_close(timescales(core), (-1.0 / torch.log(g)).float())
    assert timescales(core).std() > 0  # UGI spreads the time scales


def test_timescales_follow_training_of_the_bias() -> None:
    core = make_core("lstm", 3, 4)
    with torch.no_grad():
        core.bias[core._block("f")] = 5.0
    assert timescales(core).min() > 100.0


@pytest.mark.parametrize(
    "name", ["lstm", "fast_lstm", "fast2_lstm", "softsign_lstm", "ur_lstm", "c_lstm", "ur_gru"]
)
def test_log_timescales_equal_the_log_of_unsaturated_timescales(name: str) -> None:
    torch.manual_seed(0)
    core = make_core(name, 3, 32)
    log_ts = log_timescales(core)
    assert log_ts.dtype == torch.float64 and log_ts.shape == (32,)
    torch.testing.assert_close(log_ts.float(), timescales(core).log(), rtol=1e-5, atol=1e-5)


def test_log_timescale_of_a_saturated_fast_gate_stays_finite_and_exact() -> None:
    core = make_core("fast_lstm", 3, 3)
    with torch.no_grad():
        core.bias[core._block("f")] = torch.tensor([5.0, 7.0, 10.0])
    # sigma(sinh 5) rounds to 1 even in float64, so the naive time scale is infinite...
    g = torch.sigmoid(torch.sinh(torch.tensor(5.0, dtype=torch.float64)))
    assert g == 1.0
    # ...while -1/log sigma(x) = 1/softplus(-x) ~ e^x gives log tau = sinh(b)
    log_ts = log_timescales(core)
    assert torch.isfinite(log_ts).all()
    expected = torch.sinh(torch.tensor([5.0, 7.0, 10.0], dtype=torch.float64))
    torch.testing.assert_close(log_ts, expected, rtol=1e-9, atol=1e-9)
    assert torch.isinf(timescales(core)[2])  # e^11013 is beyond float range


def test_log_timescale_of_saturated_refine_and_softsign_gates() -> None:
    core = make_core("ur_lstm", 3, 2)
    with torch.no_grad():  # f, r = sigma(40) round to 1; 1 - g = (1-f)((1-f) + 2f(1-r)) ~ 3e^-80
        core.bias[core._block("f")] = 40.0
        core.bias[core._block("r")] = 40.0
    expected = torch.full((2,), 80.0 - math.log(3.0), dtype=torch.float64)
    torch.testing.assert_close(log_timescales(core), expected, rtol=1e-9, atol=1e-9)
    soft = make_core("softsign_lstm", 3, 1)
    with torch.no_grad():  # 1 - phi(z) = 1 / (2 + z): tau ~ z + 1.5 for large z
        soft.bias[soft._block("f")] = 1e12
    torch.testing.assert_close(
        log_timescales(soft), torch.tensor([math.log(1e12 + 1.5)], dtype=torch.float64)
    )


@pytest.mark.parametrize("name", ["power_rnn", "leaky_rnn"])
def test_timescales_reject_cores_without_forget_gate(name: str) -> None:
    with pytest.raises(ValueError, match="forget gate"):
        timescales(make_core(name, 3, 4))
    with pytest.raises(ValueError, match="forget gate"):
        log_timescales(make_core(name, 3, 4))


def test_input_gradient_profile_matches_autograd() -> None:
    torch.manual_seed(0)
    core = make_core("lstm", 2, 8)
    head = torch.nn.Linear(8, 1)
    x = torch.randn(20, 4, 2)
    x_before = x.clone()

    def model_fn(xs: torch.Tensor) -> torch.Tensor:
        y, _ = core(xs, core.initial_state(xs.shape[1]))
        return head(y[-1])

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return out.square().mean()

    profile = input_gradient_profile(model_fn, x, loss_fn)
    assert profile.shape == (20,)
    xs = x.clone().requires_grad_(True)
    loss_fn(model_fn(xs)).backward()
    torch.testing.assert_close(profile, xs.grad.flatten(1).norm(dim=1))
    assert torch.equal(x, x_before) and not x.requires_grad
    # at initialisation the gradient decays as it goes back from the loss at step T
    assert profile[-1] > profile[0] * 10


def test_input_gradient_profile_zero_where_loss_does_not_look() -> None:
    x = torch.randn(6, 3, 2)
    profile = input_gradient_profile(lambda xs: xs[2] * 3.0, x, lambda out: out.sum())
    expected = torch.zeros(6)
    expected[2] = 3.0 * math.sqrt(3 * 2)
    torch.testing.assert_close(profile, expected)


def test_power_rnn_keeps_gradient_longer_than_leaky_rnn() -> None:
    """Ohno & Kumagai Fig. 2: r > 0 turns the exponential decay of ||dL/dx_t|| polynomial."""
    profiles = {}
    for name in ("leaky_rnn", "power_rnn"):
        torch.manual_seed(0)
        core = make_core(name, 1, 16, alpha_init=0.5).double()
        x = torch.randn(80, 4, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        profiles[name] = input_gradient_profile(
            lambda xs, core=core: core(xs, core.initial_state(xs.shape[1]))[0][-1],
            x,
            lambda out: out.sum(),
        )
    ratio = {k: (p[0] / p[-1]).item() for k, p in profiles.items()}
    assert ratio["power_rnn"] > 100 * ratio["leaky_rnn"]


def test_input_gradient_profile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"\[T, B, D\]"):
        input_gradient_profile(lambda xs: xs, torch.randn(4, 3), lambda out: out.sum())
    with pytest.raises(ValueError, match="scalar"):
        input_gradient_profile(lambda xs: xs, torch.randn(4, 3, 2), lambda out: out)


def test_log_timescales_fall_back_to_a_core_with_only_timescales() -> None:
    class OnlyTimescales(torch.nn.Module):  # a user core written before log time scales
        def forget_gate_timescales(self) -> torch.Tensor:
            return torch.tensor([2.0, 100.0])

    torch.testing.assert_close(
        log_timescales(OnlyTimescales()),
        torch.tensor([math.log(2.0), math.log(100.0)], dtype=torch.float64),
    )
