"""memcores: gated recurrent memory cores for RL agents and sequence models, in PyTorch.

One installed package. Its subpackages are the repository's top-level folders:
``memcores.cores`` (the memory cores), ``memcores.envs`` (gymnasium and batched torch envs,
sequence tasks), ``memcores.agents`` (policies, PPO/A2C, trainers, engine adapters) and
``memcores.experiments`` (CLI, configs, sweeps, benchmarks). The everyday names are here::

    import memcores
    core = memcores.make_core("ur_lstm", input_size=10, hidden_size=128)
    config = memcores.load_config(memcores.RLConfig, "memory_s7", ["train.total_steps=4096"])
    result = memcores.train(config, "runs/ms7")

They are imported on first use, so ``import memcores.envs`` does not import torch.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import PackageNotFoundError, version

# A wheel installs the subpackages inside this folder. A checkout keeps them in the repository's
# top-level folders beside it: the package's search path then takes in the repository root, so
# the checkout one runs from (a worktree, mutmut's copy) is the code that runs.
_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "cores")):
    __path__.append(os.path.dirname(_here))  # noqa: F821  (a package's __path__ is a module global)

try:
    __version__ = version("memcores")
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    "CORES": "memcores.cores",
    "make_core": "memcores.cores",
    "MemoryCore": "memcores.cores.base",
    "make_env": "memcores.envs",
    "make_batched_env": "memcores.envs.batched_registry",
    "load_config": "memcores.experiments.config",
    "shipped_configs": "memcores.experiments.config",
    "RLConfig": "memcores.agents.rl_config",
    "SupervisedConfig": "memcores.agents.supervised_config",
    "train": "memcores.agents.rl_trainer",
    "evaluate_run": "memcores.agents.evaluation",
    "train_supervised": "memcores.agents.supervised",
}
# the supervised trainer's entry point is `train` in its own module
_RENAMED = {"train_supervised": "train"}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    """Import an everyday name on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'memcores' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
