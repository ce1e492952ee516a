"""What the fake CuPy knows about the order of GPU work: which launches are ordered before which
(vector clocks over streams), when work completes, and CuPy's memory pool with one arena per stream.

On a GPU, work on one stream runs in issue order, but two streams run independently unless an
event chain orders them (``event.record(a)``, ``b.wait_event(event)``), the host waits for one
(``synchronize``, a read of a value), or CUDA's legacy null stream orders them implicitly (work on
the null stream waits for all blocking streams, work on a blocking stream waits for the null
stream; ``non_blocking=True`` streams are exempt). Each stream keeps a vector clock: for every
stream, how much of its work is ordered before the stream's next launch.

CuPy's memory pool hands a freed block out again only to allocations on the stream it was
allocated on (one arena per stream): reuse on that stream is safe, as the stream's later work runs
after the earlier work that used the block. A block used on *another* stream without ordering is a
race: a copy stream writing into a block whose old contents compute kernels queued earlier may
still read, say. Every block remembers the last read and the last write of each stream (also across
reuse), and each use is checked against them: :class:`UnorderedAccess` is raised for a use not
ordered after another stream's conflicting use (read after write, write after read or write).

Completion: by default work completes as it is issued (events are done at once). In the manual
mode (``FakeCupy(manual_completion=True)``) work completes only when the host synchronises with it
or the test calls ``fake.release()``, so tests can check what code does while the GPU is still
busy (``event.done`` is False until then).
"""

from __future__ import annotations

import itertools

#: the size granularity of CuPy's memory pool (bytes)
POOL_ROUND = 512


class UnorderedAccess(RuntimeError):
    """A block used on one stream without an event chain after a conflicting use on another."""


def merge(into: dict, clock: dict) -> None:
    """``into`` becomes the element-wise maximum of the two vector clocks."""
    for name, n in clock.items():
        if into.get(name, 0) < n:
            into[name] = n


class Block:
    """A block of device memory of CuPy's pool: its arena (the stream it was allocated on), its
    size class, the arrays using it, and the last read and write of each stream."""

    _ids = itertools.count(1)

    def __init__(self, size: int, arena: str):
        self.id = next(self._ids)
        self.size, self.arena = size, arena
        self.refs = 0
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}

    def use(self, stream_name: str, clock: dict, write: bool, what: str) -> None:
        """Check a use on ``stream_name`` (whose vector clock is ``clock``) against the other
        streams' uses, then note it."""
        earlier = [("write", self.writes)] + ([("read", self.reads)] if write else [])
        for kind, uses in earlier:
            for other, n in uses.items():
                if other != stream_name and clock.get(other, 0) < n:
                    raise UnorderedAccess(
                        f"{what} on {stream_name} {'writes' if write else 'reads'} block "
                        f"{self.id} (pool arena {self.arena}) while the {kind} #{n} on {other} "
                        f"may still run: no event orders them"
                    )
        (self.writes if write else self.reads)[stream_name] = clock.get(stream_name, 0)

    def __repr__(self) -> str:
        return f"<Block {self.id} {self.size} B of {self.arena}>"


class MemoryPool:
    """CuPy's device memory pool: freed blocks go back to their arena (their stream) and are
    handed out again, most recently freed first, to allocations of the same size class on that
    stream."""

    def __init__(self):
        self._free: dict[tuple, list[Block]] = {}
        self.reused: list[Block] = []  # blocks handed out again, in order

    def malloc(self, nbytes: int, arena: str) -> Block:
        """A block of at least ``nbytes`` for an allocation while ``arena`` is current."""
        size = max(1, -(-nbytes // POOL_ROUND)) * POOL_ROUND
        free = self._free.get((arena, size))
        if free:
            block = free.pop()
            self.reused.append(block)
            return block
        return Block(size, arena)

    def free(self, block: Block) -> None:
        """Return ``block`` to its arena (its last array is gone)."""
        self._free.setdefault((block.arena, block.size), []).append(block)

    def free_all_blocks(self) -> None:
        """Forget the free blocks (``MemoryPool.free_all_blocks``)."""
        self._free.clear()
