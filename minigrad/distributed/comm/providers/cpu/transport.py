"""The exchange primitive the cpu backend's collectives are written on, and the rule that picks
the transport that implements it.

``transport.exchange(header, sends, on_headers, consume, what)``: every member of the group hands
over a JSON ``header`` and, for each peer j, the array ``sends[j]`` it sends to j (or None). The
transport delivers all members' headers to ``on_headers(headers)`` (which may raise: mismatched
fingerprints), then calls ``consume({src: (offset, bytes)})`` with the pieces addressed to this
rank, possibly in several rounds for large messages (``offset`` is the byte offset of the piece
within the array src sent). It returns the headers. ``what()`` describes the call for messages.
An optional ``key`` promises that calls with equal keys send equal headers (but for ``seq``) and
equally laid out data, so a transport may cache the encoded header.

Transports: :class:`LocalTransport` (a one-member group), :class:`~.shm.ShmTransport` (all members
on this host), :class:`~.tcp.TcpTransport` (members on several hosts).
"""

from __future__ import annotations

import os

from minigrad.distributed.comm.providers.base import as_bytes
from minigrad.distributed.runtime.settings import TRANSPORT_ENV

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def choose_transport(ranks: list[int], hosts: list[str]) -> str:
    """``"local"``, ``"shm"`` or ``"tcp"`` for the group ``ranks`` (``hosts[r]``: rank r's host).

    The one rule for collectives and point-to-point alike, evaluated identically by every member:
    shared memory when all members share a host, TCP otherwise; ``MINIGRAD_DIST_TRANSPORT`` forces
    one (``tcp`` tests the multi-host path on one machine).
    """
    if len(ranks) == 1:
        return "local"
    forced = os.environ.get(TRANSPORT_ENV, "auto").lower()
    if forced not in ("auto", "shm", "tcp"):
        raise ValueError(f"{TRANSPORT_ENV}={forced!r}: expected 'auto', 'shm' or 'tcp'")
    same_host = len({hosts[r] for r in ranks}) == 1
    if forced == "shm" and not same_host:
        raise ValueError(f"{TRANSPORT_ENV}=shm but group {ranks} spans several hosts")
    if forced != "auto":
        return forced
    return "shm" if same_host and SHM_DIR is not None else "tcp"


class LocalTransport:
    """The exchange of a one-member group (world size 1): headers and data stay in-process."""

    kind = "local"

    def __init__(self, ctx):
        self.ctx = ctx

    def exchange(self, header: dict, sends: list, on_headers, consume, what,
                 key=None) -> list[dict]:
        """The one member's header and data, handed straight back (``key`` is not needed)."""
        on_headers([header])
        if sends[0] is not None:
            consume({0: (0, memoryview(as_bytes(sends[0])))})
        return [header]

    def abort(self) -> None:
        """Nothing to tell: there are no peers."""

    def close(self) -> None:
        """Nothing to release."""
