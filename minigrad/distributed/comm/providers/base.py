"""The backend interface every collective backend implements (``cpu``, ``mpi``, ``nccl``).

A backend object serves one process group on one rank. It receives C-contiguous arrays of its
kind (NumPy for ``cpu`` and ``mpi``, CuPy for ``nccl``), group-local root indices and the call's
sequence number, and moves the bytes; everything users see (argument checks, Tensors, CuPy staging,
``ReduceOp.AVG``, async handles) is done once, above it, in :mod:`minigrad.distributed.comm.arrays`.

Three rules hold for every backend, so all of them behave the same when something goes wrong:

* **Fingerprints.** Before touching data, all members agree on the call's fingerprint (op,
  sequence number, root, shapes/dtypes, backend). Ranks that call different collectives, or the same
  one with different shapes, all raise :class:`CollectiveMismatchError` naming every rank's call,
  instead of hanging or corrupting memory.
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
    """Ranks called different collectives, or the same one with different shapes/dtypes/roots."""


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


#: NumPy ufunc of each reduction the backends perform (AVG never reaches a backend).
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


def array_meta(a) -> list | None:
    """``[shape, dtype name]`` of an array (None for None): what a fingerprint says of a buffer."""
    return None if a is None else [list(a.shape), dtype_name(a.dtype)]


def fingerprint(op: str, seq: int, root: int | None = None, sig: Any = None) -> dict:
    """The cheap per-call identity all ranks must agree on (``sig``: shapes/dtypes to match)."""
    return {"op": op, "seq": seq, "root": root, "sig": sig}


def describe(fp: dict) -> str:
    """Human-readable form of a fingerprint for messages: ``all_reduce#3(sig=...)``."""
    parts = []
    if fp.get("root") is not None:
        parts.append(f"root={fp['root']}")
    if fp.get("sig") is not None:
        parts.append(f"sig={fp['sig']}")
    via = f" via {fp['backend']}" if fp.get("backend") not in (None, "cpu") else ""
    return f"{fp['op']}#{fp['seq']}({', '.join(parts)}){via}"


FINGERPRINT_KEYS = ("op", "seq", "root", "sig", "backend")


def check_fingerprints(headers: list[dict], ranks: list[int]) -> None:
    """Raise :class:`CollectiveMismatchError` when the group members' fingerprints differ.

    All members call this with the same list of headers, so all of them raise together.
    """
    ref = headers[0]
    for i, h in enumerate(headers[1:], start=1):
        if any(h.get(k) != ref.get(k) for k in FINGERPRINT_KEYS):
            calls = "; ".join(
                f"rank {ranks[j]} called {describe(x)}" for j, x in enumerate(headers)
            )
            raise CollectiveMismatchError(
                f"collective mismatch in group {ranks} between rank {ranks[0]} and rank "
                f"{ranks[i]}: {calls}"
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


class Backend(abc.ABC):
    """One process group's collectives and point-to-point messages on one rank.

    ``ctx`` is the group's runtime context (:class:`minigrad.distributed.comm.group.GroupContext`):
    ``ranks`` (global ranks in group order), ``rank`` (this process's index in the group),
    ``global_rank``, ``timeout``, ``warn_after``, the store ``client`` and a key ``prefix``.
    Roots are group indices; point-to-point peers are global ranks. Array arguments are
    C-contiguous; results are fresh arrays unless a method says it works in place.
    """

    name = "?"
    accepts_gpu_arrays = False  # CuPy arrays are staged through host memory unless True

    def __init__(self, ctx):
        self.ctx = ctx
        self._worker: OrderedWorker | None = None

    # --- collectives -----------------------------------------------------------------------------
    @abc.abstractmethod
    def all_reduce(self, x, op: ReduceOp, seq: int) -> None:
        """Reduce ``x`` over the group, in place (every member's ``x`` holds the result)."""

    @abc.abstractmethod
    def broadcast(self, x, root: int, seq: int):
        """The root's ``x`` on every member. Non-roots pass a buffer to fill in place (returned)
        or None (a new array is returned; shape and dtype come from the root)."""

    @abc.abstractmethod
    def reduce(self, x, op: ReduceOp, root: int, seq: int) -> None:
        """Reduce ``x`` over the group into the root's ``x`` (in place); other inputs unchanged."""

    @abc.abstractmethod
    def all_gather(self, x, seq: int) -> list:
        """Every member's array in group order (shapes may differ per member; dtypes may not)."""

    @abc.abstractmethod
    def gather(self, x, root: int, seq: int) -> list | None:
        """Every member's array on the root (group order); None on the others."""

    @abc.abstractmethod
    def scatter(self, chunks: list | None, root: int, seq: int):
        """The root's ``chunks[i]`` to member i (non-roots pass None)."""

    @abc.abstractmethod
    def reduce_scatter(self, chunks: list, op: ReduceOp, seq: int):
        """``chunks[i]`` reduced over the group onto member i."""

    @abc.abstractmethod
    def all_to_all(self, chunks: list, seq: int) -> list:
        """``result[j]`` is member j's ``chunks[my index]``."""

    @abc.abstractmethod
    def barrier(self, seq: int) -> None:
        """Return once every member has entered the barrier."""

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
