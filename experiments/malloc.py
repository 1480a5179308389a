"""Keep freed memory inside the process (glibc ``malloc``), so large tensors stop page-faulting.

Why: glibc hands every block of 32 MiB or more back to the kernel when it is freed (``mmap``) and
trims the top of its heap, so the next tensor of that size is fresh memory and its first touch
costs a page fault per 4 KiB. A training step frees and reallocates the same large buffers every
update (gate buffers, their gradients, oneDNN's LSTM workspace), so it pays those faults every
update (``memcores bench cores`` prints whether the setting is on; compare with
``MEMCORES_KEEP_FREED_MEMORY=0``). PyTorch's
CPU tuning guide suggests swapping in jemalloc or tcmalloc for the same reason; ``mallopt`` gets
the effect without a preload. The cost: the process keeps its peak heap, and glibc's
``posix_memalign`` (PyTorch's CPU allocation) recycles a freed block only once one fits with its
alignment slack, so a buffer allocated again and again at one size is held up to ~7 times
before the heap stops growing (a ``rel_lstm`` denoise T=1000 run's peak RSS rose by 12 %).

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
