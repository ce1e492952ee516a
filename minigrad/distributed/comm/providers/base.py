"""The backend interface every collective backend implements (``cpu``, ``mpi``, ``nccl``).

A backend object serves one process group on one rank. It receives C-contiguous arrays of its
kind (NumPy for ``cpu`` and ``mpi``, CuPy for ``nccl``), group-local root indices and the call's
sequence number, and moves the bytes; everything users see (argument checks, Tensors, CuPy staging,
``ReduceOp.AVG``, async handles) is done once, above it, in :mod:`minigrad.distributed.comm.arrays`.

Three rules hold for every backend, so all of them behave the same when something goes wrong:

* **Fingerprints.** Before touching data, all members agree on the call's fingerprint (op,
  sequence number, root, shapes/dtypes, backend, and the caller's ``check`` string if it gave one).
  Ranks that call different collectives, the same one with different shapes, or with different
  ``check`` strings, all raise :class:`CollectiveMismatchError` naming every rank's call, instead
  of hanging or corrupting memory. A caller with its own notion of "the same call" (the global
  tensors' lockstep digest) passes it as ``check`` and needs no exchange of its own.
* **Bounded waits.** Every wait is watched (:class:`~.waiting.Watchdog`): a warning after the
  group's ``warn_after`` seconds naming the ranks that have not arrived, and
  :class:`CollectiveTimeoutError` after its ``timeout``.
* **Order.** Asynchronous operations of a group run in submission order on one worker
  (:class:`OrderedWorker`); a synchronous call first waits for them (:meth:`Backend.flush`).
"""

from __future__ import annotations

import abc
import enum
import queue
import threading
from typing import Any, Callable

import numpy as np


