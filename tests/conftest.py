"""Shared pytest settings."""

import os

# Tests must not depend on a display or a GPU.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
