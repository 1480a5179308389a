"""Encoder of flat vector observations (the POPGym envs, :mod:`envs.popgym_env`)."""

from __future__ import annotations

from torch import Tensor, nn


class VectorEncoder(nn.Module):
    """``[N, input_size]`` float vector -> ``[N, output_size]`` features.

    POPGym's baseline feature map: one linear layer then a LayerNorm without learned scale
    or shift (Morad et al., ICLR 2023, the ``feature_map`` of their memory models), so the
    core reads inputs of a fixed scale whatever mix of one-hots and reals the env emits.
    """

    def __init__(self, input_size: int, output_size: int = 128) -> None:
        super().__init__()
        if input_size <= 0:
            raise ValueError(f"vector observations must be non-empty, got size {input_size}")
        self.input_shape = (int(input_size),)
        self.output_size = int(output_size)
        self.net = nn.Sequential(
            nn.Linear(input_size, output_size), nn.LayerNorm(output_size, elementwise_affine=False)
        )

    def forward(self, vector: Tensor) -> Tensor:
        """``vector [N, input_size]`` -> ``[N, output_size]``."""
        return self.net(vector.float())