class CollectiveError(RuntimeError):
    """A collective failed (peer aborted or died, connection lost, bad arguments)."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different shapes/dtypes/roots or
    ``check`` strings. ``ranks`` are the group's global ranks and ``calls`` their fingerprints (in
    group order), so a caller can tell what differed (``calls[j].get("check")``)."""

    def __init__(self, message: str, ranks: list | None = None, calls: list | None = None):
        super().__init__(message)
        self.ranks = list(ranks or [])
        self.calls = list(calls or [])


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete in time: some rank skipped it, hangs, or is too slow."""


class ReduceOp(enum.Enum):
    """Reduction of a collective (PyTorch's ``dist.ReduceOp``); strings name them too: ``"sum"``.

    ``AVG`` is the sum divided by the group size: true division for floating-point dtypes, floor
    division (NumPy's ``//``) for integer dtypes; it is refused for ``bool``. On ``bool`` arrays SUM
    and MAX are logical or, PRODUCT and MIN logical and (NumPy's semantics).
    """

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"

    __hash__ = object.__hash__  # members are singletons: the identity hash, without Enum's call

    @classmethod
    def parse(cls, op: Any, where: str) -> ReduceOp:
        """``op`` as a ReduceOp; a string is matched case-insensitively (``"max"``, ``"AVG"``)."""
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            for member in cls:
                if member.value == op.lower():
                    return member
        names = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{where}: unknown reduce op {op!r}, expected dist.ReduceOp.X or {names}")


def divide_by_count(x, n: int) -> None:
    """``ReduceOp.AVG``'s last step, in place: ``x /= n`` for floating-point dtypes, ``x //= n``
    (floor division) for integer ones. A floating-point division by a power of two runs as the
    multiplication by its inverse: the same bits (both round the same exact value), half the
    time in NumPy."""
    if x.dtype.kind not in "fc":
        x //= n
    elif n & (n - 1) == 0:
        x *= 1.0 / n
    else:
        x /= n


def reduce_in_order(arrays: list[np.ndarray], ufunc, out: np.ndarray) -> np.ndarray:
    """``out`` = arrays[0] op arrays[1] op ... (group order; ``out`` may be one of the inputs):
    the order every backend that reduces by itself follows, so its results are bitwise the same
    on every member. The first call reads the first two inputs before it writes (NumPy's rule for
    overlapping operands), so only later inputs that share memory with ``out`` are copied first."""
    if len(arrays) == 1:
        out[...] = arrays[0]
        return out
    later = [np.array(a, copy=True) if np.may_share_memory(a, out) else a for a in arrays[2:]]
    ufunc(arrays[0], arrays[1], out=out)
    for a in later:
        ufunc(out, a, out=out)
    return out


#: NumPy ufunc of each reduction the backends perform (AVG reaches only backends that fold it in,
#: ``Backend.averages``; the others get SUM and the division happens above them).
UFUNCS = {
    ReduceOp.SUM: np.add,
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}

#: Bool reductions as the backends run them on 0/1 bytes (NumPy's semantics): sum is "or" (max),
#: product is "and" (min).
BOOL_AS_BYTES_OPS = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PRODUCT: ReduceOp.MIN}


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """The dtype as users write it (``float32``), for fingerprints and error messages (cached:
    NumPy computes ``dtype.name`` anew on each access, which shows in per-call latency)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def contiguous(a):
    """A C-contiguous view or copy of a NumPy/CuPy array; 0-d arrays stay 0-d (unlike
    ``ascontiguousarray``, which turns them into shape (1,))."""
    return a if a.flags.c_contiguous else a.copy(order="C")


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a NumPy array as a flat uint8 view (a copy first if it is not contiguous)."""
    return contiguous(np.asarray(a)).reshape(-1).view(np.uint8)


def array_meta(a) -> list | None:
    """``[shape, dtype name]`` of an array (None for None): what a fingerprint says of a buffer."""
    return None if a is None else [list(a.shape), dtype_name(a.dtype)]


def fingerprint(op: str, seq: int, root: int | None = None, sig: Any = None,
                check: str | None = None) -> dict:
    """The cheap per-call identity all ranks must agree on (``sig``: shapes/dtypes to match;
    ``check``: the caller's own string that must match too, left out when None)."""
    fp = {"op": op, "seq": seq, "root": root, "sig": sig}
    if check is not None:
        fp["check"] = check
    return fp


def describe(fp: dict) -> str:
    """Human-readable form of a fingerprint for messages: ``all_reduce#3(sig=...)``."""
    parts = []
    if fp.get("root") is not None:
        parts.append(f"root={fp['root']}")
    if fp.get("sig") is not None:
        parts.append(f"sig={fp['sig']}")
    if fp.get("check") is not None:
        parts.append(f"check={fp['check']!r}")
    via = f" via {fp['backend']}" if fp.get("backend") not in (None, "cpu") else ""
    return f"{fp['op']}#{fp['seq']}({', '.join(parts)}){via}"


FINGERPRINT_KEYS = ("op", "seq", "root", "sig", "backend", "check")


def check_fingerprints(headers: list[dict], ranks: list[int]) -> None:
    """Raise :class:`CollectiveMismatchError` when the group members' fingerprints differ.

    All members call this with the same list of headers, so all of them raise together.
    """
    ref = headers[0]
    for i, h in enumerate(headers[1:], start=1):
        if h is ref:  # the transport found the same header bytes: nothing to compare
            continue
        if any(h.get(k) != ref.get(k) for k in FINGERPRINT_KEYS):
            calls = "; ".join(
                f"rank {ranks[j]} called {describe(x)}" for j, x in enumerate(headers)
            )
            raise CollectiveMismatchError(
                f"collective mismatch in group {ranks} between rank {ranks[0]} and rank "
                f"{ranks[i]}: {calls}",
                ranks,
                headers,
            )


class Work:
    """Handle of an asynchronous operation (PyTorch's ``Work``): ``wait()`` returns its result.

    Errors of the operation are raised by ``wait()``. Waiting twice returns the same result.
    """

    def __init__(self, wait_fn: Callable[[], Any], done_fn: Callable[[], bool] | None = None):
        self._wait_fn = wait_fn
        self._done_fn = done_fn
        self._result: Any = None
        self._finished = False
        self._lock = threading.Lock()

    @classmethod
    def ready(cls, value: Any) -> Work:
        """A handle of an operation that already finished with ``value``."""
        return cls(lambda: value, lambda: True)

    def wait(self) -> Any:
        """Block until the operation finished; return its result (or raise its error)."""
        with self._lock:
            if not self._finished:
                self._result = self._wait_fn()
                self._finished = True
            return self._result

    def is_completed(self) -> bool:
        """Whether ``wait()`` would return without blocking."""
        if self._finished:
            return True
        return bool(self._done_fn()) if self._done_fn is not None else False

    def then(self, fn: Callable[[Any], Any]) -> Work:
        """A handle whose ``wait()`` waits for this one, then returns ``fn(result)``."""
        return Work(lambda: fn(self.wait()), self.is_completed)

    def __repr__(self) -> str:
        return f"Work(completed={self.is_completed()})"


CLOSE_WAIT = 5.0  # seconds closing a process group waits for its queued asynchronous work


class OrderedWorker:
    """A thread that runs submitted callables one at a time, in submission order.

    Asynchronous collectives of a group run here, so they keep the order in which they were
    issued; :meth:`flush` waits until everything submitted so far has run; :meth:`close` stops the
    thread once its queue is empty (it is a daemon thread, so a job that never closes still exits).
    """

    def __init__(self, name: str):
        self._queue: queue.Queue = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Work:
        """Queue ``fn``; the returned Work's ``wait()`` gives its result or raises its error."""
        box: dict = {}
        done = threading.Event()
        with self._cond:
            self._pending += 1
        self._queue.put((fn, box, done))

        def wait():
            done.wait()
            if "error" in box:
                raise box["error"]
            return box["value"]

        return Work(wait, done.is_set)

    def flush(self) -> None:
        """Block until every callable submitted so far has finished."""
        if self._pending == 0:  # nothing queued (read under the GIL: no lock needed to see 0)
            return
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Let queued work finish, then stop the thread (waiting at most ``wait`` seconds: work
        stuck on a dead peer ends with its own timeout error)."""
        self._queue.put(None)
        self._thread.join(wait)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box["value"] = fn()
            except BaseException as exc:  # delivered to the caller by Work.wait()
                box["error"] = exc
            finally:
                done.set()
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
            # keep nothing of the finished call while waiting for the next: its arrays (a
            # pooled buffer the caller wants to reuse, a result the caller dropped) are free
            item = fn = box = done = None


class Backend(abc.ABC):
    """One process group's collectives and point-to-point messages on one rank.

    ``ctx`` is the group's runtime context (:class:`minigrad.distributed.comm.group.GroupContext`):
    ``ranks`` (global ranks in group order), ``rank`` (this process's index in the group),
    ``global_rank``, ``timeout``, ``warn_after``, the store ``client`` and a key ``prefix``.
    Roots are group indices; point-to-point peers are global ranks. Array arguments are
    C-contiguous; results are fresh arrays unless a method says it works in place. ``check``
    (optional, every collective) is the caller's string folded into the fingerprint.

    A backend writes :meth:`exchange` (the one data-movement primitive), the reductions, broadcast
    and barrier; gather, scatter, all-gather and all-to-all are written here once, on
    :meth:`exchange`. A backend overrides one of them only for a native fast path.
    """

    name = "?"
    accepts_gpu_arrays = False  # CuPy arrays are staged through host memory unless True
    averages = False  # True: all_reduce takes ReduceOp.AVG and folds the division into its passes

    def __init__(self, ctx):
        self.ctx = ctx
        self._worker: OrderedWorker | None = None

    # --- the data-movement primitive -------------------------------------------------------------
    @abc.abstractmethod
    def exchange(self, fp: dict, sends: list) -> list:
        """A personalised all-to-all: ``sends[i]`` (an array or None) goes to member i, and
        ``result[j]`` is what member j sent to this one (None when it sent nothing).

        ``fp`` is the call's fingerprint with ``fp["meta"]``, the ``[shape, dtype]`` of each of
        ``sends`` (:func:`array_meta`): the members agree on the fingerprints (raising
        :class:`CollectiveMismatchError` on all of them) and learn the shapes they receive from
        the metadata before any data moves."""

    def move(self, op: str, seq: int, root: int | None, sig: Any, sends: list,
             check: str | None = None) -> list:
        """:meth:`exchange` of ``sends`` under the fingerprint of collective ``op`` (``root``: a
        global rank or None; ``sig``: what else the members must agree on)."""
        fp = dict(fingerprint(op, seq, root, sig, check), meta=[array_meta(a) for a in sends])
        return self.exchange(fp, sends)

    # --- collectives -----------------------------------------------------------------------------
    @abc.abstractmethod
    def all_reduce(self, x, op: ReduceOp, seq: int, check: str | None = None) -> None:
        """Reduce ``x`` over the group, in place (every member's ``x`` holds the result)."""

    @abc.abstractmethod
    def broadcast(self, x, root: int, seq: int, check: str | None = None):
        """The root's ``x`` on every member. Non-roots pass a buffer to fill in place (returned)
        or None (a new array is returned; shape and dtype come from the root)."""

    @abc.abstractmethod
    def reduce(self, x, op: ReduceOp, root: int, seq: int, check: str | None = None) -> None:
        """Reduce ``x`` over the group into the root's ``x`` (in place); other inputs unchanged."""

    def all_gather(self, x, seq: int, check: str | None = None) -> list:
        """Every member's array in group order (shapes may differ per member; dtypes may not)."""
        n = len(self.ctx.ranks)
        return self.move("all_gather", seq, None, dtype_name(x.dtype), [x] * n, check)

    def all_gather_into(self, x, out, seq: int, check: str | None = None) -> None:
        """Member j's ``x`` into ``out[j * x.size : (j + 1) * x.size]`` (``out`` flat, of
        ``x``'s dtype; every member's ``x`` has one size, agreed with the fingerprint). This
        default receives each member's array and copies it in; a backend that can write the
        pieces straight into ``out`` overrides it."""
        n, k = len(self.ctx.ranks), x.size
        sig = [dtype_name(x.dtype), int(k)]
        for j, part in enumerate(self.move("all_gather_into", seq, None, sig, [x] * n, check)):
            out[j * k : (j + 1) * k] = part.reshape(-1)

    def gather(self, x, root: int, seq: int, check: str | None = None) -> list | None:
        """Every member's array on the root (group order); None on the others."""
        sends = [x if j == root else None for j in range(len(self.ctx.ranks))]
        outs = self.move("gather", seq, self.ctx.ranks[root], dtype_name(x.dtype), sends, check)
        return outs if self.ctx.rank == root else None

    def scatter(self, chunks: list | None, root: int, seq: int, check: str | None = None):
        """The root's ``chunks[i]`` to member i (non-roots pass None)."""
        n = len(self.ctx.ranks)
        sends = list(chunks) if self.ctx.rank == root else [None] * n
        return self.move("scatter", seq, self.ctx.ranks[root], None, sends, check)[root]

    @abc.abstractmethod
    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int, check: str | None = None):
        """``chunks[i]`` reduced over the group onto member i."""

    def all_to_all(self, chunks: list, seq: int, check: str | None = None) -> list:
        """``result[j]`` is member j's ``chunks[my index]``."""
        sig = dtype_name(chunks[0].dtype) if chunks else None
        return self.move("all_to_all", seq, None, sig, list(chunks), check)

    @abc.abstractmethod
    def barrier(self, seq: int, check: str | None = None) -> None:
        """Return once every member has entered the barrier."""

    def shared_empty(self, count: int, dtype: np.dtype):
        """A new 1-D array of ``count`` elements that this group's collectives can read in place
        on every member (see :func:`minigrad.distributed.comm.arrays.shared_empty`), or None
        where the backend has no such memory."""
        return None

    # --- point to point (peers are global ranks) ----------------------------------------------
    @abc.abstractmethod
    def send(self, x, dst: int, header: dict) -> None:
        """Send a message to ``dst``: a small JSON ``header`` and the array ``x`` (or None).
        Returns once the message is buffered or delivered."""

    @abc.abstractmethod
    def recv(self, src: int) -> tuple[dict, Any]:
        """The next message from ``src``: ``(header, array or None)``, in the order sent."""

    # --- execution ------------------------------------------------------------------------------
    def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (a closure over this backend's methods) now, after queued async work."""
        self.flush()
        return fn()

    def submit(self, fn: Callable[[], Any]) -> Work:
        """Run ``fn`` asynchronously, after everything submitted before it; return its Work."""
        if self._worker is None:
            self._worker = OrderedWorker(f"mg-{self.name}-g{self.ctx.gid}")
        return self._worker.submit(fn)

    def flush(self) -> None:
        """Wait until every submitted operation has finished (keeps collectives in order)."""
        if self._worker is not None:
            self._worker.flush()

    def close(self) -> None:
        """Release the group's resources; stops the async worker."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


def check_broadcast_buffers(headers: list[dict], root: int, ranks: list[int], seq: int) -> None:
    """Every non-root that passed a buffer to ``broadcast`` must match the root's shape and dtype
    (``headers[j]["meta"]``: ``[shape, dtype name]`` or None); all members raise together."""
    ref = headers[root]["meta"]
    bad = [
        f"rank {ranks[j]} passed {h['meta'][0]} {h['meta'][1]}"
        for j, h in enumerate(headers)
        if h.get("meta") is not None and h["meta"] != ref
    ]
    if bad:
        raise CollectiveMismatchError(
            f"broadcast#{seq} in group {ranks}: root rank {ranks[root]} sends shape {ref[0]} "
            f"{ref[1]}, but " + "; ".join(bad)
        )
