"""A log of the collectives tensor-parallel code issues: kind, group, phase and bytes sent.

Every collective of the tensor-parallel layers goes through :mod:`.regions`, which calls
:func:`record`; inside ``with log_collectives() as log:`` the calls are appended to ``log``. Tests
compare ``log.counts()`` with the communication table of each mode, and the benchmark adds up
``log.bytes_sent()``.

Bytes sent are those of the bandwidth-optimal algorithm for each kind, for this rank, with ``n``
the payload in bytes and ``P`` the group size: all-reduce (ring: reduce-scatter + all-gather)
``2(P-1)/P · n``; all-gather ``(P-1) · n`` (its own piece to every peer); reduce-scatter
``(P-1)/P · n`` of the input; all-to-all ``(P-1)/P · n``; broadcast ``(P-1) · n`` on the root and
0 elsewhere; reduce ``n`` on every non-root and 0 on the root. (Over a round in which every rank
is root once, broadcast and reduce cost each rank ``(P-1) · n`` either way.)

Example::

    with tp.log_collectives() as log:
        y = layer(x)
    log.counts()   # Counter({('all_reduce', '1d', 'forward'): 1})
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

from minigrad.autodiff import get_backwarding_grad_manager
from minigrad.distributed.comm.group import Group
from minigrad.distributed.mesh.parallel_context import get_parallel_context

__all__ = ["CollectiveLog", "CollectiveRecord", "bytes_sent", "log_collectives", "record"]


@dataclass(frozen=True)
class CollectiveRecord:
    """One collective: ``kind``, ``group`` (its context name, else its ranks), ``phase``
    ("forward" or "backward"), ``nbytes`` (payload) and ``sent`` (bytes this rank sends)."""

    kind: str
    group: str
    phase: str
    nbytes: int
    sent: float


def bytes_sent(kind: str, nbytes: int, size: int, is_root: bool = False) -> float:
    """Bytes this rank sends in a collective of ``kind`` over ``size`` ranks (see module doc)."""
    p = size
    if kind == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if kind == "all_gather":
        return (p - 1) * nbytes
    if kind in ("reduce_scatter", "all_to_all"):
        return (p - 1) / p * nbytes
    if kind == "broadcast":
        return (p - 1) * nbytes if is_root else 0.0
    if kind == "reduce":
        return 0.0 if is_root else float(nbytes)
    raise ValueError(f"bytes_sent: unknown collective kind {kind!r}")


class CollectiveLog:
    """The records of one ``with log_collectives()`` block."""

    def __init__(self):
        self.records: list[CollectiveRecord] = []

    def counts(self, phase: str | None = None, with_phase: bool = True) -> Counter:
        """How many collectives of each ``(kind, group, phase)`` (or ``(kind, group)`` when
        ``with_phase`` is False), optionally only of one ``phase``."""
        out: Counter = Counter()
        for r in self.records:
            if phase is None or r.phase == phase:
                out[(r.kind, r.group, r.phase) if with_phase else (r.kind, r.group)] += 1
        return out

    def bytes_sent(self, phase: str | None = None) -> float:
        """Total bytes this rank sent (optionally in one phase)."""
        return sum(r.sent for r in self.records if phase is None or r.phase == phase)

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return f"CollectiveLog({dict(self.counts())}, bytes_sent={self.bytes_sent():.0f})"


_ACTIVE: list[CollectiveLog] = []


@contextmanager
def log_collectives():
    """Record every tensor-parallel collective issued inside the block (nested blocks each get
    every record)."""
    log = CollectiveLog()
    _ACTIVE.append(log)
    try:
        yield log
    finally:
        _ACTIVE.remove(log)


def group_label(group: Group) -> str:
    """The parallel context's name of ``group`` (e.g. "2d_row"), else its rank list."""
    ctx = get_parallel_context(required=False)
    name = ctx.group_name(group) if ctx is not None else None
    return name if name is not None else str(group.ranks)


def record(kind: str, group: Group, nbytes: int, is_root: bool = False) -> None:
    """Note one collective in every active log (called by the region functions)."""
    if not _ACTIVE:
        return
    phase = "backward" if get_backwarding_grad_manager() is not None else "forward"
    rec = CollectiveRecord(kind, group_label(group), phase, int(nbytes),
                           bytes_sent(kind, nbytes, group.size, is_root))
    for log in _ACTIVE:
        log.records.append(rec)
