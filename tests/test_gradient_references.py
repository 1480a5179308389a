"""Independent references for rules whose only other comparison shares their code.

- The LRU's online rule: its input gradient is the instantaneous path ``h_t <- gamma B u_t``,
  which the ``spatial`` mode computes through plain autograd, so the two must give the same
  encoder and LayerNorm gradients; its recurrent gradients are exact (RTRL) in the top layer,
  so central differences of the loss must match them, and with a reset at every step no
  gradient crosses time and *every* parameter's online gradient is the true one.
- RelLSTM's screening on scores built to tie: a tie keeps the stored state.
- h-detach: the gradient of one draw equals the plain LSTM's with the drawn steps' ``h_{t-1}``
  detached, and the draws detach with probability ``p``, so the mean gradient converges to
  the mixture of the ``2^T`` detach patterns weighted by their probabilities.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from memcores.cores import make_core
from memcores.cores.lru import LRUCore
from memcores.cores.rel_lstm import RelLSTM, screening_update

T, B, D_IN, H, N = 6, 2, 3, 4, 3


# ---------------------------------------------------------------------------- LRU
def _lru(layers: int, seed: int = 0) -> tuple[LRUCore, torch.nn.Linear]:
    torch.manual_seed(seed)
    core = LRUCore(D_IN, H, state_size=N, layers=layers, r_min=0.5).double()
    return core, torch.nn.Linear(H, 2).double()


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, D_IN, dtype=torch.float64, generator=g)
    return x, torch.randn(T, B, 2, dtype=torch.float64, generator=g)


def _loss(core, decoder, x, target, starts=None) -> torch.Tensor:
    y, _ = core(x, core.initial_state(x.shape[1]), starts)
    return ((decoder(y) - target) ** 2).sum()


def _grads(core, decoder, mode, x, target, starts=None) -> dict[str, torch.Tensor]:
    core.grad = mode
    core.train()
    core.zero_grad(set_to_none=True)
    _loss(core, decoder, x, target, starts).backward()
    return {n: p.grad.clone() for n, p in core.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("layers", [1, 2])
def test_lru_online_input_gradient_equals_the_spatial_rule(layers):
    """Below every LRU the online rule and spatial backprop send the same error: encoder and
    LayerNorm gradients agree to rounding (they differ from BPTT's)."""
    core, decoder = _lru(layers)
    x, target = _data()
    online = _grads(core, decoder, "online", x, target)
    spatial = _grads(core, decoder, "spatial", x, target)
    bptt = _grads(core, decoder, "bptt", x, target)
    below = ["encoder.weight", "encoder.bias", "blocks.0.norm.weight", "blocks.0.norm.bias"]
    for name in below:
        torch.testing.assert_close(online[name], spatial[name], rtol=1e-12, atol=1e-14)
        assert not torch.allclose(online[name], bptt[name], rtol=1e-3), name


def _central_difference(loss_fn, p: torch.Tensor, index: tuple[int, ...], eps=1e-6) -> float:
    with torch.no_grad():
        p[index] += eps
        up = loss_fn().item()
        p[index] -= 2 * eps
        down = loss_fn().item()
        p[index] += eps
    return (up - down) / (2 * eps)


def _check_against_differences(core, decoder, grads, names, x, target, starts=None):
    core.eval()  # the same forward; no autograd needed for the differences
    for name in names:
        p = dict(core.named_parameters())[name]
        for flat in range(min(p.numel(), 3)):
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), p.shape))
            fd = _central_difference(lambda: _loss(core, decoder, x, target, starts), p, index)
            g = grads[name][index].item()
            assert g == pytest.approx(fd, rel=1e-5, abs=1e-8), (name, index)


LRU_RECURRENT = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im")


def test_lru_online_recurrent_gradients_match_finite_differences():
    """One layer: the traces give the exact gradient of the recurrent parameters."""
    core, decoder = _lru(1)
    x, target = _data()
    online = _grads(core, decoder, "online", x, target)
    names = [f"blocks.0.lru.{n}" for n in LRU_RECURRENT]
    _check_against_differences(core, decoder, online, names, x, target)


def test_lru_online_gradient_of_every_parameter_is_exact_when_nothing_crosses_time():
    """A reset before every step cuts every path through time: then the online rule's input
    gradient is the whole gradient and the encoder's matches central differences too."""
    core, decoder = _lru(2)
    x, target = _data()
    starts = torch.ones(T, B, dtype=torch.bool)
    online = _grads(core, decoder, "online", x, target, starts)
    names = [
        "encoder.weight",
        "encoder.bias",
        "blocks.0.norm.weight",
        "blocks.0.lru.B_re",
        "blocks.0.lru.B_im",
        "blocks.0.lru.gamma_log",
        "blocks.1.lru.B_im",
    ]
    _check_against_differences(core, decoder, online, names, x, target, starts)


