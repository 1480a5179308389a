"""Contract tests run on every registered core (the list comes from ``cores.CORES``)."""

from __future__ import annotations

import pytest
import torch

from memcores.cores import CORES, MemoryCore, core_options, make_core

T, B, D, H = 7, 3, 4, 5
ALL_CORES = sorted(CORES)


def build(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> MemoryCore:
    """Build ``name`` with a fixed seed; a core whose module fails to import fails the test."""
    torch.manual_seed(seed)
    return make_core(name, D, H).to(dtype)


def inputs(seed: int = 1, steps: int = T, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(steps, B, D, generator=gen, dtype=torch.float64).to(dtype)


def warm_state(core: MemoryCore) -> tuple[torch.Tensor, ...]:
    """A state that is not the initial one (after a few steps of input)."""
    with torch.no_grad():
        _, state = core(inputs(seed=99, steps=3), core.initial_state(B))
    return state


def assert_states_close(a, b, **tol) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, **tol)


@pytest.mark.parametrize("name", ALL_CORES)
def test_shapes_and_state(name: str) -> None:
    core = build(name)
    state = core.initial_state(B)
    assert isinstance(state, tuple) and all(isinstance(s, torch.Tensor) for s in state)
    assert all(s.shape[0] == B for s in state)
    y, new_state = core(inputs(), state)
    assert y.shape == (T, B, H)
    assert isinstance(new_state, tuple)
    assert [s.shape for s in new_state] == [s.shape for s in state]
    assert core.input_size == D and core.hidden_size == H


@pytest.mark.parametrize("name", ALL_CORES)
def test_chunks_compose(name: str) -> None:
    """Running [0, T) equals running [0, k) then [k, T) from the returned state."""
    core = build(name).eval()
    x, state = inputs(), warm_state(core)
    with torch.no_grad():
        y, final = core(x, state)
        y1, mid = core(x[:3], state)
        y2, final2 = core(x[3:], mid)
    torch.testing.assert_close(torch.cat([y1, y2]), y)
    assert_states_close(final2, final)


@pytest.mark.parametrize("name", ALL_CORES)
def test_starts_reset_rows(name: str) -> None:
    """A reset in the middle equals running the two halves separately, the second from
    ``initial_state``; rows without a reset are unaffected."""
    core = build(name).eval()
    x, state = inputs(), warm_state(core)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[4, 0] = True  # row 0: reset in the middle
    starts[0, 2] = True  # row 2: reset before the first step
    with torch.no_grad():
        y, final = core(x, state, starts)
        y_plain, final_plain = core(x, state)
        y_a, _ = core(x[:4], state)
        y_b, final_b = core(x[4:], core.initial_state(B))
        y_fresh, final_fresh = core(x, core.initial_state(B))
    # row 0: first half from the carried state, second half from a fresh state
    torch.testing.assert_close(y[:4, 0], y_a[:, 0])
    torch.testing.assert_close(y[4:, 0], y_b[:, 0])
    # row 1: no reset
    torch.testing.assert_close(y[:, 1], y_plain[:, 1])
    # row 2: reset at t = 0 means starting from the initial state
    torch.testing.assert_close(y[:, 2], y_fresh[:, 2])
    for s, sb, sp, sf in zip(final, final_b, final_plain, final_fresh, strict=True):
        torch.testing.assert_close(s[0], sb[0])
        torch.testing.assert_close(s[1], sp[1])
        torch.testing.assert_close(s[2], sf[2])


@pytest.mark.parametrize("name", ALL_CORES)
def test_declared_capabilities_match_the_core(name: str) -> None:
    """``has_step`` is declared exactly by the cores that implement ``step``, and a declared
    ``state_arity`` is the length of the initial state."""
    core = build(name)
    assert core.has_step == (type(core).step is not MemoryCore.step)
    if core.state_arity is not None:
        assert core.state_arity == len(core.initial_state(B))


@pytest.mark.parametrize("name", [n for n in ALL_CORES if build(n).state_arity is not None])
def test_wrong_state_count_names_the_expected_count(name: str) -> None:
    core = build(name)
    state = core.initial_state(B)
    for wrong in (state[:-1], (*state, state[0])):
        with pytest.raises(ValueError, match=f"expects {len(state)} state tensors, got"):
            core(inputs(), wrong)


def test_reset_where_resets_steps_and_sequences_to_zero_or_an_initial_state() -> None:
    from memcores.cores.base import reset_where

    state = (torch.ones(3, 2), torch.ones(3, 2, 4, dtype=torch.float64))
    mask = torch.tensor([True, False, True])
    zeroed = reset_where(state, mask)
    assert zeroed[0][:, 0].tolist() == [0.0, 1.0, 0.0]
    assert zeroed[1].sum(dim=(1, 2)).tolist() == [0.0, 8.0, 0.0]
    assert zeroed[1].dtype == torch.float64
    (fresh,) = reset_where(state[:1], mask, (torch.full((3, 2), 5.0),))
    assert fresh[:, 1].tolist() == [5.0, 1.0, 5.0]
    seq = torch.ones(4, 3, 2)  # [T, B, H] with a [T, B] mask
    starts = torch.zeros(4, 3, dtype=torch.bool)
    starts[2, 1] = True
    (masked,) = reset_where((seq,), starts)
    assert masked.sum().item() == 4 * 3 * 2 - 2 and masked[2, 1].abs().sum().item() == 0.0


@pytest.mark.parametrize("name", ALL_CORES)
def test_finite_gradients(name: str) -> None:
    core = build(name).train()
    x = inputs().requires_grad_(True)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[3, 1] = True
    y, state = core(x, warm_state(core), starts)
    loss = y.square().mean() + sum(
        s.float().square().mean() for s in state if s.is_floating_point()
    )
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert x.grad.abs().sum() > 0
    grads = [p.grad for p in core.parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    for g in grads:
        assert g is None or torch.isfinite(g).all()


def _devices() -> list:
    cuda = pytest.param("cuda", marks=pytest.mark.cuda)
    return ["cpu"] + ([cuda] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ALL_CORES)
def test_state_moves_across_devices_and_dtypes(name: str, dtype: torch.dtype, device: str) -> None:
    core = build(name, dtype=dtype).to(device).eval()
    state = core.initial_state(B, device)
    for s in state:
        assert s.device.type == device
        if s.is_floating_point():
            assert s.dtype == dtype
    x = inputs(dtype=dtype).to(device)
    with torch.no_grad():
        y, state = core(x, state)
        assert y.dtype == dtype and y.device.type == device
        # a state stored on the CPU (e.g. in a rollout buffer) moves back and is reused
        cpu_state = tuple(s.cpu() for s in state)
        y2, _ = core(x, tuple(s.to(device) for s in cpu_state))
        y3, _ = core(x, state)
    torch.testing.assert_close(y2, y3)
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("name", ALL_CORES)
def test_same_seed_same_output(name: str) -> None:
    outs = []
    for _ in range(2):
        core = build(name, seed=123).train()
        torch.manual_seed(7)
        y, _ = core(inputs(), core.initial_state(B))
        outs.append(y.detach())
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    other = build(name, seed=124)
    y_other, _ = other(inputs(), other.initial_state(B))
    assert not torch.equal(outs[0], y_other.detach())


@pytest.mark.parametrize("name", ALL_CORES)
def test_make_core_rejects_unknown_option(name: str) -> None:
    options = core_options(name)
    with pytest.raises(ValueError, match="no_such_option") as info:
        make_core(name, D, H, no_such_option=1)
    for option in options:
        assert option in str(info.value)


def test_make_core_rejects_unknown_name() -> None:
    with pytest.raises(ValueError) as info:
        make_core("no_such_core", D, H)
    for name in ("lstm", "ur_lstm", "fast_lstm", "gru", "power_rnn"):
        assert name in str(info.value)


def test_make_core_rejects_preset_override() -> None:
    with pytest.raises(ValueError, match="fixed"):
        make_core("fast_lstm", D, H, activation="sigmoid")


def test_user_options_reach_the_core() -> None:
    assert make_core("hdetach_lstm", D, H, p=0.5).p == 0.5
    assert make_core("c_lstm", D, H, t_max=50).t_max == 50
    assert make_core("power_rnn", D, H, r=1.5).r == 1.5
    with pytest.raises(ValueError, match="p must be"):
        make_core("hdetach_lstm", D, H, p=1.5)


def test_bench_cores_quick_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from memcores.experiments.bench import cores as bench

    assert bench.main(["--quick", "--cores", "lstm,tied_lstm,fast_lstm,ur_lstm,gru"]) == 0
    out = capsys.readouterr().out
    assert "threads=1" in out and "x nn.LSTM" in out and "x twin" in out
    for name in ("nn.LSTM", "lstm", "tied_lstm", "fast_lstm", "ur_lstm", "gru"):
        assert any(line.startswith(f"{name} ") for line in out.splitlines()), name
    with pytest.raises(ValueError, match="valid cores"):
        bench.main(["--quick", "--cores", "nope"])


def test_bench_cores_runs_a_core_with_options_beside_its_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memcores.experiments.bench import cores as bench

    assert bench.parse_core_spec("rel_lstm:impl=loop:nu=3") == (
        "rel_lstm",
        {"impl": "loop", "nu": 3},
    )
    assert bench.main(["--quick", "--cores", "rel_lstm,rel_lstm:impl=loop"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line}
    assert rows["rel_lstm:impl=loop"][-1] == "rel_lstm"  # compared with the default rel_lstm
    with pytest.raises(ValueError, match="not key=value"):
        bench.main(["--quick", "--cores", "rel_lstm:loop"])
    with pytest.raises(ValueError, match="valid cores"):
        bench.main(["--quick", "--cores", "nope:impl=loop"])


def test_bench_cores_marks_each_target_separately() -> None:
    from memcores.experiments.bench import cores as bench

    # three rounds of (wall, cpu) seconds: ur_lstm 1.1x nn.LSTM but 1.35x its tied twin
    samples = {
        "nn.LSTM": [(1.0, 1.0)] * 3,
        "tied_lstm": [(0.8148, 0.8148)] * 3,
        "ur_lstm": [(1.1, 1.1)] * 3,
    }
    assert bench._target("ur_lstm", samples) == "ok <=1.5x nn, MISS <=1.3x twin"
    samples["ur_lstm"] = [(1.6, 1.6)] * 3
    assert bench._target("ur_lstm", samples) == "MISS <=1.5x nn, MISS <=1.3x twin"
    assert bench._target("gru", samples) == ""


def test_bench_cores_splits_the_refine_ratio() -> None:
    from memcores.experiments.bench import cores as bench

    samples = {"tied_lstm": [(1.0, 1.0)] * 3, "ur_lstm": [(1.4, 1.4)] * 3}
    assert bench.format_refine_split(samples) is None
    samples["lstm"] = [(1.3, 1.3)] * 3
    line = bench.format_refine_split(samples)
    assert "lstm / tied_lstm = 1.30x" in line and "ur_lstm / lstm = 1.08x" in line
    assert "matrix products" not in line
    samples["matmuls 3H"], samples["matmuls 4H"] = [(0.5, 0.5)] * 3, [(0.6, 0.6)] * 3
    assert "4H / 3H gate rows = 600.0 / 500.0 ms = 1.20x" in bench.format_refine_split(samples)
    samples["nn.LSTM"] = [(1.0, 1.0)] * 3
    table = bench.format_table(samples, 1)  # the matmul runs are not cores: no table rows
    assert "matmuls" not in table and "ur_lstm" in table


def test_bench_matmul_floor_runs_only_beside_ur_and_its_twin() -> None:
    from memcores.experiments.bench import cores as bench

    runs, _ = bench.build_runs(["tied_lstm", "ur_lstm"], T=3, B=2, D=4, H=5, seed=0)
    assert set(bench.MATMUL_RUNS) <= runs.keys()
    runs["matmuls 4H"]()  # the closure runs on its own buffers
    runs, _ = bench.build_runs(["tied_lstm", "fast_lstm"], T=3, B=2, D=4, H=5, seed=0)
    assert not set(bench.MATMUL_RUNS) & runs.keys()


def test_bench_cores_min_stat_uses_the_fastest_rounds() -> None:
    from memcores.experiments.bench import cores as bench

    # per-round ratios 1.12, 0.80, 1.078 (median 1.078); the fastest rounds are 1.04 and 1.00
    samples = {
        "nn.LSTM": [(1.0, 1.0)] * 3,
        "tied_lstm": [(1.00, 1.00), (1.30, 1.30), (1.02, 1.02)],
        "fast_lstm": [(1.12, 1.12), (1.04, 1.04), (1.10, 1.10)],
    }
    assert bench.summary_time(samples, "tied_lstm", 0) == 1.02
    assert bench.summary_time(samples, "tied_lstm", 0, "min") == 1.00
    assert bench.ratio(samples, "fast_lstm", "tied_lstm", 0) == pytest.approx(1.10 / 1.02)
    assert bench.ratio(samples, "fast_lstm", "tied_lstm", 0, "min") == pytest.approx(1.04)
    assert bench._target("fast_lstm", samples) == "ok <=1.5x nn, MISS <=1.05x twin"
    assert bench._target("fast_lstm", samples, "min") == "ok <=1.5x nn, ok <=1.05x twin"
    table = bench.format_table(samples, 1, "min")
    assert "1.04x" in table and "1040.0" in table
    samples["tied_lstm"] = [(1.0, 0.0)] * 3  # a cpu clock too coarse to see the run
    assert bench.ratio(samples, "fast_lstm", "tied_lstm", 1, "min") is None
