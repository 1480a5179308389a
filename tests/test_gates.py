"""Math of the gates, initialisers and gated cores (cores.gates, cores.gated, cores.gru,
cores.power_rnn)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from memcores.cores import CORES, fast_tanh, gates, make_core, presets_of
from memcores.cores.gated import GatedLSTM

ACTS = gates.ACTIVATIONS
SIGMA_1 = 1.0 / (1.0 + math.exp(-1.0))


# ---------------------------------------------------------------------------- activations
@pytest.mark.parametrize("act", ACTS)
def test_gate_symmetry_range_and_slope_at_zero(act: str) -> None:
    phi = gates.gate_fn(act)
    z = torch.linspace(-2, 2, 81, dtype=torch.float64, requires_grad=True)
    f = phi(z)
    assert (f > 0).all() and (f < 1).all()
    assert (f[1:] > f[:-1]).all()  # strictly increasing
    torch.testing.assert_close(phi(-z), 1 - f)
    z0 = torch.zeros((), dtype=torch.float64, requires_grad=True)
    (slope0,) = torch.autograd.grad(phi(z0), z0)
    assert slope0.item() == pytest.approx(0.25)


def test_gate_formulas() -> None:
    z = torch.linspace(-4, 4, 33, dtype=torch.float64)
    torch.testing.assert_close(gates.fast_gate(z), torch.sigmoid(torch.sinh(z)))
    torch.testing.assert_close(gates.fast2_gate(z), torch.sigmoid(torch.sinh(torch.sinh(z))))
    torch.testing.assert_close(
        gates.softsign_gate(z), (torch.nn.functional.softsign(z / 2) + 1) / 2
    )
    # faster saturation: 1 - phi(3) ordered softsign > sigmoid > fast > fast2
    one_minus = [
        1 - gates.gate_fn(a)(torch.tensor(3.0, dtype=torch.float64))
        for a in ("softsign", "sigmoid", "fast", "fast2")
    ]
    assert one_minus == sorted(one_minus, reverse=True)


@pytest.mark.parametrize("act", ACTS)
def test_gate_gradcheck_and_closed_form_derivative(act: str) -> None:
    z = torch.linspace(-3, 3, 25, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gates.gate_fn(act), (z,))
    (auto,) = torch.autograd.grad(gates.gate_fn(act)(z).sum(), z)
    torch.testing.assert_close(gates.gate_derivative(act, z.detach()), auto)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("act", ["fast", "fast2"])
def test_fast_gate_finite_at_extreme_inputs(act: str, dtype: torch.dtype) -> None:
    z = torch.tensor([-1e4, -100.0, -89.0, 0.0, 89.0, 100.0, 1e4], dtype=dtype, requires_grad=True)
    f = gates.gate_fn(act)(z)
    (grad,) = torch.autograd.grad(f.sum(), z)
    assert torch.isfinite(f).all() and torch.isfinite(grad).all()
    assert f[0] == 0 and f[-1] == 1 and grad[0] == 0 and grad[-1] == 0
    assert torch.isfinite(gates.gate_derivative(act, z.detach())).all()
    # the naive formula really fails there, so the test above is meaningful
    naive = torch.tensor([1e4], dtype=dtype, requires_grad=True)
    (naive_grad,) = torch.autograd.grad(torch.sigmoid(torch.sinh(naive)).sum(), naive)
    assert torch.isnan(naive_grad).all()


@pytest.mark.parametrize("name", ["fast_lstm", "fast2_lstm"])
@pytest.mark.parametrize("impl", ["fused", "loop"])
def test_fast_lstm_finite_with_saturated_forget_bias(impl: str, name: str) -> None:
    core = make_core(name, 3, 4, impl=impl)
    with torch.no_grad():
        core.bias[core._block("f")] = torch.tensor([1e4, -1e4, 95.0, -95.0])
    x = torch.randn(5, 2, 3, requires_grad=True)
    y, _ = core(x, core.initial_state(2))
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in core.parameters())


# ---------------------------------------------------------------------------- initialisers
@pytest.mark.parametrize(
    "act, expected",
    [
        ("sigmoid", 1.0),
        ("fast", math.asinh(1.0)),
        ("softsign", math.e - 1.0),
        ("fast2", math.asinh(math.asinh(1.0))),
    ],
)
def test_constant_init_rule(act: str, expected: float) -> None:
    b = gates.constant_bias(act, 8)
    torch.testing.assert_close(b, torch.full((8,), expected, dtype=torch.float64))
    torch.testing.assert_close(
        gates.gate_fn(act)(b), torch.full((8,), SIGMA_1, dtype=torch.float64)
    )


@pytest.mark.parametrize("name", ["lstm", "tied_lstm", "fast_lstm", "fast2_lstm", "softsign_lstm"])
def test_constant_init_in_cores(name: str) -> None:
    core = make_core(name, 3, 16)
    b = core.bias.detach().double()
    f = gates.gate_fn(core.activation)(b[core._block("f")])
    torch.testing.assert_close(
        f, torch.full((16,), SIGMA_1, dtype=torch.float64), atol=1e-6, rtol=0
    )
    if "i" in core.gate_names:
        assert (b[core._block("i")] == 0).all()


def test_chrono_init_distribution() -> None:
    t_max = 200.0
    torch.manual_seed(0)
    b = gates.chrono_bias("sigmoid", 20000, t_max)
    e = torch.exp(b)  # ~ U[1, t_max - 1]
    assert e.min() >= 1.0 and e.max() <= t_max - 1.0
    for q in (0.1, 0.5, 0.9):
        expected = 1.0 + q * (t_max - 2.0)
        assert torch.quantile(e, q).item() == pytest.approx(expected, rel=0.05)
    # other activations give the same gate values as the sigmoid chrono init
    torch.manual_seed(0)
    bf = gates.chrono_bias("fast", 20000, t_max)
    torch.testing.assert_close(gates.fast_gate(bf), torch.sigmoid(b))


def test_chrono_core_input_bias_is_minus_forget_bias() -> None:
    core = make_core("c_lstm", 3, 64, t_max=50)
    b = core.bias.detach()
    torch.testing.assert_close(b[core._block("i")], -b[core._block("f")])
    assert b[core._block("f")].exp().max() <= 49.0 + 1e-4
    assert b[core._block("f")].min() >= 0.0


@pytest.mark.parametrize("act", ACTS)
def test_uniform_init_distribution(act: str) -> None:
    d = 20000
    torch.manual_seed(0)
    u = gates.gate_fn(act)(gates.uniform_bias(act, d))
    assert u.min() >= 1.0 / d - 1e-9 and u.max() <= 1.0 - 1.0 / d + 1e-9
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        assert torch.quantile(u, q).item() == pytest.approx(q, abs=0.02)


def test_uniform_cores_bias_bookkeeping() -> None:
    ur = make_core("ur_lstm", 3, 32)
    b = ur.bias.detach()
    torch.testing.assert_close(b[ur._block("r")], -b[ur._block("f")])  # same sample
    assert b[ur._block("f")].std() > 0.5  # spread, not a constant
    u = make_core("u_lstm", 3, 32)
    bu = u.bias.detach()
    torch.testing.assert_close(bu[u._block("i")], -bu[u._block("f")])
    uf = make_core("uf_lstm", 3, 32)
    assert uf.activation == "fast" and uf.tied and uf.init == "uniform"
    r = make_core("r_lstm", 3, 32)
    assert (r.bias.detach()[r._block("r")] == 0).all()
    assert torch.allclose(r.bias.detach()[r._block("f")], torch.ones(32))


# ---------------------------------------------------------------------------- refine gate
def test_refine_gate_band() -> None:
    gen = torch.Generator().manual_seed(0)
    f = torch.rand(10000, dtype=torch.float64, generator=gen)
    r = torch.rand(10000, dtype=torch.float64, generator=gen)
    g = gates.refine(f, r)
    assert (g >= f**2 - 1e-12).all() and (g <= 1 - (1 - f) ** 2 + 1e-12).all()
    torch.testing.assert_close(gates.refine(f, torch.zeros_like(f)), f**2)
    torch.testing.assert_close(gates.refine(f, torch.ones_like(f)), 1 - (1 - f) ** 2)
    torch.testing.assert_close(gates.refine(f, torch.full_like(f, 0.5)), f)
    f.requires_grad_(True)
    r.requires_grad_(True)
    assert torch.autograd.gradcheck(gates.refine, (f[:20], r[:20]))


# ---------------------------------------------------------------------------- fused vs loop
# every preset of the gated LSTM with a CPU fused function (the registry's, so a new one is
# tested too; on the CPU the power-law cell runs the reference loop)
PRESETS = [
    name
    for name in presets_of("memcores.cores.gated:GatedLSTM")
    if not CORES[name].preset.get("power")
]


def _refined(activation: str):  # a refine gate on a non-sigmoid forget gate: no preset has one
    return lambda impl: GatedLSTM(3, 6, activation=activation, tied=True, refine=True, impl=impl)


@pytest.fixture(params=[False, True], ids=["native_tanh", "tanh_via_sigmoid"])
def tanh_path(request, monkeypatch) -> bool:
    """Run a test through both ways the fused forward takes a tanh on CPU (the machine's vector
    ISA and the size pick one; see ``cores.fast_tanh.via_sigmoid``)."""
    monkeypatch.setattr(fast_tanh, "via_sigmoid", lambda device, numel: request.param)
    return request.param


def _assert_same_values_and_gradients(fused, loop, x, starts, h0, c0) -> None:
    """The outputs, the final state and every gradient (inputs, initial state, parameters) of
    a loss reading all of them agree between the two cores (the same h-detach draws)."""
    results = []
    for core in (fused, loop):
        xs = x.clone().requires_grad_(True)
        state = (h0.clone().requires_grad_(True), c0.clone().requires_grad_(True))
        torch.manual_seed(5)  # same h-detach draws
        y, (h, c) = core(xs, state, starts)
        (y.sin().sum() + (h * c).sum() + c.sum()).backward()
        results.append(
            (y, h, c, xs.grad, state[0].grad, state[1].grad, *[p.grad for p in core.parameters()])
        )
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "build",
    [functools.partial(make_core, name, 3, 6) for name in PRESETS]
    + [_refined("fast"), _refined("softsign")],
    ids=[*PRESETS, "refine_fast", "refine_softsign"],
)
@pytest.mark.usefixtures("tanh_path")
def test_fused_matches_reference_loop(build) -> None:
    torch.manual_seed(0)
    fused = build(impl="fused").double().train()
    loop = build(impl="loop").double().train()
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(9, 4, 3, dtype=torch.float64)
    starts = torch.zeros(9, 4, dtype=torch.bool)
    starts[3, 1] = starts[6, 2] = starts[0, 3] = True
    h0 = torch.randn(4, 6, dtype=torch.float64)
    c0 = torch.randn(4, 6, dtype=torch.float64)
    _assert_same_values_and_gradients(fused, loop, x, starts, h0, c0)


def _gated(activation: str, tied: bool, refine: bool):  # hidden size 4
    return lambda impl: GatedLSTM(3, 4, activation=activation, tied=tied, refine=refine, impl=impl)


@pytest.mark.parametrize("with_starts", [False, True], ids=["no_starts", "starts"])
@pytest.mark.parametrize(
    "build",
    [functools.partial(make_core, name, 3, 4) for name in PRESETS]
    + [_gated(a, tied=True, refine=True) for a in ("fast", "softsign")]
    + [_gated(a, tied=False, refine=False) for a in ("fast", "fast2", "softsign")],
    ids=[
        *PRESETS,
        "refine_fast",
        "refine_softsign",
        "untied_fast",
        "untied_fast2",
        "untied_softsign",
    ],
)
def test_fused_matches_reference_loop_over_several_backward_chunks(build, with_starts) -> None:
    """35 steps: the fused backward's chunks of 16, 16 and 3 steps (each reads the cell state
    the chunk before it ended in), with and without episode starts; 5 rows, so a factor sized
    by rows instead of steps cannot broadcast."""
    from memcores.cores import _fused_lstm

    assert _fused_lstm._CHUNK == 16
    torch.manual_seed(1)
    fused = build(impl="fused").double().train()
    loop = build(impl="loop").double().train()
    loop.load_state_dict(fused.state_dict())
    T, B = 35, 5
    x = torch.randn(T, B, 3, dtype=torch.float64)
    starts = None
    if with_starts:
        starts = torch.zeros(T, B, dtype=torch.bool)
        starts[20, 1] = starts[5, 3] = True
    h0, c0 = torch.randn(B, 4, dtype=torch.float64), torch.randn(B, 4, dtype=torch.float64)
    _assert_same_values_and_gradients(fused, loop, x, starts, h0, c0)


@pytest.mark.parametrize("name", ["ur_lstm", "lstm", "fast_lstm", "fast2_lstm", "softsign_lstm"])
def test_fused_gradcheck(name: str) -> None:
    torch.manual_seed(0)
    core = make_core(name, 2, 3, impl="fused").double()
    x = torch.randn(4, 2, 2, dtype=torch.float64, requires_grad=True)
    starts = torch.zeros(4, 2, dtype=torch.bool)
    starts[2, 0] = True
    h0 = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)

    def fn(x, w_ih, w_hh, bias, h0, c0):
        params = {"weight_ih": w_ih, "weight_hh": w_hh, "bias": bias}
        y, (h, c) = torch.func.functional_call(core, params, (x, (h0, c0), starts))
        return y, c

    w_ih, w_hh, b = (
        p.detach().clone().requires_grad_(True) for p in (core.weight_ih, core.weight_hh, core.bias)
    )
    assert torch.autograd.gradcheck(fn, (x, w_ih, w_hh, b, h0, c0))


@pytest.mark.parametrize("name", ["fast_lstm", "fast2_lstm"])
def test_fused_fast_gate_gradient_matches_loop_near_saturation(name: str) -> None:
    # forget pre-activations from 0.5 to 40: the fused backward's cosh factors (and fast2's
    # clamp of sinh a at 30) must give the reference loop's gradient across the saturating band
    torch.manual_seed(0)
    fused = make_core(name, 3, 6, impl="fused").double()
    loop = make_core(name, 3, 6, impl="loop").double()
    with torch.no_grad():
        fused.bias[fused._block("f")] = torch.tensor([0.5, 1.5, 2.5, 3.5, -4.0, 40.0])
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(7, 2, 3, dtype=torch.float64)
    grads = []
    for core in (fused, loop):
        y, _ = core(x, tuple(s.double() for s in core.initial_state(2)))
        y.sum().backward()
        grads.append([p.grad for p in core.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["fast_lstm", "fast2_lstm"])
@pytest.mark.usefixtures("tanh_path")
def test_fused_fast_gate_float32_matches_loop_across_exp_range(name: str) -> None:
    # the fused forward computes sinh a as e - 1/(4 e) with e = exp(a) / 2 in float32. Near
    # a = 0 this subtracts two values close to 1/2; past |a| = 88 e is inf or 0. Forward values
    # and gradients must still match the reference loop (torch.sinh on a clamped argument) to
    # float32 precision, with no NaN from 0 * inf in the slope
    torch.manual_seed(0)
    fused = make_core(name, 3, 8, impl="fused")
    loop = make_core(name, 3, 8, impl="loop")
    with torch.no_grad():
        fused.bias[fused._block("f")] = torch.tensor([0.0, 1e-3, -0.3, 2.0, 6.0, -6.0, 95.0, -95.0])
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(9, 4, 3)
    outputs, grads = [], []
    for core in (fused, loop):
        y, _ = core(x, core.initial_state(4))
        (y * torch.linspace(-1.0, 1.0, 8)).sum().backward()
        outputs.append(y.detach())
        grads.append([p.grad for p in core.parameters()])
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- equivalences
def _copy_torch_lstm(core: GatedLSTM, ref: torch.nn.LSTM) -> None:
    H = core.hidden_size

    def reorder(w: torch.Tensor) -> torch.Tensor:  # torch: i, f, g, o -> ours (see gate_names)
        blocks = dict(zip("ifuo", w.split(H), strict=True))
        return torch.cat([blocks[n] for n in core.gate_names])

    with torch.no_grad():
        core.weight_ih.copy_(reorder(ref.weight_ih_l0))
        core.weight_hh.copy_(reorder(ref.weight_hh_l0))
        core.bias.copy_(reorder(ref.bias_ih_l0 + ref.bias_hh_l0))


@pytest.mark.parametrize("impl", ["fused", "loop"])
def test_lstm_equals_torch_lstm(impl: str) -> None:
    torch.manual_seed(0)
    core = make_core("lstm", 3, 5, impl=impl).double()
    ref = torch.nn.LSTM(3, 5).double()
    _copy_torch_lstm(core, ref)
    x = torch.randn(8, 2, 3, dtype=torch.float64)
    y, (h, c) = core(x, core.initial_state(2))
    y_ref, (h_ref, c_ref) = ref(x)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(c, c_ref[0])


def test_gru_equals_torch_gru() -> None:
    torch.manual_seed(0)
    core = make_core("gru", 3, 5).double()
    ref = torch.nn.GRU(3, 5).double()
    H = 5

    def reorder(w: torch.Tensor) -> torch.Tensor:  # torch: r, z, n -> ours: z, r, n
        r, z, n = w.split(H)
        return torch.cat([z, r, n])

    with torch.no_grad():
        core.weight_ih.copy_(reorder(ref.weight_ih_l0))
        core.weight_hh.copy_(reorder(ref.weight_hh_l0))
        b_ih, b_hh = reorder(ref.bias_ih_l0), reorder(ref.bias_hh_l0)
        core.bias.copy_(torch.cat([b_ih[: 2 * H] + b_hh[: 2 * H], b_ih[2 * H :]]))
        core.bias_hn.copy_(b_hh[2 * H :])
    x = torch.randn(8, 2, 3, dtype=torch.float64)
    y, _ = core(x, core.initial_state(2))
    torch.testing.assert_close(y, ref(x)[0])


def test_gru_variants_change_only_the_update_gate() -> None:
    fast = make_core("fast_gru", 3, 8)
    assert fast.gate_names == ("z", "r", "n")
    torch.testing.assert_close(
        gates.fast_gate(fast.bias.detach()[fast._block("z")].double()),
        torch.full((8,), SIGMA_1, dtype=torch.float64),
    )
    assert (fast.bias.detach()[fast._block("r")] == 0).all()
    ur = make_core("ur_gru", 3, 8)
    assert ur.gate_names == ("z", "q", "r", "n")
    b = ur.bias.detach()
    torch.testing.assert_close(b[ur._block("q")], -b[ur._block("z")])


# ---------------------------------------------------------------------------- h-detach
def _grad(t: torch.Tensor) -> torch.Tensor:
    """``t.grad``, or zeros when no gradient path reached ``t`` at all."""
    return torch.zeros_like(t) if t.grad is None else t.grad


def _pair(p: float = 0.25):
    torch.manual_seed(0)
    lstm = make_core("lstm", 3, 5, impl="loop").double()
    hd = make_core("hdetach_lstm", 3, 5, p=p).double()
    hd.load_state_dict(lstm.state_dict())
    return lstm, hd


def test_hdetach_forward_equals_lstm() -> None:
    lstm, hd = _pair(p=0.5)
    hd.train()
    x = torch.randn(10, 4, 3, dtype=torch.float64)
    y, state = lstm(x, lstm.initial_state(4))
    y_hd, state_hd = hd(x, hd.initial_state(4))
    torch.testing.assert_close(y_hd, y)
    torch.testing.assert_close(state_hd[1], state[1])


@pytest.mark.parametrize("impl", ["fused", "loop"])
def test_hdetach_p1_blocks_the_h_path_only(impl: str) -> None:
    lstm, hd = _pair(p=1.0)
    hd.impl = impl
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2, 3, dtype=torch.float64, generator=gen)
    h0 = torch.randn(2, 5, dtype=torch.float64, generator=gen)
    c0 = torch.randn(2, 5, dtype=torch.float64, generator=gen)

    def grads(core):
        xs = x.clone().requires_grad_(True)
        h, c = h0.clone().requires_grad_(True), c0.clone().requires_grad_(True)
        y, _ = core(xs, (h, c))
        y[-1].sum().backward()
        return xs.grad, _grad(h), c.grad

    gx, gh, gc = grads(hd.train())
    # h_0 only enters the gates of step 0, so its whole gradient is blocked ...
    assert (gh == 0).all()
    # ... while the cell path still carries gradient to c_0 and to the earliest input
    assert (gc.abs() > 0).all() and gx[0].abs().sum() > 0
    gx_lstm, gh_lstm, _ = grads(lstm)
    assert gh_lstm.abs().sum() > 0 and not torch.allclose(gx_lstm, gx)

    # equals a hand-written LSTM whose gate input h_{t-1} is always detached
    xs = x.clone().requires_grad_(True)
    h, c = h0, c0
    for x_t in xs.unbind(0):
        a = F.linear(x_t, lstm.weight_ih, lstm.bias) + F.linear(h.detach(), lstm.weight_hh)
        h, c = lstm.cell(a, c)
    h.sum().backward()
    torch.testing.assert_close(gx, xs.grad)


def test_hdetach_one_draw_per_step_shared_by_batch_and_off_in_eval() -> None:
    _, hd = _pair(p=0.5)
    outcomes = set()
    for seed in range(16):
        torch.manual_seed(seed)
        h0 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
        c0 = torch.zeros(3, 5, dtype=torch.float64)
        y, _ = hd.train()(torch.randn(1, 3, 3, dtype=torch.float64), (h0, c0))
        y.sum().backward()
        zero_rows = (_grad(h0) == 0).all(dim=1)
        assert zero_rows.all() or not zero_rows.any()  # the batch shares the draw
        outcomes.add(bool(zero_rows.all()))
    assert outcomes == {True, False}
    # evaluation is deterministic and never detaches
    h0 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    hd.p = 1.0
    y, _ = hd.eval()(torch.randn(1, 3, 3, dtype=torch.float64), (h0, torch.zeros(3, 5).double()))
    y.sum().backward()
    assert (h0.grad.abs().sum(dim=1) > 0).all()


# ---------------------------------------------------------------------------- power RNN
def test_power_rnn_r0_equals_leaky_rnn() -> None:
    torch.manual_seed(0)
    leaky = make_core("leaky_rnn", 3, 6).double()
    power = make_core("power_rnn", 3, 6, r=0.0).double()
    power.load_state_dict(leaky.state_dict())
    x = torch.randn(12, 2, 3, dtype=torch.float64)
    y_leaky, _ = leaky(x, leaky.initial_state(2))
    y_power, _ = power(x, power.initial_state(2))
    torch.testing.assert_close(y_power, y_leaky, rtol=0, atol=0)
    # and both are the textbook leaky RNN (1 - alpha) h + alpha tanh(U h + W x + b)
    alpha = leaky.alpha.detach()
    h = torch.zeros(2, 6, dtype=torch.float64)
    for t in range(12):
        h_tilde = torch.tanh(h @ leaky.weight_hh.T + x[t] @ leaky.weight_ih.T + leaky.bias)
        h = (1 - alpha) * h + alpha * h_tilde
    torch.testing.assert_close(y_leaky[-1], h.detach())


def test_power_rnn_decay_term_and_init() -> None:
    torch.manual_seed(0)
    core = make_core("power_rnn", 3, 400).double()
    h = torch.linspace(-1.5, 1.5, 7, dtype=torch.float64)
    torch.testing.assert_close(core.decay(h), h.abs() ** 2 * h)
    assert core.weight_hh.std().item() == pytest.approx(0.1 / math.sqrt(400), rel=0.05)
    assert 0 < core.alpha.item() < 1 and core.alpha.item() == pytest.approx(0.1)
    half = make_core("power_rnn", 3, 4, r=0.5).double()
    z = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(half.decay(z).sum(), z)
    assert torch.isfinite(g).all()


def test_power_rnn_decays_polynomially_without_input() -> None:
    """With U = 0 and no input, |h| decays like t^(-1/r), much slower than the leaky RNN."""
    cores = {}
    for r in (0.0, 2.0):
        torch.manual_seed(0)
        core = make_core("power_rnn", 1, 1, r=r, alpha_init=0.5).double()
        with torch.no_grad():
            core.weight_hh.zero_()
            core.weight_ih.zero_()
        cores[r] = core
    x = torch.zeros(200, 1, 1, dtype=torch.float64)
    h0 = (torch.full((1, 1), 0.9, dtype=torch.float64),)
    y0, _ = cores[0.0](x, h0)
    y2, _ = cores[2.0](x, h0)
    assert y0[-1].abs().item() < 1e-30
    assert y2[-1].abs().item() > 0.05


def test_alpha_stays_in_unit_interval() -> None:
    core = make_core("leaky_rnn", 2, 3)
    with torch.no_grad():
        core.alpha_logit.fill_(50.0)
    assert 0 < core.alpha.item() <= 1.0
    with pytest.raises(ValueError, match="alpha_init"):
        make_core("leaky_rnn", 2, 3, alpha_init=1.5)


def test_fused_core_falls_back_to_the_loop_under_autocast() -> None:
    core = make_core("ur_lstm", 3, 4)
    x = torch.randn(5, 2, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, (h, c) = core(x, core.initial_state(2))
    y.float().sum().backward()
    assert y.shape == (5, 2, 4) and torch.isfinite(core.weight_hh.grad).all()


@pytest.mark.parametrize("name", ["lstm", "ur_lstm", "rel_lstm"])
def test_fused_cores_run_on_the_meta_device(name: str) -> None:
    """The memory bench measures graphs on ``meta``, where autocast's check raises."""
    core = make_core(name, 3, 4).to("meta")
    y, _ = core(torch.empty(5, 2, 3, device="meta"), core.initial_state(2, "meta"))
    assert y.shape == (5, 2, 4) and y.device.type == "meta"


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_fast_gate_slope_paths_agree(threads: int) -> None:
    # the fast gate's slope is computed per chunk of steps with ops ATen may split across
    # threads; with 1 and 2 threads it must equal the reference loop, also where sinh
    # saturates the gate
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(0)
        fused = make_core("fast_lstm", 3, 6, impl="fused").double()
        loop = make_core("fast_lstm", 3, 6, impl="loop").double()
        loop.load_state_dict(fused.state_dict())
        x = torch.randn(7, 4, 3, dtype=torch.float64) * 30.0  # pushes some |a_f| past 10
        grads = []
        for core in (fused, loop):
            xs = x.clone().requires_grad_(True)
            y, _ = core(xs, core.initial_state(4))
            y.sum().backward()
            grads.append((xs.grad, *[p.grad for p in core.parameters()]))
        for a, b in zip(*grads, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b)
    finally:
        torch.set_num_threads(previous)