@pytest.mark.parametrize("grad", ["bptt", "online", "spatial", "truncated"])
def test_lru_runs_the_scan_kernel_it_was_given(grad, monkeypatch):
    """Every scan of the layer, forward and (online) backward, uses the configured kernel."""
    import memcores.cores.lru as lru

    used = []

    def spy(fn, tensors: int):
        """``fn`` recording the method it is called with (after ``tensors`` tensor args)."""

        def wrapped(*args, **kwargs):
            used.append(args[tensors] if len(args) > tensors else kwargs.get("method", "auto"))
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(lru, "linear_scan", spy(lru.linear_scan, 3))  # (a, b, h0, method)
    monkeypatch.setattr(lru, "scan_adjoint", spy(lru.scan_adjoint, 2))  # (a, grad_h, method)
    torch.manual_seed(0)
    core = LRUCore(D_IN, H, state_size=N, layers=1, grad=grad, scan="parallel").double()
    x, target = _data()
    _loss(core.train(), torch.nn.Linear(H, 2).double(), x, target).backward()
    assert used and all(method == "parallel" for method in used), used
    assert len(used) == (2 if grad == "online" else 1)
    layer = core.blocks[0].lru
    u, h0 = torch.zeros(2, 1, H, dtype=torch.float64), torch.zeros(1, N, dtype=torch.complex128)
    with pytest.raises(ValueError, match="unknown grad mode 'nope'; valid: bptt, online, spatial"):
        layer.scan(u, h0, None, "nope")


# ---------------------------------------------------------------------------- RelLSTM
def _full_state(relevant_scores, leaving_score):
    """One row: a buffer of 2 whose oldest state (value 9, ``leaving_score``) is screened now,
    and a full relevant set of states 1, 2 with ``relevant_scores``."""
    f64 = torch.float64
    buffer = torch.tensor([[[9.0], [8.0]]], dtype=f64)
    buffer_scores = torch.tensor([[leaving_score, 0.0]], dtype=f64)
    relevant = torch.tensor([[[1.0], [2.0]]], dtype=f64)
    scores = torch.tensor([relevant_scores], dtype=f64)
    two = torch.tensor([2.0], dtype=f64)
    return buffer, buffer_scores, two, relevant, scores, two.clone()


@pytest.mark.parametrize(
    "leaving, kept",
    [(0.5, [1.0, 2.0]), (0.5 + 1e-12, [9.0, 2.0]), (0.25, [1.0, 2.0])],
    ids=["tie", "just-above", "below"],
)
def test_screening_a_tie_keeps_the_stored_state(leaving, kept):
    state = _full_state([0.5, 0.75], leaving)
    new = torch.tensor([[7.0]], dtype=torch.float64)
    out = screening_update(*state, new)
    assert out[3][0, :, 0].tolist() == kept
    expected_scores = [max(leaving, 0.5) if kept[0] == 9.0 else 0.5, 0.75]
    assert out[4][0].tolist() == expected_scores
    assert out[5].tolist() == [2.0]  # the set stays full
    assert out[0][0, :, 0].tolist() == [8.0, 7.0]  # the buffer shifts either way


def test_screening_lag_one_screens_the_newest_state_and_other_lags_are_refused():
    """``lag = 1`` screens ``h_{t-1}`` (the last buffer slot) into a free slot of a one-slot
    relevant set; lags outside ``[1, L]`` are refused with the valid range."""
    f64 = torch.float64
    buffer = torch.tensor([[[9.0], [8.0]]], dtype=f64)
    scores = torch.tensor([[0.5, 0.25]], dtype=f64)
    empty = (torch.zeros(1, 1, 1, dtype=f64), torch.zeros(1, 1, dtype=f64), torch.zeros(1))
    count = torch.tensor([2.0], dtype=f64)
    new = torch.tensor([[7.0]], dtype=f64)
    out = screening_update(buffer, scores, count, *empty, new, lag=1)
    assert out[3][0, 0, 0].item() == 8.0 and out[4][0, 0].item() == 0.25 and out[5].item() == 1
    for lag in (0, 3):
        with pytest.raises(ValueError, match=f"lag must be in \\[1, 2\\], got {lag}"):
            screening_update(buffer, scores, count, *empty, new, lag=lag)


def test_screening_runs_where_its_tensors_are():
    """Every tensor screening makes follows the state's device (``meta`` stands in for a GPU:
    mixing it with a CPU tensor raises)."""
    state = [t.to("meta") for t in _full_state([0.5, 0.75], 0.6)]
    out = screening_update(*state, torch.zeros(1, 1, dtype=torch.float64, device="meta"))
    assert all(t.device.type == "meta" for t in out)


