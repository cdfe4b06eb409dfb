"""A meta-path finder that runs a callback right after one module has been executed.

Why a hook instead of importing the module: ccoll must act as soon as a heavy module exists (torch for
``ccoll-run``; FSDP2's state module for zero-code FSDP2) without importing it in processes that never
do. Standard library only, and importable without ccoll: ``ccoll-run``'s ``sitecustomize`` loads this file
by its path before ccoll may be imported (importing the ``ccoll`` package imports torch); inside ccoll,
:func:`ccoll.frameworks.when_imported` is the one place that puts it on ``sys.meta_path`` (a row of the
table in ``ccoll/frameworks/__init__.py``)."""
import importlib.util
import sys


class AfterImport:
    """Finds ``name`` with the normal finders, then makes its loader call ``then()`` once the module's own
    code has run and it is in ``sys.modules``; leaves ``sys.meta_path`` then. A ``find_spec`` that does
    not import (``importlib.util.find_spec("deepspeed")``: transformers and accelerate probe for packages
    this way before importing them) gets a spec whose loader is never run: the finder stays in place for
    the real import."""

    def __init__(self, name, then):
        self.name, self.then = name, then
        self.finding = False  # inside our own find_spec: let the other finders answer

    def find_spec(self, name, path=None, target=None):
        if name != self.name or self.finding:
            return None
        self.finding = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.finding = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then(module):
            exec_module(module)
            sys.modules[name] = module  # what the import system does right after; the callback imports it
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                self.then()

        spec.loader.exec_module = exec_then
        return spec
