"""A happens-before model of CUDA streams, events and the caching allocator, so ccoll's real stream
ordering code (:mod:`ccoll.streams`) can be checked on CPU tensors, in CI, without a GPU.

Why a model and not a recording: a log says *which* calls were made; a GPU bug is an access that is
not *ordered* after the write it depends on. The model replays torch's semantics and flags exactly
those accesses:

- streams carry vector clocks; each kernel issued on a stream ticks its own component; an event is a
  copy of its stream's clock; ``wait(stream, event)`` joins the event's clock into the stream's;
- the current stream is **per thread** (torch: thread-local, every new thread starts on the device's
  default stream), and ``use(stream)`` changes it for the calling thread only;
- every tensor storage remembers its last write (stream, tick) and the reads since; a read on stream S
  is ordered iff ``S.clock[writer] >= tick`` (a write also against every read since: no overwrite of
  data another stream still reads);
- the allocator: a storage belongs to the stream current when it was allocated; when Python drops it,
  every use on another stream must already be ordered before that stream (the block is reused by the
  next allocation there), unless ``record_stream`` (:meth:`Model.keep`) named the using stream;
- kernels are attributed to the stream current in the thread that issues them: every aten op run
  while tracking (a ``TorchDispatchMode`` entered per thread) reads its inputs and writes its mutated
  arguments on it; the codec calls (``encode_rows`` / ``decode_rows`` / ``decode_sum``) and the
  in-memory transport's requests are hooked as NCCL behaves: a communication runs on its own stream
  that waits for the current stream at issue, and a request's ``wait()`` makes the stream current in
  the waiting thread wait for it;
- futures: torch's CUDA-aware ``Future`` records an event on the completing thread's current stream,
  and ``wait()``/``value()`` make the waiting thread's current stream wait for it
  (:meth:`Model.future` / :meth:`Model.complete` / :meth:`Model.consume`).

Plugged into ccoll through its seam: ``ccoll.streams._api_for`` returns the model (:func:`install`).
Paths that need a real process group (the patched ``torch.distributed.batch_isend_irecv`` calls
torch's own) run on gloo ranks, each installing the same model in its process without pytest
(:func:`installed`, a :class:`Patcher`), with torch's ``isend``/``irecv`` hooked as communications
(:func:`hook_torch_p2p`).
Findings are collected in :attr:`Model.violations` (raising inside the collectives would be swallowed
by worker threads); tests assert the list is empty.
"""
from __future__ import annotations

import contextlib
import threading
import types
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that allocate without writing (no kernel)
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class Stream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.clock: dict[str, int] = {name: 0}

    def tick(self) -> int:
        self.clock[self.name] += 1
        return self.clock[self.name]

    def sees(self, stream: str, tick: int) -> bool:
        return stream == self.name or self.clock.get(stream, 0) >= tick

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class Event:
    __slots__ = ("stream", "clock")

    def __init__(self, stream: Stream) -> None:
        self.stream, self.clock = stream.name, dict(stream.clock)

    def __repr__(self) -> str:
        return f"<event on {self.stream} at {self.clock.get(self.stream)}>"


class _Storage:
    """What the model knows about one storage: allocating stream, last write, reads since, kept-for."""

    __slots__ = ("ref", "alloc", "write", "reads", "kept", "what")

    def __init__(self, ref: StorageWeakRef, alloc: Stream, what: str) -> None:
        self.ref, self.alloc, self.what = ref, alloc, what
        self.write: tuple[str, int, str] | None = None
        self.reads: list[tuple[str, int, str]] = []
        self.kept: set[str] = set()


