"""The ``"cpu"`` backend: collectives on NumPy arrays, over shared memory or TCP.

Every collective is one primitive, :meth:`exchange`: each group member hands over the array it sends
to each peer (or None) plus a header (fingerprint + shapes); each member receives the headers of all
and the pieces addressed to it. Collectives are written once on top of it (:class:`CpuBackend`).

Transports:

* :class:`ShmTransport` (ranks on one host): every rank owns a memory-mapped segment in /dev/shm
  with a control block (step counter, abort flag, pid) and two data areas. An exchange round is
  "write my stream into area ``step % 2``, bump my step, wait until all peers reached it, read their
  area": double buffering by step parity means a rank may write the next round while slower peers
  still read the previous one, so each round costs a single synchronisation. Large messages stream
  through in rounds of ``MINIGRAD_DIST_SHM_CHUNK`` bytes. Segments are unlinked as soon as every
  peer has mapped them, so nothing is left in /dev/shm even if a process is killed.
* :class:`TcpTransport` (ranks on different hosts, or ``MINIGRAD_DIST_TRANSPORT=tcp``): a full mesh
  of sockets; a round sends header + payload to every peer and reads from all, multiplexed with
  ``selectors`` so large messages cannot deadlock on full socket buffers.

Point-to-point ``send``/``recv`` use separate per-pair channels (a shared-memory ring buffer per
direction, or a lazily connected socket), so a send returns as soon as the data is buffered.
Limitation: the shared-memory protocol relies on x86's store ordering (TSO).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
import queue
import selectors
import socket
import struct
import threading
import time
import uuid
from typing import Callable

import numpy as np

from minigrad.distributed.backends import (
    CollectiveError,
    CollectiveTimeoutError,
    Work,
    check_fingerprints,
    describe,
    fingerprint,
)

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None
_CTRL = 4096  # control block: int64 [step, abort, pid]
_META = 1 << 16  # per-area header space
_DEFAULT_CHUNK = 1 << 20
_FRAME = struct.Struct("!II")
_LEN = struct.Struct("!Q")
_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def shm_prefix(job: str) -> str:
    """File-name prefix of this job's segments (the launcher removes leftovers by this prefix)."""
    return f"mg-{job}-"


