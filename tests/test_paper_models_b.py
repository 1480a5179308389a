"""The papers' remaining models (part b): RelRNN and Algorithm 2's screening, the gated
power-law rule, and the LRU paper's linear RNN and GRU blocks under multi-layer SnAp-1.

Equations are checked in float64 against direct transcriptions written here, step by step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from rl_helpers import tiny_config

from agents.rl_trainer import train
from cores import CORES, make_core
from cores.rel_lstm import RelLSTM, RelRNN
from cores.snap import (
    BlockGRUCore,
    GRURecurrence,
    LinearRecurrence,
    LinearRNNCore,
    _SnAp1Scan,
)

F64 = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


# ============================================================================ SnAp-1
def _layer(kind: str, seed: int = 0) -> LinearRecurrence | GRURecurrence:
    torch.manual_seed(seed)
    layer = LinearRecurrence(3, 4) if kind == "linear" else GRURecurrence(3)
    layer = layer.double()
    with torch.no_grad():  # non-zero biases so every term of the GRU's Jacobian matters
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


@pytest.mark.parametrize("kind", ["linear", "gru"])
def test_jacobian_diagonal_matches_autograd(kind) -> None:
    layer = _layer(kind)
    n = layer.state_size
    u, h = torch.randn(3, dtype=F64), torch.randn(n, dtype=F64)
    jac = torch.autograd.functional.jacobian(lambda hp: layer.cell(u, hp), h)
    torch.testing.assert_close(layer.jacobian_diag(u, h), torch.diagonal(jac))


def _grad(y: torch.Tensor, params: list) -> tuple[torch.Tensor, ...]:
    """``dy/dparams``, zeros for parameters ``y`` does not depend on."""
    return torch.autograd.grad(y, params, retain_graph=True, materialize_grads=True)


def _snap1_by_traces(layer, u, keep, weights):
    """Direct transcription of SnAp-1 for one layer and the loss ``sum_t w_t . h_t``: forward
    traces ``M_t = diag(d_t) M_{t-1} + I_t`` (``d_t`` from autograd's full Jacobian, ``I_t``
    the immediate Jacobian wrt every parameter), gradient ``sum_t w_t^T M_t``."""
    params = list(layer.parameters())
    sizes = [p.numel() for p in params]
    T, B = u.shape[:2]
    n = layer.state_size
    grads = torch.zeros(sum(sizes), dtype=F64)
    for b in range(B):
        h = torch.zeros(n, dtype=F64)
        m = torch.zeros(n, sum(sizes), dtype=F64)
        for t in range(T):
            if keep is not None and keep[t, b] == 0:
                h, m = torch.zeros_like(h), torch.zeros_like(m)
            u_tb = u[t, b]
            jac_h = torch.autograd.functional.jacobian(lambda hp, v=u_tb: layer.cell(v, hp), h)

            h_new = layer.cell(u[t, b], h)  # h_{t-1} constant: the immediate partials
            imm = torch.stack(
                [torch.cat([g.reshape(-1) for g in _grad(h_new[i], params)]) for i in range(n)]
            )
            m = torch.diagonal(jac_h).unsqueeze(1) * m + imm
            h = layer.cell(u[t, b], h).detach()
            grads += weights[t, b] @ m
    return [g.view_as(p) for g, p in zip(grads.split(sizes), params, strict=True)]


@pytest.mark.parametrize("kind", ["linear", "gru"])
@pytest.mark.parametrize("with_reset", [False, True])
def test_snap1_scan_equals_forward_trace_transcription(kind, with_reset) -> None:
    layer = _layer(kind)
    T, B = 6, 2
    g = torch.Generator().manual_seed(3)
    u = torch.randn(T, B, 3, dtype=F64, generator=g)
    w = torch.randn(T, B, layer.state_size, dtype=F64, generator=g)
    keep = None
    if with_reset:
        keep = torch.ones(T, B, dtype=F64)
        keep[3, 1] = 0.0
    h0 = torch.zeros(B, layer.state_size, dtype=F64)
    h = _SnAp1Scan.apply(layer, "snap1", u, h0, keep, *layer.scan_parameters())
    got = torch.autograd.grad((h * w).sum(), layer.scan_parameters())
    want = _snap1_by_traces(layer, u, keep, w)
    by_name = dict(zip([id(p) for p in layer.parameters()], want, strict=True))
    for p, gp in zip(layer.scan_parameters(), got, strict=True):
        torch.testing.assert_close(gp, by_name[id(p)], rtol=1e-10, atol=1e-12)


def _net(cls, layers: int, grad: str, seed: int = 0, **kw):
    torch.manual_seed(seed)
    core = cls(3, 6, layers=layers, grad=grad, **kw).double()
    decoder = torch.nn.Linear(6, 2).double()
    return core, decoder


def _grads(core, decoder, x, target, starts=None) -> dict[str, torch.Tensor]:
    core.train()
    core.zero_grad(set_to_none=True)
    decoder.zero_grad(set_to_none=True)
    y, _ = core(x, core.initial_state(x.shape[1]), starts)
    ((decoder(y) - target) ** 2).sum().backward()
    named = [*core.named_parameters(), *(("dec." + n, p) for n, p in decoder.named_parameters())]
    return {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p) for n, p in named}


def _both(cls, layers, T, seed=0, prepare=None, **kw):
    g = torch.Generator().manual_seed(seed + 10)
    x = torch.randn(T, 2, 3, dtype=F64, generator=g)
    target = torch.randn(T, 2, 2, dtype=F64, generator=g)
    out = {}
    for mode in ("bptt", "snap1"):
        core, dec = _net(cls, layers, mode, seed, **kw)
        if prepare is not None:
            prepare(core)
        out[mode] = _grads(core, dec, x, target)
    return out["bptt"], out["snap1"]


def _diagonalise(core) -> None:
    """Zero the off-diagonal recurrent weights: every layer becomes independent modules."""
    with torch.no_grad():
        for block in core.blocks:
            layer = block.layer
            for w in [layer.A] if isinstance(layer, LinearRecurrence) else layer.weight_hh.chunk(3):
                w.copy_(torch.diag(torch.diagonal(w)))


LAYER_EXACT = ("layer.", "glu.", "dec.")  # exact in a single block; LN and encoder are upstream


@pytest.mark.parametrize("cls", [LinearRNNCore, BlockGRUCore])
def test_snap1_exact_for_one_block_with_diagonal_recurrence(cls) -> None:
    bptt, snap = _both(cls, layers=1, T=7, prepare=_diagonalise)
    for name in bptt:
        if any(k in name for k in LAYER_EXACT):
            assert _rel(snap[name], bptt[name]) < 1e-10, name
    # upstream of the recurrence the spatial error is an approximation
    assert _rel(snap["encoder.weight"], bptt["encoder.weight"]) > 1e-3


@pytest.mark.parametrize("cls", [LinearRNNCore, BlockGRUCore])
def test_snap1_is_approximate_with_dense_recurrence(cls) -> None:
    bptt, snap = _both(cls, layers=1, T=7)
    recurrent = "blocks.0.layer.A" if cls is LinearRNNCore else "blocks.0.layer.weight_hh"
    assert _rel(snap[recurrent], bptt[recurrent]) > 1e-3
    for name in ("blocks.0.glu.weight", "dec.weight"):  # after the recurrence: still exact
        assert _rel(snap[name], bptt[name]) < 1e-10, name


@pytest.mark.parametrize("cls", [LinearRNNCore, BlockGRUCore])
def test_snap1_exact_for_a_single_step(cls) -> None:
    bptt, snap = _both(cls, layers=2, T=1)
    for name in bptt:
        assert _rel(snap[name], bptt[name]) < 1e-10, name
    bptt, snap = _both(cls, layers=2, T=5)  # two layers, several steps: not exact
    assert _rel(snap["blocks.0.norm.weight"], bptt["blocks.0.norm.weight"]) > 1e-3


@pytest.mark.parametrize("cls", [LinearRNNCore, BlockGRUCore])
def test_modes_share_the_forward_and_spatial_freezes_recurrent_weights(cls) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 3, dtype=F64, generator=g)
    starts = torch.zeros(5, 2, dtype=torch.bool)
    starts[2, 0] = True
    outs, grads = [], {}
    for mode in ("bptt", "snap1", "truncated", "spatial"):
        core, dec = _net(cls, 2, mode)
        outs.append(core(x, core.initial_state(2), starts)[0])
        grads[mode] = _grads(core, dec, x, torch.zeros(5, 2, 2, dtype=F64), starts)
    for y in outs[1:]:
        torch.testing.assert_close(y, outs[0])
    rec = "blocks.1.layer.A" if cls is LinearRNNCore else "blocks.1.layer.weight_hh"
    assert grads["spatial"][rec].abs().max() == 0.0
    assert grads["truncated"][rec].abs().max() > 0.0
    assert _rel(grads["truncated"][rec], grads["snap1"][rec]) > 1e-6
    inp = "blocks.1.layer.B" if cls is LinearRNNCore else "blocks.1.layer.weight_ih"
    torch.testing.assert_close(grads["spatial"][inp], grads["truncated"][inp])


def test_parameter_counts_match_the_paper_and_bad_options() -> None:
    """Table 5: 267,956 (linear RNN, H=146, N=64) and 270,011 (4-layer GRU, H=91), counting
    an 8-input encoder and a 14-logit decoder as the paper does."""

    def count(core, h):
        return sum(p.numel() for p in core.parameters()) + h * 14 + 14

    assert count(make_core("linear_rnn", 8, 146), 146) == 267_956
    assert count(make_core("block_gru", 8, 91), 91) == 270_011
    with pytest.raises(ValueError, match="bptt, snap1, truncated, spatial"):
        make_core("linear_rnn", 4, 8, grad="online")
    with pytest.raises(ValueError, match="valid options"):
        make_core("block_gru", 4, 8, state_size=3)


@pytest.mark.parametrize("core", ["linear_rnn", "block_gru"])
def test_snap1_runs_in_the_rl_trainer(tmp_path, core) -> None:
    config = tiny_config(
        f"core.name={core}", "core.grad=snap1", "core.layers=2", "train.total_steps=64"
    )
    result = train(config, tmp_path / "run")
    assert result.updates == 1


# ============================================================================ power law
def _tied_lstm_step(core, x, h, c, r):
    """Transcription: gate-tied LSTM with the gated power rule on the cell."""
    H = core.hidden_size
    a = x @ core.weight_ih.T + core.bias + h @ core.weight_hh.T
    blocks = dict(zip(core.gate_names, a.split(H, dim=-1), strict=True))
    f = torch.sigmoid(blocks["f"])
    o = torch.sigmoid(blocks["o"])
    u = torch.tanh(blocks["u"])
    c = (c - (1 - f) * c.abs() ** r * c + (1 - f) * u).clamp(-1, 1)
    return o * torch.tanh(c), c


def _gru_step(core, x, h, r):
    H = core.hidden_size
    ax = x @ core.weight_ih.T + core.bias
    ah = h @ core.weight_hh.T
    blocks = dict(zip(core.gate_names, range(len(core.gate_names)), strict=True))

    def blk(t, name):
        return t[..., blocks[name] * H : (blocks[name] + 1) * H]

    z = torch.sigmoid(blk(ax, "z") + blk(ah, "z"))
    rr = torch.sigmoid(blk(ax, "r") + blk(ah, "r"))
    n = torch.tanh(blk(ax, "n") + rr * (blk(ah, "n") + core.bias_hn))
    return (h - (1 - z) * h.abs() ** r * h + (1 - z) * n).clamp(-1, 1)


@pytest.mark.parametrize("r", [2.0, 1.5])
def test_power_lstm_and_gru_equal_their_transcription(r) -> None:
    torch.manual_seed(0)
    lstm = make_core("tied_lstm", 3, 5, power=r).double()
    gru = make_core("gru", 3, 5, power=r).double()
    x = 3 * torch.randn(9, 2, 3, dtype=F64)  # large inputs: gates near 0 and 1, the clip acts
    starts = torch.zeros(9, 2, dtype=torch.bool)
    starts[4, 1] = True
    y, (h_last, c_last) = lstm(x, lstm.initial_state(2), starts)
    yg, (hg_last,) = gru(x, gru.initial_state(2), starts)
    h = c = hg = torch.zeros(2, 5, dtype=F64)
    for t in range(9):
        keep = (~starts[t]).to(F64).unsqueeze(1)
        h, c, hg = h * keep, c * keep, hg * keep
        h, c = _tied_lstm_step(lstm, x[t], h, c, r)
        hg = _gru_step(gru, x[t], hg, r)
        torch.testing.assert_close(y[t], h)
        torch.testing.assert_close(yg[t], hg)
    torch.testing.assert_close(c_last, c)
    torch.testing.assert_close(hg_last, hg)


def test_power_presets_and_zero_power_is_the_ordinary_cell() -> None:
    assert make_core("power_lstm", 3, 4).power == 2.0 and make_core("power_gru", 3, 4).power == 2.0
    with pytest.raises(ValueError, match="fixed"):
        make_core("power_lstm", 3, 4, power=1.0)
    with pytest.raises(ValueError, match="power must be >= 0"):
        make_core("gru", 3, 4, power=-1.0)
    x = torch.randn(6, 2, 3, dtype=F64)
    for name in ("tied_lstm", "gru"):
        torch.manual_seed(1)
        plain = make_core(name, 3, 4).double()
        torch.manual_seed(1)
        zero = make_core(name, 3, 4, power=0.0).double()
        y_zero = zero(x, zero.initial_state(2))[0]
        torch.testing.assert_close(y_zero, plain(x, plain.initial_state(2))[0])


def test_power_decay_is_polynomial_without_input() -> None:
    """Free decay (candidate u = 0, constant forget gate f): the linear cell decays as f^t,
    the power cell as ~ t^(-1/r)."""
    core = make_core("power_lstm", 1, 1).double()
    with torch.no_grad():
        core.weight_ih.zero_()
        core.weight_hh.zero_()
        core.bias.zero_()
        core.bias[core._block("f")] = 2.0  # f = sigma(2) ~ 0.88
        core.bias[core._block("u")] = 0.0  # u = 0: no new input
    h0 = (torch.zeros(1, 1, dtype=F64), torch.full((1, 1), 0.9, dtype=F64))
    _, (_, c) = core(torch.zeros(2000, 1, 1, dtype=F64), h0)
    k = 1 - 1 / (1 + math.exp(-2.0))
    assert c.item() == pytest.approx((2 * k * 2000) ** -0.5, rel=0.05)  # c ~ (2 k t)^(-1/2)
    assert c.item() > 1e3 * (1 - k) ** 2000


# ============================================================================ RelRNN
def _algorithm2(core: RelLSTM, x: torch.Tensor) -> torch.Tensor:
    """Transcription of Algorithm 2 for a RelRNN, one batch row at a time (python lists)."""
    T, B, _ = x.shape
    H = core.hidden_size
    lag = core.rho if core.screen == "rho" else core.nu
    out = torch.zeros(T, B, H, dtype=F64)
    V, U, b = core.recurrent.weight, core.input_proj.weight, core.input_proj.bias
    Wa, Ua, v = core.query.weight, core.key.weight, core.score.weight[0]
    ba = core.key.bias if core.key.bias is not None else torch.zeros(H, dtype=F64)
    for row in range(B):
        s = torch.zeros(H, dtype=F64)
        history: list[list] = []  # [h_i, beta_i] for every past step i
        relevant: list[list] = []
        for t in range(T):
            h = torch.tanh(V @ s + U @ x[t, row] + b)  # line 2
            if core.rho > 0 and t - lag >= 0:  # lines 6-7: screen h_{t-lag}
                cand = history[t - lag]
                if len(relevant) < core.rho:
                    relevant.append(list(cand))
                else:
                    low = min(range(len(relevant)), key=lambda j: relevant[j][1])
                    if cand[1] > relevant[low][1]:
                        relevant[low] = list(cand)
            history.append([h, 0.0])  # line 3
            window = history[max(0, t - core.nu + 1) :]  # lines 4-5
            memory = [w[0] for w in window] + [r_[0] for r_ in relevant]  # line 8
            e = torch.stack([v @ torch.tanh(Wa @ s + Ua @ m + ba) for m in memory])  # line 10
            z = torch.softmax(e, 0)  # line 11
            for w, a in zip(window, z[: len(window)], strict=False):
                w[1] += float(a.detach())  # beta: attention received while buffered
            s = h + sum(a * m for a, m in zip(z, memory, strict=True))  # line 12
            out[t, row] = s
    return out


@pytest.mark.parametrize(
    "nu, rho, screen, key_bias",
    [(2, 4, "rho", True), (4, 2, "rho", False), (2, 4, "exit", True), (3, 3, "rho", True)],
)
def test_rel_rnn_follows_algorithm_2(nu, rho, screen, key_bias) -> None:
    torch.manual_seed(0)
    core = make_core("rel_rnn", 2, 3, nu=nu, rho=rho, screen=screen, key_bias=key_bias).double()
    with torch.no_grad():
        core.key.weight.mul_(3.0)  # sharper attention: screening decisions differ by state
        if key_bias:
            core.key.bias.normal_()
    x = torch.randn(14, 3, 2, dtype=F64)
    y, _ = core(x, core.initial_state(3))
    torch.testing.assert_close(y, _algorithm2(core, x), rtol=1e-10, atol=1e-12)
    assert (core.key.bias is not None) == key_bias


def test_screen_rho_and_exit_differ_only_when_nu_differs_from_rho() -> None:
    x = torch.randn(20, 4, 2, dtype=F64)

    def run(nu, rho, screen):
        torch.manual_seed(0)
        core = RelRNN(2, 3, nu=nu, rho=rho, screen=screen).double()
        with torch.no_grad():
            core.key.weight.mul_(3.0)
        y, state = core(x, core.initial_state(4))
        return y, dict(zip(RelRNN.STATE_NAMES, state, strict=True))

    y_rho, _ = run(3, 3, "rho")
    y_exit, _ = run(3, 3, "exit")
    torch.testing.assert_close(y_rho, y_exit)
    y_rho, st = run(2, 5, "rho")
    y_exit, st_exit = run(2, 5, "exit")
    assert st["buffer"].shape[1] == 5 and st_exit["buffer"].shape[1] == 2
    assert not torch.allclose(y_rho, y_exit)


def test_rel_rnn_modrelu_and_options() -> None:
    core = make_core("rel_rnn", 2, 3, nonlinearity="modrelu").double()
    assert core.modrelu_bias is not None and len(core.STATE_NAMES) == 8
    x = torch.randn(4, 1, 2, dtype=F64)
    core(x, core.initial_state(1))[0].sum().backward()
    assert core.modrelu_bias.grad is not None
    assert make_core("rel_rnn", 2, 3).modrelu_bias is None
    with pytest.raises(ValueError, match="tanh, modrelu"):
        make_core("rel_rnn", 2, 3, nonlinearity="relu")
    with pytest.raises(ValueError, match="rho, exit"):
        make_core("rel_lstm", 2, 3, screen="first")


# ============================================================================ sb3 + registry
NEW_CORES = ("rel_rnn", "power_lstm", "power_gru", "linear_rnn", "block_gru")


def test_new_cores_are_registered() -> None:
    assert set(NEW_CORES) <= set(CORES)


@pytest.mark.parametrize(
    "core, options",
    [("rel_rnn", {}), ("power_lstm", {}), ("block_gru", {"grad": "snap1", "layers": 1})],
)
def test_recurrent_ppo_runs_new_cores(core, options) -> None:
    from rl_helpers import sb3_recurrent_ppo

    model = sb3_recurrent_ppo(core, hidden_size=8, core_options=options)
    vec = model.get_env()
    before = [p.detach().clone() for p in model.policy.lstm_actor.parameters()]
    model.learn(32)
    after = list(model.policy.lstm_actor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    actions, _ = model.predict(vec.reset(), episode_start=np.ones(2, dtype=bool))
    assert actions.shape == (2,)
    vec.close()


# ============================================================================ configs
@pytest.mark.parametrize(
    "path, overrides, expected",
    [
        ("experiments/configs/snap1_pattern_copy.yaml", [], {"grad": "snap1", "state_size": 64}),
        (
            "experiments/configs/snap1_pattern_copy.yaml",
            ["core.name=block_gru", "core.hidden_size=91", "core.grad=bptt"],
            {"grad": "bptt", "hidden_size": 91},
        ),
        ("experiments/configs/rel_copy.yaml", ["core.name=rel_rnn"], {"screen": "exit"}),
        ("experiments/configs/adding.yaml", ["core.name=power_lstm"], {"power": 2.0}),
    ],
)
def test_documented_configs_build(path, overrides, expected) -> None:
    from agents.supervised import build_model, build_task
    from agents.supervised_config import SupervisedConfig
    from experiments.config import load_config

    config = load_config(SupervisedConfig, path, overrides)
    core = build_model(config, build_task(config)).core
    assert {k: getattr(core, k) for k in expected} == expected
