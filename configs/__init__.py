"""The shipped policies, cluster descriptions (clusters/) and codec tables (codecs/) as package data:
pyproject.toml maps this directory to the package ``ccoll._configs``, so a wheel carries them and
``importlib.resources`` finds them (ccoll/resources.py) in a wheel and in an editable install alike."""
