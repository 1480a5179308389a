"""``tanh`` on the CPU computed as ``2 sigmoid(2 z) - 1`` where that is faster: the one rule.

Why: on CPU, ATen's ``tanh`` costs about the same per element at every size, while ``sigmoid``
is vectorised, so from several thousand elements the identity's two extra elementwise ops cost
less than the difference; where ATen dispatches AVX2 its ``tanh`` is about 10x a sigmoid at
every size, so there the identity pays at any size. :func:`via_sigmoid` states the rule; every
CPU path that takes a ``tanh`` this way (:func:`tanh`, the fused LSTM's cell tanh) asks it.
Example: forward+backward of an additive-attention score
``tanh(W_a s + U_a m)`` over ``[8, 200, 64]`` takes 304 us with ``torch.tanh`` and 163 us this
way (``memcores bench cores --tanh`` prints the comparison on the machine at hand). Below the
threshold ``torch.tanh`` is the faster of the two and is used as is. The backward is ATen's own
``tanh_backward`` on the saved output, exactly as for ``torch.tanh``.
"""

from __future__ import annotations

import torch
from torch import Tensor

SIGMOID_FROM = 16384
"""Tensors with at least this many elements on CPU take the sigmoid route: the break-even size
of ``memcores bench cores --tanh`` (1.00x at 16,384 elements, 0.78x at 4,096); below it the
fused LSTM's cell ``tanh`` at B x H = 64 x 128 is also faster with ``torch.tanh``."""

_AVX2 = torch.backends.cpu.get_cpu_capability() == "AVX2"  # fixed per CPU, never timed


def via_sigmoid(device: torch.device, numel: int) -> bool:
    """Whether a ``tanh`` of ``numel`` elements on ``device`` is taken as ``2 sigmoid(2 z) - 1``:
    on the CPU, where ATen dispatches AVX2 or from :data:`SIGMOID_FROM` elements."""
    return device.type == "cpu" and (_AVX2 or numel >= SIGMOID_FROM)


class _TanhViaSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: Tensor) -> Tensor:  # type: ignore[override]
        y = torch.sigmoid(z * 2.0).mul_(2.0).sub_(1.0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return torch.ops.aten.tanh_backward(grad, y)


def tanh(z: Tensor) -> Tensor:
    """``torch.tanh(z)`` (same values to rounding, same gradient), faster for large CPU tensors."""
    if via_sigmoid(z.device, z.numel()):
        return _TanhViaSigmoid.apply(z)
    return torch.tanh(z)
