"""Checkpoints: ``mg.save(obj, path)`` and ``mg.load(path, map_location=None)``.

Format: one safetensors file. Every array (Tensor data, NumPy array) is a safetensors entry; the
Python structure around them (dicts, lists, tuples, scalars, strings, None) is JSON in the header
metadata, with a CRC32 per array. Loading parses JSON and raw little-endian buffers only, so a
checkpoint can never run code: unlike pickle-based formats, a malicious file is just a bad file.
Safetensors was chosen because it is the ecosystem's standard safe tensor container, has a NumPy
API and a strict, length-checked header (a truncated file is detected before any data is read).

Arbitrary Python objects are refused unless the caller opts in on both sides: ``save(...,
pickle=True)`` stores them pickled, and ``load(..., allow_pickle=True)`` accepts such files (and
legacy pickle checkpoints). Checkpoints written by MegEngine (pickles of NumPy arrays, containers
and tensors) load without that opt-in through a restricted unpickler that cannot run code.

Writes are atomic: a temporary file in the target directory is written, fsynced and renamed over
the old file, so a crash mid-save leaves the previous checkpoint intact.

Global tensors (OneFlow's logical checkpoints): ``save(..., global_dst_rank=r)`` stores each global
tensor's *logical* value, gathered to rank ``r``, which alone writes the file; ``load(...,
global_src_rank=r)`` reads the file once on rank ``r`` and hands the objects to every rank, where
``to_global`` can lay them out at any world size and SBP. The distributed side comes in through
the seam :data:`minigrad.seams.GLOBAL_IO` (this layer never imports ``minigrad.distributed``).

Example::

    mg.save({"net": net.state_dict(), "opt": opt.state_dict(), "epoch": 3}, "ckpt.mgc")
    ckpt = mg.load("ckpt.mgc", map_location="cpu0")
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle as _pickle
import tempfile
import zlib
from collections import OrderedDict
from typing import Any, Callable

import numpy as np
from safetensors.numpy import load as _st_load
from safetensors.numpy import save as _st_save

from minigrad import seams
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.device import as_device
from minigrad.backend.dtypes import bfloat16, is_bfloat16
from minigrad.backend.xp import to_numpy
from minigrad.megengine_checkpoint import (
    MegEngineCheckpointError,
    RefusedPickleError,
    load_megengine,
)

FORMAT = "minigrad.checkpoint"
VERSION = 1
_PICKLE_MAGIC = (b"\x80", b"PK")  # pickle protocol >= 2, zip (legacy torch-style) files


_ARRAY_KINDS = "biufc"  # what the container stores natively (bool, ints, floats, complex)
#: A safetensors file starts with its JSON header's length as a little-endian u64.
HEADER_LENGTH_BYTES = 8
#: Pickle protocol for opted-in objects: 4 reads on every supported Python (>= 3.4) and handles
#: large objects (protocol 5 would need Python 3.8 on the reading side).
PICKLE_PROTOCOL = 4


def _native(arr: np.ndarray) -> np.ndarray:
    """Native byte order (the container is little-endian only)."""
    return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))


def checksum(arr: np.ndarray) -> int:
    """The CRC32 of an array's bytes (C order): what checkpoints store to detect corruption."""
    if not arr.size:
        return 0
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    return zlib.crc32(memoryview(arr.reshape(-1)).cast("B"))


class CheckpointError(ValueError):
    """A file that is not a readable minigrad checkpoint (truncated, corrupt or foreign)."""


class UnsafeCheckpointError(CheckpointError):
    """The checkpoint would need unpickling (code execution) and the caller did not allow it."""


# -- encoding --------------------------------------------------------------------------------------
class _SingleProcessIO:
    """What save/load do about ranks until the distributed layer installs its own: one process,
    rank 0, and no global tensors."""

    def rank(self) -> int:
        return 0

    def gather(self, tensor, dst: int):
        raise TypeError("mg.save: a global tensor needs minigrad.distributed (not imported)")

    def share(self, payload, src: int) -> bytes:
        return payload


_SINGLE_PROCESS = _SingleProcessIO()


