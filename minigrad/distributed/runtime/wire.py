"""Byte framing shared by every TCP connection of the runtime (store, cpu-backend sockets).

A frame is ``!II`` (header length, payload length), a UTF-8 JSON header, then raw payload bytes.
JSON, never pickle: nothing received from the network can run code. Peers prove they belong to the
job with an HMAC of the job secret (:func:`auth_token`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct

FRAME = struct.Struct("!II")  # header length, payload length
U64 = struct.Struct("!Q")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes (raises ConnectionError when the peer closes first)."""
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from the socket (raises ConnectionError when the peer closes first)."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed by peer")
        got += k


def encode_header(header: dict) -> bytes:
    """A compact JSON encoding of a frame header."""
    return json.dumps(header, separators=(",", ":")).encode()


def frame_prefix(header: dict, payload_len: int) -> bytes:
    """The bytes that precede a payload of ``payload_len`` bytes: sizes, then the JSON header."""
    h = encode_header(header)
    return FRAME.pack(len(h), payload_len) + h


def send_frame(sock: socket.socket, header: dict, payload: bytes = b"") -> None:
    """Send one frame (blocking)."""
    sock.sendall(frame_prefix(header, len(payload)) + payload)


def recv_header(sock: socket.socket, max_header: int, max_payload: int) -> tuple[dict, int]:
    """Read a frame's sizes and JSON header; return ``(header, payload length)``.

    Raises ValueError for frames larger than the limits or headers that are not JSON objects.
    """
    hlen, plen = FRAME.unpack(recv_exact(sock, FRAME.size))
    if hlen > max_header or plen > max_payload:
        raise ValueError(f"frame too large (header {hlen} B, payload {plen} B)")
    header = json.loads(recv_exact(sock, hlen).decode())
    if not isinstance(header, dict):
        raise ValueError("frame header is not a JSON object")
    return header, plen


def auth_token(secret: bytes, label: str) -> bytes:
    """HMAC-SHA256 of ``label`` under the job secret: proves a connection comes from the job."""
    return hmac.new(secret, label.encode(), hashlib.sha256).digest()
