"""TCP transport: the group exchange over a full mesh of sockets (members on several hosts).

A round sends one frame (sizes, JSON header, payload; see
:mod:`minigrad.distributed.runtime.wire`) to every peer and reads one from each, multiplexed with
``selectors`` so that large messages cannot deadlock on full socket buffers. Each frame is read
exactly to its end: the next collective's bytes follow on the same socket. Connections authenticate
with an HMAC of the job secret, so a stranger connecting to a listening port is dropped.
"""

from __future__ import annotations

import hmac
import json
import selectors
import socket
import struct

from minigrad.distributed.comm.providers.base import (
    CollectiveError,
    CollectiveTimeoutError,
    as_bytes,
)
from minigrad.distributed.comm.providers.waiting import Watchdog
from minigrad.distributed.runtime.wire import FRAME, U64, auth_token, encode_header, recv_exact

SELECT_INTERVAL = 0.5  # seconds between watchdog polls while sockets are idle


def local_ip_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (what peers should connect to)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, 9))  # UDP connect sends nothing: it only picks the route
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def connect_authenticated(addr, me: int, secret: bytes, label: str, timeout: float):
    """Connect to a peer's listening socket and prove membership (rank + HMAC of ``label``)."""
    s = socket.create_connection(tuple(addr), timeout=timeout)
    s.sendall(U64.pack(me) + auth_token(secret, label))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def accept_authenticated(lsock, secret: bytes, label_of, timeout: float):
    """Accept one connection; return ``(peer rank, socket)``, or None for a stranger (dropped).
    ``label_of(rank)`` is the label that rank authenticates with."""
    s, _ = lsock.accept()
    try:
        s.settimeout(timeout)
        (peer,) = U64.unpack(recv_exact(s, U64.size))
        token = recv_exact(s, 32)
    except (OSError, ConnectionError, struct.error):
        s.close()
        return None
    if not hmac.compare_digest(token, auth_token(secret, label_of(peer))):
        s.close()
        return None
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return peer, s


