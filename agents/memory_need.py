"""What a config's largest tensors need, checked against the computer before a run starts.

A size typed one digit too long (``task.length=100000000``, ``env.n_envs=10000000``) would
otherwise fail deep inside NumPy or PyTorch with a traceback and a half-made run folder, or
run until the machine swaps. Each trainer counts the tensors it is sure to allocate (a lower
bound: activations, gradients and the optimiser come on top) and :func:`check_fits` refuses
a count beyond the memory of the computer or the GPU, naming the keys that set it.
"""

from __future__ import annotations

import os

import torch

GIB = 2**30


def memory_of(device: torch.device) -> int | None:
    """Total bytes of ``device``'s memory: the GPU's, or the computer's physical memory for
    the CPU; ``None`` where the platform does not say (then nothing is refused)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return None


def observation_bytes(env_id: str, env_kwargs: dict | None = None) -> int:
    """Bytes of one observation of ``env_id`` (every array of its observation space), read
    from one probe env.

    :raises ValueError: an unknown env id or bad env options (the probe env's errors).
    """
    import numpy as np

    from memcores.envs import make_env

    probe = make_env(env_id, **dict(env_kwargs or {}))
    try:
        spaces = getattr(probe.observation_space, "spaces", {"obs": probe.observation_space})
        return sum(
            int(np.prod(space.shape or ())) * np.dtype(space.dtype).itemsize
            for space in spaces.values()
            if space.dtype is not None
        )
    finally:
        probe.close()


def check_fits(need: int, devices: tuple[torch.device, ...], what: str, advice: str) -> None:
    """Refuse ``need`` bytes that exceed the memory of any of ``devices``.

    :param what: the keys and sizes that make up ``need``, as the message shows them
        (``"task.length=100000000 (100,000,020 steps) x train.batch_size=32 x 74 float32"``).
    :param advice: what to lower (``"lower task.length or train.batch_size"``).
    :raises ValueError: one line with ``what``, both sizes in GiB and ``advice``.
    """
    for device in dict.fromkeys(devices):  # each device once
        have = memory_of(device)
        if have is not None and need > have:
            where = "the computer's" if device.type == "cpu" else f"the GPU's ({device})"
            raise ValueError(
                f"{what} need at least {need / GIB:,.1f} GiB of memory, more than {where} "
                f"{have / GIB:,.1f} GiB; {advice}"
            )
