"""minGRU and minLSTM (Feng et al., "Were RNNs All We Needed?", arXiv:2410.01201) pinned by
hand: the candidate activation and its slope, the constructor's defaults, checks and forget
bias, and steps of one and two layers (D = 1, H = 2) written out with ``math`` in float64,
through the fused scan (both CPU scans, blocks of 16 steps included) and the step form; the
fused backward against finite differences."""

from __future__ import annotations

import math

import pytest
import torch

from memcores.cores import make_core
from memcores.cores.min_rnn import (
    CHUNK,
    MinGRU,
    MinLSTM,
    _candidate_parts,
    _MinRNNScan,
    candidate,
)

F64 = torch.float64
_W = {"gru": (1.0, -1.0, 2.0, -0.5), "lstm": (1.0, -1.0, 0.5, 2.0, 2.0, -0.5)}
_B = {"gru": (0.0, 0.5, -1.0, 0.25), "lstm": (0.3, 0.5, -0.2, 0.1, -1.0, 0.25)}
"""Layer-1 projections (D = 1, H = 2) of the hand cores: rows z, z, h~, h~ (minGRU) and
f, f, i, i, h~, h~ (minLSTM)."""
_W2 = {"gru": ((0.5, 0.0), (0.0, -1.0), (1.0, 0.5), (-0.5, 1.0)), "lstm": None}
_B2 = {"gru": (0.1, -0.2, 0.3, 0.0), "lstm": None}
"""Layer-2 projection (2 -> 2) of the two-layer minGRU."""


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def _g(z: float) -> float:
    """The paper's candidate activation: z + 1/2 for z >= 0, sigma(z) below."""
    return z + 0.5 if z >= 0 else _sigmoid(z)


def _hand_step(kind: str, h: list[float], k: list[float]) -> list[float]:
    """One step from the projection ``k`` (2 or 3 blocks of 2): minGRU
    h = (1 - z) h + z g(k_h); minLSTM h = f/(f+i) h + i/(f+i) g(k_h)."""
    if kind == "gru":
        z = [_sigmoid(k[j]) for j in range(2)]
        return [(1 - z[j]) * h[j] + z[j] * _g(k[2 + j]) for j in range(2)]
    f = [_sigmoid(k[j]) for j in range(2)]
    i = [_sigmoid(k[2 + j]) for j in range(2)]
    return [(f[j] * h[j] + i[j] * _g(k[4 + j])) / (f[j] + i[j]) for j in range(2)]


def _layer1(kind: str, x: float) -> list[float]:
    return [w * x + b for w, b in zip(_W[kind], _B[kind], strict=True)]


def _layer_norm2(y: list[float]) -> list[float]:
    """LayerNorm of 2 units at its initial affine (1, 0): (y - mean) / sqrt(var + 1e-5)."""
    mean = (y[0] + y[1]) / 2
    var = ((y[0] - mean) ** 2 + (y[1] - mean) ** 2) / 2
    return [(v - mean) / math.sqrt(var + 1e-5) for v in y]


_NORMS = (((1.0, 1.0), (0.0, 0.0)), ((2.0, -1.0), (0.5, 0.0)))
"""(weight, bias) of the LayerNorm before layers 2 and 3 of the hand cores."""


def _hand_core(kind: str, layers: int = 1, scan: str = "auto") -> MinGRU | MinLSTM:
    """Layer 1 from :data:`_W`, :data:`_B`; every later layer from :data:`_W2`, :data:`_B2`
    with the LayerNorm affines of :data:`_NORMS`."""
    cls = MinGRU if kind == "gru" else MinLSTM
    core = cls(1, 2, layers=layers, scan=scan).double()
    with torch.no_grad():
        proj = core.cells[0].proj
        proj.weight.copy_(torch.tensor(_W[kind], dtype=F64).unsqueeze(1))
        proj.bias.copy_(torch.tensor(_B[kind], dtype=F64))
        for cell, norm, (weight, bias) in zip(core.cells[1:], core.norms, _NORMS, strict=False):
            cell.proj.weight.copy_(torch.tensor(_W2[kind], dtype=F64))
            cell.proj.bias.copy_(torch.tensor(_B2[kind], dtype=F64))
            norm.weight.copy_(torch.tensor(weight, dtype=F64))
            norm.bias.copy_(torch.tensor(bias, dtype=F64))
    return core