def _global_io():
    """The rank-aware side of save/load: what ``minigrad.distributed.global_tensor`` installed in
    :data:`minigrad.seams.GLOBAL_IO`, or one process when the distributed layer is not loaded.
    ``io.rank()`` is this process's rank; ``io.gather(tensor, dst)`` a global tensor's logical
    value as a NumPy array on rank ``dst`` (None on the others, every rank calls it);
    ``io.share(payload, src)`` rank ``src``'s bytes on every rank."""
    return seams.GLOBAL_IO.value or _SINGLE_PROCESS


def _tensor_node(t: Tensor, key: str) -> dict:
    """The JSON node of a tensor whose array is stored under ``key``."""
    node = {"tensor": key, "device": str(t.device)}
    if isinstance(t, Parameter):
        node["parameter"] = True
    if is_bfloat16(t.dtype):
        node["dtype"] = "bfloat16"
    return node


def _bits(arr: np.ndarray) -> np.ndarray:
    """What the container stores for ``arr``: a bfloat16 array as its 16-bit patterns (uint16;
    the NumPy side of safetensors has no BF16), everything else as it is. The structure node
    records ``"dtype": "bfloat16"`` so that loading views the bits back."""
    return arr.view(np.uint16) if is_bfloat16(arr.dtype) else arr


def _from_bits(arr: np.ndarray, node: dict) -> np.ndarray:
    return arr.view(bfloat16()) if node.get("dtype") == "bfloat16" else arr


class _Encoder:
    """Turn a Python object into a JSON-able tree plus a dict of named NumPy arrays. Global
    tensors are gathered to ``global_dst_rank`` (their logical values)."""

    def __init__(self, allow_pickle: bool, global_dst_rank: int | None = None):
        self.allow_pickle = allow_pickle
        self.global_dst_rank = global_dst_rank
        self.arrays: dict[str, np.ndarray] = {}
        # id(Tensor or ndarray) -> key: shared objects stored once (None: a global tensor that
        # another rank writes)
        self.memo: dict[int, str | None] = {}
        self.keep: list = []  # keeps memoised objects alive so ids stay unique while encoding

    def _array(self, obj, arr: np.ndarray) -> str:
        key = self.memo.get(id(obj))
        if key is None:
            key = f"a{len(self.arrays)}"
            self.arrays[key] = arr if arr.flags.c_contiguous else arr.copy(order="C")
            self.memo[id(obj)] = key
            self.keep.append(obj)
        return key

    def encode(self, obj, path: str) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int) and not isinstance(obj, bool):
            return {"int": str(obj)} if abs(obj) > 2**53 else obj
        if isinstance(obj, float):
            return {"float": repr(obj)}  # repr round-trips exactly, including nan and inf
        if isinstance(obj, Tensor) and obj.is_global:
            return self._global(obj, path)
        if isinstance(obj, Tensor):
            return _tensor_node(obj, self._array(obj, _bits(to_numpy(obj.data))))
        if isinstance(obj, np.ndarray):
            if is_bfloat16(obj.dtype):
                return {"ndarray": self._array(obj, _bits(obj)), "dtype": "bfloat16"}
            if obj.dtype.kind not in _ARRAY_KINDS:
                return self._fallback(obj, path)
            return {"ndarray": self._array(obj, _native(obj))}
        if isinstance(obj, np.generic):
            if obj.dtype.kind not in _ARRAY_KINDS:
                return self._fallback(obj, path)
            return {"npscalar": self._array(obj, _native(np.asarray(obj)))}
        if isinstance(obj, bytes):
            return {"bytes": base64.b64encode(obj).decode("ascii")}
        if isinstance(obj, (list, tuple)):
            items = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            if type(obj) is list:
                return items
            if type(obj) is tuple:
                return {"tuple": items}
            return self._fallback(obj, path)  # namedtuples and other subclasses
        if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
            if all(isinstance(k, str) for k in obj):
                items = {k: self.encode(v, f"{path}[{k!r}]") for k, v in obj.items()}
                return {"dict": items} if type(obj) is dict else {"odict": items}
            pairs = [[self.encode(k, f"{path}.key"), self.encode(v, f"{path}[{k!r}]")]
                     for k, v in obj.items()]
            return {"pairs": pairs, "ordered": type(obj) is OrderedDict}
        return self._fallback(obj, path)

    def _global(self, obj, path: str) -> Any:
        """A global tensor's logical value (gathered to the writing rank; others store None)."""
        if self.global_dst_rank is None:
            raise RuntimeError(
                f"mg.save: {path or 'the object'} is a global tensor (placement {obj.placement}, "
                f"sbp {obj.sbp}): Please set global_dst_rank in `mg.save` to save global tensor"
            )
        if id(obj) not in self.memo:  # gather once per tensor, on every rank alike
            arr = _global_io().gather(obj, self.global_dst_rank)
            if arr is None:  # not the writing rank: nothing of this file is kept here
                self.memo[id(obj)] = None
                self.keep.append(obj)
            else:
                self._array(obj, np.ascontiguousarray(arr))
        key = self.memo[id(obj)]
        return None if key is None else _tensor_node(obj, key)

    def _fallback(self, obj, path: str) -> Any:
        if not self.allow_pickle:
            raise TypeError(
                f"mg.save: cannot store {type(obj).__module__}.{type(obj).__qualname__} at "
                f"{path or 'the top level'} safely (only Tensors, NumPy arrays, dicts, lists, "
                "tuples, numbers, strings, bytes and None are supported); pass pickle=True to "
                "store it with pickle (loading it will then need allow_pickle=True)"
            )
        data = np.frombuffer(_pickle.dumps(obj, protocol=PICKLE_PROTOCOL), dtype=np.uint8)
        return {"pickle": self._array(data, data)}