class TcpTransport:
    """Group exchange over a full mesh of TCP sockets (lower index accepts, higher connects)."""

    kind = "tcp"

    def __init__(self, ctx):
        self.ctx = ctx
        self.ranks, self.index = ctx.ranks, ctx.rank
        n, me = len(self.ranks), self.index
        self.socks: dict[int, socket.socket] = {}
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("0.0.0.0", 0))
        lsock.listen(n)
        key = f"{ctx.prefix}/tcp"
        ctx.client.set(f"{key}/{me}", [local_ip_towards(ctx.client.host), lsock.getsockname()[1]])
        label = lambda j: f"{ctx.prefix}/{j}"
        try:
            for j in range(me):
                addr = ctx.client.get(f"{key}/{j}", timeout=ctx.timeout)
                self.socks[j] = connect_authenticated(addr, me, ctx.secret, label(me), ctx.timeout)
            lsock.settimeout(ctx.timeout)
            while len(self.socks) < n - 1:
                got = accept_authenticated(lsock, ctx.secret, label, ctx.timeout)
                if got is not None and me < got[0] < n:
                    self.socks[got[0]] = got[1]
                elif got is not None:
                    got[1].close()
        except socket.timeout as exc:
            raise CollectiveTimeoutError(
                f"TCP mesh setup of group {self.ranks} timed out on rank {ctx.global_rank}"
            ) from exc
        finally:
            lsock.close()
        for s in self.socks.values():
            s.setblocking(False)
        self.sel = selectors.DefaultSelector()

    def close(self) -> None:
        """Close the sockets to every peer."""
        for s in self.socks.values():
            s.close()
        self.socks.clear()

    def abort(self) -> None:
        """Closing the sockets is how peers learn that this rank gave up."""
        self.close()

    def exchange(self, header: dict, sends: list, on_headers, consume, what,
                 key=None) -> list[dict]:
        """One exchange (see :mod:`.transport`): a frame to and from every peer (``key`` unused:
        encoding the header is small next to a socket round trip)."""
        n, me = len(self.ranks), self.index
        payload = [as_bytes(a) if a is not None else None for a in sends]
        lens = [int(p.size) if p is not None else None for p in payload]
        header = dict(header, _n=lens)
        h = encode_header(header)  # the same for every peer; only the payload length differs
        out = {}
        for j in self.socks:
            p = payload[j]
            parts = [memoryview(FRAME.pack(len(h), lens[j] or 0) + h)]
            if p is not None and p.size:
                parts.append(memoryview(p))
            out[j] = parts
        inc = {j: {"pre": bytearray(), "hdr": None, "data": None, "got": 0} for j in self.socks}
        headers: list = [None] * n
        headers[me] = header
        received = {}
        pending_in, pending_out = set(self.socks), set(self.socks)
        late = lambda: [self.ranks[j] for j in pending_in]
        ctx = self.ctx
        watchdog = Watchdog(what, ctx.timeout, ctx.warn_after, ctx.global_rank, late)
        sel = self.sel
        for j, s in self.socks.items():
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, j)
        try:
            while pending_in or pending_out:
                events = sel.select(SELECT_INTERVAL)
                watchdog.poll()
                for key, ev in events:
                    j, s = key.data, key.fileobj
                    if ev & selectors.EVENT_WRITE and j in pending_out:
                        self._send_some(s, j, out, pending_out)
                    if ev & selectors.EVENT_READ and j in pending_in:
                        if self._recv_some(s, j, inc[j], what):
                            pending_in.discard(j)
                            headers[j] = inc[j]["hdr"]
                            received[j] = inc[j]["data"]
                    mask = (selectors.EVENT_READ if j in pending_in else 0) | (
                        selectors.EVENT_WRITE if j in pending_out else 0
                    )
                    if mask:
                        sel.modify(s, mask, j)
                    else:
                        sel.unregister(s)
        finally:
            for s in self.socks.values():
                try:
                    sel.unregister(s)
                except (KeyError, ValueError):
                    pass
        on_headers(headers)
        pieces = {}
        for src in range(n):
            if src == me:
                if payload[me] is not None:
                    pieces[src] = (0, memoryview(payload[me]))
            elif headers[src]["_n"][me] is not None:
                pieces[src] = (0, memoryview(received[src]))
        if pieces:
            consume(pieces)
        return headers

    def _send_some(self, s, j, out, pending_out) -> None:
        parts = out[j]
        while parts:
            try:
                k = s.send(parts[0])
            except BlockingIOError:
                return
            except OSError as exc:
                raise CollectiveError(f"connection to rank {self.ranks[j]} failed: {exc}") from exc
            if k < len(parts[0]):
                parts[0] = parts[0][k:]
                return
            parts.pop(0)
        pending_out.discard(j)

    def _recv_some(self, s, j, st, what) -> bool:
        """Advance peer ``j``'s frame; never read past it (the next collective's bytes follow)."""
        try:
            while st["hdr"] is None:
                pre = st["pre"]
                need = FRAME.size - len(pre) if len(pre) < FRAME.size else None
                if need is None:
                    hlen, plen = FRAME.unpack_from(pre)
                    need = FRAME.size + hlen - len(pre)
                    if need == 0:
                        st["hdr"] = json.loads(bytes(pre[FRAME.size :]))
                        st["data"] = bytearray(plen)
                        break
                chunk = s.recv(need)
                if not chunk:
                    raise ConnectionError
                pre += chunk
            view = memoryview(st["data"])
            while st["got"] < len(view):
                k = s.recv_into(view[st["got"] :])
                if k == 0:
                    raise ConnectionError
                st["got"] += k
            return True
        except BlockingIOError:
            return False
        except (ConnectionError, OSError) as exc:
            raise CollectiveError(
                f"{what()}: connection to rank {self.ranks[j]} lost (did it die?)"
            ) from exc
