"""Shared helpers of the equation tests: float64 inputs, perturbed cores, affine blocks."""

from __future__ import annotations

import math

import pytest
import torch

from memcores.cores import make_core

T, B, D = 9, 3, 4
"""Steps, batch rows and input size of the equation checks."""


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def inputs(seed: int = 0, steps: int = T) -> torch.Tensor:
    """Float64 inputs ``[steps, B, D]``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(steps, B, D, generator=gen, dtype=torch.float64)


def build(name: str, hidden: int, seed: int = 0, **options) -> torch.nn.Module:
    """A float64 core with every parameter, biases included, perturbed at random."""
    torch.manual_seed(seed)
    core = make_core(name, D, hidden, **options).double()
    with torch.no_grad():  # random biases too, so no term of the equations hides at zero
        for p in core.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return core


def affine(core, rows: slice, x_t: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``W x + U h + b`` restricted to the rows of one gate block: ``[B, len(rows)]``."""
    return x_t @ core.weight_ih[rows].T + h @ core.weight_hh[rows].T + core.bias[rows]


def assert_forward_checks_its_arguments(core: torch.nn.Module, name: str) -> None:
    """``core`` (input size 1, hidden 2) refuses, with check_sequence's messages, an input of
    the wrong size, a state that is not a tuple and starts of the wrong shape."""
    x, state = torch.zeros(3, 2, 1), core.initial_state(2)
    with pytest.raises(ValueError, match=rf"^{name} expects x of shape \[T, B, 1\], got"):
        core(torch.zeros(3, 2, 4), state)
    with pytest.raises(TypeError, match=r"^state must be a tuple of tensors, got list$"):
        core(x, list(state))
    with pytest.raises(ValueError, match=r"^starts must have shape \[T, B\]=\(3, 2\), got"):
        core(x, state, torch.zeros(2, 2, dtype=torch.bool))
