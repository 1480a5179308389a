"""Keep freed memory inside the process (glibc ``malloc``), so large tensors stop page-faulting.

Why: glibc hands every block of 32 MiB or more back to the kernel when it is freed (``mmap``) and
trims the top of its heap, so the next tensor of that size is fresh memory and its first touch
costs a page fault per 4 KiB. A training step frees and reallocates the same large buffers every
update (gate buffers, their gradients, oneDNN's LSTM workspace), so it pays those faults every
update: on this project's CI-class VM, ~3 us per fault, 25 ms per 32 MiB buffer, and
``torch.nn.LSTM`` at T=256, B=64, H=128 faulted 18,000-35,000 times per forward+backward. PyTorch's
CPU tuning guide suggests swapping in jemalloc or tcmalloc for the same reason; ``mallopt`` gets
the effect without a preload. The cost: the process keeps its peak heap, and glibc's
``posix_memalign`` (PyTorch's CPU allocation) recycles a freed block only once one fits with its
alignment slack, so a buffer allocated again and again at one size is held up to ~7 times
before the heap stops growing (a 64 MiB probe; a ``rel_lstm`` denoise T=1000 run peaked at
2,585 MB with it against 2,311 MB without, +12%).

``memcores`` applies it at start-up; ``MEMCORES_KEEP_FREED_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV_VAR = "MEMCORES_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap and never trim it (glibc on Linux only).

    :return: whether the setting is in effect (``False`` on other platforms, on a libc without
        ``mallopt``, or when ``MEMCORES_KEEP_FREED_MEMORY=0``).
    """
    if os.environ.get(ENV_VAR, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and others: nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, _INT_MAX) == 1
