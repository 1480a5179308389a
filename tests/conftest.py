"""Shared pytest settings and fixtures.

- ``device``: every test that takes it runs once per available device: ``"cpu"`` always,
  ``"cuda"`` where a GPU is present, marked ``cuda``.
- ``@pytest.mark.cuda``: a test that runs on a GPU where one is present (CUDA graphs
  recorded, kernels compiled); ``pytest -m cuda`` runs them on a GPU machine.
- ``@pytest.mark.needs_ray``: a test of the Ray Tune engine; skipped, with that reason, where
  Ray (the ``ray`` extra) is not installed.
- With a GPU, cuDNN and the fused kernels run full float32 products (no TF32).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

# Tests must not depend on a display or a GPU.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# Without a GPU, Triton kernels run on CPU tensors under Triton's interpreter; the variable
# must be set before triton is first imported (cores import it only where a kernel is used).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # PyTorch lets cuDNN's RNNs, and with them the fused Triton kernels, take TF32 products by
    # default; the tests compare those kernels with the reference loops in full float32 (the
    # legacy switch sets cuDNN's convolutions and RNNs alike, so either API reads it back)
    torch.backends.cudnn.allow_tf32 = False

CUDA = pytest.param("cuda", marks=pytest.mark.cuda)
DEVICES = ["cpu"] + ([CUDA] if torch.cuda.is_available() else [])
"""The devices the ``device`` fixture runs a test on (the GPU's cases marked ``cuda``)."""


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Each available device in turn (``"cpu"``, and ``"cuda"`` where a GPU is present)."""
    return request.param


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs_ray: needs Ray (pip install 'memcores[ray]'); skipped without it"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("ray") is not None:
        return
    skip = pytest.mark.skip(reason="needs Ray: pip install 'memcores[ray]'")
    for item in items:
        if "needs_ray" in item.keywords:
            item.add_marker(skip)
