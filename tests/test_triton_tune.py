"""The fused kernels' tile tuner (cores/triton_tune.py), with a stand-in kernel and clock."""

from __future__ import annotations

import pytest
import torch

from cores import triton_tune


class FakeKernel:
    """Indexable by a grid like a ``@triton.jit`` function; each call adds 1 to its buffer in
    place (as the fused kernels update ``h``) and records the cut it ran with."""

    __name__ = "fake_kernel"

    def __init__(self) -> None:
        self.cuts: list[tuple[int, int, int]] = []

    def __getitem__(self, grid):
        def run(buffer, T, B, H, **meta):
            buffer.add_(1.0)
            self.cuts.append((meta["BLOCK_N"], meta["BLOCK_K"], meta.get("num_warps", 4)))

        return run


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(triton_tune, "_BEST", {})


def test_candidates_clamp_to_the_hidden_size_and_start_with_the_default():
    cuts = triton_tune.candidates(16, {"BLOCK_N": 16, "BLOCK_K": 16})
    assert cuts == [
        {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 4},
        {"BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 8},
    ]
    wide = triton_tune.candidates(256, {"BLOCK_N": 32, "BLOCK_K": 32})
    assert wide[0] == {"BLOCK_N": 32, "BLOCK_K": 32, "num_warps": 4}
    assert {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8} in wide
    assert len(wide) == len({tuple(c.values()) for c in wide})


def test_the_fastest_cut_wins_and_every_trial_starts_from_the_initial_values():
    kernel, buffer = FakeKernel(), torch.zeros(3)
    seen_before_run: list[float] = []
    fastest = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 8}

    def clock(run) -> float:
        run()
        seen_before_run.append(float(buffer[0]) - 1.0)  # the value the trial started from
        return 0.5 if kernel.cuts[-1] == tuple(fastest.values()) else 1.0

    meta = triton_tune.best_meta(
        kernel, (1,), (buffer, 8, 4, 128), {"BLOCK_N": 32, "BLOCK_K": 32, "ACT": 1}, 128, clock
    )
    assert {k: meta[k] for k in fastest} == fastest and meta["ACT"] == 1
    assert seen_before_run == [0.0] * len(seen_before_run) and len(seen_before_run) > 2
    assert torch.equal(buffer, torch.zeros(3))  # restored after tuning: the real launch is exact


def test_a_shape_is_tuned_once_and_a_new_shape_again():
    kernel, calls = FakeKernel(), []

    def clock(run) -> float:
        calls.append(1)
        run()
        return 1.0

    meta = {"BLOCK_N": 32, "BLOCK_K": 32}
    triton_tune.best_meta(kernel, (1,), (torch.zeros(2), 8, 4, 64), meta, 64, clock)
    first = len(calls)
    triton_tune.best_meta(kernel, (1,), (torch.zeros(2), 8, 4, 64), meta, 64, clock)
    assert len(calls) == first
    triton_tune.best_meta(kernel, (1,), (torch.zeros(2), 16, 4, 64), meta, 64, clock)
    assert len(calls) == 2 * first


def test_a_cut_that_fails_to_compile_is_skipped():
    kernel = FakeKernel()

    def clock(run) -> float:
        run()
        if kernel.cuts[-1][0] == 32:
            raise RuntimeError("out of resources: shared memory")
        return 1.0

    meta = triton_tune.best_meta(
        kernel, (1,), (torch.zeros(2), 8, 4, 64), {"BLOCK_N": 32, "BLOCK_K": 32}, 64, clock
    )
    assert meta["BLOCK_N"] == 64


def test_tuning_is_opt_in_and_off_on_cpu_tensors_and_under_the_interpreter(monkeypatch):
    monkeypatch.delenv(triton_tune.ENV_VAR, raising=False)
    cuda_like = (torch.empty(2, device="meta"), 8, 4, 16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t.device.type == "meta"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_tune.enabled(cuda_like)  # off by default
    monkeypatch.setenv(triton_tune.ENV_VAR, "1")
    assert triton_tune.enabled(cuda_like)
    assert not triton_tune.enabled((torch.zeros(2), 8, 4, 16))  # CPU tensors
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_tune.enabled(cuda_like)


@pytest.mark.parametrize("cut", [(64, 64), (64, 128), (128, 128)])
@pytest.mark.parametrize("name", ["ur_lstm", "tied_lstm", "fast_gru", "slstm"])
def test_every_candidate_cut_gives_the_reference_values_under_the_interpreter(
    monkeypatch, name: str, cut: tuple[int, int]
) -> None:
    """The kernels with the wide cuts the tuner may keep on a GPU (here run by Triton's
    interpreter, at a hidden size that leaves the last chunk partly masked)."""
    pytest.importorskip("triton", reason="triton is in the dev extra")
    if torch.cuda.is_available():
        pytest.skip("on CUDA the tuned-cut test of tests/test_triton_kernels.py covers this")
    from cores import make_core, triton_gates

    block_n, block_k = cut
    monkeypatch.setattr(
        triton_gates,
        "block_meta",
        lambda hidden: dict(BLOCK_B=triton_gates.BLOCK_B, BLOCK_N=block_n, BLOCK_K=block_k),
    )
    steps, batch, width, hidden = 3, 2, 3, 72
    torch.manual_seed(0)
    ref = make_core(name, width, hidden, impl="loop").double().train()
    tri = make_core(name, width, hidden, impl="triton").double().train()
    tri.load_state_dict(ref.state_dict())
    x = torch.randn(steps, batch, width, dtype=torch.float64)
    starts = torch.tensor([[False, True], [True, False], [False, False]])
    with torch.no_grad():
        _, state = ref(x.flip(0), ref.initial_state(batch))
    outs = []
    for core in (ref, tri):
        xg = x.clone().requires_grad_(True)
        y, final = core(xg, state, starts)
        (y.sin().sum() + sum(s.sum() for s in final)).backward()
        outs.append([y, *final, xg.grad, *(p.grad for p in core.parameters())])
    for a, b in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


class CompiledKernel(FakeKernel):
    """Writes its buffer as a compiled kernel does: unseen by autograd's version counter."""

    def __getitem__(self, grid):
        def run(buffer, T, B, H, **meta):
            buffer.data.add_(1.0)

        return run


class _ViewsOfOneBuffer(torch.autograd.Function):
    """As the fused GRU: the outputs are views of one buffer the backward's launch reads."""

    @staticmethod
    def forward(ctx, x):
        buffer = torch.cat([x.new_zeros(1), x])
        ctx.save_for_backward(buffer)
        return buffer[1:], buffer[-1:].clone()

    @staticmethod
    def backward(ctx, d_views, d_last):
        (buffer,) = ctx.saved_tensors
        meta = {"BLOCK_N": 32, "BLOCK_K": 32}
        triton_tune.best_meta(CompiledKernel(), (1,), (buffer, 8, 4, 64), meta, 64, _once)
        return d_views + d_last.sum()


def _once(run) -> float:
    run()
    return 1.0


def test_tuning_inside_a_backward_leaves_the_forwards_views_usable():
    """Restoring a launch's tensors after the trials does not count as an in-place change to
    autograd: the outputs of a function whose backward tunes stay readable after it."""
    x = torch.randn(4, requires_grad=True)
    views, last = _ViewsOfOneBuffer.apply(x)
    (views.sum() + last.sum()).backward()
    assert torch.equal(views.detach(), x.detach())  # raised "modified inplace" before
    assert (views * 2).sum().item() == pytest.approx(2 * x.sum().item())
