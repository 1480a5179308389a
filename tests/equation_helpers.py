"""Shared helpers of the equation tests: float64 inputs, perturbed cores, affine blocks."""

from __future__ import annotations

import math

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
