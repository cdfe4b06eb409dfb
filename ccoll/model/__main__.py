"""``python -m ccoll.model``: see :mod:`ccoll.model`."""
import sys

from .cli import main

sys.exit(main())
