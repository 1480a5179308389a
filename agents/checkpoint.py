"""Atomic checkpoints loadable with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.files import atomic_write


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or not a memcores checkpoint."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (see :func:`atomic_write`).

    A crash mid-write leaves the previous checkpoint intact. ``payload`` must hold only what
    ``weights_only=True`` loading accepts: tensors, numbers, strings, lists, tuples and dicts.
    """
    return atomic_write(path, lambda handle: torch.save(payload, handle))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; a clear error if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for truncated/foreign files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a memcores checkpoint ({_load_failure(err)})"
        ) from err
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} holds {type(payload).__name__}, expected a dict")
    return payload


def _load_failure(err: Exception) -> str:
    """Why ``torch.load`` failed, in one line and without torch's advice to load unsafely."""
    text = str(err)
    if "Weights only load failed" in text or "weights_only" in text:
        return "it holds Python objects other than tensors and plain data; refused for safety"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first.split(". ")[0].rstrip(".")  # torch appends paragraphs of advice


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states in a ``weights_only``-safe form."""
    # The legacy global NumPy RNG is what third-party code seeds and draws from, so it is the
    # state that must survive a resume.
    np_state = np.random.get_state()  # noqa: NPY002
    state: dict[str, Any] = {
        "python": _to_lists(random.getstate()),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(_to_tuples(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        (
            "MT19937",
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(obj: Any) -> Any:
    return [_to_lists(o) for o in obj] if isinstance(obj, (tuple, list)) else obj


def _to_tuples(obj: Any) -> Any:
    return tuple(_to_tuples(o) for o in obj) if isinstance(obj, list) else obj