def _hand_sequence(kind, xs, h0, starts, layers=1):
    """Outputs [T][B] and final states per layer, every number from the functions above:
    layer l > 1 reads w_l * LayerNorm(y) + b_l and adds its h to y."""
    states = [[list(h) for h in layer] for layer in h0]
    ys = []
    for t, x_t in enumerate(xs):
        row_ys = []
        for b, x in enumerate(x_t):
            if starts is not None and starts[t][b]:
                for layer in states:
                    layer[b] = [0.0, 0.0]
            h = _hand_step(kind, states[0][b], _layer1(kind, x))
            states[0][b] = h
            y = h
            for layer in range(1, layers):
                weight, bias = _NORMS[layer - 1]
                n = [v * w + c for v, w, c in zip(_layer_norm2(y), weight, bias, strict=True)]
                k = [
                    sum(w * v for w, v in zip(row, n, strict=True)) + c
                    for row, c in zip(_W2[kind], _B2[kind], strict=True)
                ]
                h2 = _hand_step(kind, states[layer][b], k)
                states[layer][b] = h2
                y = [y[j] + h2[j] for j in range(2)]
            row_ys.append(y)
        ys.append(row_ys)
    return ys, states


def test_candidate_and_its_slope_by_hand() -> None:
    """g(z) = sigma(z) below 0 and z + 1/2 from 0 on; g' = sigma(z)(1 - sigma(z)) below 0 and
    1 from 0 on (the right derivative at 0, in both forms)."""
    z = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=F64, requires_grad=True)
    g_want = [_sigmoid(-2.0), _sigmoid(-0.5), 0.5, 1.0, 3.5]
    s = [_sigmoid(-2.0), _sigmoid(-0.5)]
    slope_want = [s[0] * (1 - s[0]), s[1] * (1 - s[1]), 1.0, 1.0, 1.0]
    g = candidate(z)
    torch.testing.assert_close(g, torch.tensor(g_want, dtype=F64))
    (grad,) = torch.autograd.grad(g.sum(), z)
    torch.testing.assert_close(grad, torch.tensor(slope_want, dtype=F64))
    values, slope = _candidate_parts(z.detach())
    torch.testing.assert_close(values, torch.tensor(g_want, dtype=F64))
    torch.testing.assert_close(slope, torch.tensor(slope_want, dtype=F64))
    assert slope.dtype == F64


def test_defaults_shapes_and_forget_bias() -> None:
    """One layer and scan 'auto' by default; layer 1 maps D -> (G + 1) H, later layers
    H -> (G + 1) H with a LayerNorm before each; minLSTM's forget bias is 1."""
    gru, lstm = MinGRU(3, 2), MinLSTM(3, 2)
    for core, blocks in ((gru, 2), (lstm, 3)):
        assert core.scan == "auto" and len(core.cells) == 1 and len(core.norms) == 0
        assert core.state_arity == 1
        assert core.cells[0].proj.weight.shape == (blocks * 2, 3)
    deep = MinLSTM(3, 2, layers=3, scan="parallel")
    assert deep.scan == "parallel" and deep.state_arity == 3
    assert [c.proj.weight.shape for c in deep.cells] == [(6, 3), (6, 2), (6, 2)]
    assert len(deep.norms) == 2 and all(n.normalized_shape == (2,) for n in deep.norms)
    for cell in deep.cells:
        assert torch.equal(cell.proj.bias[:2].detach(), torch.ones(2))
        assert cell.proj.bias[2:].abs().max() < 1.0  # nn.Linear's bound for the rest
    assert not torch.equal(gru.cells[0].proj.bias[:2].detach(), torch.ones(2))
    assert (gru.cells[0].kind, lstm.cells[0].kind) == ("gru", "lstm")
    assert (gru.cells[0].gates, lstm.cells[0].gates) == (1, 2)


def test_bad_options_are_refused_with_exact_messages() -> None:
    for layers in (0, -1):
        with pytest.raises(ValueError, match=rf"^layers must be positive, got {layers}$"):
            MinGRU(3, 2, layers=layers)
    with pytest.raises(
        ValueError, match=r"^unknown scan 'magic'; valid: auto, parallel, sequential, triton$"
    ):
        MinLSTM(3, 2, scan="magic")
    assert len(MinGRU(3, 2, layers=1).cells) == 1


