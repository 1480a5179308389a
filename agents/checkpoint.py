"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)`` onto the CPU.

Every checkpoint loads onto the CPU whatever device wrote it (:func:`load_checkpoint`); the
caller moves what belongs on its device there (``module.load_state_dict`` copies into the
module's tensors, ``optimizer.load_state_dict`` casts to the parameters' device) while the
RNG states stay CPU tensors, as :func:`set_rng_state` needs them.

Both trainers write one layout and one format: ``checkpoints/last.pt`` inside the run folder
(:data:`CHECKPOINT_NAME`; the supervised trainer adds the step-0 weights,
:data:`INIT_CHECKPOINT_NAME`), a dict tagged ``format`` :data:`CHECKPOINT_FORMAT` and
``trainer`` (``"rl"`` or ``"supervised"``), with ``config``, ``model`` (the ``state_dict``),
``optimizer``, ``step`` (frames for RL, updates for supervised), ``rng`` and
``skipped_updates``; RL checkpoints add ``updates``, ``n_actions`` and ``image_shape``,
supervised ones ``best``. Checkpoints of the earlier formats (``memcores-rl/1``,
``memcores-supervised-v1``, the supervised ``checkpoint.pt``/``init.pt`` at the top of the
folder) load in every release (:func:`upgrade_checkpoint`): a results record made with one
stays evidence.

A results record's folder (``results/<experiment>/<trial>/``, written by ``memcores record``)
holds the final policy as :data:`RECORD_POLICY_NAME`; every command that takes a run folder
takes a record folder too (:func:`find_checkpoint`).

RL checkpoints are read by :func:`load_rl_checkpoint` and turned back into a policy by
:func:`policy_from_checkpoint`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memcores.agents.files import atomic_write
from memcores.agents.networks import build_policy
from memcores.agents.policy import RecurrentActorCritic
from memcores.agents.rl_config import RLConfig, config_from_dict