def save(obj: Any, f, pickle: bool = False, global_dst_rank: int | None = None) -> None:
    """Save ``obj`` (nested dicts/lists/tuples of Tensors, arrays, scalars, strings, None) to the
    path ``f`` atomically, or into a writable binary file object.

    ``pickle=True`` additionally allows arbitrary Python objects (stored pickled; reading them
    back requires ``mg.load(..., allow_pickle=True)``).

    ``global_dst_rank=r`` (OneFlow): every rank calls ``save``; global tensors are gathered to rank
    ``r`` as their logical values and only rank ``r`` writes the file. Saving a global tensor
    without it is an error.

    Example::

        mg.save(model.state_dict(), "ckpt.mgc", global_dst_rank=0)
    """
    enc = _Encoder(allow_pickle=pickle, global_dst_rank=global_dst_rank)
    tree = enc.encode(obj, "")
    if global_dst_rank is not None and _global_io().rank() != global_dst_rank:
        return
    checksums = {k: checksum(a) for k, a in enc.arrays.items()}
    meta = {
        "format": FORMAT,
        "version": str(VERSION),
        "structure": json.dumps(tree, allow_nan=False),
        "crc32": json.dumps(checksums),
    }
    payload = _st_save(enc.arrays, metadata=meta)
    if hasattr(f, "write"):
        f.write(payload)
        return
    atomic_write(os.fspath(f), payload)


