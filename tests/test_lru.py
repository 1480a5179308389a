"""Tests of the LRU core: contract, gradient modes (float64 against BPTT autograd)."""

from __future__ import annotations

import pytest
import torch

from memcores.cores import make_core
from memcores.cores.lru import LRUCore

T, B, D_IN, H, N = 10, 3, 4, 8, 6


def _build(layers: int, grad: str = "bptt", seed: int = 0) -> tuple[LRUCore, torch.nn.Linear]:
    torch.manual_seed(seed)
    core = LRUCore(D_IN, H, state_size=N, layers=layers, r_min=0.5, grad=grad).double()
    decoder = torch.nn.Linear(H, 2).double()
    return core, decoder


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, D_IN, dtype=torch.float64, generator=g)
    target = torch.randn(T, B, 2, dtype=torch.float64, generator=g)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[6, 1] = True
    return x, target, starts


def _grads(core, decoder, mode, x, target, starts=None) -> dict[str, torch.Tensor]:
    core.grad = mode
    core.train()
    core.zero_grad(set_to_none=True)
    decoder.zero_grad(set_to_none=True)
    y, _ = core(x, core.initial_state(x.shape[1]), starts)
    loss = ((decoder(y) - target) ** 2).mean(-1).sum()
    loss.backward()
    named = [*core.named_parameters(), *(("dec." + n, p) for n, p in decoder.named_parameters())]
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in named}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


LRU_PARAMS = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im", "C_re", "C_im", "D")


def test_registry_and_options() -> None:
    core = make_core("lru", 5, 16, state_size=4, layers=2, grad="online")
    assert isinstance(core, LRUCore) and core.grad == "online"
    with pytest.raises(ValueError, match="grad"):
        make_core("lru", 5, 16, grad="rtrl")
    with pytest.raises(ValueError, match="valid options"):
        make_core("lru", 5, 16, hidden=3)
    with pytest.raises(ValueError, match="r_min"):
        LRUCore(5, 16, r_min=0.9, r_max=0.5)


def test_shapes_state_and_chunking() -> None:
    core, _ = _build(layers=2)
    core.eval()
    x, _, _ = _data()
    state = core.initial_state(B)
    assert len(state) == 2 and all(s.shape == (B, N, 2) for s in state)
    assert all(s.dtype == torch.float64 for s in state)
    y, last = core(x, state)
    assert y.shape == (T, B, H) and all(s.shape == (B, N, 2) for s in last)
    # Running in two chunks while carrying the state gives the same outputs.
    y1, mid = core(x[:4], state)
    y2, last2 = core(x[4:], mid)
    torch.testing.assert_close(torch.cat([y1, y2]), y)
    for a, b in zip(last, last2, strict=True):
        torch.testing.assert_close(a, b)
    # The state survives storage in a stacked buffer and a dtype move.
    stored = torch.stack(mid, 0).float()
    assert stored.shape == (2, B, N, 2)
    core_f = core.float()
    y3, _ = core_f(x[4:].float(), tuple(stored.unbind(0)))
    torch.testing.assert_close(y3.double(), y2, rtol=1e-4, atol=1e-4)


def test_starts_reset_state() -> None:
    core, _ = _build(layers=2)
    core.eval()
    x, _, starts = _data()
    y, _ = core(x, core.initial_state(B), starts)
    # Row 1 restarts at t=6: equal to a fresh run of row 1 from t=6.
    y_fresh, _ = core(x[6:, 1:2], core.initial_state(1))
    torch.testing.assert_close(y[6:, 1:2], y_fresh)
    # Other rows are untouched by row 1's reset.
    y_none, _ = core(x, core.initial_state(B))
    torch.testing.assert_close(y[:, [0, 2]], y_none[:, [0, 2]])
    assert not torch.allclose(y[6:, 1], y_none[6:, 1])


def test_acting_step_matches_the_scan_and_follows_parameter_updates() -> None:
    core, decoder = _build(layers=2)
    x, target, starts = _data()
    opt = torch.optim.SGD(core.parameters(), lr=0.5)
    for _ in range(2):  # the second round acts after an optimiser step changed the weights
        core.eval()
        state = core.initial_state(B)
        scan_y, _ = core(x, state, starts)  # with autograd: the scan path
        acted = []
        with torch.no_grad():
            for t in range(T):  # one gradient-free step at a time: the acting path
                y_t, state = core(x[t : t + 1], state, starts[t : t + 1])
                acted.append(y_t)
        torch.testing.assert_close(torch.cat(acted), scan_y.detach())
        core.train()
        opt.zero_grad()
        ((decoder(core(x, core.initial_state(B))[0]) - target) ** 2).mean().backward()
        opt.step()


@pytest.mark.parametrize("mode", ["bptt", "online", "spatial", "truncated"])
def test_all_modes_same_forward(mode: str) -> None:
    core, _ = _build(layers=2)
    x, _, starts = _data()
    core.eval()
    ref, _ = core(x, core.initial_state(B), starts)
    core.grad = mode
    core.train()  # training-mode forward values must not depend on the gradient mode either
    y, state = core(x, core.initial_state(B), starts)
    torch.testing.assert_close(y, ref)
    core.eval()
    y_eval, _ = core(x, core.initial_state(B), starts)
    torch.testing.assert_close(y_eval, ref)


