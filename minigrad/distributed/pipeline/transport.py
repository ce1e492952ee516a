"""``Transport``: how the stages of a pipeline exchange messages (the engine's only point-to-point
code).

A message is a list of arrays plus a flag saying whether the stage output was a tuple. On the wire
each array is one ``comm.send`` (which returns once the data is buffered and carries shape and
dtype), read with ``comm.recv`` in the same order; channels are FIFO per pair of ranks. The
message's own fields, ``[kind, number of arrays, tuple flag]``, travel as the ``tag`` of its first
send, inside the header ``comm.send`` sends anyway: a one-tensor activation is exactly one send.
A message without arrays (a stage input with no float tensor gets an empty gradient message) sends
one empty array to carry its fields. A message to the own rank (one stage holding consecutive
chunks) is handed over in a local queue.

An *abort* message carries a failure's description (its UTF-8 bytes) instead of data; receiving one
raises :class:`Aborted`, a :class:`~minigrad.distributed.pipeline.PipelineError`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.pipeline.errors import PipelineError

__all__ = ["ABORT", "DATA", "Aborted", "Transport"]

DATA, ABORT = 0, 1  # message kinds


class Aborted(PipelineError):
    """An abort message arrived: another rank's step failed (``reason`` says where and why,
    ``origin`` is the rank it came from)."""

    def __init__(self, reason: str, origin: int):
        super().__init__(reason)
        self.reason, self.origin = reason, origin


class Transport:
    """Messages between the ranks of a pipeline (see the module docstring for the wire format).

    Retargeting the engine to another point-to-point API means changing :meth:`send_array` and
    :meth:`recv_array` only.
    """

    def __init__(self, rank: int):
        self.rank = rank
        self._local: deque = deque()

    @staticmethod
    def send_array(array, dst: int, tag: list | None = None) -> None:
        """Send one array (and ``tag``, the message's fields, when given) to global rank ``dst``."""
        comm.send(array, dst, tag=tag)

    @staticmethod
    def recv_array(src: int) -> tuple:
        """The next array from global rank ``src`` and its tag (None when it carried none)."""
        return comm.recv(src, with_tag=True)

    def send(self, arrays: list, dst: int, as_tuple: bool = False, kind: int = DATA) -> None:
        """Send ``arrays`` (one message) to global rank ``dst``."""
        fields = [kind, len(arrays), int(as_tuple)]
        if dst == self.rank:
            self._local.append((fields, list(arrays)))
            return
        first = arrays[0] if arrays else np.empty(0, np.uint8)
        self.send_array(first, dst, fields)
        for array in arrays[1:]:
            self.send_array(array, dst)

    def recv(self, src: int) -> tuple[list, bool]:
        """The next message from global rank ``src``: ``(arrays, as_tuple)``."""
        if src == self.rank:
            fields, arrays = self._local.popleft()
        else:
            first, fields = self.recv_array(src)
            if fields is None:
                raise PipelineError(
                    f"Transport.recv: the message from rank {src} carries no pipeline header "
                    f"(a send outside the pipeline engine on this channel?)")
            count = int(fields[1])
            arrays = [first] if count else []
            arrays += [self.recv_array(src)[0] for _ in range(count - 1)]
        kind, _, as_tuple = (int(v) for v in fields)
        if kind == ABORT:
            raise Aborted(bytes(arrays[0].tolist()).decode(), src)
        return arrays, bool(as_tuple)

    def abort(self, reason: str, dst: int) -> None:
        """Tell ``dst`` that this rank's step failed because of ``reason``."""
        self.send([np.frombuffer(reason.encode(), np.uint8)], dst, kind=ABORT)
