"""Collective backends, chosen by name, plus the contract they share (errors, fingerprints, Work).

``"cpu"`` (:mod:`.cpu`) moves NumPy arrays over shared memory on one host or TCP between hosts;
``"nccl"`` (:mod:`.nccl`) moves CuPy arrays with NCCL. Every collective carries a fingerprint
(op, per-group sequence number, root, shape/dtype signature) that all ranks compare before touching
data, so mismatched calls raise on every rank instead of hanging or corrupting arrays.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class CollectiveError(RuntimeError):
    """A collective failed (peer aborted or died, connection lost, bad arguments)."""


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives, or the same one with different shapes/dtypes/roots."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective did not complete in time: some rank skipped it, hangs, or is too slow."""


def fingerprint(op: str, seq: int, root: int | None = None, sig: Any = None) -> dict:
    """The cheap per-call identity all ranks must agree on (``sig``: shapes/dtypes to match)."""
    return {"op": op, "seq": seq, "root": root, "sig": sig}


def describe(fp: dict) -> str:
    """Human-readable form of a fingerprint for error messages: ``all_reduce#3(shape=...)``."""
    parts = []
    if fp.get("root") is not None:
        parts.append(f"root={fp['root']}")
    if fp.get("sig") is not None:
        parts.append(f"sig={fp['sig']}")
    return f"{fp['op']}#{fp['seq']}({', '.join(parts)})"


def check_fingerprints(headers: list[dict], ranks: list[int]) -> None:
    """Raise :class:`CollectiveMismatchError` when the group members' fingerprints differ.

    All ranks call this with the same list of headers, so all of them raise together.
    """
    keys = ("op", "seq", "root", "sig")
    ref = headers[0]
    for i, h in enumerate(headers[1:], start=1):
        if any(h.get(k) != ref.get(k) for k in keys):
            calls = "; ".join(
                f"rank {ranks[j]} called {describe(x)}" for j, x in enumerate(headers)
            )
            raise CollectiveMismatchError(
                f"collective mismatch in group {ranks} between rank {ranks[0]} and rank "
                f"{ranks[i]}: "
                f"{calls}"
            )


class Work:
    """Handle of an asynchronous collective; ``wait()`` returns its result array.

    The CPU backend runs the collective on a per-group worker thread; NCCL records a CUDA event on
    its communication stream and ``wait()`` only makes the current stream wait on it.
    """

    def __init__(self, wait_fn: Callable[[], Any], done_fn: Callable[[], bool] | None = None):
        self._wait_fn = wait_fn
        self._done_fn = done_fn
        self._result: Any = None
        self._finished = False
        self._lock = threading.Lock()

    @classmethod
    def completed(cls, value: Any) -> Work:
        w = cls(lambda: value)
        return w

    def wait(self) -> Any:
        with self._lock:
            if not self._finished:
                self._result = self._wait_fn()
                self._finished = True
            return self._result

    def is_completed(self) -> bool:
        if self._finished:
            return True
        return bool(self._done_fn()) if self._done_fn is not None else False


BACKENDS = ("cpu", "nccl")


def nccl_available() -> bool:
    """Whether CuPy with NCCL support and a CUDA device are usable in this process."""
    from minigrad.distributed.backends.nccl import is_available

    return is_available()


def create_backend(name: str, ctx) -> Any:
    """Factory: backend ``name`` for a group context ``ctx`` (see ``group.GroupContext``)."""
    if name == "cpu":
        from minigrad.distributed.backends.cpu import CpuBackend

        return CpuBackend(ctx)
    if name == "nccl":
        from minigrad.distributed.backends.nccl import NcclBackend

        return NcclBackend(ctx)
    raise ValueError(f"unknown distributed backend {name!r}: expected one of {BACKENDS} or 'auto'")
