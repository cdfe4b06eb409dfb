"""The CUDA sources as package data: pyproject.toml maps this directory to the package ``ccoll._kernels``, so
a wheel carries them and ``importlib.resources`` finds them (ccoll/resources.py) in a wheel and in an editable
install alike. Nothing to import here: the sources are compiled by NVRTC, nvcc or the simt build."""