CHECKPOINT_FORMAT = "memcores/2"
"""``format`` field of every checkpoint either trainer writes."""
CHECKPOINT_NAME = "checkpoints/last.pt"
"""Where, inside a run folder, the latest checkpoint lives."""
INIT_CHECKPOINT_NAME = "checkpoints/init.pt"
"""The supervised trainer's weights at step 0 (for before/after diagnostics)."""
RECORD_POLICY_NAME = "policy.pt"
"""Where, inside a results record's folder, its final policy lives (a slim checkpoint)."""
LEGACY_FORMATS = {"memcores-rl/1": "rl", "memcores-supervised-v1": "supervised"}
"""Format tags of earlier releases -> the trainer that wrote them (loaded in every release)."""
LEGACY_NAMES = {CHECKPOINT_NAME: "checkpoint.pt", INIT_CHECKPOINT_NAME: "init.pt"}
"""Supervised checkpoint paths of earlier releases (at the top of the run folder)."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated or not a memcores checkpoint."""


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write ``payload`` to ``path`` atomically (see :func:`atomic_write`).

    A crash mid-write leaves the previous checkpoint intact. ``payload`` must hold only what
    ``weights_only=True`` loading accepts: tensors, numbers, strings, lists, tuples and dicts.
    """
    return atomic_write(path, lambda handle: torch.save(payload, handle))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint onto the CPU with ``weights_only=True``; a clear error if it is
    missing or corrupt.

    Tensors saved from a GPU (or any other device) come back as CPU tensors: loading never
    needs the writer's device, and the RNG states in it stay usable by :func:`set_rng_state`.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated/foreign files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a memcores checkpoint ({_load_failure(err)})"
        ) from err
    if not isinstance(payload, dict):
        raise CheckpointError(f"checkpoint {path} holds {type(payload).__name__}, expected a dict")
    return upgrade_checkpoint(payload, path)


def upgrade_checkpoint(payload: dict[str, Any], path: str | Path = "") -> dict[str, Any]:
    """A checkpoint of an earlier format in today's form (``format`` :data:`CHECKPOINT_FORMAT`,
    ``trainer``, ``model``, ``step``); any other payload is returned as it is.

    ``memcores-rl/1`` kept the weights under ``policy`` and the frame count under
    ``global_step``; ``memcores-supervised-v1`` already used ``model`` and ``step``.
    """
    trainer = LEGACY_FORMATS.get(payload.get("format"))  # type: ignore[arg-type]
    if trainer is None:
        return payload
    upgraded = {**payload, "format": CHECKPOINT_FORMAT, "trainer": trainer}
    if trainer == "rl":
        upgraded["model"] = upgraded.pop("policy")
        upgraded["step"] = upgraded.pop("global_step")
    return upgraded


def checkpoint_path(run_dir: str | Path, name: str = CHECKPOINT_NAME) -> Path:
    """``run_dir / name``, or the file of that role in an earlier release's layout when only
    that one exists (a supervised run's ``checkpoint.pt`` / ``init.pt``)."""
    path = Path(run_dir) / name
    legacy = Path(run_dir) / LEGACY_NAMES.get(name, name)
    return legacy if not path.is_file() and legacy.is_file() else path


def _load_failure(err: Exception) -> str:
    """Why ``torch.load`` failed, in one line and without torch's advice to load unsafely."""
    text = str(err)
    if "Unsupported global" in text or "GLOBAL" in text:  # a pickled class or function
        return "it holds Python objects other than tensors and plain data; refused for safety"
    unreadable = isinstance(err, KeyError)  # pickle's opcode table lacks the first byte
    if unreadable or "Weights only load failed" in text or "weights_only" in text:
        return "its bytes are not a PyTorch checkpoint's: random or damaged data"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first.split(". ")[0].rstrip(".")  # torch appends paragraphs of advice


def find_checkpoint(run: str | Path) -> Path:
    """A run folder, a results record's folder or a checkpoint file -> the checkpoint file."""
    run = Path(run)
    if run.is_dir():
        path = checkpoint_path(run)
        record_policy = run / RECORD_POLICY_NAME
        if not path.is_file() and record_policy.is_file():
            return record_policy
        if not path.is_file():
            raise FileNotFoundError(
                f"no checkpoint in folder {run} (a run folder holds {CHECKPOINT_NAME}, a "
                f"results record's folder {RECORD_POLICY_NAME}); was it trained with "
                "`memcores train`?"
            )
        return path
    if not run.exists():
        raise FileNotFoundError(f"run folder or checkpoint not found: {run}")
    return run


def load_trainer_checkpoint(path: str | Path, trainer: str) -> dict[str, Any]:
    """Load a checkpoint onto the CPU and check that ``trainer`` (``"rl"``/``"supervised"``)
    wrote it.

    :raises CheckpointError: missing, corrupt, not a memcores checkpoint, or the other
        trainer's.
    """
    payload = load_checkpoint(path)
    tag = (payload.get("format"), payload.get("trainer"))
    if tag != (CHECKPOINT_FORMAT, trainer):
        kind = "RL" if trainer == "rl" else trainer
        raise CheckpointError(
            f"{path} is not a memcores {kind} checkpoint (format {tag[0]!r}, trainer "
            f"{tag[1]!r}; expected {CHECKPOINT_FORMAT!r}, {trainer!r})"
        )
    return payload


def load_rl_checkpoint(run: str | Path) -> dict[str, Any]:
    """Load and check an RL checkpoint (a run folder or a ``.pt`` file), onto the CPU."""
    return load_trainer_checkpoint(find_checkpoint(run), "rl")


def saved_policy_weights(payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A checkpoint's policy weights, without the constants early versions also saved."""
    weights = dict(payload["model"])
    for name in ("image.scale", "image.offsets"):
        weights.pop(name, None)
    return weights


def policy_from_checkpoint(
    payload: dict[str, Any], device: str | torch.device = "cpu"
) -> tuple[RecurrentActorCritic, RLConfig]:
    """Rebuild the trained policy (eval mode, on ``device``) and its config from a loaded
    checkpoint.

    A record's ``policy.pt`` keeps no reconstruction decoder (it only trains the core), so the
    rebuilt policy has none either when the weights lack it."""
    config = config_from_dict(payload["config"])
    policy = build_policy(config, int(payload["n_actions"]), tuple(payload["image_shape"]))
    weights = saved_policy_weights(payload)
    if not any(name.startswith("decoder.") for name in weights):
        policy.decoder = None
    policy.load_state_dict(weights)
    return policy.to(device).eval(), config


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