class Model:
    """The fake device API of :class:`ccoll.streams.Call` (same methods as ``CudaApi``) plus the
    happens-before checks."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.tls = threading.local()
        self.streams: dict[str, Stream] = {"default": Stream("default")}
        self.storages: dict[int, _Storage] = {}
        self.violations: list[str] = []
        self.futures: dict[int, tuple[Any, Event]] = {}
        self._comm = 0

    # --- the CudaApi surface ------------------------------------------------------------------
    def stream(self, name: str) -> Stream:
        with self.lock:
            s = self.streams.get(name)
            if s is None:
                s = self.streams[name] = Stream(name)
            return s

    def side_stream(self, device: Any) -> Stream:
        return self.stream("side")

    def current_stream(self, device: Any = None) -> Stream:
        return getattr(self.tls, "current", None) or self.streams["default"]

    def record(self, stream: Stream, timing: bool = False) -> Event:
        with self.lock:
            return Event(stream)

    def wait(self, stream: Stream, event: Event) -> None:
        with self.lock:
            for k, v in event.clock.items():
                if stream.clock.get(k, 0) < v:
                    stream.clock[k] = v

    @contextlib.contextmanager
    def use(self, stream: Stream):
        before = getattr(self.tls, "current", None)
        self.tls.current = stream
        try:
            yield
        finally:
            self.tls.current = before

    def keep(self, tensor: torch.Tensor, stream: Stream) -> None:
        st = self._state(tensor, "kept tensor")
        if st is not None:
            with self.lock:
                st.kept.add(stream.name)

    def query(self, event: Event) -> bool:
        return True

    def elapsed_s(self, start: Event, end: Event) -> float:
        return 0.25

    def future(self, device: Any) -> torch.futures.Future:
        return torch.futures.Future()

    def complete(self, fut: torch.futures.Future, value: Any) -> None:
        """torch's CUDA future: an event on the completing thread's current stream."""
        with self.lock:
            self.futures[id(fut)] = (fut, Event(self.current_stream()))
        fut.set_result(value)

    def consume(self, fut: torch.futures.Future) -> Any:
        """``fut.wait()`` as torch's CUDA future does it: the waiting thread's current stream waits for
        the event recorded at completion (a future completed without one gives no ordering), and the
        value's tensors are record_stream-ed on that stream (torch does both in ``wait()``)."""
        value = fut.wait()
        with self.lock:
            entry = self.futures.get(id(fut))
        if entry is not None and entry[0] is fut:
            self.wait(self.current_stream(), entry[1])
        for t in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(t, torch.Tensor):
                self.keep(t, self.current_stream())
        return value

    # --- accesses ---------------------------------------------------------------------------------
    def _state(self, t: torch.Tensor, what: str, fresh: bool = False) -> _Storage | None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return None
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            return None
        ptr = storage.data_ptr()
        with self.lock:
            st = self.storages.get(ptr)
            if st is not None and st.ref.expired():
                self._freed(ptr, st)
                st = None
            if st is None or fresh:
                st = self.storages[ptr] = _Storage(StorageWeakRef(storage), self.current_stream(), what)
            return st

    def _freed(self, ptr: int, st: _Storage) -> None:
        """The allocator reuses the block on its stream: every other stream's use must be ordered."""
        del self.storages[ptr]
        uses = ([st.write] if st.write else []) + st.reads
        for stream, tick, what in uses:
            if stream in st.kept or stream.startswith("comm") or st.alloc.sees(stream, tick):
                continue
            self.violations.append(
                f"freed while in use: {st.what} (allocated on {st.alloc.name}) was dropped while '{what}' on "
                f"stream {stream} may still use it (no record_stream for {stream}, not ordered before {st.alloc.name})")

    def collect(self) -> None:
        """Check every storage Python has dropped since the last look."""
        with self.lock:
            for ptr, st in list(self.storages.items()):
                if st.ref.expired():
                    self._freed(ptr, st)

    def kernel(self, what: str, reads=(), writes=(), stream: Stream | None = None) -> None:
        """One kernel on ``stream`` (default: the current one) reading ``reads`` and writing ``writes``."""
        s = stream or self.current_stream()
        states_r = [st for st in (self._state(t, what) for t in reads) if st is not None]
        states_w = [st for st in (self._state(t, what) for t in writes) if st is not None]
        with self.lock:
            tick = s.tick()
            for st in states_r + states_w:
                if st.write and not s.sees(st.write[0], st.write[1]):
                    self.violations.append(
                        f"unordered read: '{what}' on stream {s.name} uses {st.what} before its producer "
                        f"'{st.write[2]}' on stream {st.write[0]} (no event wait orders them)")
            for st in states_w:
                for stream, rt, rwhat in st.reads:
                    if not s.sees(stream, rt):
                        self.violations.append(
                            f"unordered overwrite: '{what}' on stream {s.name} writes {st.what} while '{rwhat}' "
                            f"on stream {stream} may still read it")
            for st in states_r:
                st.reads.append((s.name, tick, what))
            for st in states_w:
                st.write, st.reads = (s.name, tick, what), []

    def produce(self, t: torch.Tensor, what: str) -> None:
        """A tensor written now by the current stream (a test's input, made on the compute stream)."""
        self._state(t, what, fresh=True)
        self.kernel(f"produce {what}", writes=[t])

    def read(self, t: torch.Tensor, what: str) -> None:
        self.kernel(f"consume {what}", reads=[t])

    # --- communication (NCCL semantics) -----------------------------------------------------------
    def comm(self, what: str, reads=(), writes=()) -> Event:
        """A communication issued now: its own stream waits for the current stream, then reads/writes;
        returns the event a request's wait() joins."""
        with self.lock:
            self._comm += 1
            s = self.stream(f"comm{self._comm}")
        self.wait(s, self.record(self.current_stream()))
        self.kernel(what, reads, writes, stream=s)
        return self.record(s)

    # --- tracking ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def suspended(self):
        before = getattr(self.tls, "off", False)
        self.tls.off = True
        try:
            yield
        finally:
            self.tls.off = before

    def off(self) -> bool:
        return getattr(self.tls, "off", False)

    @contextlib.contextmanager
    def tracking(self):
        """Attribute every aten op of this thread to its current stream."""
        with _Track(self):
            yield


