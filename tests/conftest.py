"""Shared pytest settings."""

import os

# Tests must not depend on a display or a GPU.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

# Triton kernels run on CPU tensors under Triton's interpreter, which must be chosen before
# triton is imported; with a GPU present they run compiled on CUDA instead.
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
