"""Directory that ``ccoll.run`` puts first on PYTHONPATH: its ``sitecustomize.py`` activates ccoll in every
Python process of a launch (see ccoll.run). Nothing here is imported as ``ccoll._activate``."""