class _Track(TorchDispatchMode):
    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        m = self.model
        if m.off():
            return out
        name = func.__name__.split(".")[0]
        schema = func._schema
        reads, writes = [], []
        for i, a in enumerate(schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, torch.Tensor):
                    (writes if a.alias_info is not None and a.alias_info.is_write else reads).append(x)
        outs = out if isinstance(out, (list, tuple)) else [out]
        inputs = {_ptr(x) for x in reads + writes}
        fresh = [o for r, o in zip(schema.returns, outs)
                 if isinstance(o, torch.Tensor) and r.alias_info is None and _ptr(o) not in inputs]
        for o in fresh:
            m._state(o, f"tensor from aten.{name}", fresh=True)
        if name in _NO_KERNEL:
            return out
        views = all(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns) and schema.returns
        if views and not writes:
            return out  # a view: no kernel
        m.kernel(f"aten.{name}", reads, writes + fresh)
        return out


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# --- plugging it into ccoll ---------------------------------------------------------------------------

_CODEC_CALLS = {
    # name -> (positional indices read, indices written, keyword names written)
    "encode_rows": ((0,), (1,), ("feedback",)),
    "decode_rows": ((0,), (1,), ()),
    "decode_sum": ((0,), (), ("out",)),
}


def hook_codec(model: Model, codec: Any) -> Any:
    """Make ``codec``'s batched calls kernels of the current stream (their inner torch ops are not
    tracked: one call is one launch on a GPU). Returns the codec."""
    for name, (r_idx, w_idx, w_kw) in _CODEC_CALLS.items():
        inner = getattr(codec, name)

        def call(*args, _inner=inner, _name=name, _r=r_idx, _w=w_idx, _kw=w_kw, **kwargs):
            reads = [args[i] for i in _r if i < len(args)]
            writes = [args[i] for i in _w if i < len(args)] + [kwargs[k] for k in _kw if kwargs.get(k) is not None]
            reads += [kwargs[k] for k in _kw if kwargs.get(k) is not None]  # feedback is read too
            with model.suspended():
                result = _inner(*args, **kwargs)
            if isinstance(result, torch.Tensor) and not writes:
                writes.append(result)
            model.kernel(f"codec {_name}", reads, writes)
            return result

        setattr(codec, name, call)
    return codec


class _CommWork:
    """A request whose wait() makes the waiting thread's current stream wait for the communication."""

    def __init__(self, model: Model, inner: Any, done: Event) -> None:
        self.model, self.inner, self.done = model, inner, done

    def wait(self, *args: Any) -> bool:
        with self.model.suspended():
            if self.inner is not None:
                self.inner.wait(*args)
        self.model.wait(self.model.current_stream(), self.done)
        return True

    def is_completed(self) -> bool:
        return self.inner is None or self.inner.is_completed()


_TRANSPORT_CALLS = {
    # name -> (positional indices read, indices written)
    "native_all_reduce": ((0,), (0,)),
    "native_reduce_scatter": ((1,), (0,)),
    "native_all_gather": ((1,), (0,)),
    "native_broadcast": ((0,), (0,)),
    "native_all_to_all": ((1,), (0,)),
    "native_isend": ((0,), ()),
    "native_irecv": ((), (0,)),
}


