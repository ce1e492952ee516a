"""A safe encoding of Python objects for ``broadcast_object_list`` and ``all_gather_object``.

PyTorch sends objects with pickle, so a peer (or anyone who can reach the job's sockets) can run
code in every rank. minigrad never unpickles: objects are encoded as a JSON tree plus raw bytes for
``bytes`` values and NumPy arrays, and only these types are accepted, each coming back as exactly
the same type (and dtype):

``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict`` with
``str`` keys, NumPy arrays and NumPy scalars of numeric, bool, string and datetime dtypes.

Anything else (sets, class instances, object arrays, subclasses of the types above) is refused with
a TypeError naming it. Decoding checks the structure strictly and raises ValueError on anything
malformed.

Example::

    data = encode({"step": 3, "w": np.ones(2, np.float32)})
    decode(data)   # {'step': 3, 'w': array([1., 1.], dtype=float32)}
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

MAGIC = b"MGOBJ1"
_LEN = struct.Struct("!Q")
_DTYPE_KINDS = "biufcmMSU"  # bool, ints, floats, complex, datetimes, byte and unicode strings
ALLOWED = ("None, bool, int, float, str, bytes, list, tuple, dict with str keys, NumPy arrays and "
           "NumPy scalars")


def _refuse(obj, path: str):
    raise TypeError(
        f"cannot send {type(obj).__module__}.{type(obj).__qualname__} at {path}: object "
        f"collectives accept only {ALLOWED} (minigrad never pickles)"
    )


def _dtype_str(dtype: np.dtype, obj, path: str) -> str:
    if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        _refuse(obj, path)
    return dtype.str


def encode(obj) -> bytes:
    """``obj`` as bytes (raises TypeError for types outside the accepted list)."""
    blobs: list[bytes] = []

    def blob(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    def walk(o, path: str):
        t = type(o)
        if o is None or t is bool or t is str:
            return o
        if t is int:
            return {"int": str(o)}  # JSON numbers would blur int, float and huge ints
        if t is float:
            return {"float": o.hex() if math.isfinite(o) else repr(o)}
        if t is bytes:
            return {"bytes": blob(o)}
        if t is list:
            return {"list": [walk(v, f"{path}[{i}]") for i, v in enumerate(o)]}
        if t is tuple:
            return {"tuple": [walk(v, f"{path}[{i}]") for i, v in enumerate(o)]}
        if t is dict:
            items = []
            for k, v in o.items():
                if type(k) is not str:
                    raise TypeError(f"cannot send a dict key of type {type(k).__name__} at {path} "
                                    f"(object collectives accept str keys only)")
                items.append([k, walk(v, f"{path}[{k!r}]")])
            return {"dict": items}
        if t is np.ndarray:
            return {"ndarray": [blob(o.tobytes()), _dtype_str(o.dtype, o, path), list(o.shape)]}
        if isinstance(o, np.generic) and t is o.dtype.type:
            return {"npscalar": [blob(o.tobytes()), _dtype_str(o.dtype, o, path)]}
        _refuse(o, path)

    tree = json.dumps(walk(obj, "the top level"), separators=(",", ":")).encode()
    parts = [MAGIC, _LEN.pack(len(tree)), tree, _LEN.pack(len(blobs))]
    for b in blobs:
        parts += [_LEN.pack(len(b)), b]
    return b"".join(parts)


def decode(data: bytes):
    """The object :func:`encode` made (raises ValueError for anything else)."""
    data = bytes(data)
    if not data.startswith(MAGIC):
        raise ValueError("not a minigrad object encoding (object collectives never unpickle)")
    pos = len(MAGIC)

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError("truncated object encoding")
        pos += n
        return data[pos - n : pos]

    tree = json.loads(take(_LEN.unpack(take(_LEN.size))[0]))
    blobs = [take(_LEN.unpack(take(_LEN.size))[0]) for _ in range(_LEN.unpack(take(_LEN.size))[0])]
    if pos != len(data):
        raise ValueError("trailing bytes after the object encoding")

    def blob(i) -> bytes:
        if type(i) is not int or not 0 <= i < len(blobs):
            raise ValueError(f"bad blob reference {i!r}")
        return blobs[i]

    def dtype(s) -> np.dtype:
        dt = np.dtype(str(s))
        if dt.kind not in _DTYPE_KINDS:
            raise ValueError(f"dtype {s!r} is not allowed")
        return dt

    def build(node):
        if node is None or type(node) in (bool, str):
            return node
        if type(node) is not dict or len(node) != 1:
            raise ValueError(f"malformed object encoding node {node!r:.80}")
        (tag, v), = node.items()
        if tag == "int":
            return int(v)
        if tag == "float":
            return float.fromhex(v) if "0x" in v else float(v)
        if tag == "bytes":
            return blob(v)
        if tag in ("list", "tuple"):
            items = [build(x) for x in v]
            return items if tag == "list" else tuple(items)
        if tag == "dict":
            if any(type(k) is not str for k, _ in v):
                raise ValueError("object encoding: dict keys must be strings")
            return {k: build(x) for k, x in v}
        if tag == "ndarray":
            i, dt, shape = v
            return np.frombuffer(blob(i), dtype(dt)).reshape(shape).copy()
        if tag == "npscalar":
            i, dt = v
            return np.frombuffer(blob(i), dtype(dt))[0]
        raise ValueError(f"unknown object encoding tag {tag!r}")

    return build(tree)
