"""Ring transfers that overlap with compute: send a block to the next rank of a ring and receive
one from the previous rank while the current block is being computed.

Ring attention moves K/V blocks (and, in backward, their gradient accumulators) one hop around the
ring per step. :class:`RingExchange` starts such a hop and returns at once; ``wait()`` returns the
blocks that arrived. Underneath are two FIFO worker threads per exchange object: one sends, one
receives, each working through its requests in the order they were issued. Because every rank
issues the same sequence of hops, the n-th message rank r sends to r+1 is the n-th message r+1
receives from r — the matching rule of point-to-point communication — and because sending and
receiving run on separate threads no rank can deadlock, even when a message is larger than the
transport's buffer and ``send`` blocks until the peer reads.

With ``overlap=False`` every hop completes before :meth:`RingExchange.shift` returns: the same
messages in the same order, with nothing hidden behind compute (the baseline of the benchmark).

INTEGRATION POINT (dist.isend / dist.irecv): :meth:`RingExchange.isend` and
:meth:`RingExchange.irecv` have the contract of ``torch.distributed.isend/irecv`` (start the
transfer, return a handle whose ``wait()`` completes it; messages between a pair match in issue
order). Once ``dist.isend(array, dst)`` / ``dist.irecv(src)`` exist, these two methods become
calls to them, the worker threads go away, and the ring code does not change.
"""

from __future__ import annotations

import queue
import threading

from minigrad.backend.device import as_device
from minigrad.distributed import comm
from minigrad.distributed.group import Group, get_p2p, get_world_size
from minigrad.distributed.sequence_parallel.groups import position_in

__all__ = ["Pending", "RingExchange"]


class Pending:
    """The handle of a transfer started in the background; ``wait()`` returns its result or raises
    the error the transfer raised (timeouts and dead peers included)."""

    def __init__(self):
        self._done = threading.Event()
        self._value = None
        self._error: BaseException | None = None

    def _finish(self, value=None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def is_completed(self) -> bool:
        """Whether the transfer has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self):
        """Block until the transfer finished; return its result (None for a send)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class _Worker:
    """A daemon thread running submitted calls one after another, in submission order."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> Pending:
        pending = Pending()
        self._queue.put((pending, fn, args))
        return pending

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            pending, fn, args = item
            try:
                pending._finish(fn(*args))
            except BaseException as exc:  # handed to whoever waits on it
                pending._finish(error=exc)

    def stop(self, wait: bool) -> None:
        self._queue.put(None)
        if wait:
            self._thread.join()


class _ShiftPending:
    """The pending receives of one ring hop (and its sends, which must finish too)."""

    def __init__(self, sends: list, recvs: list):
        self._sends, self._recvs = sends, recvs

    def wait(self) -> list:
        """The arrays received from the previous rank, in the order they were sent."""
        for s in self._sends:
            s.wait()
        return [r.wait() for r in self._recvs]


class RingExchange:
    """Hops around the ring of ``group`` (global ranks in group order; rank i sends to i+1 and
    receives from i−1, cyclically), overlapped with compute unless ``overlap=False``. The
    transfers run with ``device`` current and received arrays land on it (None: the default
    device).

    Use it as a context manager so its threads end with the ring::

        with RingExchange(group) as ring:
            pending = ring.shift([k, v])        # starts sending k, v on and receiving the next pair
            ...                                 # compute with the current k, v
            k, v = pending.wait()
    """

    def __init__(self, group: Group, device=None, overlap: bool = True):
        index, size = position_in("RingExchange", group)
        ranks = group.ranks
        self.next_rank = ranks[(index + 1) % size]
        self.prev_rank = ranks[(index - 1) % size]
        self.size, self.overlap = size, bool(overlap)
        self.device = None if device is None else as_device(device)
        self._workers = None
        if size > 1:
            if get_world_size() > 1:
                get_p2p()  # create the channels object here, not concurrently from two threads
            self._workers = (_Worker("ring-send"), _Worker("ring-recv"))

    # -- the seam: torch.distributed.isend / irecv semantics -------------------------------------
    def isend(self, array, dst: int) -> Pending:
        """Start sending ``array`` to global rank ``dst``; it must not be modified until done."""
        return self._workers[0].submit(self._on_device, comm.send, array, dst)

    def irecv(self, src: int) -> Pending:
        """Start receiving the next array from global rank ``src``."""
        return self._workers[1].submit(self._on_device, comm.recv, src, self.device)

    def _on_device(self, fn, *args):
        """Run ``fn`` on a worker thread with this exchange's device current (CUDA's current
        device is per thread)."""
        if self.device is None:
            return fn(*args)
        with self.device.context():
            return fn(*args)

    # -- ring hops -------------------------------------------------------------------------------
    def shift(self, arrays) -> _ShiftPending:
        """Send ``arrays`` to the next rank and receive as many from the previous one."""
        if self._workers is None:
            raise RuntimeError("RingExchange.shift: a ring of one rank has nobody to shift to")
        arrays = list(arrays)
        sends = [self.isend(a, self.next_rank) for a in arrays]
        recvs = [self.irecv(self.prev_rank) for _ in arrays]
        pending = _ShiftPending(sends, recvs)
        if not self.overlap:
            result = pending.wait()
            pending = _ShiftPending([], [_done(a) for a in result])
        return pending

    def close(self, wait: bool = True) -> None:
        """End the worker threads (after the transfers issued so far, when ``wait``)."""
        if self._workers is not None:
            for w in self._workers:
                w.stop(wait)
            self._workers = None

    def __enter__(self) -> "RingExchange":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # On an error, transfers may wait for peers that will never come: do not join them (they
        # end with the transport's timeout).
        self.close(wait=exc_type is None)


def _done(value) -> Pending:
    p = Pending()
    p._finish(value)
    return p