def install(monkeypatch, model: Model) -> Model:
    """Route ``ccoll.streams`` to ``model``, hook the in-memory transport's requests and make the
    ccoll waiter threads track their ops too. ``monkeypatch``: pytest's fixture, or a :class:`Patcher`
    (a process without pytest's fixtures: a gloo rank)."""
    import ccoll.streams as streams
    import ccoll.transports.handle as handle
    import ccoll.transports.memory as memory

    monkeypatch.setattr(streams, "_api_for", lambda device: model)
    for name, (r_idx, w_idx) in _TRANSPORT_CALLS.items():
        inner = getattr(memory.MemoryTransport, name)

        def call(self, *args, _inner=inner, _name=name, _r=r_idx, _w=w_idx, **kwargs):
            async_op = kwargs.get("async_op", args[-1] if args and isinstance(args[-1], bool) else False)
            done = model.comm(f"comm {_name}", [args[i] for i in _r], [args[i] for i in _w])
            with model.suspended():
                work = _inner(self, *args, **kwargs)
            if _name in ("native_isend", "native_irecv") or async_op:
                return _CommWork(model, work, done)
            model.wait(model.current_stream(), done)  # a synchronous call: torch makes the current stream wait
            return work

        monkeypatch.setattr(memory.MemoryTransport, name, call)

    real = threading.Thread

    class Thread(real):
        def run(self) -> None:
            with model.tracking():
                super().run()

    shim = types.SimpleNamespace(**{k: getattr(threading, k) for k in dir(threading) if not k.startswith("__")})
    shim.Thread = Thread
    monkeypatch.setattr(handle, "threading", shim)
    return model


def hook_torch_p2p(monkeypatch, model: Model) -> None:
    """Make ``torch.distributed.isend`` / ``irecv`` (on a real process group: gloo ranks) communications
    of the model, as NCCL behaves: each runs on its own stream that waits for the current stream at
    issue and returns a request whose ``wait()`` orders the waiting thread's current stream. Must run
    before ``ccoll.patch.install``, so the patch's originals (what its wrappers and torch's
    ``batch_isend_irecv`` call while ccoll is busy) are these."""
    import torch.distributed as dist

    from ccoll.patch.state import SLOT

    assert not SLOT.originals, "hook torch's p2p before ccoll.patch.install (its originals must be the hooked ones)"
    for name, sending in (("isend", True), ("irecv", False)):
        inner = getattr(dist, name)

        def call(tensor, *args, _inner=inner, _name=name, _sending=sending, **kwargs):
            done = model.comm(f"comm torch {_name}", [tensor] if _sending else [], [] if _sending else [tensor])
            with model.suspended():
                work = _inner(tensor, *args, **kwargs)
            return _CommWork(model, work, done)

        monkeypatch.setattr(dist, name, call)
        monkeypatch.setattr(dist.distributed_c10d, name, call)  # P2POp checks its op against this one