def atomic_write(path: str, payload) -> None:
    """Write ``payload`` (bytes, or a list of buffers written one after another without joining
    them) to ``path`` so that readers see the old file or the new one, never a part: a temporary
    file in the same directory, fsynced, renamed over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in (payload if isinstance(payload, list) else [payload]):
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


# -- decoding --------------------------------------------------------------------------------------
def _device_mapper(map_location) -> Callable[[str], str]:
    if map_location is None:
        return lambda name: name
    if callable(map_location):
        return lambda name: str(map_location(name))
    if isinstance(map_location, dict):
        rules = sorted(((str(k), str(v)) for k, v in map_location.items()),
                       key=lambda kv: -len(kv[0]))

        def mapped(name: str) -> str:
            for prefix, target in rules:
                if name.startswith(prefix):
                    return target + name[len(prefix):] if prefix != name else target
            return name

        return mapped
    target = str(map_location)
    return lambda name: target


class _Decoder:
    def __init__(self, arrays, where: str, map_device, allow_pickle: bool):
        self.arrays = arrays
        self.where = where
        self.map_device = map_device
        self.allow_pickle = allow_pickle
        self.memo: dict[tuple, Any] = {}

    def _get(self, key: str) -> np.ndarray:
        if key not in self.arrays:
            raise CheckpointError(f"mg.load: {self.where} is corrupt: array {key!r} is missing")
        return self.arrays[key]

    def decode(self, node) -> Any:
        if node is None or isinstance(node, (bool, str, int)):
            return node
        if isinstance(node, list):
            return [self.decode(v) for v in node]
        if not isinstance(node, dict) or len(node) == 0:
            raise CheckpointError(f"mg.load: {self.where} is corrupt: bad structure node {node!r}")
        if "tensor" in node:
            return self._tensor(node)
        if "ndarray" in node:
            return self._shared(("nd", node["ndarray"]),
                                lambda: _from_bits(self._get(node["ndarray"]), node).copy())
        if "npscalar" in node:
            return self._get(node["npscalar"])[()]
        if "float" in node:
            return float(node["float"])
        if "int" in node:
            return int(node["int"])
        if "bytes" in node:
            return base64.b64decode(node["bytes"])
        if "tuple" in node:
            return tuple(self.decode(v) for v in node["tuple"])
        if "dict" in node:
            return {k: self.decode(v) for k, v in node["dict"].items()}
        if "odict" in node:
            return OrderedDict((k, self.decode(v)) for k, v in node["odict"].items())
        if "pairs" in node:
            items = [(self.decode(k), self.decode(v)) for k, v in node["pairs"]]
            return OrderedDict(items) if node.get("ordered") else dict(items)
        if "pickle" in node:
            if not self.allow_pickle:
                raise UnsafeCheckpointError(
                    f"mg.load: {self.where} contains pickled Python objects, which can run "
                    "arbitrary code when loaded; pass allow_pickle=True only if you trust the file"
                )
            return _pickle.loads(self._get(node["pickle"]).tobytes())
        raise CheckpointError(f"mg.load: {self.where} is corrupt: unknown node {sorted(node)}")

    def _shared(self, key, make):
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def _tensor(self, node) -> Tensor:
        device = _target_device(self.where, self.map_device, node.get("device", "cpu0"))
        cls = Parameter if node.get("parameter") else Tensor

        def make():
            return cls(_from_bits(self._get(node["tensor"]), node), device=device)

        return self._shared(("t", node["tensor"], str(device), cls.__name__), make)


def _target_device(where: str, map_device, saved: str):
    """The device a tensor saved on ``saved`` loads to, with a clear error when it is unusable."""
    target = map_device(saved)
    try:
        return as_device(target)
    except (ValueError, RuntimeError) as exc:
        raise RuntimeError(
            f"mg.load: {where} has a tensor saved on {saved}, which maps to {target!r} "
            f"here, but that device is not usable ({exc}); pass map_location, e.g. "
            f'map_location="cpu0"'
        ) from None


def _load_megengine(payload: bytes, where: str, map_location) -> Any:
    """A pickle read by the restricted MegEngine reader (which never runs code from the file)."""
    map_device = _device_mapper(map_location)

    def make_tensor(array, saved: str, parameter: bool) -> Tensor:
        return (Parameter if parameter else Tensor)(
            array, device=_target_device(where, map_device, saved))

    try:
        return load_megengine(payload, make_tensor)
    except RefusedPickleError as exc:
        raise UnsafeCheckpointError(
            f"mg.load: {where} is a pickle file that is not a plain MegEngine checkpoint: {exc}. "
            "Pass allow_pickle=True only if you trust the file (unpickling can run arbitrary code)"
        ) from None
    except MegEngineCheckpointError as exc:
        raise CheckpointError(f"mg.load: {where}: {exc}") from None


def load(f, map_location=None, allow_pickle: bool = False, format: str | None = None,  # noqa: A002
         global_src_rank: int | None = None, weights_only: bool | None = None) -> Any:
    """Load what ``save`` wrote, or a MegEngine checkpoint, from a path or a binary file object.

    ``map_location`` moves tensors: a device name (``"cpu0"``), a dict mapping saved device
    prefixes to new ones (``{"gpu0": "cpu0"}``, ``{"gpu": "cpu"}``) or a callable
    ``saved_name -> new_name``. By default tensors return to the device they were saved from.
    NumPy arrays and Python values are returned as they were saved.

    ``format="megengine"`` reads a file written by ``megengine.save`` (``.mge``) with a restricted
    unpickler that rebuilds only NumPy arrays, plain containers and MegEngine tensors and refuses
    everything else without running it (:mod:`minigrad.megengine_checkpoint`). With the default
    ``format=None`` a pickle file (a MegEngine checkpoint or a legacy one) is read the same safe
    way; ``allow_pickle=True`` unpickles it without restriction instead, for trusted files only.
    ``format="minigrad"`` accepts only minigrad's own container.

    ``global_src_rank=r`` (OneFlow): every rank calls ``load``; only rank ``r`` reads the file and
    the others receive its bytes, so each gets the same (local) objects, e.g. the logical tensors
    written by ``save(..., global_dst_rank=...)``, ready for ``to_global`` at any world size.

    ``weights_only`` (PyTorch's ``torch.load`` argument): True or None is what ``load`` always
    does (nothing but data is rebuilt); False is refused, use ``allow_pickle=True`` for a trusted
    file.
    """
    if weights_only is False:
        raise ValueError(
            "mg.load: weights_only=False is not supported (minigrad never runs code from a file "
            "by default); pass allow_pickle=True to unpickle a trusted file without restriction"
        )
    if format not in (None, "minigrad", "megengine"):
        raise ValueError(f"mg.load: format must be None, 'minigrad' or 'megengine', got {format!r}")
    is_file = hasattr(f, "read")
    where = repr(getattr(f, "name", "<file object>") if is_file else os.fspath(f))
    if global_src_rank is None or _global_io().rank() == global_src_rank:
        payload = f.read() if is_file else _read_file(f, where)
    else:
        payload = None  # the reading rank sends it
    if global_src_rank is not None:
        payload = _global_io().share(payload, global_src_rank)
    return _load_payload(payload, where, map_location, allow_pickle, format)


def _read_file(path, where: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"mg.load: no checkpoint at {where}") from None


def _load_payload(payload: bytes, where: str, map_location, allow_pickle: bool, format) -> Any:  # noqa: A002
    """Decode a checkpoint's bytes (see ``load``)."""
    if format == "megengine":
        return _load_megengine(payload, where, map_location)
    try:
        arrays = _st_load(payload)
        meta = _read_metadata(payload)
    except Exception as exc:  # the container could not be parsed at all
        if payload[:2].startswith(_PICKLE_MAGIC[0]) or payload[:2] == _PICKLE_MAGIC[1]:
            if allow_pickle:
                return _pickle.load(io.BytesIO(payload))
            if format is None and payload.startswith(_PICKLE_MAGIC[0]):
                return _load_megengine(payload, where, map_location)
            raise UnsafeCheckpointError(
                f"mg.load: {where} looks like a pickle file; unpickling can run arbitrary code, "
                "so it is refused. Pass allow_pickle=True only if you trust the file"
            ) from None
        raise CheckpointError(
            f"mg.load: {where} is not a valid minigrad checkpoint (truncated or corrupt "
            f"file): {type(exc).__name__}: {exc}"
        ) from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(
            f"mg.load: {where} is a safetensors file but not a minigrad checkpoint (no "
            f"{FORMAT!r} metadata)"
        )
    if int(meta.get("version", "0")) > VERSION:
        raise CheckpointError(
            f"mg.load: {where} has format version {meta['version']}, newer than this minigrad "
            f"reads ({VERSION}); upgrade minigrad"
        )
    try:
        tree = json.loads(meta["structure"])
        checksums = json.loads(meta["crc32"])
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"mg.load: {where} is corrupt: bad metadata ({exc})") from None
    for key, arr in arrays.items():
        crc = checksum(arr)
        if checksums.get(key) != crc:
            raise CheckpointError(
                f"mg.load: {where} is corrupt: checksum mismatch for array {key!r} "
                f"(shape {arr.shape}, {arr.dtype})"
            )
    return _Decoder(arrays, where, _device_mapper(map_location), allow_pickle).decode(tree)


def _read_metadata(payload: bytes) -> dict:
    """The ``__metadata__`` of a safetensors header (the NumPy API returns only the arrays)."""
    head = HEADER_LENGTH_BYTES
    if len(payload) < head:
        raise ValueError(f"file shorter than the {head}-byte header length")
    n = int.from_bytes(payload[:head], "little")
    if n > len(payload) - head:
        raise ValueError(f"header length {n} exceeds the file size {len(payload)}")
    header = json.loads(payload[head:head + n])
    return header.get("__metadata__") or {}
