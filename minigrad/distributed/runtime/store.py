"""Rendezvous store: a small authenticated TCP key-value server (MegEngine's Server/Client role).

Ranks use it only for rendezvous and metadata (addresses, NCCL ids, barriers), never for array data.

Wire protocol (both directions): frames of :mod:`.wire` (sizes, a UTF-8 JSON header, raw payload
bytes). Values travel as ``bytes`` (raw payload) or JSON (``kind="json"``); nothing received from
the network is ever unpickled. A connection starts with a challenge-response: the server sends
``MAGIC + nonce``, the client answers ``HMAC-SHA256(secret, nonce)``; any other answer, or a
malformed frame later on, closes that connection only.

Example::

    server = Server(port=0, secret=b"s3cret")
    client = Client("127.0.0.1", server.port, secret=b"s3cret")
    client.set("x", {"a": 1}); client.get("x")   # -> {'a': 1}
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from minigrad.distributed.runtime.settings import DEFAULT_TIMEOUT, SECRET_ENV
from minigrad.distributed.runtime.wire import recv_exact, recv_header, send_frame

MAGIC = b"MGSTORE1"
MAX_HEADER = 1 << 16  # JSON headers are small: anything larger is garbage or an attack
MAX_PAYLOAD = 64 << 20  # values are rendezvous metadata, never array data
AUTH_TIMEOUT = 5.0  # seconds a new connection has to answer the challenge
CONNECT_ATTEMPT_TIMEOUT = 10.0  # seconds per TCP connect attempt while the server may be starting


class StoreError(RuntimeError):
    """A store request failed (timeout, missing key, server unreachable, authentication)."""


class StoreTimeout(StoreError, TimeoutError):
    """A blocking store request (get, barrier) did not complete within its timeout."""


def generate_secret() -> str:
    """A fresh per-job secret (hex), as the launcher passes it to children via the environment."""
    return secrets.token_hex(16)


def as_secret(secret: bytes | str | None) -> bytes:
    """The job secret as bytes: ``secret``, else ``MINIGRAD_DIST_SECRET``, else empty."""
    if secret is None:
        secret = os.environ.get(SECRET_ENV, "")
    return secret.encode() if isinstance(secret, str) else bytes(secret)


def _recv_frame(sock: socket.socket) -> tuple[dict, bytes]:
    header, plen = recv_header(sock, MAX_HEADER, MAX_PAYLOAD)
    return header, recv_exact(sock, plen) if plen else b""


def _encode(value: Any) -> tuple[str, bytes]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes", bytes(value)
    try:
        return "json", json.dumps(value, separators=(",", ":")).encode()
    except TypeError as exc:
        raise TypeError(
            f"store values must be bytes, str, int or JSON-able objects, got {type(value).__name__}"
        ) from exc


def _decode(kind: str, payload: bytes) -> Any:
    return payload if kind == "bytes" else json.loads(payload.decode())


def is_serving(host: str, port: int, secret: bytes | str | None = None) -> bool:
    """Whether a minigrad store already listens at ``host:port`` (e.g. a user-started
    ``dist.Server``): then rank 0 joins it instead of starting its own."""
    try:
        Client(host, port, secret, timeout=AUTH_TIMEOUT, connect_timeout=0).close()
    except StoreError as exc:
        if "wrong secret" in str(exc) or "not a minigrad store" in str(exc):
            raise
        return False
    return True


# ------------------------------------------------------------------------------------ server


class Server:
    """The store server: one thread accepting, one thread per authenticated connection.

    ``port=0`` picks a free port (read it back from ``.port``). A second server on a port in use
    raises ``OSError`` naming the port.
    """

    def __init__(self, port: int = 0, secret: bytes | str | None = None, host: str = "0.0.0.0"):
        self._secret = as_secret(secret)
        self._data: dict[str, tuple[str, bytes]] = {}
        self._barriers: dict[str, list[int]] = {}  # name -> [arrived, generation]
        self._cond = threading.Condition()
        self._closed = False
        self.rejected = 0  # connections dropped for bad auth or garbage (observable in tests)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
        except OSError as exc:
            self._sock.close()
            msg = f"store server cannot listen on port {port}: {exc.strerror}"
            raise OSError(exc.errno, msg) from exc
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="mg-store", daemon=True)
        self._thread.start()

    @property
    def py_server_port(self) -> int:
        """MegEngine's name for :attr:`port` (the port actually listened on)."""
        return self.port

    def fileno(self) -> int:
        """The listening socket's descriptor (forked ranks close their copy)."""
        return self._sock.fileno()

    def __repr__(self) -> str:
        return f"Server(port={self.port}, {'closed' if self._closed else 'serving'})"

    def close(self) -> None:
        """Stop accepting; waiting requests are released with an error."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._cond:
            self._cond.notify_all()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _authenticate(self, conn: socket.socket) -> bool:
        nonce = secrets.token_bytes(32)
        conn.settimeout(AUTH_TIMEOUT)
        conn.sendall(MAGIC + nonce)
        answer = recv_exact(conn, 32)
        expected = hmac.new(self._secret, nonce, hashlib.sha256).digest()
        ok = hmac.compare_digest(answer, expected)
        conn.sendall(b"OK" if ok else b"NO")
        conn.settimeout(None)
        return ok

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not self._authenticate(conn):
                self.rejected += 1
                return
            while not self._closed:
                try:
                    header, payload = _recv_frame(conn)
                except ConnectionError:
                    return
                reply, rpayload = self._handle(header, payload)
                send_frame(conn, reply, rpayload)
        except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
            self.rejected += 1  # garbage or a broken client: drop this connection only
        finally:
            conn.close()

    def _wait(self, pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not pred():
            left = deadline - time.monotonic()
            if left <= 0 or self._closed:
                return False
            self._cond.wait(min(left, 1.0))
        return True

    def _handle(self, h: dict, payload: bytes) -> tuple[dict, bytes]:
        op, key = h["op"], str(h.get("key", ""))
        timeout = float(h.get("timeout", 0.0))
        with self._cond:
            if op == "set":
                self._data[key] = (str(h["kind"]), payload)
                self._cond.notify_all()
                return {"ok": True}, b""
            if op in ("get", "pop"):
                if not self._wait(lambda: key in self._data, timeout):
                    return {"ok": False, "timeout": True, "error": f"key {key!r} not set"}, b""
                kind, value = self._data.pop(key) if op == "pop" else self._data[key]
                return {"ok": True, "kind": kind}, value
            if op == "check":
                return {"ok": True, "kind": "json"}, json.dumps(key in self._data).encode()
            if op == "add":
                kind, old = self._data.get(key, ("json", b"0"))
                value = int(json.loads(old)) + int(h["amount"])
                self._data[key] = ("json", str(value).encode())
                self._cond.notify_all()
                return {"ok": True, "kind": "json"}, str(value).encode()
            if op == "delete":
                existed = self._data.pop(key, None) is not None
                return {"ok": True, "kind": "json"}, json.dumps(existed).encode()
            if op == "barrier":
                return self._barrier(key, int(h["count"]), timeout)
        return {"ok": False, "error": f"unknown op {op!r}"}, b""

    def _barrier(self, name: str, count: int, timeout: float) -> tuple[dict, bytes]:
        state = self._barriers.setdefault(name, [0, 0])
        gen = state[1]
        state[0] += 1
        if state[0] >= count:
            state[0], state[1] = 0, gen + 1
            self._cond.notify_all()
            return {"ok": True}, b""
        if self._wait(lambda: state[1] != gen, timeout):
            return {"ok": True}, b""
        arrived = state[0]
        state[0] -= 1  # this waiter leaves; the barrier stays consistent for the others
        return {
            "ok": False,
            "timeout": True,
            "error": f"barrier {name!r}: only {arrived} of {count} participants arrived",
        }, b""


# ------------------------------------------------------------------------------------ client


class Client:
    """A store client. Thread-safe: each thread gets its own authenticated connection.

    ``connect_timeout`` covers a server that is not up yet (ranks may start before rank 0's server):
    connecting is retried until then. ``set``, ``get`` and ``add`` take ``within``: seconds to wait
    for the store's answer, connecting included, on top of the request's own timeout (None: no
    bound); a store that does not answer in time (the process serving it hangs, or is ending)
    raises :class:`StoreError` and the connection is dropped.
    """

    def __init__(
        self,
        host: str,
        port: int,
        secret: bytes | str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float | None = None,
    ):
        self.host, self.port, self.timeout = host, int(port), float(timeout)
        self._secret = as_secret(secret)
        self._connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._local = threading.local()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._conn()  # fail early: unreachable server or wrong secret

    def _conn(self, within: float | None = None) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            return sock
        deadline = time.monotonic() + (self._connect_timeout if within is None else within)
        attempt = CONNECT_ATTEMPT_TIMEOUT if within is None else max(within, 0.01)
        delay = 0.01
        while True:
            try:
                addr = (self.host, self.port)
                sock = socket.create_connection(addr, timeout=attempt)
                break
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"cannot connect to the store at {self.host}:{self.port} within "
                        f"{self._connect_timeout:.1f} s: {exc}"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        try:
            hello = recv_exact(sock, len(MAGIC) + 32)
            if hello[: len(MAGIC)] != MAGIC:
                raise StoreError(f"{self.host}:{self.port} is not a minigrad store")
            sock.sendall(hmac.new(self._secret, hello[len(MAGIC) :], hashlib.sha256).digest())
            if recv_exact(sock, 2) != b"OK":
                raise StoreError(
                    f"store at {self.host}:{self.port} rejected this client: wrong secret "
                    f"(set the same {SECRET_ENV} on every rank)"
                )
        except (OSError, ConnectionError) as exc:
            sock.close()
            raise StoreError(f"store handshake with {self.host}:{self.port} failed: {exc}") from exc
        except StoreError:
            sock.close()
            raise
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._local.sock = sock
        with self._lock:
            self._socks.append(sock)
        return sock

    def _request(self, header: dict, payload: bytes = b"", within: float | None = None) -> Any:
        sock = self._conn(within)
        try:
            if within is not None:
                sock.settimeout(max(within, 0.01) + float(header.get("timeout", 0.0)))
            send_frame(sock, header, payload)
            reply, rpayload = _recv_frame(sock)
            if within is not None:
                sock.settimeout(None)
        except (OSError, ConnectionError, ValueError) as exc:
            self._local.sock = None  # a late answer must not be read as the next one's
            sock.close()
            if isinstance(exc, socket.timeout):
                raise StoreError(
                    f"store at {self.host}:{self.port} did not answer {header['op']!r} within "
                    f"{within:g} s (the process serving it hangs or is ending)") from exc
            raise StoreError(f"store request {header['op']!r} failed: {exc}") from exc
        if not reply.get("ok"):
            cls = StoreTimeout if reply.get("timeout") else StoreError
            raise cls(f"store {header['op']}: {reply.get('error')}")
        return _decode(reply["kind"], rpayload) if "kind" in reply else None

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else float(timeout)

    def set(self, key: str, value: Any, *, within: float | None = None) -> None:
        """Store ``value`` (bytes, str, int or a JSON-able object) under ``key``."""
        kind, payload = _encode(value)
        self._request({"op": "set", "key": key, "kind": kind}, payload, within)

    def get(self, key: str, timeout: float | None = None, *, within: float | None = None) -> Any:
        """Block until ``key`` is set (or raise :class:`StoreTimeout`), then return its value."""
        return self._request({"op": "get", "key": key, "timeout": self._timeout(timeout)},
                             within=within)

    def pop(self, key: str, timeout: float | None = None) -> Any:
        """Like :meth:`get`, and delete the key."""
        return self._request({"op": "pop", "key": key, "timeout": self._timeout(timeout)})

    def check(self, key: str) -> bool:
        """Whether ``key`` is set (non-blocking)."""
        return bool(self._request({"op": "check", "key": key}))

    def add(self, key: str, amount: int = 1, *, within: float | None = None) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (0 if unset); return the result."""
        return int(self._request({"op": "add", "key": key, "amount": int(amount)}, within=within))

    def delete(self, key: str) -> bool:
        """Delete ``key``; return whether it existed."""
        return bool(self._request({"op": "delete", "key": key}))

    def barrier(self, name: str, count: int, timeout: float | None = None) -> None:
        """Block until ``count`` callers reached barrier ``name`` (reusable: generations)."""
        self._request(
            {"op": "barrier", "key": name, "count": int(count), "timeout": self._timeout(timeout)}
        )

    # MegEngine's names for the user-facing key-value API.
    def user_set(self, key: str, value: Any) -> None:
        """MegEngine name: set a user key (namespaced apart from internal keys)."""
        self.set("user/" + key, value)

    def user_get(self, key: str, timeout: float | None = None) -> Any:
        """MegEngine name: blocking get of a user key."""
        return self.get("user/" + key, timeout)

    def user_pop(self, key: str, timeout: float | None = None) -> Any:
        """MegEngine name: blocking get-and-delete of a user key."""
        return self.pop("user/" + key, timeout)

    def close(self) -> None:
        """Close this client's connections (one per thread that used it)."""
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
            self._socks.clear()
        self._local = threading.local()
