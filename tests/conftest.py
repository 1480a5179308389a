"""Shared pytest settings."""

import os

import torch

# Tests must not depend on a display or a GPU.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
# Without a GPU, Triton kernels run on CPU tensors under Triton's interpreter; the variable
# must be set before triton is first imported (cores import it only where a kernel is used).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
