"""The one mechanism through which ccoll replaces anything that is not its own.

Every attribute of another package's module, class or object that ccoll replaces is a row of the table
(:class:`Patch`, one tuple ``PATCHES`` per adapter, all of them in :data:`ccoll.frameworks.TABLE`), and every
replacement goes through :func:`replace`, which refuses an (owner, attribute) no row lists and records the
original. :func:`restore` puts every recorded original back (``ccoll.patch.uninstall``), except one that
someone else replaced on top of ccoll's, which it leaves with a warning. After-import hooks on
``sys.meta_path`` go through :func:`when_imported`, recorded the same way and removed by :func:`restore`.

Owners are named by their dotted path: a module by ``__name__``, a class by ``__module__.__qualname__``,
any other object by the ``owner=`` its caller gives, checked against what that path holds. A row's owner
``"megatron.*"`` covers ``megatron`` and every module under it.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from ..errors import CcollError
from ..log import logger, warn_once
from .after_import import AfterImport

#: when a row's replacement is made: by ``ccoll.patch.install`` (undone by uninstall), when the process
#: imports a module while the patch is installed (undone by uninstall), or by ``ccoll-run``'s activation for
#: the life of the process
INSTALL, IMPORT, CCOLL_RUN = "install", "import", "ccoll-run"


class PatchError(CcollError, RuntimeError):
    """ccoll tried to replace something its table (ccoll/frameworks) does not list."""


@dataclass(frozen=True)
class Patch:
    """One row: ``framework``'s ``owner`` (dotted path) gets ccoll's ``attrs``, made by ``by`` (a ccoll module
    or function), ``when`` (:data:`INSTALL` / :data:`IMPORT` / :data:`CCOLL_RUN`; ``module``: the import that
    triggers an :data:`IMPORT` row), ``why`` in a few words."""

    framework: str
    owner: str
    attrs: tuple
    when: str
    by: str
    why: str
    module: str = ""

    def covers(self, owner: str, attr: str) -> bool:
        if attr not in self.attrs:
            return False
        if self.owner.endswith(".*"):
            prefix = self.owner[:-2]
            return owner == prefix or owner.startswith(prefix + ".")
        return owner == self.owner


@dataclass
class Wrapping:
    """What ``ccoll.patch.install`` hands every adapter's ``install``/``uninstall``: ``make(name, torch_fn)``
    builds the wrapper of a torch.distributed function; ``originals`` / ``wrappers``: name -> torch's
    function / ccoll's wrapper, filled by the torch.distributed adapter (first) and read by the others."""

    make: Callable[[str, Callable], Callable]
    originals: dict
    wrappers: dict


class _Record:
    __slots__ = ("obj", "owner", "attr", "original", "new", "row")

    def __init__(self, obj, owner, attr, original, new, row):
        self.obj, self.owner, self.attr, self.original, self.new, self.row = obj, owner, attr, original, new, row


_lock = threading.RLock()
_rows: list[Patch] = []  # filled by ccoll.frameworks from the adapters' PATCHES
_done: dict[tuple[int, str], _Record] = {}  # (id(owner object), attribute) -> what ccoll replaced, in order
_hooks: list[AfterImport] = []  # after-import hooks ccoll put on sys.meta_path that have not fired


def register(rows: Iterable[Patch]) -> None:
    """The table (called once, by ccoll.frameworks)."""
    _rows[:] = list(rows)


def row_of(owner: str, attr: str) -> "Patch | None":
    return next((r for r in _rows if r.covers(owner, attr)), None)


def owner_name(obj: Any) -> str:
    """A module's ``__name__``, a class's ``__module__.__qualname__``."""
    if isinstance(obj, type(sys)):
        return obj.__name__
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    raise PatchError(f"ccoll.frameworks: name the owner of {obj!r} (owner=): it is neither a module nor a class")


