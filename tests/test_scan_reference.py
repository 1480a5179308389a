"""The linear scans of cores.scan against a step loop written here, with autograd's gradients
of that loop as the reference for the hand-written backward (real and complex, every CPU
kernel, lengths that do and do not fill the parallel scan's chunks)."""

from __future__ import annotations

import pytest
import torch

from memcores.cores.scan import (
    _chunk_size,
    linear_scan,
    previous_states,
    resolve_method,
    scan_adjoint,
    scan_values,
)


def _loop(a, b, h0):
    h, out = h0, []
    for t in range(b.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return torch.stack(out)


def _inputs(steps: int, complex_: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g)

    if complex_:
        a = 0.9 * torch.polar(
            torch.rand(steps, 2, 3, dtype=torch.float64, generator=g), rand(steps, 2, 3)
        )
        return (
            a,
            torch.complex(rand(steps, 2, 3), rand(steps, 2, 3)),
            torch.complex(rand(2, 3), rand(2, 3)),
        )
    return torch.rand(steps, 2, 3, dtype=torch.float64, generator=g), rand(steps, 2, 3), rand(2, 3)


@pytest.mark.parametrize("method", ["sequential", "parallel"])
@pytest.mark.parametrize("steps", [1, 5, 16])
@pytest.mark.parametrize("complex_", [False, True], ids=["real", "complex"])
def test_linear_scan_values_and_gradients_are_the_step_loops(method, steps, complex_):
    a, b, h0 = _inputs(steps, complex_)
    a[steps // 2] = 0  # an episode start: nothing before it passes
    leaves = [t.clone().requires_grad_(True) for t in (a, b, h0)]
    ref = [t.clone().requires_grad_(True) for t in (a, b, h0)]
    h = linear_scan(*leaves, method=method)
    h_ref = _loop(*ref)
    torch.testing.assert_close(h, h_ref)
    weights = torch.randn(h.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    (h.real * weights + (h.imag * weights if complex_ else 0)).sum().backward()
    (h_ref.real * weights + (h_ref.imag * weights if complex_ else 0)).sum().backward()
    for got, want in zip(leaves, ref, strict=True):
        torch.testing.assert_close(got.grad, want.grad)


def test_scan_values_broadcasts_a_shared_coefficient_and_writes_into_out():
    a, b, h0 = _inputs(6, False)
    shared = a[:, :1, :1]  # one coefficient per step, broadcast over the batch and units
    for method in ("sequential", "parallel"):
        out = torch.empty_like(b)
        got = scan_values(shared, b, h0, method, out=out)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got, _loop(shared.expand_as(b), b, h0))


def test_previous_states_and_chunk_sizes():
    h, h0 = torch.arange(1.0, 4.0).view(3, 1), torch.tensor([0.5])
    assert previous_states(h, h0)[:, 0].tolist() == [0.5, 1.0, 2.0]
    assert [_chunk_size(t) for t in (1, 4, 16, 64, 100, 1000)] == [1, 2, 4, 8, 8, 32]
    assert resolve_method("parallel", torch.device("cpu")) == "parallel"
    with pytest.raises(ValueError, match="unknown scan method 'fast'; valid: auto, parallel"):
        linear_scan(torch.ones(2, 1), torch.ones(2, 1), torch.zeros(1), method="fast")


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_the_initial_state_is_cast_to_the_inputs_dtype_first(method):
    """A float64 h0 scans exactly like h0 cast to float32: no widened output, no first step
    rounded once from float64."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.rand(7, 16, 16, generator=g), torch.randn(7, 16, 16, generator=g)
    h0 = torch.randn(16, 16, generator=g, dtype=torch.float64)
    h = scan_values(a, b, h0, method)
    assert h.dtype == torch.float32
    assert torch.equal(h, scan_values(a, b, h0.float(), method))


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_an_out_of_the_wrong_length_is_refused(method):
    a, b, h0 = _inputs(6, False)
    with pytest.raises((ValueError, RuntimeError)):
        scan_values(a, b, h0, method, out=torch.empty_like(b[:5]))


def test_forward_and_backward_run_the_method_asked_for():
    """A parallel scan's values and gradient are the parallel kernels', bit for bit (in float32
    their rounding differs from the sequential kernels' at this length); without a method the
    CPU runs the sequential ones."""
    g = torch.Generator().manual_seed(3)
    a = torch.rand(37, 4, 5, generator=g)
    b = torch.randn(37, 4, 5, generator=g)
    h0 = torch.randn(4, 5, generator=g)
    grad_h = torch.randn(37, 4, 5, generator=g)
    for method in ("parallel", "sequential"):
        other = "sequential" if method == "parallel" else "parallel"
        leaf = b.clone().requires_grad_(True)
        h = linear_scan(a, leaf, h0, method=method)
        h.backward(grad_h)
        assert torch.equal(h, scan_values(a, b, h0, method))
        assert not torch.equal(h, scan_values(a, b, h0, other))
        assert torch.equal(leaf.grad, scan_adjoint(a, grad_h, method))
        assert not torch.equal(leaf.grad, scan_adjoint(a, grad_h, other))
    assert torch.equal(linear_scan(a, b, h0), scan_values(a, b, h0, "sequential"))


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_linear_scan_broadcasts_a_shared_coefficient(method):
    """One coefficient per step for all rows: the loop's values, and a's gradient summed back
    to its own shape."""
    a, b, h0 = _inputs(6, False)
    shared = a[:, :1, :1].clone().requires_grad_(True)
    ref = shared.detach().clone().requires_grad_(True)
    h = linear_scan(shared, b, h0, method=method)
    h_ref = _loop(ref.expand_as(b), b, h0)
    torch.testing.assert_close(h, h_ref)
    h.sum().backward()
    h_ref.sum().backward()
    assert shared.grad.shape == (6, 1, 1)
    torch.testing.assert_close(shared.grad, ref.grad)
