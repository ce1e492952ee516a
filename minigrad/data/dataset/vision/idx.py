"""Parser for the IDX file format used by MNIST (optionally gzip-compressed).

An IDX file is a 4-byte magic number ``0x00 0x00 <dtype code> <ndim>``, then ``ndim`` big-endian
uint32 dimension sizes, then the row-major payload. We validate every part of it because a
truncated download otherwise turns into silently wrong training data.

Example::

    images = read_idx("t10k-images-idx3-ubyte.gz", expected_magic=2051)  # (10000, 28, 28) uint8
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Sequence

import numpy as np

__all__ = ["IDXFormatError", "IDX_DTYPES", "parse_idx", "read_idx", "encode_idx"]

# dtype code (third magic byte) -> big-endian NumPy dtype, as defined by the IDX format.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


class IDXFormatError(ValueError):
    """Raised when an IDX file is malformed; the message names the file and the problem."""


def parse_idx(
    data: bytes,
    name: str = "<bytes>",
    expected_magic: int | None = None,
    expected_shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """Decode raw (already decompressed) IDX bytes into an array in native byte order.

    ``expected_shape`` may contain ``None`` for dimensions that are not checked, e.g.
    ``(None, 28, 28)`` for MNIST images or ``(10000,)`` to check the sample count.
    """
    if len(data) < 4:
        raise IDXFormatError(
            f"{name}: file is {len(data)} bytes, too short for the 4-byte IDX magic"
        )
    magic = int.from_bytes(data[:4], "big")
    zero, code, ndim = int.from_bytes(data[:2], "big"), data[2], data[3]
    if expected_magic is not None and magic != expected_magic:
        raise IDXFormatError(
            f"{name}: wrong IDX magic number: expected {expected_magic} (0x{expected_magic:08x}), "
            f"got {magic} (0x{magic:08x})"
        )
    if zero != 0 or code not in IDX_DTYPES:
        raise IDXFormatError(
            f"{name}: not an IDX file: magic 0x{magic:08x} must start with two zero bytes and a "
            f"dtype code in {[hex(c) for c in IDX_DTYPES]}"
        )
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise IDXFormatError(
            f"{name}: truncated header: {ndim} dimensions need {header_size} bytes, "
            f"file has {len(data)}"
        )
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    if expected_shape is not None:
        ok = len(shape) == len(expected_shape) and all(
            e is None or e == s for e, s in zip(expected_shape, shape, strict=False)
        )
        if not ok:
            want = tuple("*" if e is None else e for e in expected_shape)
            raise IDXFormatError(f"{name}: wrong shape: expected {want}, header says {shape}")
    dtype = IDX_DTYPES[code]
    payload = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(data) - header_size
    if actual < payload:
        raise IDXFormatError(
            f"{name}: truncated payload: shape {shape} of {dtype.name} needs {payload} bytes, "
            f"file has {actual} (is the file complete?)"
        )
    if actual > payload:
        raise IDXFormatError(
            f"{name}: {actual - payload} unexpected trailing bytes after the payload of "
            f"shape {shape}"
        )
    array = np.frombuffer(data, dtype=dtype, count=payload // dtype.itemsize, offset=header_size)
    return array.reshape(shape).astype(dtype.newbyteorder("="), copy=True)


def read_idx(
    path: str | os.PathLike,
    expected_magic: int | None = None,
    expected_shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """Read an IDX file from disk; ``.gz`` files are decompressed (detected by their content)."""
    name = os.fspath(path)
    with open(name, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":  # gzip magic
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise IDXFormatError(f"{name}: corrupt or truncated gzip data ({exc})") from exc
    return parse_idx(raw, name, expected_magic, expected_shape)


def encode_idx(array: np.ndarray) -> bytes:
    """Serialise an array to IDX bytes (used by tests and to write small fixtures)."""
    array = np.asarray(array)
    codes = [c for c, d in IDX_DTYPES.items() if array.dtype.newbyteorder(">") == d]
    if not codes:
        raise TypeError(f"encode_idx: dtype {array.dtype} has no IDX code")
    code, dtype = codes[0], IDX_DTYPES[codes[0]]
    header = bytes([0, 0, code, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape
    )
    return header + np.ascontiguousarray(array, dtype=dtype).tobytes()