# ---------------------------------------------------------------------------- fast tanh
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("numel", [64, 4 * 8192])  # below and above the sigmoid threshold
def test_fast_tanh_matches_torch_tanh_in_value_and_gradient(dtype, numel: int) -> None:
    torch.manual_seed(0)
    z = (torch.randn(numel, dtype=dtype) * 4).requires_grad_(True)
    y = fast_tanh.tanh(z)
    via = fast_tanh.via_sigmoid(z.device, numel)
    assert via == (fast_tanh._AVX2 or numel >= fast_tanh.SIGMOID_FROM)
    assert (y.grad_fn.name() == "_TanhViaSigmoidBackward") == via
    grad = torch.randn(numel, dtype=dtype)
    (dz,) = torch.autograd.grad(y, z, grad)
    z_ref = z.detach().clone().requires_grad_(True)
    y_ref = torch.tanh(z_ref)
    (dz_ref,) = torch.autograd.grad(y_ref, z_ref, grad)
    tol = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=0, atol=1e-14)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(dz, dz_ref, **tol)
    assert y.abs().max() <= 1  # saturates at +-1, never past it


def test_bench_tanh_routes_prints_and_records_each_shape(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    from memcores.experiments.bench import cores as bench
    from memcores.experiments.bench.record import read_record

    assert bench.main(["--quick", "--tanh", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    rows = [line.split() for line in lines if not line.startswith("wrote ")]
    assert [row[0] for row in rows] == ["x".join(map(str, s)) for s in bench.TANH_SHAPES]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in rows)
    (table,) = read_record(tmp_path)["tables"]
    assert [(r[0], r[2], r[3]) for r in table["rows"]] == [(r[0], r[2], r[3]) for r in rows]
