"""Lockstep checks: ranks that run different global ops get an error naming the op, not a hang.

Global tensors only work when every rank of a placement runs the same global ops in the same
order (a rank-dependent branch breaks that). Each rank keeps, per placement, a running *digest* of
the global ops it ran there: a hash chained over every op's fingerprint (op name, sequence number,
logical shapes, SBPs), plus a readable line for the last op. Comparing digests costs nothing until
ranks talk anyway, so the check rides on communication that happens regardless:

* before every collective of a redistribution, the ranks of its group exchange their digests (one
  small all-gather); any difference raises :class:`LockstepError` on every one of them, naming
  each rank's op; a rank that never arrives makes the others raise the same error, naming the op
  they wait in, when the collective times out;
* a point-to-point transfer (a change of placement) first sends the transfer's fingerprint, which
  the receiver compares with its own.

``set_lockstep_check(False)`` (or ``MINIGRAD_GLOBAL_CHECK=0``) turns the exchange off.

Example of the error, on every rank::

    LockstepError: global ops diverged on placement(type="cpu", ranks=[0, 1]): rank 0 is at
    global op #3 to_global(... ) after 'add ...', rank 1 is at #2 ...
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.providers.base import CollectiveError

__all__ = ["LockstepError", "is_lockstep_check_enabled", "record", "set_lockstep_check",
           "verify", "send_fingerprint", "check_fingerprint"]

_WIDTH = 512  # bytes exchanged per rank: 16 digest, 8 sequence number, the rest the last ops
_KEEP = 3  # the ops a rank reports when the digests differ
_ENABLED = os.environ.get("MINIGRAD_GLOBAL_CHECK", "1") != "0"


class LockstepError(RuntimeError):
    """Ranks of a placement ran different global ops (or one never arrived)."""


class _History:
    """This rank's global ops on one placement: count, chained digest and the last ops' lines."""

    __slots__ = ("seq", "digest", "recent")

    def __init__(self):
        self.seq, self.digest, self.recent = 0, b"\0" * 16, []

    @property
    def last(self) -> str:
        return self.recent[-1] if self.recent else "(no global op yet)"


_HISTORY: dict = {}
_CHANNELS: dict = {}  # (src rank, dst rank) -> transfers so far


def set_lockstep_check(enabled: bool) -> None:
    """Turn the cross-rank comparison of global-op fingerprints on (default) or off."""
    global _ENABLED
    _ENABLED = bool(enabled)


def is_lockstep_check_enabled() -> bool:
    """Whether fingerprints are compared (see :func:`set_lockstep_check`)."""
    return _ENABLED


def _history(placement) -> _History:
    h = _HISTORY.get(placement)
    if h is None:
        h = _HISTORY[placement] = _History()
    return h


def record(placement, what: str) -> str:
    """Count a global op this rank runs on ``placement`` and chain its fingerprint ``what`` into
    the digest; returns the op's line (``#seq what``) for error messages."""
    h = _history(placement)
    h.seq += 1
    line = f"#{h.seq} {what}"
    h.recent = (h.recent + [line])[-_KEEP:]
    h.digest = hashlib.blake2b(h.digest + line.encode(), digest_size=16).digest()
    return line


def _payload(h: _History) -> np.ndarray:
    text = (" then ".join(h.recent) or h.last).encode()[-(_WIDTH - 24):]
    raw = h.digest + h.seq.to_bytes(8, "little") + text + b"\0" * (_WIDTH - 24 - len(text))
    return np.frombuffer(raw, dtype=np.uint8).copy()


def _line(row: np.ndarray) -> tuple:
    raw = row.tobytes()
    return raw[:16], raw[24:].rstrip(b"\0").decode(errors="replace")


def verify(placement, group, ranks: list, doing: str) -> None:
    """Before a collective on ``group`` (ranks ``ranks`` of ``placement``): compare the digests of
    the group's ranks and raise :class:`LockstepError` on all of them if they differ."""
    if not _ENABLED or group is None:
        return
    h = _history(placement)
    try:
        rows = comm.all_gather(_payload(h), group)
    except CollectiveError as exc:
        raise LockstepError(
            f"global op {h.last} on {placement}: rank {ranks} did not all arrive at {doing} "
            f"({type(exc).__name__}: {exc}). Every rank of a placement must run the same global "
            "ops in the same order (is there a rank-dependent branch?)"
        ) from None
    lines = [_line(np.asarray(r)) for r in rows]
    if any(d != lines[0][0] for d, _ in lines):
        listing = "; ".join(f"rank {r} ran {text}" for r, (_, text) in zip(ranks, lines))
        raise LockstepError(
            f"global ops diverged on {placement} at {doing}: {listing}. Every rank of a "
            "placement must run the same global ops in the same order (is there a "
            "rank-dependent branch?)"
        )


def _transfer_line(src: int, dst: int, what: str) -> str:
    n = _CHANNELS.get((src, dst), 0) + 1
    _CHANNELS[(src, dst)] = n
    return f"transfer #{n} from rank {src} to rank {dst}: {what}"


def send_fingerprint(src: int, dst: int, what: str) -> None:
    """The sender's side of a checked point-to-point transfer (call before sending the data)."""
    line = _transfer_line(src, dst, what)
    if _ENABLED:
        comm.send(np.frombuffer(line.encode(), dtype=np.uint8).copy(), dst)


def check_fingerprint(src: int, dst: int, what: str) -> None:
    """The receiver's side: the sender's fingerprint must equal this rank's."""
    line = _transfer_line(src, dst, what)
    if not _ENABLED:
        return
    try:
        theirs = np.asarray(comm.recv(src)).tobytes().decode(errors="replace")
    except CollectiveError as exc:
        raise LockstepError(
            f"{line}: rank {src} never sent it ({type(exc).__name__}: {exc}). Every rank must run "
            "the same global ops in the same order (is there a rank-dependent branch?)"
        ) from None
    if theirs != line:
        raise LockstepError(
            f"global ops diverged: rank {dst} expects {line!r} but rank {src} sent {theirs!r}. "
            "Every rank must run the same global ops in the same order (is there a "
            "rank-dependent branch?)"
        )
