"""Point-to-point messages of the cpu backend: one channel per ordered pair of ranks.

A pair on one host talks through a shared-memory :class:`~.shm.Ring` created by the sender (the
receiver maps it at its first receive and unlinks the file); a pair on different hosts through a
TCP connection opened by the sender to the receiver's listening socket. The pair's transport comes
from :func:`~.transport.choose_transport`, so both ends always agree. ``send`` returns as soon as
the message is in the channel, so "everyone sends, then everyone receives" rings do not deadlock
(as long as a message fits the ring or the socket buffers; larger ones stream while the receiver
drains them).

Message: a frame (sizes, JSON header with the message's sequence number, shape, dtype and the
caller's header fields), then the array's bytes. Sequence numbers are checked on receipt.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading

import numpy as np

from minigrad.distributed.comm.providers.base import CollectiveError, as_bytes
from minigrad.distributed.comm.providers.cpu import shm
from minigrad.distributed.comm.providers.cpu.tcp import (
    SELECT_INTERVAL,
    accept_authenticated,
    connect_authenticated,
    local_ip_towards,
)
from minigrad.distributed.comm.providers.cpu.transport import choose_transport
from minigrad.distributed.comm.providers.waiting import Watchdog
from minigrad.distributed.runtime.store import StoreTimeout
from minigrad.distributed.runtime.wire import FRAME, frame_prefix

LISTEN_BACKLOG = 64


class PeerChannels:
    """This rank's channels to every peer (``ctx`` is the WORLD group's context)."""

    def __init__(self, ctx, hosts: list[str]):
        self.ctx, self.hosts = ctx, hosts
        self.rank = ctx.global_rank
        self.out: dict[int, object] = {}
        self.inc: dict[int, object] = {}
        self.seq_out: dict[int, int] = {}
        self.seq_in: dict[int, int] = {}
        self._accepted: dict[int, socket.socket] = {}
        self._cond = threading.Condition()
        self._lsock = None
        world = range(len(hosts))
        if any(choose_transport([self.rank, r], hosts) == "tcp" for r in world if r != self.rank):
            self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._lsock.bind(("0.0.0.0", 0))
            self._lsock.listen(LISTEN_BACKLOG)
            addr = [local_ip_towards(ctx.client.host), self._lsock.getsockname()[1]]
            ctx.client.set(f"{ctx.prefix}/p2p/addr/{self.rank}", addr)
            threading.Thread(target=self._accept_loop, name="mg-p2p-accept", daemon=True).start()

    def close(self) -> None:
        """Stop accepting connections and close every channel."""
        if self._lsock is not None:
            self._lsock.close()
        for ch in list(self.out.values()) + list(self.inc.values()):
            ch.close()

    def _label(self, src: int) -> str:
        return f"{self.ctx.prefix}/p2p/{src}"

    def _accept_loop(self) -> None:
        while True:
            try:
                got = accept_authenticated(self._lsock, self.ctx.secret, self._label, 10.0)
            except OSError:
                return  # the listening socket was closed
            if got is not None:
                with self._cond:
                    self._accepted[got[0]] = got[1]
                    self._cond.notify_all()

    def _watchdog(self, what: str, peer: int) -> Watchdog:
        ctx = self.ctx
        return Watchdog(what, ctx.timeout, ctx.warn_after, self.rank, lambda: [peer])

    def _out(self, dst: int, watchdog: Watchdog):
        ch = self.out.get(dst)
        if ch is None:
            ctx = self.ctx
            if choose_transport([self.rank, dst], self.hosts) == "tcp":
                addr = ctx.client.get(f"{ctx.prefix}/p2p/addr/{dst}", timeout=ctx.timeout)
                sock = connect_authenticated(addr, self.rank, ctx.secret, self._label(self.rank),
                                             ctx.timeout)
                ch = _SocketChannel(sock)
            else:
                path = shm.new_path(ctx.job, f"p{self.rank}to{dst}")
                seg = shm.Segment(path, shm.CTRL_BYTES + shm.chunk_bytes(), create=True)
                seg.ctrl[shm.RING_WRITER_PID] = os.getpid()
                ctx.client.set(f"{ctx.prefix}/p2p/shm/{self.rank}->{dst}", path)
                ch = shm.Ring(seg)  # the receiver unlinks the file once it has mapped it
            self.out[dst] = ch
        return ch

    def _in(self, src: int, watchdog: Watchdog):
        ch = self.inc.get(src)
        if ch is None:
            ctx = self.ctx
            if choose_transport([src, self.rank], self.hosts) == "tcp":
                with self._cond:
                    while src not in self._accepted:
                        self._cond.wait(SELECT_INTERVAL)
                        watchdog.poll()
                    ch = _SocketChannel(self._accepted.pop(src))
            else:
                key = f"{ctx.prefix}/p2p/shm/{src}->{self.rank}"
                path = _store_get_watched(ctx.client, key, watchdog)
                seg = shm.Segment(path, os.path.getsize(path), create=False)
                shm.unlink(path)
                seg.ctrl[shm.RING_READER_PID] = os.getpid()
                ch = shm.Ring(seg)
            self.inc[src] = ch
        return ch

    def send(self, x, dst: int, header: dict) -> None:
        """Send ``header`` and the NumPy array ``x`` (or None) to global rank ``dst``."""
        seq = self.seq_out.get(dst, 0)
        self.seq_out[dst] = seq + 1
        watchdog = self._watchdog(f"send#{seq} from rank {self.rank} to rank {dst}", dst)
        meta = {"seq": seq, "header": header}
        data = memoryview(b"")
        if x is not None:
            meta.update(shape=list(x.shape), dtype=x.dtype.str)
            data = memoryview(as_bytes(x))
        ch = self._out(dst, watchdog)
        ch.write(memoryview(frame_prefix(meta, data.nbytes)), watchdog)
        if data.nbytes:
            ch.write(data, watchdog)

    def recv(self, src: int) -> tuple[dict, np.ndarray | None]:
        """The next message from global rank ``src``: ``(header, array or None)``."""
        seq = self.seq_in.get(src, 0)
        self.seq_in[src] = seq + 1
        watchdog = self._watchdog(f"recv#{seq} on rank {self.rank} from rank {src}", src)
        ch = self._in(src, watchdog)
        sizes = bytearray(FRAME.size)
        ch.read(memoryview(sizes), watchdog)
        hlen, plen = FRAME.unpack(sizes)
        raw = bytearray(hlen)
        ch.read(memoryview(raw), watchdog)
        meta = json.loads(bytes(raw))
        if meta.get("seq") != seq:
            raise CollectiveError(
                f"{watchdog.what()}: got message #{meta.get('seq')} (protocol out of sync)"
            )
        if "shape" not in meta:
            return meta["header"], None
        out = np.empty(meta["shape"], dtype=np.dtype(meta["dtype"]))
        if out.nbytes != plen:
            raise CollectiveError(
                f"{watchdog.what()}: payload of {plen} B for a {out.nbytes} B array"
            )
        if plen:
            ch.read(memoryview(as_bytes(out)), watchdog)
        return meta["header"], out


def _store_get_watched(client, key: str, watchdog: Watchdog):
    """``client.get(key)`` in short steps, so the watchdog can warn while the peer is absent."""
    while True:
        try:
            return client.get(key, timeout=SELECT_INTERVAL)
        except StoreTimeout:
            watchdog.poll()


class _SocketChannel:
    """A connected socket used as a byte stream with watched waits."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock

    def _wait(self, for_write: bool, watchdog: Watchdog) -> None:
        fds = ([], [self.sock], []) if for_write else ([self.sock], [], [])
        if not any(select.select(*fds, SELECT_INTERVAL)):
            watchdog.poll()

    def write(self, data: memoryview, watchdog: Watchdog) -> None:
        while len(data):
            try:
                k = self.sock.send(data)
            except BlockingIOError:
                self._wait(True, watchdog)
                continue
            except OSError as exc:
                raise CollectiveError(f"{watchdog.what()}: connection lost ({exc})") from exc
            data = data[k:]

    def read(self, out: memoryview, watchdog: Watchdog) -> None:
        got = 0
        while got < len(out):
            try:
                k = self.sock.recv_into(out[got:])
            except BlockingIOError:
                self._wait(False, watchdog)
                continue
            except OSError as exc:
                raise CollectiveError(f"{watchdog.what()}: connection lost ({exc})") from exc
            if k == 0:
                raise CollectiveError(f"{watchdog.what()}: connection closed (did the peer die?)")
            got += k

    def close(self) -> None:
        self.sock.close()