class Patcher:
    """What :func:`install` uses of pytest's ``monkeypatch`` (``setattr``, ``undo``), for processes that
    have no pytest fixture: the gloo ranks a test starts."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []

    def setattr(self, target: Any, name: str, value: Any) -> None:
        self._saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self) -> None:
        while self._saved:
            target, name, value = self._saved.pop()
            setattr(target, name, value)


@contextlib.contextmanager
def installed(model: Model, torch_p2p: bool = False):
    """:func:`install` (and :func:`hook_torch_p2p` with ``torch_p2p``) for the block, then everything
    put back: the same model in a process without pytest (a gloo rank)."""
    patcher = Patcher()
    try:
        install(patcher, model)
        if torch_p2p:
            hook_torch_p2p(patcher, model)
        yield model
    finally:
        patcher.undo()


# --- which algorithms ran under the model (coverage by construction) --------------------------------------

#: torch's hook contracts: a DDP comm hook takes a GradBucket; an FSDP2 Comm subclasses one of these
_FSDP_COMMS = ("AllGather", "ReduceScatter")


def _ccoll_root():
    import pathlib

    import ccoll

    return pathlib.Path(ccoll.__file__).resolve().parent


def algorithms() -> list[str]:
    """Every code path of ccoll that orders a compressed call on CUDA streams, derived from the source so a
    new one cannot be left out: (1) the algorithms the router (``ccoll/collectives/__init__.py``) dispatches
    to -- every public function taking the call's ``run`` first in a module the router imports from its own
    package (flat, small, hierarchy, varsize; whatever the dispatch looks like);
    (2) every function outside the router that opens its own stream call (``Run(...)`` or
    ``streams.begin(...)``: weight-delta, the patched ``batch_isend_irecv``); (3) torch's hooks that drive
    the router with their own tensors: DDP comm hooks (a ``GradBucket`` parameter) and FSDP2 Comms (a
    subclass of FSDP2's ``AllGather`` / ``ReduceScatter``: their ``__call__``). Names are
    ``module:qualname`` (``ccoll.collectives.flat:all_reduce``, ``ccoll.patch.batch:make.<locals>.batch_isend_irecv``)."""
    import ast

    root = _ccoll_root()
    found: set[str] = set()
    router = ast.parse((root / "collectives" / "__init__.py").read_text())
    for node in router.body:  # the algorithm modules: what the router imports from its own package
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None:
            for a in node.names:
                tree = ast.parse((root / "collectives" / f"{a.name}.py").read_text())
                for fn in tree.body:  # an algorithm takes the call's Run first
                    if (isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") and fn.args.args
                            and fn.args.args[0].arg == "run"):
                        found.add(f"ccoll.collectives.{a.name}:{fn.name}")

    def own_nodes(fn):
        """The nodes of ``fn``'s own body, not of the functions nested in it."""
        todo = list(fn.body)
        while todo:
            n = todo.pop()
            yield n
            if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.extend(ast.iter_child_nodes(n))

    def walk(body, prefix, module):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = prefix + node.name
                opens = any(isinstance(n, ast.Call) and (
                    (isinstance(n.func, ast.Name) and n.func.id == "Run")
                    or (isinstance(n.func, ast.Attribute) and n.func.attr == "begin"
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "streams"))
                    for n in own_nodes(node))
                hook = any(a.annotation is not None and "GradBucket" in ast.unparse(a.annotation)
                           for a in node.args.args)
                if module != "ccoll.collectives" and (opens or hook):
                    found.add(f"{module}:{qual}")
                walk(node.body, qual + ".<locals>.", module)
            elif isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & set(_FSDP_COMMS):
                    found.add(f"{module}:{prefix}{node.name}.__call__")
                walk(node.body, prefix + node.name + ".", module)

    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if module in ("ccoll.collectives.call", "ccoll.streams"):
            continue  # the skeleton and the stream machinery themselves
        walk(ast.parse(path.read_text()).body, "", module)
    return sorted(found)


def _variant(name: str, fn, args, kwargs) -> set[str]:
    """Tags of one call: the world size class (``p=2`` / ``p>=3``) of its transport and, for the flat and
    one-exchange pipelines, whether it ran several segments (``segments>1``)."""
    import inspect

    from ccoll.collectives import segments as seg

    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    except TypeError:
        return set()
    tags = set()
    tr = bound.get("tr")
    if tr is not None and hasattr(tr, "world_size"):
        p = tr.world_size
        tags.add("p=2" if p == 2 else "p>=3" if p > 2 else f"p={p}")
        c = bound.get("c")
        t = bound.get("tensor", bound.get("input"))
        if c is not None and isinstance(t, torch.Tensor) and name.startswith(("ccoll.collectives.flat:",
                                                                             "ccoll.collectives.small:")):
            if name.endswith(":all_reduce"):
                n = len(seg.segments(t.numel(), p, t.element_size(), c.align_numel))
            elif name.endswith((":reduce_scatter_tensor", ":all_gather_into_tensor")):
                m = t.numel() // p if name.endswith("reduce_scatter_tensor") else t.numel()
                n = len(seg.spans(m, p, t.element_size(), c.align_numel))
            else:
                n = 1
            if n > 1:
                tags.add("segments>1")
    return tags


def record_algorithms(monkeypatch, reached: dict[str, set[str]], names: list[str] | None = None) -> None:
    """Wrap every function of :func:`algorithms` (or ``names``) so each call adds its name and its
    :func:`_variant` tags to ``reached`` (name -> tags; the empty tag ``""`` marks a call). A nested
    function (``make.<locals>.f``) is reached through its factory: the factory's result is wrapped."""
    import functools
    import importlib

    lock = threading.Lock()

    def wrapping(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            tags = _variant(name, fn, args, kwargs) | {""}
            with lock:
                reached.setdefault(name, set()).update(tags)
            return fn(*args, **kwargs)
        return wrapper

    for name in names or algorithms():
        module, qual = name.split(":")
        owner: Any = importlib.import_module(module)
        parts = qual.split(".<locals>.")
        path = parts[0].split(".")
        for attr in path[:-1]:
            owner = getattr(owner, attr)
        target = owner.__dict__[path[-1]] if isinstance(owner, type) else getattr(owner, path[-1])
        if len(parts) == 1:
            monkeypatch.setattr(owner, path[-1], wrapping(name, target))
        else:  # the factory returns the function: wrap what it returns
            def factory(*args, _make=target, _name=name, **kwargs):
                return wrapping(_name, _make(*args, **kwargs))
            monkeypatch.setattr(owner, path[-1], functools.wraps(target)(factory))


__all__ = ["Event", "Model", "Patcher", "Stream", "algorithms", "hook_codec", "hook_torch_p2p", "install", "installed",
           "record_algorithms"]
