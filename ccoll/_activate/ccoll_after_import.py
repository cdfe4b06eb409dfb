"""A meta-path finder that runs a callback right after one module has been executed.

Why a hook instead of importing the module: ccoll must act as soon as a heavy module exists (torch for
``ccoll-run``; FSDP2's state module for zero-code FSDP2) without importing it in processes that never
do. Importable without ccoll (``sitecustomize`` uses it before ccoll may be imported): it imports only
the standard library."""
import importlib.util
import sys


class AfterImport:
    """Finds ``name`` with the normal finders (this finder removes itself first), then makes its loader
    call ``then()`` once the module's own code has run and it is in ``sys.modules``."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):
            exec_module(module)
            sys.modules[name] = module  # what the import system does right after; the callback imports it
            self.then()

        spec.loader.exec_module = exec_then
        return spec
