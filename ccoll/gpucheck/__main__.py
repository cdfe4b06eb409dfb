"""``python -m ccoll.gpucheck [--out DIR] [--cpu-selftest] ...``: see ccoll.gpucheck.check."""
import sys

from .check import main

if __name__ == "__main__":
    sys.exit(main())
