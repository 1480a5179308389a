"""The Triton linear scan (:mod:`cores.triton_scan`) against the step-loop recurrence, and the
linear-recurrence cores through it (the path CUDA tensors take by default).

Without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``, set by
``conftest.py``) on CPU tensors, which is slow: shapes stay tiny. With a GPU the same tests run
the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton")

from memcores.cores import make_core, triton_scan  # noqa: E402
from memcores.cores.scan import linear_scan, linear_scan_loop, resolve_method  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# on a GPU every test here runs the compiled kernels: `pytest -m cuda` selects them
pytestmark = [pytest.mark.cuda] if torch.cuda.is_available() else []
B, D, H = 2, 3, 4


@pytest.fixture(autouse=True, params=[DEVICE.type])
def kernel_device(request: pytest.FixtureRequest) -> str:
    """Puts the device the kernels run on into every test id, so ``pytest -k cuda`` (the
    test part of ``memcores bench gpu``) selects these tests on a GPU machine."""
    return request.param


def _problem(steps: int, dtype: torch.dtype, seed: int = 0):
    """``a, b, h0`` and an upstream gradient, with ``|a| < 1``, complex phases, and resets
    (``a = 0``) inside the sequence."""
    gen = torch.Generator().manual_seed(seed)
    real = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
    shape = (steps, B, 3)
    a = torch.rand(shape, generator=gen, dtype=real).to(dtype)
    if dtype.is_complex:
        a = a * torch.exp(2j * torch.rand(shape, generator=gen, dtype=real))
    a[steps // 2, 0] = 0
    a[min(steps - 1, 3), 1, 2] = 0
    b = torch.randn(shape, generator=gen, dtype=real).to(dtype)
    h0 = torch.randn(shape[1:], generator=gen, dtype=real).to(dtype)
    grad = torch.randn(shape, generator=gen, dtype=real).to(dtype)
    return [t.to(DEVICE) for t in (a, b, h0, grad)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64, torch.complex128])
@pytest.mark.parametrize(("steps", "block_t"), [(1, 64), (40, 16)])
def test_triton_scan_matches_the_loop_in_values_and_gradients(
    dtype, steps, block_t, monkeypatch
) -> None:
    """Outputs and the gradients of ``a``, ``b`` and ``h0``, one tile and several (the carry
    between tiles, forward and reversed), resets included."""
    monkeypatch.setattr(triton_scan, "BLOCK_T", block_t)
    a, b, h0, grad = _problem(steps, dtype)
    results = []
    for fn in (lambda *t: linear_scan(*t, method="triton"), linear_scan_loop):
        leaves = [t.clone().requires_grad_(True) for t in (a, b, h0)]
        h = fn(*leaves)
        torch.autograd.backward(h, grad)
        results.append((h.detach(), *(t.grad for t in leaves)))
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype in (torch.float32, torch.complex64) else {}
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, **tol)


def test_triton_scan_accepts_a_broadcast_coefficient_and_state() -> None:
    lam = torch.tensor([0.5, -0.9, 0.1], dtype=torch.float64, device=DEVICE)
    b = torch.randn(7, B, 3, dtype=torch.float64, device=DEVICE)
    h0 = torch.ones(3, dtype=torch.float64, device=DEVICE)
    torch.testing.assert_close(
        triton_scan.scan_values(lam, b, h0), linear_scan_loop(lam, b, h0.expand(B, 3))
    )


def test_triton_scan_reads_and_writes_permuted_inputs() -> None:
    """Inputs and upstream gradients that are permuted views (dense, not contiguous)."""
    a, b, h0, grad = _problem(12, torch.float32)
    b_view = b.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    grad_view = grad.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    assert not b_view.is_contiguous() and not grad_view.is_contiguous()
    torch.testing.assert_close(triton_scan.scan_values(a, b_view, h0), linear_scan_loop(a, b, h0))
    torch.testing.assert_close(
        triton_scan.scan_adjoint(a, grad_view), triton_scan.scan_adjoint(a, grad)
    )


def test_triton_scan_on_cpu_tensors_without_the_interpreter_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setattr(triton_scan, "_INTERPRETED", False)
    with pytest.raises(ValueError, match="runs on CUDA tensors .*TRITON_INTERPRET=1"):
        triton_scan.scan_values(torch.ones(2, 1), torch.ones(2, 1), torch.zeros(1))


class _OpCounter(TorchDispatchMode):
    """Counts the torch operations dispatched while active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _launches(method: str, steps: int, monkeypatch) -> tuple[int, int]:
    """(kernel launches, torch operations) of one forward+backward of :func:`linear_scan`."""
    calls = []
    kernel = triton_scan._scan_kernel

    class Counting:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    monkeypatch.setattr(triton_scan, "_scan_kernel", Counting())
    a, b, h0, grad = _problem(steps, torch.float32)
    leaves = [t.requires_grad_(True) for t in (a, b, h0)]
    with _OpCounter() as counter:
        torch.autograd.backward(linear_scan(*leaves, method=method), grad)
    return len(calls), counter.ops


