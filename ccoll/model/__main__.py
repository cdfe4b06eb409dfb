"""``python -m ccoll.model``: see :mod:`ccoll.model`."""
import sys

from . import main

sys.exit(main())
