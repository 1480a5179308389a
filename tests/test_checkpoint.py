"""Atomic checkpoints, weights_only loading, clear errors and RNG round trips."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from memcores.agents.checkpoint import (
    CheckpointError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_round_trip_with_weights_only(tmp_path):
    model = torch.nn.Linear(3, 2)
    path = save_checkpoint(tmp_path / "ckpt.pt", {"model": model.state_dict(), "step": 7})
    loaded = torch.load(path, weights_only=True)
    assert loaded["step"] == 7
    assert torch.equal(loaded["model"]["weight"], model.weight.detach())
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temp files left


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt.pt", {"step": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(path, {"step": 2, "bad": Unpicklable()})
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_missing_and_corrupt_checkpoints_raise_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "none.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(corrupt)
    good = save_checkpoint(tmp_path / "good.pt", {"w": torch.ones(100)})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:50])
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(truncated)


def test_rng_state_round_trip_through_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)  # noqa: NPY002 - the legacy global RNG is exactly what is captured
    torch.manual_seed(3)
    save_checkpoint(tmp_path / "rng.pt", {"rng": rng_state()})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())  # noqa: NPY002
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected  # noqa: NPY002
