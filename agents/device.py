"""Device selection shared by every trainer."""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when present, else CPU; ``"cuda"`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {name!r} requested but no CUDA GPU is available; use cpu or auto"
            )
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise ValueError(f"unknown device {name!r}; valid: {', '.join(DEVICE_CHOICES)} (or cuda:N)")
