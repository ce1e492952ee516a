"""The files of a checkpoint directory, and reading them back safely.

A checkpoint is a directory::

    step-1000/
        rank00000.safetensors   # the pieces rank 0 owns (safetensors: raw arrays, no code)
        rank00001.safetensors
        index.json              # written last, by rank 0: the commit
    latest                      # in the parent: the name of the newest committed checkpoint

``index.json`` names every logical tensor's shape and dtype, and for each piece its file, its
name in that file, its box (offsets and sizes) and its CRC32; plus the plain values, the world
size and the layout it was saved from. It appears by an atomic rename once every rank's file is
written, so a directory without it is an unfinished save and is never loaded; ``latest`` is
updated (atomically too) only after that.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors import safe_open

from minigrad.backend.dtypes import bfloat16
from minigrad.serialization import CheckpointError, atomic_write, checksum

__all__ = [
    "FORMAT",
    "INDEX",
    "LATEST",
    "PieceReader",
    "np_dtype",
    "read_index",
    "rank_file",
    "write_index",
    "write_latest",
    "write_pieces",
]

FORMAT = "minigrad.distributed.checkpoint"
VERSION = 1
INDEX = "index.json"
LATEST = "latest"


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of an index dtype name (``bfloat16`` through ml_dtypes)."""
    return np.dtype(bfloat16()) if name == "bfloat16" else np.dtype(name)


def rank_file(rank: int) -> str:
    """The name of the file rank ``rank`` writes its pieces to."""
    return f"rank{rank:05d}.safetensors"


def piece_name(key: str, offsets) -> str:
    """The name of a piece inside its safetensors file."""
    return key + "@" + ",".join(str(o) for o in offsets)


def _stored(arr: np.ndarray, dtype: str) -> np.ndarray:
    """What the file holds: bfloat16 as its 16-bit patterns (safetensors' NumPy side has no
    BF16), everything else as it is, C-contiguous."""
    arr = np.ascontiguousarray(arr)
    return arr.view(np.uint16) if dtype == "bfloat16" else arr


def write_pieces(directory: str, rank: int, pieces: list) -> dict | None:
    """Write ``pieces`` — ``(key, Box, array, dtype name)`` — to this rank's file; returns the
    file's record for the index (None when this rank owns no piece)."""
    if not pieces:
        return None
    arrays, records = {}, []
    for key, box, arr, dtype in pieces:
        name = piece_name(key, box.offsets)
        stored = _stored(arr, dtype)
        arrays[name] = stored
        records.append({"key": key, "name": name, "offsets": list(box.offsets),
                        "sizes": list(box.sizes), "crc32": checksum(stored)})
    file = rank_file(rank)
    parts = safetensors_parts(arrays, {"format": FORMAT})
    atomic_write(os.path.join(directory, file), parts)
    return {"file": file, "bytes": sum(memoryview(p).nbytes for p in parts), "pieces": records}


#: safetensors' names of the dtypes a checkpoint stores (bfloat16 is stored as uint16 bits)
_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64",
              "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32",
              "uint16": "U16", "uint8": "U8", "bool": "BOOL"}


def safetensors_parts(arrays: dict, metadata: dict) -> list:
    """A safetensors file as a list of buffers — the length-prefixed JSON header, then each
    array's bytes in place — so that large arrays are written without first being joined into
    one payload (the layout of the safetensors specification; ``safe_open`` reads it)."""
    header, offset, data = {"__metadata__": metadata}, 0, []
    for name, arr in arrays.items():
        dtype = _ST_DTYPES.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"dist.checkpoint.save: {name!r} has dtype {arr.dtype.name}, which "
                            "safetensors cannot store")
        arr = np.ascontiguousarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        data.append(memoryview(arr.reshape(-1)).cast("B") if arr.size else b"")
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    return [len(text).to_bytes(8, "little"), text, *data]


def write_index(directory: str, index: dict) -> None:
    """Commit the checkpoint: the index appears atomically."""
    atomic_write(os.path.join(directory, INDEX),
                 json.dumps(index, indent=1, sort_keys=True).encode())


def write_latest(directory: str) -> None:
    """Name ``directory`` in its parent's ``latest`` file (DeepSpeed's convention)."""
    parent, name = os.path.split(os.path.abspath(directory))
    atomic_write(os.path.join(parent, LATEST), (name + "\n").encode())


def read_index(directory: str) -> dict:
    """The index of the checkpoint in ``directory`` (CheckpointError when there is none, or it
    is unreadable, or from a newer format)."""
    path = os.path.join(directory, INDEX)
    try:
        with open(path, "rb") as f:
            index = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(
            f"dist.checkpoint.load: {directory!r} has no {INDEX}: not a checkpoint, or its save "
            "did not finish") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"dist.checkpoint.load: {path!r} is unreadable: {exc}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(f"dist.checkpoint.load: {path!r} is not a {FORMAT} index")
    if int(index.get("version", 0)) > VERSION:
        raise CheckpointError(
            f"dist.checkpoint.load: {path!r} has format version {index['version']}, newer than "
            f"this minigrad reads ({VERSION})")
    return index


class PieceReader:
    """Reads pieces of a checkpoint, each once, checking its shape, dtype and CRC32; every
    failure names the file and the tensor."""

    def __init__(self, directory: str):
        self.directory = directory
        self._files: dict[str, object] = {}
        self._cache: dict[tuple[str, str], np.ndarray] = {}

    def _open(self, file: str, key: str):
        handle = self._files.get(file)
        if handle is None:
            path = os.path.join(self.directory, file)
            if not os.path.exists(path):
                raise CheckpointError(
                    f"dist.checkpoint.load: file {path!r} is missing (it holds tensor {key!r})")
            try:
                handle = safe_open(path, framework="numpy")
            except Exception as exc:  # the header could not be parsed
                raise CheckpointError(
                    f"dist.checkpoint.load: file {path!r} is corrupt (tensor {key!r}): "
                    f"{type(exc).__name__}: {exc}") from None
            self._files[file] = handle
        return handle

    def read(self, key: str, dtype: str, piece: dict) -> np.ndarray:
        """The array of ``piece`` (an index record) of tensor ``key``."""
        file, name = piece["file"], piece["name"]
        cached = self._cache.get((file, name))
        if cached is not None:
            return cached
        path = os.path.join(self.directory, file)
        handle = self._open(file, key)
        try:
            arr = handle.get_tensor(name)
        except Exception as exc:
            raise CheckpointError(
                f"dist.checkpoint.load: file {path!r} is corrupt: piece {name!r} of tensor "
                f"{key!r} unreadable ({type(exc).__name__}: {exc})") from None
        if tuple(arr.shape) != tuple(piece["sizes"]):
            raise CheckpointError(
                f"dist.checkpoint.load: file {path!r}: piece {name!r} of tensor {key!r} has "
                f"shape {tuple(arr.shape)}, the index says {tuple(piece['sizes'])}")
        crc = checksum(arr)
        if crc != piece["crc32"]:
            raise CheckpointError(
                f"dist.checkpoint.load: file {path!r} is corrupt: checksum mismatch in piece "
                f"{name!r} of tensor {key!r} (crc32 {crc}, the index says {piece['crc32']})")
        if dtype == "bfloat16":
            arr = arr.view(bfloat16())
        elif arr.dtype != np.dtype(dtype):
            raise CheckpointError(
                f"dist.checkpoint.load: file {path!r}: piece {name!r} of tensor {key!r} is "
                f"{arr.dtype.name}, the index says {dtype}")
        self._cache[(file, name)] = arr
        return arr
