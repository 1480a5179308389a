"""``python -m memcores``: the ``memcores`` command line."""

import sys

from memcores.experiments.cli import main

if __name__ == "__main__":
    sys.exit(main())