def test_online_equals_bptt_with_one_layer() -> None:
    core, decoder = _build(layers=1)
    x, target, starts = _data()
    ref = _grads(core, decoder, "bptt", x, target, starts)
    got = _grads(core, decoder, "online", x, target, starts)
    for name in LRU_PARAMS:
        key = f"blocks.0.lru.{name}"
        assert ref[key].abs().max() > 0
        assert _rel(got[key], ref[key]) < 1e-6, key
    for key in ("blocks.0.glu.weight", "dec.weight", "dec.bias"):
        assert _rel(got[key], ref[key]) < 1e-6, key
    # The encoder sits below the recurrence: spatial backprop is only an approximation there.
    assert _rel(got["encoder.weight"], ref["encoder.weight"]) > 1e-3


def test_online_two_layers_top_exact_bottom_not() -> None:
    core, decoder = _build(layers=2, seed=3)
    x, target, _ = _data(seed=4)
    ref = _grads(core, decoder, "bptt", x, target)
    got = _grads(core, decoder, "online", x, target)
    for name in LRU_PARAMS:
        top = f"blocks.1.lru.{name}"
        assert _rel(got[top], ref[top]) < 1e-6, top
    for key in ("dec.weight", "dec.bias", "blocks.1.glu.weight"):
        assert _rel(got[key], ref[key]) < 1e-6, key
    for name in ("nu_log", "theta_log", "gamma_log", "B_re", "B_im", "C_re", "D"):
        low = f"blocks.0.lru.{name}"
        assert _rel(got[low], ref[low]) > 1e-3, low


def test_spatial_and_truncated_baselines() -> None:
    core, decoder = _build(layers=2)
    x, target, starts = _data()
    ref = _grads(core, decoder, "bptt", x, target, starts)
    spatial = _grads(core, decoder, "spatial", x, target, starts)
    trunc = _grads(core, decoder, "truncated", x, target, starts)
    for layer in (0, 1):
        for name in ("nu_log", "theta_log"):
            key = f"blocks.{layer}.lru.{name}"
            assert torch.count_nonzero(spatial[key]) == 0, key
            assert trunc[key].abs().max() > 0, key
        for name in ("gamma_log", "B_re"):
            key = f"blocks.{layer}.lru.{name}"
            # spatial and truncated share the instantaneous gamma/B term; both differ from BPTT.
            torch.testing.assert_close(spatial[key], trunc[key])
            assert _rel(trunc[key], ref[key]) > 1e-3
    # The decoder's gradient is exact in every mode (nothing recurrent above it).
    torch.testing.assert_close(spatial["dec.weight"], ref["dec.weight"])
    # One-step truncation: the last layer's lambda gradient uses only h_{t-1}, i.e. the
    # first term of the online trace; it must differ from the exact (online) gradient.
    online = _grads(core, decoder, "online", x, target, starts)
    assert _rel(trunc["blocks.1.lru.nu_log"], online["blocks.1.lru.nu_log"]) > 1e-3


def test_bptt_gradient_matches_finite_differences() -> None:
    # Guards the reference itself: autograd through the complex scan vs central differences.
    core, decoder = _build(layers=1)
    x, target, _ = _data()
    g = _grads(core, decoder, "bptt", x, target)["blocks.0.lru.theta_log"]
    p = core.blocks[0].lru.theta_log
    eps = 1e-6
    with torch.no_grad():
        for i in range(2):
            p[i] += eps
            up = ((decoder(core(x, core.initial_state(B))[0]) - target) ** 2).mean(-1).sum()
            p[i] -= 2 * eps
            down = ((decoder(core(x, core.initial_state(B))[0]) - target) ** 2).mean(-1).sum()
            p[i] += eps
            assert abs((up - down).item() / (2 * eps) - g[i].item()) < 1e-6 * max(1, abs(g[i]))


def test_pattern_copy_config_builds_the_paper_model() -> None:
    from pathlib import Path

    from memcores.agents.supervised_config import SupervisedConfig
    from memcores.experiments.config import load_config

    path = Path(__file__).parents[1] / "experiments" / "configs" / "lru_pattern_copy.yaml"
    for grad in ("bptt", "online", "spatial", "truncated"):
        cfg = load_config(SupervisedConfig, path, [f"core.grad={grad}"])
        core = make_core("lru", 8, cfg.core.hidden_size, **cfg.core.options)
        assert core.grad == grad and len(core.blocks) == 4 and core.state_size == 64


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["bptt", "online"])
def test_cuda_move_matches_cpu(mode: str) -> None:
    core, decoder = _build(layers=2, grad=mode)
    x, target, starts = _data()
    ref = _grads(core, decoder, mode, x, target, starts)
    core, decoder = core.cuda(), decoder.cuda()
    state = core.initial_state(B)
    assert all(s.is_cuda for s in state)
    got = _grads(core, decoder, mode, x.cuda(), target.cuda(), starts.cuda())
    for name, g in ref.items():
        torch.testing.assert_close(got[name].cpu(), g)
