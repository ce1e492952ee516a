"""Ring transfers that overlap with compute: send a block to the next rank of a ring and receive
one from the previous rank while the current block is being computed.

Ring attention moves K/V blocks (and, in backward, their gradient accumulators) one hop around the
ring per step. :class:`RingExchange` starts such a hop and returns at once; ``wait()`` returns the
blocks that arrived. The hops are ``comm.isend``/``comm.irecv``: each runs on the per-peer worker
thread of the point-to-point layer, in issue order, so the n-th message rank r sends to r+1 is the
n-th message r+1 receives from r, and because sends and receives run on their own threads no rank
can deadlock, even when a message is larger than the transport's buffer.

With ``overlap=False`` every hop completes before :meth:`RingExchange.shift` returns: the same
messages in the same order, with nothing hidden behind compute (the baseline of the benchmark).
"""

from __future__ import annotations

from minigrad.backend.device import as_device
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import Group
from minigrad.distributed.sequence_parallel.groups import position_in

__all__ = ["RingExchange"]


class _ShiftPending:
    """The transfers of one ring hop: its sends (which must finish too) and its receives."""

    def __init__(self, sends: list, recvs: list):
        self._sends, self._recvs = sends, recvs
        self._result = None

    def wait(self) -> list:
        """The arrays received from the previous rank, in the order they were sent."""
        if self._result is None:
            for s in self._sends:
                s.wait()
            self._result = [r.wait() for r in self._recvs]
        return self._result


class RingExchange:
    """Hops around the ring of ``group`` (global ranks in group order; rank i sends to i+1 and
    receives from i−1, cyclically), overlapped with compute unless ``overlap=False``. Received
    arrays land on ``device`` (None: where the transport delivers them, NumPy on the CPU).

    Example::

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

    def shift(self, arrays) -> _ShiftPending:
        """Send ``arrays`` to the next rank and receive as many from the previous one. The arrays
        must not be modified until the returned hop's ``wait()`` returned."""
        if self.size == 1:
            raise RuntimeError("RingExchange.shift: a ring of one rank has nobody to shift to")
        arrays = list(arrays)
        sends = [comm.isend(a, self.next_rank) for a in arrays]
        recvs = [comm.irecv(self.prev_rank, device=self.device) for _ in arrays]
        pending = _ShiftPending(sends, recvs)
        if not self.overlap:
            pending.wait()
        return pending

    def __enter__(self) -> "RingExchange":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Nothing to release: the transfers belong to the point-to-point layer, whose watchdog
        ends a transfer that waits for a peer that never comes."""