def test_initial_state_is_one_zero_tensor_per_layer() -> None:
    core = MinGRU(3, 2, layers=2).double()
    state = core.initial_state(4)
    assert len(state) == 2
    for s in state:
        assert torch.equal(s, torch.zeros(4, 2, dtype=F64))
    meta = core.initial_state(3, "meta")
    assert all(s.device.type == "meta" and s.shape == (3, 2) for s in meta)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_one_step_by_hand(kind: str) -> None:
    """x = 2 from h = (0.5, -1): minGRU k = (2, -1.5, 3, -0.75); minLSTM k = (2.3, -1.5,
    0.8, 4.1, 3, -0.75) (layer 1's projection), through step and both CPU scans."""
    k = {"gru": [2.0, -1.5, 3.0, -0.75], "lstm": [2.3, -1.5, 0.8, 4.1, 3.0, -0.75]}[kind]
    assert _layer1(kind, 2.0) == pytest.approx(k)
    want = _hand_step(kind, [0.5, -1.0], k)
    if kind == "gru":
        z0, z1 = _sigmoid(2.0), _sigmoid(-1.5)
        assert want == pytest.approx(
            [(1 - z0) * 0.5 + z0 * 3.5, (1 - z1) * -1.0 + z1 * _sigmoid(-0.75)]
        )
    h0 = torch.tensor([[0.5, -1.0]], dtype=F64)
    x = torch.tensor([[2.0]], dtype=F64)
    for scan in ("sequential", "parallel", "auto"):
        core = _hand_core(kind, scan=scan)
        y, (h,) = core(x.unsqueeze(0), (h0,))
        torch.testing.assert_close(y[0], torch.tensor([want], dtype=F64))
        torch.testing.assert_close(h, y[0])
        y_step, (h_step,) = core.step(x, (h0,))
        torch.testing.assert_close(y_step, torch.tensor([want], dtype=F64))
        torch.testing.assert_close(h_step, y_step)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("scan", ["sequential", "parallel"])
def test_sequence_carries_the_state_and_resets_at_episode_starts(kind: str, scan: str) -> None:
    """Three steps, two rows from a nonzero h0: row 0 carries h, row 1 restarts from 0 at
    step 1; without starts (or all-false ones) nothing resets."""
    core = _hand_core(kind, scan=scan)
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25)]
    starts = [[False, False], [False, True], [False, False]]
    h0 = [[[0.5, -1.0], [0.3, 0.7]]]
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    state = (torch.tensor(h0[0], dtype=F64),)
    for flags in (starts, None, [[False, False]] * 3):
        ys, states = _hand_sequence(kind, xs, h0, flags)
        mask = None if flags is None else torch.tensor(flags)
        y, (h,) = core(x, state, mask)
        torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
        torch.testing.assert_close(h, torch.tensor(states[0], dtype=F64))
    free, _ = _hand_sequence(kind, xs, h0, None)
    reset, _ = _hand_sequence(kind, xs, h0, starts)
    assert free[1][1] != pytest.approx(reset[1][1])  # the reset changes row 1


@pytest.mark.parametrize("scan", ["sequential", "parallel"])
def test_two_layers_by_hand(scan: str) -> None:
    """Layer 2 reads LayerNorm(y) and adds its h to y (the residual block); each layer keeps
    its own state, and a start resets both."""
    core = _hand_core("gru", layers=2, scan=scan)
    xs = [(2.0, -1.0), (0.5, 1.5), (-1.0, 0.25)]
    starts = [[False, False], [False, True], [False, False]]
    h0 = [[[0.5, -1.0], [0.3, 0.7]], [[-0.2, 0.4], [0.6, -0.1]]]
    ys, states = _hand_sequence("gru", xs, h0, starts, layers=2)
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    state = tuple(torch.tensor(layer, dtype=F64) for layer in h0)
    y, final = core(x, state, torch.tensor(starts))
    torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
    for got, want in zip(final, states, strict=True):
        torch.testing.assert_close(got, torch.tensor(want, dtype=F64))
    y1, s1 = core.step(x[0], state)
    torch.testing.assert_close(y1, torch.tensor(ys[0], dtype=F64))
    for got, want in zip(s1, _hand_sequence("gru", xs[:1], h0, None, layers=2)[1], strict=True):
        torch.testing.assert_close(got, torch.tensor(want, dtype=F64))