def _chunk_bytes() -> int:
    value = int(os.environ.get("MINIGRAD_DIST_SHM_CHUNK", _DEFAULT_CHUNK))
    return max(4096, value // 64 * 64)


def _contig(a) -> np.ndarray:
    """C-contiguous view or copy that keeps 0-d arrays 0-d (unlike np.ascontiguousarray)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _u8(a: np.ndarray) -> np.ndarray:
    return _contig(a).reshape(-1).view(np.uint8)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Waiter:
    """Spin, then yield, then sleep: low latency at one rank per core, fair when oversubscribed.
    (Sleeping on a futex instead was measured slower for data-parallel steps on a 2-core VM.)"""

    def __init__(self, timeout: float):
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.n = 0
        self.next_check = self.start + 0.2

    def pause(self) -> bool:
        """Back off once; return True when a slow check (timeout, dead peers) is due."""
        self.n += 1
        if self.n < 3000:  # ~100 us of spinning: the usual wait when each rank has a core
            return False
        if self.n < 5000:
            os.sched_yield()
        else:
            time.sleep(0.0002 if self.n < 20000 else 0.001)
        if self.n % 64 == 0:
            now = time.monotonic()
            if now >= self.next_check:
                self.next_check = now + 0.2
                return True
        return False

    def expired(self) -> bool:
        return time.monotonic() >= self.deadline


class _Segment:
    """A memory-mapped file in /dev/shm (created by its owner, mapped by peers)."""

    def __init__(self, path: str, size: int, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.path, self.size = path, size
        self.buf = memoryview(self.mm)
        self.ctrl = self.buf[:64].cast("q")

    def close(self) -> None:
        try:
            self.ctrl.release()
            self.buf.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass  # a caller still holds a view; the mapping goes away with the process


def _new_path(job: str, tag: str) -> str:
    if SHM_DIR is None:
        raise CollectiveError(
            "shared-memory transport needs /dev/shm (use MINIGRAD_DIST_TRANSPORT=tcp)"
        )
    return os.path.join(SHM_DIR, f"{shm_prefix(job)}{tag}-{uuid.uuid4().hex[:12]}")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------------- shared memory


class ShmTransport:
    """Group exchange over shared memory (all members on this host)."""

    kind = "shm"

    def __init__(self, ctx):
        self.ranks, self.index, self.timeout = ctx.ranks, ctx.index, ctx.timeout
        self.chunk = _chunk_bytes()
        self.area = _META + self.chunk
        n = len(self.ranks)
        path = _new_path(ctx.job, f"g{ctx.gid}r{ctx.rank}")
        self.me = _Segment(path, _CTRL + 2 * self.area, create=True)
        self.me.ctrl[2] = os.getpid()
        client, key = ctx.client, f"{ctx.prefix}/shm"
        try:
            client.set(f"{key}/{self.index}", {"path": path, "size": self.me.size})
            self.segs: list[_Segment] = []
            for j in range(n):
                if j == self.index:
                    self.segs.append(self.me)
                    continue
                info = client.get(f"{key}/{j}", timeout=self.timeout)
                self.segs.append(_Segment(info["path"], int(info["size"]), create=False))
            client.barrier(f"{key}/attached", n, timeout=self.timeout)
        finally:
            _unlink(path)  # every peer has it mapped now (or the job failed): nothing can leak
        self.pids = [int(s.ctrl[2]) for s in self.segs]
        self.step = 0

    def close(self) -> None:
        for s in self.segs:
            s.close()

    def _area(self, seg: _Segment, parity: int) -> memoryview:
        off = _CTRL + parity * self.area
        return seg.buf[off : off + self.area]

    def _sync(self, what: Callable[[], str]) -> None:
        self.step += 1
        target = self.step
        ctrls = [s.ctrl for j, s in enumerate(self.segs) if j != self.index]
        self.me.ctrl[0] = target
        w = None
        while True:
            if all(c[0] >= target for c in ctrls):
                return
            if any(c[1] for c in ctrls):
                if all(c[0] >= target for c in ctrls):
                    return  # it aborted after arriving: this round's data is complete
                bad = [self.ranks[j] for j, s in enumerate(self.segs) if s.ctrl[1]]
                raise CollectiveError(f"{what()}: rank(s) {bad} aborted this collective")
            if w is None:
                w = _Waiter(self.timeout)
            if w.pause():
                late = [self.ranks[j] for j, s in enumerate(self.segs) if s.ctrl[0] < target]
                dead = [
                    self.ranks[j] for j, s in enumerate(self.segs) if not _pid_alive(self.pids[j])
                ]
                if dead:
                    raise CollectiveError(f"{what()}: rank(s) {dead} died (process exited)")
                if w.expired():
                    raise CollectiveTimeoutError(
                        f"{what()} timed out after {self.timeout:g} s on rank "
                        f"{self.ranks[self.index]} waiting for rank(s) {late} (did they skip this "
                        f"collective, hang, or crash?)"
                    )

    def abort(self) -> None:
        self.me.ctrl[1] = 1

    def exchange(self, header: dict, sends: list, on_headers, consume, what) -> list[dict]:
        n, me = len(self.ranks), self.index
        bufs, seen, dirs, total = [], {}, [], 0
        for a in sends:
            if a is None:
                dirs.append(None)
                continue
            key = id(a)
            if key not in seen:
                u8 = _u8(a)
                seen[key] = (total, int(u8.size))
                bufs.append((total, u8))
                total = (total + int(u8.size) + 7) // 8 * 8
            dirs.append(seen[key])
        header = dict(header, _dir=dirs, _total=total)
        hb = json.dumps(header, separators=(",", ":")).encode()
        if len(hb) + 8 > _META:
            raise CollectiveError(f"{what()}: header of {len(hb)} B exceeds {_META} B")
        C = self.chunk
        k, nrounds, headers = 0, 1, None
        while k < nrounds:
            parity = self.step % 2
            area = self._area(self.me, parity)
            if k == 0:
                area[:8] = _LEN.pack(len(hb))
                area[8 : 8 + len(hb)] = hb
            lo, hi = k * C, (k + 1) * C
            for start, u8 in bufs:
                a, b = max(lo, start), min(hi, start + u8.size)
                if a < b:
                    area[_META + a - lo : _META + b - lo] = u8[a - start : b - start]
            self._sync(what)
            areas = [self._area(s, parity) for s in self.segs]
            if k == 0:
                headers = []
                for ar in areas:
                    (m,) = _LEN.unpack(ar[:8])
                    headers.append(json.loads(bytes(ar[8 : 8 + m])))
                nrounds = max(1, max((h["_total"] + C - 1) // C for h in headers))
                on_headers(headers)
            pieces = {}
            for src in range(n):
                d = headers[src]["_dir"][me]
                if d is None:
                    continue
                start, length = d
                a, b = max(lo, start), min(hi, start + length)
                if a < b or (length == 0 and k == 0):
                    pieces[src] = (a - start, areas[src][_META + a - lo : _META + max(a, b) - lo])
            if pieces:
                consume(pieces)
            k += 1
        return headers


class LocalTransport:
    """The exchange of a one-member group (world size 1): headers and data stay in-process."""

    kind = "local"

    def __init__(self, ctx):
        self.ranks, self.index = ctx.ranks, 0

    def close(self) -> None:
        pass

    def exchange(self, header: dict, sends: list, on_headers, consume, what) -> list[dict]:
        on_headers([header])
        if sends[0] is not None:
            consume({0: (0, memoryview(_u8(sends[0])))})
        return [header]


# ----------------------------------------------------------------------------------- TCP


def _local_ip_towards(host: str) -> str:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((host, 9))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def _auth_token(secret: bytes, tag: str) -> bytes:
    return hmac.new(secret, tag.encode(), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("connection closed")
        out += chunk
    return bytes(out)


class TcpTransport:
    """Group exchange over a full mesh of TCP sockets (lower index accepts, higher connects)."""

    kind = "tcp"

    def __init__(self, ctx):
        self.ranks, self.index, self.timeout = ctx.ranks, ctx.index, ctx.timeout
        n, me = len(self.ranks), self.index
        self.socks: dict[int, socket.socket] = {}
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.bind(("0.0.0.0", 0))
        lsock.listen(n)
        key = f"{ctx.prefix}/tcp"
        ip = _local_ip_towards(ctx.client.host)
        ctx.client.set(f"{key}/{me}", [ip, lsock.getsockname()[1]])
        try:
            for j in range(me):
                host, port = ctx.client.get(f"{key}/{j}", timeout=self.timeout)
                s = socket.create_connection((host, port), timeout=self.timeout)
                s.sendall(_LEN.pack(me) + _auth_token(ctx.secret, f"{ctx.prefix}/{me}"))
                self.socks[j] = s
            lsock.settimeout(self.timeout)
            while len(self.socks) < n - 1:
                s, _ = lsock.accept()
                s.settimeout(self.timeout)
                try:
                    (j,) = _LEN.unpack(_recv_exact(s, 8))
                    tok = _recv_exact(s, 32)
                except (OSError, ConnectionError, struct.error):
                    s.close()
                    continue
                if not (me < j < n) or not hmac.compare_digest(
                    tok, _auth_token(ctx.secret, f"{ctx.prefix}/{j}")
                ):
                    s.close()  # a stranger: ignore it and keep waiting for real peers
                    continue
                self.socks[j] = s
        except socket.timeout as exc:
            raise CollectiveTimeoutError(
                f"TCP mesh setup of group {self.ranks} timed out on rank {ctx.rank}"
            ) from exc
        finally:
            lsock.close()
        for s in self.socks.values():
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
        self.sel = selectors.DefaultSelector()

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()

    def abort(self) -> None:
        self.close()

    def exchange(self, header: dict, sends: list, on_headers, consume, what) -> list[dict]:
        n, me = len(self.ranks), self.index
        payload = [_u8(a) if a is not None else None for a in sends]
        lens = [int(p.size) if p is not None else None for p in payload]
        hb = json.dumps(dict(header, _n=lens), separators=(",", ":")).encode()
        out = {}
        for j in self.socks:
            p = payload[j]
            parts = [memoryview(_FRAME.pack(len(hb), lens[j] or 0) + hb)]
            if p is not None and p.size:
                parts.append(memoryview(p))
            out[j] = [parts, 0]
        inc = {j: {"pre": bytearray(), "hdr": None, "data": None, "got": 0} for j in self.socks}
        headers: list = [None] * n
        headers[me] = dict(header, _n=lens)
        received = {}
        sel = self.sel
        for j, s in self.socks.items():
            sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, j)
        deadline = time.monotonic() + self.timeout
        pending_in, pending_out = set(self.socks), set(self.socks)
        try:
            while pending_in or pending_out:
                left = deadline - time.monotonic()
                if left <= 0:
                    late = sorted(self.ranks[j] for j in pending_in | pending_out)
                    raise CollectiveTimeoutError(
                        f"{what()} timed out after {self.timeout:g} s on rank {self.ranks[me]} "
                        f"waiting for rank(s) {late} (did they skip this collective or hang?)"
                    )
                for key, ev in sel.select(min(left, 1.0)):
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
        parts, _ = out[j]
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
                need = _FRAME.size - len(pre) if len(pre) < _FRAME.size else None
                if need is None:
                    hlen, plen = _FRAME.unpack_from(pre)
                    need = _FRAME.size + hlen - len(pre)
                    if need == 0:
                        st["hdr"] = json.loads(bytes(pre[_FRAME.size :]))
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


# ------------------------------------------------------------------------ point-to-point


class _Ring:
    """A single-producer single-consumer byte ring in shared memory (one per direction)."""

    def __init__(self, seg: _Segment):
        self.seg = seg
        self.cap = seg.size - _CTRL
        self.data = seg.buf[_CTRL:]
        self.ctrl = seg.ctrl  # [write_pos, read_pos, writer_pid, reader_pid]

    def _wait(self, cond, timeout: float, what: str, peer_pid: int) -> None:
        w = _Waiter(timeout)
        while not cond():
            if w.pause():
                if peer_pid and not _pid_alive(peer_pid):
                    raise CollectiveError(f"{what}: peer process {peer_pid} died")
                if w.expired():
                    raise CollectiveTimeoutError(f"{what} timed out after {timeout:g} s")

    def write(self, data: memoryview, timeout: float, what: str) -> None:
        pos, n, cap, ctrl = 0, len(data), self.cap, self.ctrl
        while pos < n:
            w = ctrl[0]
            if w - ctrl[1] >= cap:
                self._wait(lambda: ctrl[0] - ctrl[1] < cap, timeout, what, ctrl[3])
            free = cap - (w - ctrl[1])
            off = w % cap
            k = min(free, n - pos, cap - off)
            self.data[off : off + k] = data[pos : pos + k]
            pos += k
            ctrl[0] = w + k

    def read(self, out: memoryview, timeout: float, what: str) -> None:
        pos, n, cap, ctrl = 0, len(out), self.cap, self.ctrl
        while pos < n:
            r = ctrl[1]
            if ctrl[0] == r:
                self._wait(lambda r=r: ctrl[0] > r, timeout, what, ctrl[2])
            avail = ctrl[0] - r
            off = r % cap
            k = min(avail, n - pos, cap - off)
            out[pos : pos + k] = self.data[off : off + k]
            pos += k
            ctrl[1] = r + k


class P2P:
    """Per-pair send/recv channels of one rank (shared-memory rings, or TCP sockets)."""

    def __init__(self, ctx, kind: str):
        self.ctx, self.kind = ctx, kind
        self.rank, self.timeout = ctx.rank, ctx.timeout
        self.out: dict[int, object] = {}
        self.inc: dict[int, object] = {}
        self.seq_out: dict[int, int] = {}
        self.seq_in: dict[int, int] = {}
        self._accepted: dict[int, socket.socket] = {}
        self._cond = threading.Condition()
        self._lsock = None
        if kind == "tcp":
            self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._lsock.bind(("0.0.0.0", 0))
            self._lsock.listen(64)
            ip = _local_ip_towards(ctx.client.host)
            ctx.client.set(f"{ctx.prefix}/p2p/addr/{self.rank}", [ip, self._lsock.getsockname()[1]])
            threading.Thread(target=self._accept_loop, daemon=True).start()

    def close(self) -> None:
        if self._lsock is not None:
            self._lsock.close()
        for ch in list(self.out.values()) + list(self.inc.values()):
            if isinstance(ch, socket.socket):
                ch.close()
            else:
                ch.seg.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                s, _ = self._lsock.accept()
            except OSError:
                return
            try:
                s.settimeout(10.0)
                (src,) = _LEN.unpack(_recv_exact(s, 8))
                tok = _recv_exact(s, 32)
                if not hmac.compare_digest(tok, _auth_token(self.ctx.secret, f"p2p/{src}")):
                    s.close()
                    continue
                s.settimeout(None)
            except (OSError, ConnectionError, struct.error):
                s.close()
                continue
            with self._cond:
                self._accepted[src] = s
                self._cond.notify_all()

    def _out(self, dst: int):
        ch = self.out.get(dst)
        if ch is None:
            if self.kind == "tcp":
                key = f"{self.ctx.prefix}/p2p/addr/{dst}"
                host, port = self.ctx.client.get(key, timeout=self.timeout)
                ch = socket.create_connection((host, port), timeout=self.timeout)
                ch.settimeout(self.timeout)
                ch.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                ch.sendall(_LEN.pack(self.rank) + _auth_token(self.ctx.secret, f"p2p/{self.rank}"))
            else:
                path = _new_path(self.ctx.job, f"p{self.rank}to{dst}")
                seg = _Segment(path, _CTRL + _chunk_bytes(), create=True)
                seg.ctrl[2] = os.getpid()
                self.ctx.client.set(f"{self.ctx.prefix}/p2p/shm/{self.rank}->{dst}", path)
                ch = _Ring(seg)  # the receiver unlinks the file once it has mapped it
            self.out[dst] = ch
        return ch

    def _in(self, src: int):
        ch = self.inc.get(src)
        if ch is None:
            if self.kind == "tcp":
                with self._cond:
                    if not self._cond.wait_for(lambda: src in self._accepted, self.timeout):
                        raise CollectiveTimeoutError(
                            f"recv from rank {src} on rank {self.rank}: no connection within "
                            f"{self.timeout:g} s (did rank {src} call send?)"
                        )
                    ch = self._accepted.pop(src)
                ch.settimeout(self.timeout)
            else:
                key = f"{self.ctx.prefix}/p2p/shm/{src}->{self.rank}"
                path = self.ctx.client.get(key, timeout=self.timeout)
                size = os.path.getsize(path)
                seg = _Segment(path, size, create=False)
                _unlink(path)
                seg.ctrl[3] = os.getpid()
                ch = _Ring(seg)
            self.inc[src] = ch
        return ch

    def send(self, x: np.ndarray, dst: int) -> None:
        seq = self.seq_out.get(dst, 0)
        self.seq_out[dst] = seq + 1
        what = f"send#{seq} from rank {self.rank} to rank {dst}"
        x = _contig(x)
        hb = json.dumps({"seq": seq, "shape": list(x.shape), "dtype": x.dtype.str}).encode()
        ch = self._out(dst)
        data = memoryview(_u8(x))
        if isinstance(ch, socket.socket):
            try:
                ch.sendall(_FRAME.pack(len(hb), data.nbytes) + hb)
                ch.sendall(data)
            except socket.timeout as exc:
                raise CollectiveTimeoutError(f"{what} timed out after {self.timeout:g} s") from exc
            except OSError as exc:
                raise CollectiveError(f"{what}: connection lost ({exc})") from exc
        else:
            ch.write(memoryview(_FRAME.pack(len(hb), data.nbytes) + hb), self.timeout, what)
            ch.write(data, self.timeout, what)

    def recv(self, src: int) -> np.ndarray:
        seq = self.seq_in.get(src, 0)
        self.seq_in[src] = seq + 1
        what = f"recv#{seq} on rank {self.rank} from rank {src}"
        ch = self._in(src)
        if isinstance(ch, socket.socket):
            try:
                hlen, plen = _FRAME.unpack(_recv_exact(ch, _FRAME.size))
                h = json.loads(_recv_exact(ch, hlen))
                out = np.empty(h["shape"], dtype=np.dtype(h["dtype"]))
                view = memoryview(_u8(out)) if out.size else memoryview(bytearray(0))
                got = 0
                while got < plen:
                    k = ch.recv_into(view[got:])
                    if k == 0:
                        raise ConnectionError("closed")
                    got += k
            except socket.timeout as exc:
                raise CollectiveTimeoutError(f"{what} timed out after {self.timeout:g} s") from exc
            except (OSError, ConnectionError) as exc:
                raise CollectiveError(f"{what}: connection lost (did rank {src} die?)") from exc
        else:
            pre = bytearray(_FRAME.size)
            ch.read(memoryview(pre), self.timeout, what)
            hlen, plen = _FRAME.unpack(pre)
            hb = bytearray(hlen)
            ch.read(memoryview(hb), self.timeout, what)
            h = json.loads(hb)
            out = np.empty(h["shape"], dtype=np.dtype(h["dtype"]))
            if plen:
                ch.read(memoryview(_u8(out)), self.timeout, what)
        if h["seq"] != seq:
            raise CollectiveError(f"{what}: got message #{h['seq']} (protocol out of sync)")
        return out


# ----------------------------------------------------------------------------- collectives


def _meta(a: np.ndarray | None):
    return None if a is None else [list(a.shape), a.dtype.str]


def _empty(meta) -> np.ndarray:
    return np.empty(meta[0], dtype=np.dtype(meta[1]))


def _fill(out_u8: np.ndarray, offset: int, piece: memoryview) -> None:
    if len(piece):
        out_u8[offset : offset + len(piece)] = np.frombuffer(piece, np.uint8)


class CpuBackend:
    """Collectives on NumPy arrays for one group, written on :meth:`exchange`.

    Results are fresh arrays (never views of shared memory). Reductions add the ranks' inputs in
    group order, so every rank gets bitwise the same result.
    """

    name = "cpu"

    def __init__(self, ctx):
        self.ctx = ctx
        self.transport = ctx.transport
        self._queue: queue.Queue | None = None
        self._pending = 0
        self._pending_lock = threading.Condition()

    # --- plumbing
    def _run(self, fp: dict, sends: list, on_headers=None, consume=None) -> list[dict]:
        ctx = self.ctx
        what = lambda: f"{describe(fp)} in group {ctx.ranks}"

        def headers_hook(headers):
            check_fingerprints(headers, ctx.ranks)
            if on_headers is not None:
                on_headers(headers)

        try:
            return self.transport.exchange(
                fp, sends, headers_hook, consume or (lambda pieces: None), what
            )
        except BaseException:
            if hasattr(self.transport, "abort"):
                self.transport.abort()
            ctx.broken = True
            raise

    def flush(self) -> None:
        """Wait until asynchronous collectives queued on this group have run (keeps order)."""
        with self._pending_lock:
            self._pending_lock.wait_for(lambda: self._pending == 0)

    # --- collectives
    def all_reduce(self, x: np.ndarray, op: str = "sum", seq: int = 0,
                   out: np.ndarray | None = None) -> np.ndarray:
        """``out`` (C-contiguous, like ``x``; may be ``x`` itself) receives the result: every piece
        of ``x`` is in shared memory before the matching piece of ``out`` is written."""
        ufunc = _UFUNCS[op]
        x = _contig(x)
        n = len(self.ctx.ranks)
        sig = [list(x.shape), x.dtype.str, op]
        if n > 2 and x.nbytes > (1 << 16) and x.size >= n:
            fp = fingerprint("all_reduce", seq, None, sig)
            return self._all_reduce_rs_ag(x, ufunc, fp, out)
        out = np.empty_like(x) if out is None else out
        flat = out.reshape(-1)

        def consume(pieces):
            srcs = sorted(pieces)
            off = pieces[srcs[0]][0] // x.itemsize
            views = [np.frombuffer(pieces[s][1], x.dtype) for s in srcs]
            o = flat[off : off + views[0].size]
            if len(views) == 1:
                o[...] = views[0]
                return
            ufunc(views[0], views[1], out=o)
            for v in views[2:]:
                ufunc(o, v, out=o)

        self._run(fingerprint("all_reduce", seq, None, sig), [x] * n, None, consume)
        return out

    def _all_reduce_rs_ag(self, x, ufunc, fp, out=None) -> np.ndarray:
        n, me = len(self.ctx.ranks), self.ctx.index
        flat = x.reshape(-1)
        bounds = np.linspace(0, flat.size, n + 1).astype(np.int64)
        parts = [flat[bounds[j] : bounds[j + 1]] for j in range(n)]
        mine = np.empty_like(parts[me])
        seen = set()

        def consume_rs(pieces):
            for src in sorted(pieces):
                off, mv = pieces[src]
                v = np.frombuffer(mv, x.dtype)
                o = mine[off // x.itemsize : off // x.itemsize + v.size]
                if (off, 0) not in seen:
                    o[...] = v
                    seen.add((off, 0))
                else:
                    ufunc(o, v, out=o)

        self._run(fp, parts, None, consume_rs)
        out = np.empty_like(x) if out is None else out
        out_u8 = _u8(out) if out.flags.c_contiguous else None
        fp2 = dict(fp, op="all_reduce/gather")

        def consume_ag(pieces):
            for src, (off, mv) in pieces.items():
                _fill(out_u8, int(bounds[src]) * x.itemsize + off, mv)

        self._run(fp2, [mine] * n, None, consume_ag)
        return out

    def broadcast(self, x: np.ndarray | None, root_index: int, seq: int = 0) -> np.ndarray:
        n, me = len(self.ctx.ranks), self.ctx.index
        root = self.ctx.ranks[root_index]
        if me == root_index:
            if x is None:
                raise ValueError(f"broadcast: the root rank {root} must pass an array, got None")
            x = _contig(x)
            self._run(dict(fingerprint("broadcast", seq, root), meta=_meta(x)), [x] * n)
            return x.copy()
        box = {}

        def on_headers(headers):
            box["out"] = _empty(headers[root_index]["meta"])

        def consume(pieces):
            off, mv = pieces[root_index]
            _fill(_u8(box["out"]), off, mv)

        self._run(fingerprint("broadcast", seq, root), [None] * n, on_headers, consume)
        return box["out"]

    def _collect(self, op, seq, root, sig, sends, my_sends_meta) -> list:
        """Exchange, receiving a list of arrays (one per sender that addressed this rank)."""
        n, me = len(self.ctx.ranks), self.ctx.index
        outs: list = [None] * n

        def on_headers(headers):
            for src, h in enumerate(headers):
                m = h["meta"][me] if h.get("meta") else None
                if m is not None:
                    outs[src] = _empty(m)

        def consume(pieces):
            for src, (off, mv) in pieces.items():
                _fill(_u8(outs[src]), off, mv)

        fp = dict(fingerprint(op, seq, root, sig), meta=my_sends_meta)
        self._run(fp, sends, on_headers, consume)
        return outs

    def all_gather(self, x: np.ndarray, seq: int = 0) -> list[np.ndarray]:
        n = len(self.ctx.ranks)
        x = _contig(x)
        return self._collect("all_gather", seq, None, x.dtype.str, [x] * n, [_meta(x)] * n)

    def gather(self, x: np.ndarray, root_index: int, seq: int = 0) -> list | None:
        n, me = len(self.ctx.ranks), self.ctx.index
        x = _contig(x)
        sends = [x if j == root_index else None for j in range(n)]
        meta = [_meta(a) for a in sends]
        outs = self._collect("gather", seq, self.ctx.ranks[root_index], x.dtype.str, sends, meta)
        return outs if me == root_index else None

    def scatter(self, chunks: list | None, root_index: int, seq: int = 0) -> np.ndarray:
        n, me = len(self.ctx.ranks), self.ctx.index
        root = self.ctx.ranks[root_index]
        if me == root_index:
            if chunks is None or len(chunks) != n:
                got = None if chunks is None else len(chunks)
                raise ValueError(f"scatter: root rank {root} must pass {n} chunks, got {got}")
            sends = [_contig(c) for c in chunks]
        else:
            sends = [None] * n
        outs = self._collect("scatter", seq, root, None, sends, [_meta(a) for a in sends])
        return outs[root_index]

    def reduce(self, x: np.ndarray, op: str, root_index: int, seq: int = 0) -> np.ndarray | None:
        n, me = len(self.ctx.ranks), self.ctx.index
        ufunc = _UFUNCS[op]
        x = _contig(x)
        sends = [x if j == root_index else None for j in range(n)]
        sig = [list(x.shape), x.dtype.str, op]
        meta = [_meta(a) for a in sends]
        outs = self._collect("reduce", seq, self.ctx.ranks[root_index], sig, sends, meta)
        if me != root_index:
            return None
        return _reduce_list([o for o in outs if o is not None], ufunc, x)

    def reduce_scatter(self, chunks: list, op: str, seq: int = 0) -> np.ndarray:
        n = len(self.ctx.ranks)
        if len(chunks) != n:
            raise ValueError(
                f"reduce_scatter: expected {n} chunks (one per group member), got {len(chunks)}"
            )
        ufunc = _UFUNCS[op]
        sends = [_contig(c) for c in chunks]
        sig = [[_meta(c) for c in sends], op]
        outs = self._collect("reduce_scatter", seq, None, sig, sends, [_meta(c) for c in sends])
        return _reduce_list(outs, ufunc, outs[0])

    def all_to_all(self, chunks: list, seq: int = 0) -> list[np.ndarray]:
        n = len(self.ctx.ranks)
        if len(chunks) != n:
            raise ValueError(
                f"all_to_all: expected {n} chunks (one per group member), got {len(chunks)}"
            )
        sends = [_contig(c) for c in chunks]
        dt = sends[0].dtype.str if n else None
        return self._collect("all_to_all", seq, None, dt, sends, [_meta(c) for c in sends])

    def barrier(self, seq: int = 0) -> None:
        self._run(fingerprint("barrier", seq), [None] * len(self.ctx.ranks))

    def all_reduce_async(self, x: np.ndarray, op: str, seq: int, donate: bool = False) -> Work:
        """Queue the all-reduce on this group's worker thread (collectives keep their order).
        The result is reduced into a private copy of ``x`` (the caller may overwrite its buffer
        meanwhile), or into ``x`` itself when the caller donates it."""
        x = _contig(x) if donate else np.array(x, copy=True, order="C")
        if self._queue is None:
            self._queue = queue.Queue()
            threading.Thread(target=self._worker, name="mg-allreduce", daemon=True).start()
        box: dict = {}
        done = threading.Event()
        with self._pending_lock:
            self._pending += 1
        self._queue.put((x, op, seq, box, done))

        def wait():
            done.wait()
            if "error" in box:
                raise box["error"]
            return box["value"]

        return Work(wait, done.is_set)

    def _worker(self) -> None:
        while True:
            x, op, seq, box, done = self._queue.get()
            try:
                box["value"] = self.all_reduce(x, op, seq, out=x)
            except BaseException as exc:  # delivered to the caller by Work.wait()
                box["error"] = exc
            finally:
                done.set()
                with self._pending_lock:
                    self._pending -= 1
                    self._pending_lock.notify_all()


def _reduce_list(arrays: list[np.ndarray], ufunc, like: np.ndarray) -> np.ndarray:
    out = np.array(arrays[0], copy=True)
    for a in arrays[1:]:
        ufunc(out, a, out=out)
    return out