def test_rel_lstm_keeps_the_older_of_two_tied_states(monkeypatch):
    """Through the model: states 1..5 with attention built so that 3, screened at step 5,
    ties with the weakest stored state (1): the relevant set still holds 1, not 3."""
    core = RelLSTM(1, 1, nu=2, rho=2, impl="loop").double()
    monkeypatch.setattr(core, "_lstm", lambda xp, s, c: (xp[:, :1], c))
    attention = {1.0: 0.5, 2.0: 0.75, 3.0: 0.5}  # per buffered step; score 2x

    def attend(s_prev, keys, values, mask):
        table = [[attention.get(float(v), 0.0) for v in row] for row in values[..., 0].detach()]
        return torch.tensor(table, dtype=values.dtype) * mask

    monkeypatch.setattr(core, "_attend", attend)
    with torch.no_grad():
        core.input_proj.weight.fill_(1.0)
        core.input_proj.bias.zero_()
    x = torch.arange(1, 6, dtype=torch.float64).view(5, 1, 1)
    _, state = core(x, core.initial_state(1))
    names = RelLSTM.STATE_NAMES
    assert state[names.index("relevant")][0, :, 0].tolist() == [1.0, 2.0]
    assert state[names.index("relevant_scores")][0].tolist() == [1.0, 1.5]


# ---------------------------------------------------------------------------- h-detach
def _lstm_pair(p: float):
    torch.manual_seed(0)
    lstm = make_core("lstm", 2, 3, impl="loop").double()
    hd = make_core("hdetach_lstm", 2, 3, p=p, impl="loop").double()
    hd.load_state_dict(lstm.state_dict())
    return lstm, hd


def _input_grad(core_or_pattern, lstm, x, h0, c0) -> torch.Tensor:
    """``d sum(h_T) / d x`` of h-detach (a core) or of the LSTM with the steps in a pattern's
    ``True`` positions detached."""
    xs = x.clone().requires_grad_(True)
    if isinstance(core_or_pattern, torch.nn.Module):
        y, _ = core_or_pattern(xs, (h0, c0))
        y[-1].sum().backward()
        return xs.grad
    h, c = h0, c0
    for x_t, detach in zip(xs.unbind(0), core_or_pattern, strict=True):
        gate_h = h.detach() if detach else h
        a = F.linear(x_t, lstm.weight_ih, lstm.bias) + F.linear(gate_h, lstm.weight_hh)
        h, c = lstm.cell(a, c)
    h.sum().backward()
    return xs.grad


def _inputs(steps: int = 3):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(steps, 2, 2, dtype=torch.float64, generator=g)
    h0 = torch.randn(2, 3, dtype=torch.float64, generator=g)
    c0 = torch.randn(2, 3, dtype=torch.float64, generator=g)
    return x, h0, c0


def test_hdetach_gradient_is_the_lstm_gradient_with_the_drawn_steps_detached():
    lstm, hd = _lstm_pair(p=0.5)
    hd.train()
    x, h0, c0 = _inputs()
    for seed in range(6):
        torch.manual_seed(seed)
        pattern = (torch.rand(len(x)) < hd.p).tolist()  # the draws the core will make
        torch.manual_seed(seed)
        got = _input_grad(hd, lstm, x, h0, c0)
        torch.testing.assert_close(got, _input_grad(pattern, lstm, x, h0, c0))


def test_hdetach_expected_gradient_is_the_mixture_of_detach_patterns():
    """Mean over many draws vs the exact expectation ``sum_pattern P(pattern) grad(pattern)``
    with ``P = p^k (1 - p)^(T - k)``, within 5 standard errors."""
    p, draws = 0.3, 400
    lstm, hd = _lstm_pair(p)
    hd.train()
    x, h0, c0 = _inputs()
    expected = torch.zeros_like(x)
    for pattern in itertools.product([False, True], repeat=len(x)):
        k = sum(pattern)
        expected += p**k * (1 - p) ** (len(x) - k) * _input_grad(pattern, lstm, x, h0, c0)
    torch.manual_seed(0)
    samples = torch.stack([_input_grad(hd, lstm, x, h0, c0) for _ in range(draws)])
    mean, se = samples.mean(0), samples.std(0) / draws**0.5
    assert ((mean - expected).abs() <= 5 * se + 1e-12).all()
    # the plain LSTM's gradient (never detached) is outside those bounds: the test can fail
    never = _input_grad([False] * len(x), lstm, x, h0, c0)
    assert ((mean - never).abs() > 5 * se).any()
