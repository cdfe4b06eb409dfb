"""``python -m ccoll.kernels build|check [names...]``."""
import sys

from .check import main

if __name__ == "__main__":  # not in the check's spawned workers, which import this module as __mp_main__
    sys.exit(main(sys.argv[1:]))