def test_triton_scan_launches_do_not_grow_with_the_sequence_length(monkeypatch) -> None:
    """Launch-bound step loops are what make recurrences slow on a GPU: the Triton scan runs
    one kernel per direction and a fixed set of torch operations whatever ``T`` is, while
    the sequential kernel's operations grow with ``T``."""
    short, long = _launches("triton", 8, monkeypatch), _launches("triton", 64, monkeypatch)
    assert short == long
    assert short[0] == 2  # one forward launch, one reversed launch
    seq_short, seq_long = (_launches("sequential", t, monkeypatch) for t in (8, 64))
    assert seq_long[1] > seq_short[1] + 50
    assert seq_short[0] == seq_long[0] == 0


def test_auto_takes_triton_on_cuda_and_the_step_loop_on_cpu(monkeypatch) -> None:
    assert resolve_method("auto", torch.device("cpu")) == "sequential"
    assert resolve_method("auto", torch.device("cuda", 0)) == "triton"
    assert resolve_method("parallel", torch.device("cuda", 0)) == "parallel"
    monkeypatch.setattr("memcores.cores.scan._HAS_TRITON", False)
    assert resolve_method("auto", torch.device("cuda", 0)) == "parallel"
    with pytest.raises(ValueError, match="valid: auto, parallel, sequential, triton"):
        resolve_method("fast", torch.device("cpu"))


# ---------------------------------------------------------------------------- cores
def _run(core, x, state, starts):
    """``y``, the final state, and the gradients of the input state and every parameter."""
    core.zero_grad(set_to_none=True)
    state = tuple(s.clone().requires_grad_(True) for s in state)
    y, final = core(x, state, starts)
    (y.square().sum() + sum(f.sum() for f in final)).backward()
    grads = [s.grad for s in state] + [p.grad for p in core.parameters() if p.grad is not None]
    return [y.detach(), *(f.detach() for f in final), *grads]


def _inputs(steps: int = 21):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(steps, B, D, generator=gen, dtype=torch.float64).to(DEVICE)
    starts = torch.zeros(steps, B, dtype=torch.bool)
    starts[7, 0] = starts[0, 1] = starts[steps - 3, 1] = True
    return x, starts.to(DEVICE)


@pytest.mark.parametrize("name", ["min_gru", "min_lstm"])
def test_min_rnn_through_the_triton_scan_matches_its_step_loop(name) -> None:
    """The GPU path (whole-sequence gates, one Triton scan each way) against the reference
    loop (``sequential``: blocks of 16 steps of the step recurrence), two layers, resets."""
    torch.manual_seed(0)
    core = make_core(name, D, H, layers=2, scan="sequential").double().to(DEVICE)
    x, starts = _inputs()
    state = tuple(torch.rand(B, H, dtype=torch.float64, device=DEVICE) for _ in range(2))
    want = _run(core, x, state, starts)
    core.scan = "triton"
    got = _run(core, x, state, starts)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("grad", ["bptt", "online", "truncated"])
def test_lru_through_the_triton_scan_matches_the_step_loop(grad) -> None:
    """Complex coefficients as real/imaginary pairs, every gradient mode that scans."""
    torch.manual_seed(0)
    core = make_core("lru", D, H, state_size=3, layers=2, r_min=0.5, grad=grad, scan="sequential")
    core = core.double().to(DEVICE)
    x, starts = _inputs(steps=13)
    state = tuple(torch.randn(B, 3, 2, dtype=torch.float64, device=DEVICE) for _ in range(2))
    want = _run(core, x, state, starts)
    for block in core.blocks:
        block.lru.scan_method = "triton"
    got = _run(core, x, state, starts)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("chunk_size", [1, 4])
def test_mlstm_through_the_triton_scan_matches_its_step_loop(chunk_size) -> None:
    """The chunk-state scan on the Triton kernel: outputs, final state and gradients (input
    state and parameters) against the recurrent form stepped one step at a time, from a warm
    state, with resets inside chunks, at chunk starts, and in a padded last chunk."""
    torch.manual_seed(0)
    core = make_core("mlstm", D, H, heads=2, chunk_size=chunk_size, scan="triton")
    core = core.double().to(DEVICE)
    x, starts = _inputs(steps=11)
    with torch.no_grad():
        _, warm = core(2 * x, core.initial_state(B, DEVICE))

    def step_loop(x, state, starts):
        ys = []
        for t in range(x.shape[0]):
            state = core.reset_state(state, starts[t])
            y, state = core.step(x[t], state)
            ys.append(y)
        return torch.stack(ys), state

    got = _run(core, x, warm, starts)
    core.forward = step_loop
    want = _run(core, x, warm, starts)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