def resolve(path: str) -> Any:
    """The object at dotted ``path``, from modules already imported (never imports); None if absent."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        mod = sys.modules.get(".".join(parts[:i]))
        if mod is not None:
            obj = mod
            for name in parts[i:]:
                obj = getattr(obj, name, None)
                if obj is None:
                    return None
            return obj
    return None


def _checked(obj: Any, attr: str, owner: "str | None") -> tuple[str, Patch]:
    if owner is None:
        owner = owner_name(obj)
    elif resolve(owner) is not obj:
        raise PatchError(f"ccoll.frameworks: {obj!r} is not what {owner} holds")
    row = row_of(owner, attr)
    if row is None:
        raise PatchError(f"ccoll replaces only what the table in ccoll/frameworks lists, and no row lists "
                         f"{owner}.{attr}: add a Patch row to the framework's adapter (ccoll/frameworks/*.py)")
    return owner, row


def replace(obj: Any, attr: str, new: Any, *, owner: "str | None" = None) -> Any:
    """Set ``obj.attr = new`` and remember the original (returned); a PatchError if no row lists it or
    ccoll already replaced it."""
    owner, row = _checked(obj, attr, owner)
    with _lock:
        key = (id(obj), attr)
        if key in _done:
            raise PatchError(f"ccoll.frameworks: {owner}.{attr} is already replaced by ccoll")
        original = getattr(obj, attr)
        _done[key] = _Record(obj, owner, attr, original, new, row)
        setattr(obj, attr, new)
    return original


def replaced(obj: Any, attr: str) -> bool:
    return (id(obj), attr) in _done


def original(obj: Any, attr: str) -> Any:
    """What ``obj.attr`` was before ccoll replaced it (the attribute itself when ccoll did not)."""
    rec = _done.get((id(obj), attr))
    return getattr(obj, attr) if rec is None else rec.original


def rebind(obj: Any, attr: str, value: Any, *, owner: "str | None" = None) -> None:
    """Set ``obj.attr = value`` without recording it: a listed attribute that a framework bound to ccoll's
    own wrapper while the patch was installed (a module imported then), given torch's function back at
    uninstall."""
    _checked(obj, attr, owner)
    setattr(obj, attr, value)


def when_imported(module: str, then: Callable[[], None]) -> None:
    """``then()`` now if ``module`` is imported, else right after the process imports it (an
    :class:`AfterImport` on ``sys.meta_path``, removed by :func:`restore` if it has not fired)."""
    if module in sys.modules:
        then()
        return
    if row_of("sys", "meta_path") is None:
        raise PatchError("ccoll.frameworks: no row lists sys.meta_path")
    with _lock:
        _hooks[:] = [h for h in _hooks if h in sys.meta_path]
        if any(h.name == module for h in _hooks):
            return
        hook = AfterImport(module, then)
        _hooks.append(hook)
        sys.meta_path.insert(0, hook)


def restore(when: tuple = (INSTALL, IMPORT)) -> None:
    """Put back every original ccoll recorded for rows made ``when`` (by default what ``ccoll.patch.install``
    made; ``ccoll-run``'s rows stay for the life of the process), newest first, and take ccoll's after-import
    hooks off ``sys.meta_path``. An attribute someone replaced on top of ccoll's is left (theirs stays;
    ccoll's below it passes through once uninstalled), with a warning."""
    with _lock:
        if IMPORT in when:
            for hook in _hooks:
                if hook in sys.meta_path:
                    sys.meta_path.remove(hook)
            _hooks.clear()
        for key, rec in reversed(list(_done.items())):
            if rec.row.when in when:
                _put_back(key)
    logger.debug("ccoll.frameworks: restored %s", ", ".join(when))


def restore_one(obj: Any, attr: str) -> None:
    """:func:`restore` for one attribute (nothing if ccoll did not replace it)."""
    with _lock:
        if (id(obj), attr) in _done:
            _put_back((id(obj), attr))


def _put_back(key: tuple[int, str]) -> None:
    rec = _done.pop(key)
    if getattr(rec.obj, rec.attr, None) is rec.new:
        setattr(rec.obj, rec.attr, rec.original)
    else:  # someone wrapped on top of ccoll: leave theirs
        warn_once(f"ccoll-uninstall-{rec.owner}.{rec.attr}", "ccoll: %s.%s was replaced after ccoll installed; "
                  "leaving it (ccoll's wrapper below it now passes through)", rec.owner, rec.attr)


def active() -> list[tuple[str, str]]:
    """(owner, attribute) of every replacement in place now, oldest first."""
    with _lock:
        return [(r.owner, r.attr) for r in _done.values()]


def call(obj: Any, name: str) -> Any:
    """``obj.name()`` or None when the accessor is missing or asserts that it is not initialised (how the
    adapters read a framework's state without trusting it to be built)."""
    fn = getattr(obj, name, None)
    if fn is None:
        return None
    try:
        return fn()
    except (AssertionError, RuntimeError, AttributeError, TypeError, KeyError):
        return None
