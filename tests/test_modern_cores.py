"""The shared linear scan, minGRU/minLSTM and xLSTM's sLSTM/mLSTM against direct float64
transcriptions of their equations, and each core's training form against its rollout form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from memcores.cores import make_core
from memcores.cores.scan import linear_scan, linear_scan_loop, scan_values

T, B, D, H = 11, 3, 4, 8


def _x(steps: int = T, seed: int = 1, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * torch.randn(steps, B, D, generator=gen, dtype=torch.float64)


def _starts(steps: int = T) -> torch.Tensor:
    starts = torch.zeros(steps, B, dtype=torch.bool)
    starts[5, 0] = True
    starts[0, 1] = True
    starts[2, 2] = starts[9, 2] = True
    return starts


def _step_loop(core, x, state, starts):
    """The rollout path: ``core.step`` one time step at a time, resetting rows at starts."""
    ys = []
    for t in range(x.shape[0]):
        state = core.reset_state(state, starts[t])
        y, state = core.step(x[t], state)
        ys.append(y)
    return torch.stack(ys), state


# ---------------------------------------------------------------------------- the scan
@pytest.mark.parametrize("method", ["parallel", "sequential"])
@pytest.mark.parametrize("steps", [1, 5, 16, 37])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_scan_matches_the_loop_in_values_and_gradients(method, steps, dtype) -> None:
    gen = torch.Generator().manual_seed(steps)
    shape = (steps, 2, 3)
    a = torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype)
    if dtype.is_complex:
        a = a * torch.exp(1j * torch.rand(shape, generator=gen, dtype=torch.float64))
    a[steps // 2, 0] = 0  # a reset inside the sequence
    b = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    h0 = torch.randn(shape[1:], generator=gen, dtype=torch.float64).to(dtype)
    grad_out = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    results = []
    for fn in (lambda *t: linear_scan(*t, method=method), linear_scan_loop):
        leaves = [t.clone().requires_grad_(True) for t in (a, b, h0)]
        h = fn(*leaves)
        torch.autograd.backward(h, grad_out)
        results.append((h.detach(), *(t.grad for t in leaves)))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_scan_broadcasts_a_shared_coefficient_and_sums_its_gradient() -> None:
    lam = torch.tensor([0.5, 0.9], dtype=torch.float64, requires_grad=True)
    b = torch.ones(4, 3, 2, dtype=torch.float64)
    linear_scan(lam, b, torch.zeros(3, 2, dtype=torch.float64)).sum().backward()
    lam_ref = lam.detach().clone().requires_grad_(True)
    linear_scan_loop(lam_ref, b, torch.zeros(3, 2, dtype=torch.float64)).sum().backward()
    torch.testing.assert_close(lam.grad, lam_ref.grad)


def test_scan_rejects_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="valid: auto, parallel, sequential"):
        scan_values(torch.ones(2, 1), torch.ones(2, 1), torch.zeros(1), method="fast")


# ---------------------------------------------------------------------------- minGRU / minLSTM
def _g(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def _min_gru_reference(w, bias, x, h):
    """Feng et al. eq. (minGRU), step by step: z = sigma(W_z x), h = (1 - z) h + z g(W_h x)."""
    ys = []
    for x_t in x:
        k_z, k_h = (x_t @ w.T + bias).chunk(2, -1)
        z = 1 / (1 + torch.exp(-k_z))
        h = (1 - z) * h + z * _g(k_h)
        ys.append(h)
    return torch.stack(ys)


def _min_lstm_reference(w, bias, x, h):
    """minLSTM: f' = f / (f + i), i' = i / (f + i), h = f' h + i' g(W_h x)."""
    ys = []
    for x_t in x:
        k_f, k_i, k_h = (x_t @ w.T + bias).chunk(3, -1)
        f, i = 1 / (1 + torch.exp(-k_f)), 1 / (1 + torch.exp(-k_i))
        h = f / (f + i) * h + i / (f + i) * _g(k_h)
        ys.append(h)
    return torch.stack(ys)


@pytest.mark.parametrize(
    "name, reference", [("min_gru", _min_gru_reference), ("min_lstm", _min_lstm_reference)]
)
@pytest.mark.parametrize("scale", [1.0, 8.0])  # 8: saturated gates
def test_min_rnn_scan_matches_its_equations(name, reference, scale) -> None:
    torch.manual_seed(0)
    core = make_core(name, D, H).double()
    proj = core.cells[0].proj
    h0 = torch.rand(B, H, dtype=torch.float64)
    x = _x(scale=scale)
    y, (h_last,) = core(x, (h0,))
    want = reference(proj.weight.detach(), proj.bias.detach(), x, h0)
    torch.testing.assert_close(y, want)
    torch.testing.assert_close(h_last, want[-1])


@pytest.mark.parametrize("name", ["min_gru", "min_lstm"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("scan", ["parallel", "sequential"])
def test_min_rnn_step_equals_scan_with_resets(name, layers, scan) -> None:
    """Rollouts (``step``) and training (the scan) give the same outputs, gradients aside."""
    torch.manual_seed(0)
    core = make_core(name, D, H, layers=layers, scan=scan).float()
    x, starts = _x().float(), _starts()
    state = tuple(torch.rand(B, H) for _ in range(layers))
    y, final = core(x, state, starts)
    with torch.no_grad():
        y_step, final_step = _step_loop(core, x, state, starts)
    torch.testing.assert_close(y.detach(), y_step, rtol=1e-5, atol=1e-5)
    for got, want in zip(final, final_step, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["min_gru", "min_lstm"])
@pytest.mark.parametrize("scan", ["parallel", "sequential"])
def test_min_rnn_gradients_equal_the_step_loops(name, scan) -> None:
    """The fused scan's hand-written backward equals autograd through the step loop
    (inputs, warm state and every weight), resets included."""
    torch.manual_seed(0)
    core = make_core(name, D, H, layers=2, scan=scan).double()
    x, starts = _x(scale=3.0), _starts()
    state0 = (torch.rand(B, H, dtype=torch.float64), torch.rand(B, H, dtype=torch.float64))
    grads = []
    for run in (lambda c, x, s: c(x, s, starts), lambda c, x, s: _step_loop(c, x, s, starts)):
        core.zero_grad()
        xs = x.clone().requires_grad_(True)
        state = tuple(s.clone().requires_grad_(True) for s in state0)
        y, final = run(core, xs, state)
        (y.square().sum() + final[0].sum()).backward()
        grads.append(
            [xs.grad, *(s.grad for s in state), *(p.grad.clone() for p in core.parameters())]
        )
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)


def test_min_rnn_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="layers must be positive"):
        make_core("min_gru", D, H, layers=0)
    with pytest.raises(ValueError, match="valid: auto, parallel, sequential"):
        make_core("min_lstm", D, H, scan="magic")


# ---------------------------------------------------------------------------- sLSTM
def _slstm_reference(core, x):
    """Beck et al. sLSTM without the stabiliser (exact in float64 at these magnitudes):
    c = f c + exp(i~) tanh(z~), n = f n + exp(i~), h = sigma(o~) c / n, f = sigma(f~),
    recurrent weights block-diagonal per head."""
    w, bias = core.input.weight.detach(), core.input.bias.detach()
    r = core.recurrent.detach()  # [4, heads, d, d]
    heads, d = r.shape[1], r.shape[2]
    full = torch.zeros(4, H, H, dtype=torch.float64)  # dense block-diagonal R, per gate
    for g in range(4):
        for n_ in range(heads):
            full[g, n_ * d : (n_ + 1) * d, n_ * d : (n_ + 1) * d] = r[g, n_]
    h = c = n = torch.zeros(B, H, dtype=torch.float64)
    ys = []
    for x_t in x:
        pre = (x_t @ w.T + bias).view(B, 4, H)
        rec = torch.einsum("bi,gij->bgj", h, full)
        z, i, f, o = (pre + rec).unbind(1)
        c = torch.sigmoid(f) * c + torch.exp(i) * torch.tanh(z)
        n = torch.sigmoid(f) * n + torch.exp(i)
        h = torch.sigmoid(o) * c / n
        ys.append(h)
    return torch.stack(ys)


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_slstm_matches_its_unstabilised_equations(heads) -> None:
    torch.manual_seed(0)
    core = make_core("slstm", D, H, heads=heads).double()
    x = _x()
    y, _ = core(x, core.initial_state(B))
    torch.testing.assert_close(y, _slstm_reference(core, x))


def test_slstm_recurrence_is_block_diagonal() -> None:
    """With 2 heads, unit 0's h_{t-1} cannot reach the second head's units at step t."""
    torch.manual_seed(0)
    core = make_core("slstm", D, H, heads=2).double()
    state = list(core.initial_state(B))
    state[0] = torch.rand(B, H, dtype=torch.float64, requires_grad=True)
    y, _ = core.step(_x()[0], tuple(state))
    y[:, H // 2 :].sum().backward()
    assert state[0].grad[:, : H // 2].abs().max() == 0
    assert state[0].grad[:, H // 2 :].abs().max() > 0


def test_slstm_survives_large_gate_inputs() -> None:
    """exp(i~) with i~ ~ 100s overflows unstabilised; the stabiliser keeps h finite."""
    torch.manual_seed(0)
    core = make_core("slstm", D, H).float()
    y, state = core(_x(scale=300.0).float(), core.initial_state(B))
    assert torch.isfinite(y).all() and all(torch.isfinite(s).all() for s in state)


def test_heads_must_divide_the_hidden_size() -> None:
    with pytest.raises(ValueError, match="heads must divide hidden_size=8"):
        make_core("slstm", D, H, heads=3)
    with pytest.raises(ValueError, match="heads must divide"):
        make_core("mlstm", D, H, heads=5)


# ---------------------------------------------------------------------------- mLSTM
def _mlstm_reference(core, x):
    """Beck et al. mLSTM without the stabiliser: C = f C + exp(i~) v k^T,
    n = f n + exp(i~) k, h = sigma(o) * C q / max(|n . q|, 1)."""
    heads, d = core.heads, core.head_size
    w, bias = core.qkvo.weight.detach(), core.qkvo.bias.detach()
    wg, bg = core.gates.weight.detach(), core.gates.bias.detach()
    c = torch.zeros(B, heads, d, d, dtype=torch.float64)
    n = torch.zeros(B, heads, d, dtype=torch.float64)
    ys = []
    for x_t in x:
        q, k, v, o = (x_t @ w.T + bias).chunk(4, -1)
        q, k, v = (t.reshape(B, heads, d) for t in (q, k, v))
        k = k / d**0.5
        i, f = (x_t @ wg.T + bg).chunk(2, -1)
        i, f = torch.exp(i)[..., None], torch.sigmoid(f)[..., None]
        c = f[..., None] * c + i[..., None] * torch.einsum("bhi,bhj->bhij", v, k)
        n = f * n + i * k
        num = torch.einsum("bhij,bhj->bhi", c, q)
        den = torch.clamp_min((n * q).sum(-1).abs(), 1.0)[..., None]
        ys.append(torch.sigmoid(o) * (num / den).reshape(B, H))
    return torch.stack(ys)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_mlstm_matches_its_unstabilised_equations(chunk_size) -> None:
    torch.manual_seed(0)
    core = make_core("mlstm", D, H, heads=2, chunk_size=chunk_size).double()
    x = _x()
    y, _ = core(x, core.initial_state(B))
    torch.testing.assert_close(y, _mlstm_reference(core, x))


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mlstm_parallel_form_equals_recurrent_form(chunk_size, dtype) -> None:
    """Training (chunkwise parallel) and rollout (``step``) forms agree from a warm state,
    across chunk borders and with resets inside and at the start of chunks."""
    torch.manual_seed(0)
    core = make_core("mlstm", D, H, chunk_size=chunk_size).to(dtype)
    x, starts = _x(scale=3.0).to(dtype), _starts()
    with torch.no_grad():
        _, warm = core(_x(seed=5).to(dtype), core.initial_state(B))
        y, final = core(x, warm, starts)
        y_step, final_step = _step_loop(core, x, warm, starts)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(y, y_step, **tol)
    for got, want in zip(final, final_step, strict=True):
        torch.testing.assert_close(got, want, **tol)


def test_mlstm_parallel_gradients_equal_the_recurrent_ones() -> None:
    torch.manual_seed(0)
    core = make_core("mlstm", D, H, chunk_size=4).double()
    x, starts = _x(), _starts()
    grads = []
    for run in (lambda c, s: c(x, s, starts), lambda c, s: _step_loop(c, x, s, starts)):
        core.zero_grad()
        y, state = run(core, core.initial_state(B))
        (y.square().sum() + state[0].sum()).backward()
        grads.append([p.grad.clone() for p in core.parameters()])
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)


def test_mlstm_survives_large_gate_inputs() -> None:
    torch.manual_seed(0)
    core = make_core("mlstm", D, H).float()
    y, state = core(_x(scale=300.0).float(), core.initial_state(B), _starts())
    assert torch.isfinite(y).all() and all(torch.isfinite(s).all() for s in state)


def test_logsigmoid_forget_gate_is_what_the_cells_use() -> None:
    """Guards the documented choice (sigmoid forget gate, used in log space)."""
    from memcores.cores.xlstm import stabilised_gates

    i_raw, f_raw, m_prev = torch.tensor([0.3]), torch.tensor([-1.2]), torch.tensor([0.5])
    i_gate, f_gate, m = stabilised_gates(i_raw, f_raw, m_prev)
    m_want = torch.maximum(F.logsigmoid(f_raw) + m_prev, i_raw)
    torch.testing.assert_close(m, m_want)
    torch.testing.assert_close(f_gate, torch.sigmoid(f_raw) * torch.exp(m_prev - m_want))
    torch.testing.assert_close(i_gate, torch.exp(i_raw - m_want))


def test_bench_cores_runs_the_new_cores(capsys: pytest.CaptureFixture[str]) -> None:
    from memcores.experiments.bench import cores as bench

    assert bench.main(["--quick", "--cores", "gru,min_gru,min_lstm,slstm,mlstm"]) == 0
    out = capsys.readouterr().out
    for name in ("min_gru", "min_lstm", "slstm", "mlstm"):
        row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
        assert "skipped" not in row
    assert "min_gru / gru" in out
    samples = {"nn.LSTM": [(1.0, 1.0)], "lstm": [(1.0, 1.0)], "slstm": [(2.0, 2.0)]}
    assert bench._target("slstm", samples) == ""  # the 1.5x LSTM target is not theirs
    samples.update(gru=[(3.0, 3.0)], min_gru=[(1.0, 1.0)])
    assert "min_gru trains 3.0x faster than gru" in bench.format_speedup(samples)


def test_bench_scan_kernels_prints_each_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    from memcores.experiments.bench import cores as bench

    assert bench.main(["--quick", "--scan"]) == 0
    out = capsys.readouterr().out
    for name in ("cores.scan sequential", "cores.scan parallel", "autograd step loop"):
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert float(row.split()[-1]) < 1e-4  # every kernel computes the loop's values


@pytest.mark.parametrize("name", ["min_gru", "min_lstm"])
def test_min_rnn_blocks_carry_values_and_gradients(name) -> None:
    """Sequences longer than one block of the fused layer (16 steps): the carries between
    blocks, forward and backward, with resets on and next to block borders."""
    from memcores.cores.min_rnn import CHUNK

    steps = 2 * CHUNK + 5
    torch.manual_seed(0)
    core = make_core(name, D, H).double()
    x = _x(steps=steps, scale=2.0)
    starts = torch.zeros(steps, B, dtype=torch.bool)
    starts[CHUNK, 0] = starts[CHUNK - 1, 1] = starts[2 * CHUNK + 1, 2] = True
    state0 = (torch.rand(B, H, dtype=torch.float64),)
    results = []
    for run in (lambda s: core(x, s, starts), lambda s: _step_loop(core, x, s, starts)):
        core.zero_grad()
        state = tuple(s.clone().requires_grad_(True) for s in state0)
        y, final = run(state)
        (y.square().sum() + final[0].sum()).backward()
        results.append([y.detach(), state[0].grad, *(p.grad.clone() for p in core.parameters())])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)
