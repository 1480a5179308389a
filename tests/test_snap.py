"""The LRU paper's linear RNN and GRU blocks under multi-layer SnAp-1 (cores/snap.py): the
scan against a direct transcription of the forward traces in float64, exactness where SnAp-1
is exact, and a run in the RL trainer."""

from __future__ import annotations

import pytest
import torch
from rl_helpers import tiny_config

from memcores.agents.rl_trainer import train
from memcores.cores import make_core
from memcores.cores.snap import (
    BlockGRUCore,
    GRURecurrence,
    LinearRecurrence,
    LinearRNNCore,
    _SnAp1Scan,
)

F64 = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


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
