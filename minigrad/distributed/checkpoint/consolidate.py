"""One full-weights file from a sharded checkpoint (DeepSpeed's ``zero_to_fp32``):
``python -m minigrad.distributed.checkpoint consolidate DIR OUT.safetensors``.

Every logical tensor is reassembled from its pieces (each checked against its CRC32) and written
whole, under its checkpoint name (``--prefix model`` keeps only the tensors of ``state["model"]``
and drops the prefix, giving the single-device names: ``0.weight``), into one safetensors file
that any framework reads.
"""

from __future__ import annotations

import numpy as np
from safetensors.numpy import save_file

from minigrad.distributed.checkpoint.loading import validate_index
from minigrad.distributed.checkpoint.pieces import Box, fill, full_index
from minigrad.distributed.checkpoint.state import RNG_KEY
from minigrad.distributed.checkpoint.storage import PieceReader, np_dtype, read_index

__all__ = ["consolidate", "full_tensors"]


def full_tensors(directory: str, prefix: str | None = None) -> dict[str, np.ndarray]:
    """Every logical tensor of the checkpoint in ``directory``, whole (in one process), keyed by
    checkpoint name, or, with ``prefix``, only those under ``prefix/`` with it removed."""
    index = read_index(directory)
    validate_index(index, directory)
    reader = PieceReader(directory)
    out = {}
    for key, meta in index["tensors"].items():
        if key.startswith(RNG_KEY + "/"):
            continue
        name = key
        if prefix is not None:
            if not key.startswith(prefix.rstrip("/") + "/"):
                continue
            name = key[len(prefix.rstrip("/")) + 1:]
        shape = tuple(meta["shape"])
        arr = np.empty(shape, np_dtype(meta["dtype"]))
        done = np.zeros(shape, bool)
        for piece in meta["pieces"]:
            box = Box(tuple(piece["offsets"]), tuple(piece["sizes"]))
            fill(arr, done, full_index(shape), box, reader.read(key, meta["dtype"], piece))
        out[name] = arr
    return out


def consolidate(directory: str, out_path: str, prefix: str | None = None) -> list[str]:
    """Write :func:`full_tensors` of ``directory`` to the safetensors file ``out_path``; returns
    the names written (bfloat16 tensors are stored as their uint16 bit patterns)."""
    tensors = full_tensors(directory, prefix)
    stored = {k: (v.view(np.uint16) if v.dtype.name == "bfloat16" else np.ascontiguousarray(v))
              for k, v in tensors.items()}
    save_file(stored, out_path, metadata={"source": str(directory)})
    return sorted(stored)
