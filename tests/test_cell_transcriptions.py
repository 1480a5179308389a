"""The gated LSTM and GRU cells against their equations, written out here term by term.

The reference loop (``impl="loop"``) is what every fused path and kernel is compared against,
so it is checked here against an independent transcription of the module docstrings'
equations, for each option that changes the maths (gate activation, tied input gate, refine
gate), with an episode start inside the sequence.
"""

from __future__ import annotations

import pytest
import torch

from memcores.cores.gated import GatedLSTM
from memcores.cores.gru import GatedGRU

T, B, D, H = 5, 3, 2, 4


def _phi(activation: str, z: torch.Tensor) -> torch.Tensor:
    """The gate activations of cores.gates, from their definitions."""
    if activation == "sigmoid":
        return 1 / (1 + torch.exp(-z))
    if activation == "fast":
        return 1 / (1 + torch.exp(-torch.sinh(z)))
    return 0.5 + 0.5 * z / (2 + z.abs())  # softsign


def _refined(f: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Gu et al. eq. 16: ``r (1 - (1 - f)^2) + (1 - r) f^2``."""
    return r * (1 - (1 - f) ** 2) + (1 - r) * f**2


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, D, dtype=torch.float64, generator=g)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[3, 1] = True  # row 1 restarts from zeros before step 3
    return x, starts


def _randomise(core: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in core.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=g))


@pytest.mark.parametrize(
    "activation, tied, refine",
    [
        ("sigmoid", False, False),
        ("fast", False, True),
        ("softsign", True, False),
        ("fast", True, True),
    ],
)
def test_gated_lstm_is_its_equations(activation, tied, refine):
    core = GatedLSTM(D, H, activation=activation, tied=tied, refine=refine, impl="loop").double()
    _randomise(core)
    x, starts = _inputs()
    h0 = torch.randn(B, H, dtype=torch.float64)
    c0 = torch.randn(B, H, dtype=torch.float64)
    y, (h_last, c_last) = core(x, (h0, c0), starts)

    def block(a, name):
        return a[:, core._block(name)]

    h, c = h0, c0
    for t in range(T):
        keep = (~starts[t]).double().unsqueeze(1)
        h, c = h * keep, c * keep
        a = x[t] @ core.weight_ih.T + h @ core.weight_hh.T + core.bias
        f = _phi(activation, block(a, "f"))
        g = _refined(f, torch.sigmoid(block(a, "r"))) if refine else f
        i = 1 - g if tied else torch.sigmoid(block(a, "i"))
        c = g * c + i * torch.tanh(block(a, "u"))
        h = torch.sigmoid(block(a, "o")) * torch.tanh(c)
        torch.testing.assert_close(y[t], h)
    torch.testing.assert_close(h_last, h)
    torch.testing.assert_close(c_last, c)
    # one step through step(): the same cell
    y1, (h1, c1) = core.step(x[0], (h0, c0))
    y_seq, (_, c_seq) = core(x[:1], (h0, c0))
    torch.testing.assert_close(y1, y_seq[0])
    torch.testing.assert_close(c1, c_seq)


@pytest.mark.parametrize("activation, refine", [("sigmoid", False), ("fast", True)])
def test_gated_gru_is_its_equations(activation, refine):
    core = GatedGRU(D, H, activation=activation, refine=refine, impl="loop").double()
    _randomise(core)
    x, starts = _inputs(2)
    h0 = torch.randn(B, H, dtype=torch.float64)
    y, (h_last,) = core(x, (h0,), starts)

    def block(w, name):
        return w[core._block(name)]

    h = h0
    for t in range(T):
        h = h * (~starts[t]).double().unsqueeze(1)

        def pre(name, x_t=x[t], h=h):
            return x_t @ block(core.weight_ih, name).T + h @ block(core.weight_hh, name).T

        z = _phi(activation, pre("z") + block(core.bias, "z"))
        if refine:
            z = _refined(z, torch.sigmoid(pre("q") + block(core.bias, "q")))
        r = torch.sigmoid(pre("r") + block(core.bias, "r"))
        n_x = x[t] @ block(core.weight_ih, "n").T + block(core.bias, "n")
        n = torch.tanh(n_x + r * (h @ block(core.weight_hh, "n").T + core.bias_hn))
        h = (1 - z) * n + z * h
        torch.testing.assert_close(y[t], h)
    torch.testing.assert_close(h_last, h)
    y1, (h1,) = core.step(x[0], (h0,))
    torch.testing.assert_close(y1, core(x[:1], (h0,))[0][0])
    torch.testing.assert_close(h1, y1)


# ---------------------------------------------------------------------------- resets
def test_step_loop_resets_before_reading_the_step_and_keeps_the_gradient_rule():
    """A counting core (``state += x``): the state after ``T`` steps is the sum since each
    row's last start; a reset zeroes the gradient into the steps before it too."""
    from memcores.cores.base import keep_mask, reset_where, step_loop

    x = torch.arange(1.0, 5.0).view(4, 1, 1).expand(4, 2, 1).clone().requires_grad_(True)
    starts = torch.tensor([[False, False], [False, True], [False, False], [False, False]])

    def step(x_t, state):
        (s,) = state
        return s + x_t, (s + x_t,)

    y, (last,) = step_loop(step, x, (torch.full((2, 1), 10.0),), starts, reset_where)
    assert y[:, 0, 0].tolist() == [11.0, 13.0, 16.0, 20.0]
    assert y[:, 1, 0].tolist() == [11.0, 2.0, 5.0, 9.0]  # restarted from 0 before step 1
    assert last[:, 0].tolist() == [20.0, 9.0]
    last.sum().backward()
    assert x.grad[:, 1, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert x.grad[:, 0, 0].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert keep_mask(None, torch.float32) is None
    keep = keep_mask(starts, torch.float64)
    assert keep.dtype == torch.float64 and keep.shape == (4, 2, 1)
    assert keep[..., 0].tolist() == [[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


def test_reset_state_takes_the_core_initial_state():
    core = GatedGRU(D, H, impl="loop").double()
    core.initial_state = lambda b, device=None: (torch.full((b, H), 7.0, dtype=torch.float64),)
    state = (torch.zeros(3, H, dtype=torch.float64),)
    (out,) = core.reset_state(state, torch.tensor([False, True, False]))
    assert out[:, 0].tolist() == [0.0, 7.0, 0.0]


# ---------------------------------------------------------------------------- power-law cells
def _clipped(x: torch.Tensor) -> torch.Tensor:
    return torch.minimum(torch.maximum(x, torch.full_like(x, -1.0)), torch.ones_like(x))


def test_power_law_cells_below_one_and_their_clip_to_the_unit_range():
    """``power = 0.5`` (below 1): the LSTM cell ``c - (1 - g)|c|^r c + i u`` and the GRU state
    ``h - (1 - z)(|h|^r h - n)``, both clipped to ``[-1, 1]``; states started outside the range
    hit both bounds."""
    x, _ = _inputs(4)
    lstm = GatedLSTM(D, H, power=0.5, impl="loop").double()
    _randomise(lstm)
    c0 = torch.linspace(-3.0, 3.0, B * H, dtype=torch.float64).view(B, H)
    h0 = torch.zeros(B, H, dtype=torch.float64)
    a = x[0] @ lstm.weight_ih.T + lstm.bias  # h0 = 0

    def block(name):
        return a[:, lstm._block(name)]

    g, i = torch.sigmoid(block("f")), torch.sigmoid(block("i"))
    raw = c0 - (1 - g) * c0.abs() ** 0.5 * c0 + i * torch.tanh(block("u"))
    assert (raw > 1).any() and (raw < -1).any()
    _, (h1, c1) = lstm.step(x[0], (h0, c0))
    torch.testing.assert_close(c1, _clipped(raw))
    torch.testing.assert_close(h1, torch.sigmoid(block("o")) * torch.tanh(_clipped(raw)))

    gru = GatedGRU(D, H, power=0.5, impl="loop").double()
    _randomise(gru)
    h0 = torch.linspace(-4.0, 4.0, B * H, dtype=torch.float64).view(B, H)
    w = {n: (gru.weight_ih[gru._block(n)], gru.weight_hh[gru._block(n)]) for n in "zrn"}
    z = torch.sigmoid(x[0] @ w["z"][0].T + h0 @ w["z"][1].T + gru.bias[gru._block("z")])
    r = torch.sigmoid(x[0] @ w["r"][0].T + h0 @ w["r"][1].T + gru.bias[gru._block("r")])
    n_h = h0 @ w["n"][1].T + gru.bias_hn
    n = torch.tanh(x[0] @ w["n"][0].T + gru.bias[gru._block("n")] + r * n_h)
    raw = h0 - (1 - z) * (h0.abs() ** 0.5 * h0 - n)
    assert (raw > 1).any() and (raw < -1).any()
    y, (h1,) = gru.step(x[0], (h0,))
    torch.testing.assert_close(h1, _clipped(raw))


def test_hdetach_step_detaches_with_one_draw():
    """``step()`` draws once per call (the global RNG moves by exactly one number) and, with
    ``p = 1`` while training, blocks the gradient into ``h_{t-1}``."""
    hd = GatedLSTM(D, H, hdetach=True, p=1.0, impl="loop").double().train()
    x, _ = _inputs()
    h0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(B, H, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(4)
    y, _ = hd.step(x[0], (h0, c0))
    after_step = torch.rand(1)
    torch.manual_seed(4)
    torch.rand(1)
    assert torch.equal(after_step, torch.rand(1))
    y.sum().backward()
    assert h0.grad is None or (h0.grad == 0).all()
    assert c0.grad.abs().sum() > 0
    hd.p = 0.0  # never detaches, so it draws nothing
    torch.manual_seed(4)
    hd(x, (h0, c0))
    torch.manual_seed(4)
    first = torch.rand(1)
    torch.manual_seed(4)
    hd(x, (h0, c0))
    assert torch.equal(torch.rand(1), first)


def test_reset_state_builds_the_initial_state_where_the_state_lives():
    """The initial state is made on the state's device (``meta`` stands in for a GPU, the mask
    comes from the envs on the CPU), or on the mask's when the state is empty."""
    core = GatedGRU(D, H, impl="loop")
    asked, arity = [], [1]

    def initial_state(batch, device=None):
        asked.append(torch.device(device) if device is not None else None)
        return tuple(torch.zeros(batch, H, device=device) for _ in range(arity[0]))

    core.initial_state = initial_state
    mask = torch.tensor([True, False])
    (out,) = core.reset_state((torch.ones(2, H, device="meta"),), mask)
    assert out.device.type == "meta" and asked == [torch.device("meta")]
    arity[0] = 0  # a stateless core
    assert core.reset_state((), mask) == () and asked[-1] == torch.device("cpu")
