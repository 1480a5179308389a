"""Device selection shared by every trainer and command.

- :func:`resolve_device`: a config's ``device`` string -> a ``torch.device``.
- :func:`module_device` and :func:`to_device`: tensors follow the module they enter (a policy
  on a GPU fed CPU observations moves them, once, on the way in).
- :func:`acting_device`: where a recurrent policy acts (a batch of ``n_envs`` rows, ``T = 1``)
  for a learner on a given device; the one rule the RL trainer and ``memcores bench gpu`` use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import torch
from torch import nn

DEVICE_CHOICES = ("auto", "cpu", "cuda")

ACT_ON_LEARNER_FROM = 128
"""With a learner on an accelerator, the policy acts on the learner's device from this many
envs on; below it a CPU copy acts. One acting step is a ``[n_envs, ...]`` batch with
``T = 1``: a dozen small kernels, so on a GPU it costs about the same at any small batch
(launch-bound, plus one device-to-host copy of the actions per step), while on the CPU it
grows with the batch. ``memcores bench gpu`` times both per ``n_envs`` and prints where they
cross on the machine it runs on."""

T = TypeVar("T")


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


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (else first buffer); CPU when it has none."""
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def to_device(tensors: T, device: torch.device) -> T:
    """``tensors`` (a tensor, or a dict/tuple/list of them, nested) with every tensor on
    ``device``. Tensors already there are returned as they are (no copy, no kernel), so the
    call costs a device comparison per tensor where nothing moves."""
    if isinstance(tensors, torch.Tensor):
        return tensors if tensors.device == device else tensors.to(device, non_blocking=True)
    if isinstance(tensors, Mapping):
        return {k: to_device(v, device) for k, v in tensors.items()}  # type: ignore[return-value]
    if isinstance(tensors, (tuple, list)):
        return type(tensors)(to_device(v, device) for v in tensors)  # type: ignore[return-value]
    return tensors


def acting_device(
    learner: torch.device | str,
    n_envs: int,
    threshold: int = ACT_ON_LEARNER_FROM,
    graphed: bool = False,
) -> torch.device:
    """Where a policy acts for a learner on ``learner`` with ``n_envs`` envs.

    A CPU learner acts on the CPU (the policy itself acts; nothing is copied). A learner on
    another device acts there from ``threshold`` envs on, and on a CPU copy below it (see
    :data:`ACT_ON_LEARNER_FROM`); with ``graphed`` (acting steps replayed from CUDA graphs,
    ``train.graph_acting``) it acts there at any number of envs. ``learner`` may be any
    device string, so the rule is tested without a GPU (``"meta"``, ``"cuda"``).
    """
    learner = torch.device(learner)
    if learner.type == "cpu" or (n_envs < threshold and not graphed):
        return torch.device("cpu")
    return learner


def describe_acting(learner: torch.device | str, n_envs: int, graphed: bool = False) -> str:
    """One line for logs and benchmarks: ``"acting on cpu (learner cuda, 8 envs < 128)"``."""
    act = acting_device(learner, n_envs, graphed=graphed)
    learner = torch.device(learner)
    if learner.type == "cpu":
        return "acting on cpu (cpu learner)"
    if graphed:
        return f"acting on {act} through CUDA graphs ({n_envs} envs)"
    sign = ">=" if act == learner else "<"
    return f"acting on {act} (learner {learner}, {n_envs} envs {sign} {ACT_ON_LEARNER_FROM})"


def sync(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (a CUDA device; a no-op elsewhere), so a clock
    read after it measures finished work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def info(device: torch.device | str) -> dict[str, Any]:
    """What a benchmark records about the hardware it ran on."""
    import os
    import platform

    device = torch.device(device)
    out: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out