@pytest.mark.parametrize("scan", ["sequential", "parallel"])
def test_three_layers_read_their_own_layer_norms(scan: str) -> None:
    """Layer 2 reads the first LayerNorm and layer 3 the second (different affines)."""
    core = _hand_core("gru", layers=3, scan=scan)
    xs = [(2.0, -1.0), (0.5, 1.5)]
    h0 = [[[0.5, -1.0], [0.3, 0.7]], [[-0.2, 0.4], [0.6, -0.1]], [[0.1, 0.1], [-0.3, 0.2]]]
    ys, states = _hand_sequence("gru", xs, h0, None, layers=3)
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    state = tuple(torch.tensor(layer, dtype=F64) for layer in h0)
    y, final = core(x, state)
    torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
    for got, want in zip(final, states, strict=True):
        torch.testing.assert_close(got, torch.tensor(want, dtype=F64))
    y1, _ = core.step(x[0], state)
    torch.testing.assert_close(y1, torch.tensor(ys[0], dtype=F64))


def test_step_refuses_a_state_of_the_wrong_length() -> None:
    """One state tensor per layer: step() does not drop or ignore any."""
    core = MinGRU(1, 2, layers=2).double()
    x = torch.zeros(1, 1, dtype=F64)
    h = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is shorter than argument 1$"):
        core.step(x, (h,))
    with pytest.raises(ValueError, match=r"^zip\(\) argument 2 is longer than argument 1$"):
        core.step(x, (h, h, h))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_fused_layer_over_zero_steps_is_empty(kind: str, method: str) -> None:
    """No steps: an empty [0, B, H] sequence, for either scan."""
    blocks = 2 if kind == "gru" else 3
    k = torch.zeros(0, 3, blocks * 2, dtype=F64)
    h = _MinRNNScan.apply(k, torch.ones(3, 2, dtype=F64), None, kind, method)
    assert h.shape == (0, 3, 2) and h.dtype == F64


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_sequences_longer_than_a_block_by_hand(kind: str) -> None:
    """CHUNK + 4 steps with the sequential scan: values across the block border from the
    hand loop, with a reset on the border's first step."""
    assert CHUNK == 16
    core = _hand_core(kind, scan="sequential")
    steps = CHUNK + 4
    xs = [(math.sin(t), math.cos(2 * t)) for t in range(steps)]
    starts = [[False, False] for _ in range(steps)]
    starts[CHUNK][0] = True
    starts[CHUNK - 1][1] = True
    h0 = [[[0.5, -1.0], [0.3, 0.7]]]
    ys, states = _hand_sequence(kind, xs, h0, starts)
    x = torch.tensor(xs, dtype=F64).unsqueeze(-1)
    y, (h,) = core(x, (torch.tensor(h0[0], dtype=F64),), torch.tensor(starts))
    torch.testing.assert_close(y, torch.tensor(ys, dtype=F64))
    torch.testing.assert_close(h, torch.tensor(states[0], dtype=F64))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_fused_backward_equals_finite_differences(kind: str, method: str) -> None:
    """The hand-written backward of the fused layer (k and h0) against central differences
    of its forward, over a block border (18 steps) with resets on and beside it."""
    steps, batch, size = CHUNK + 2, 2, 1
    gen = torch.Generator().manual_seed(3)
    blocks = 2 if kind == "gru" else 3
    k = (2 * torch.randn(steps, batch, blocks * size, generator=gen, dtype=F64)).requires_grad_()
    h0 = torch.randn(batch, size, generator=gen, dtype=F64, requires_grad=True)
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[CHUNK, 0] = starts[CHUNK - 1, 1] = starts[3, 1] = True
    keep = (~starts).to(F64).unsqueeze(-1)
    assert torch.autograd.gradcheck(
        lambda k, h0: _MinRNNScan.apply(k, h0, keep, kind, method), (k, h0), eps=1e-6
    )
    assert torch.autograd.gradcheck(
        lambda k, h0: _MinRNNScan.apply(k, h0, None, kind, method), (k, h0), eps=1e-6
    )


def test_the_registry_builds_both() -> None:
    assert type(make_core("min_gru", 3, 2)) is MinGRU
    assert type(make_core("min_lstm", 3, 2)) is MinLSTM
