"""Plain Python values in a checkpoint's JSON index, exactly as they were, and never pickled.

The non-tensor state of a run (step counts, hyper-parameters, a scheduler's counters, a random
generator's state) is small; it goes into the index as JSON. Standard JSON loses the difference
between a list and a tuple, refuses non-string dict keys and has no NumPy scalars, so this
module tags those: ``{"__tuple__": [...]}``, ``{"__pairs__": [[k, v], ...]}``, ``{"__np__":
"float32", "value": ...}``. Arrays found inside a value are handed to ``on_array`` (which stores
them as tensors of the checkpoint) and replaced by ``{"__tensor__": key}``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from minigrad.autodiff.tensor import Tensor

__all__ = ["from_json", "to_json"]

_TAGS = ("__tuple__", "__pairs__", "__np__", "__tensor__", "__float__", "__dict__")


def to_json(obj, path: str, on_array: Callable[[str, Any], None]) -> Any:
    """``obj`` as a JSON-able tree; arrays and tensors go to ``on_array(key, value)``, keyed by
    their ``path`` inside ``obj``."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return {"__np__": obj.dtype.name, "value": to_json(obj.item(), path, on_array)}
    if isinstance(obj, (np.ndarray, Tensor, np.generic)):
        on_array(path, obj)
        return {"__tensor__": path}
    if isinstance(obj, tuple):
        return {"__tuple__": [to_json(v, f"{path}/{i}", on_array) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [to_json(v, f"{path}/{i}", on_array) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            items = {k: to_json(v, f"{path}/{k}", on_array) for k, v in obj.items()}
            return {"__dict__": items} if any(k in _TAGS for k in obj) else items
        return {"__pairs__": [[to_json(k, f"{path}/key{i}", on_array),
                               to_json(v, f"{path}/{k}", on_array)]
                              for i, (k, v) in enumerate(obj.items())]}
    raise TypeError(
        f"dist.checkpoint.save: cannot store {type(obj).__module__}.{type(obj).__qualname__} at "
        f"{path!r} (only tensors, arrays, dicts, lists, tuples, numbers, strings and None; "
        "checkpoints are never pickled)"
    )


def from_json(node, get_array: Callable[[str], np.ndarray]) -> Any:
    """The value :func:`to_json` encoded; ``get_array(key)`` returns a stored array."""
    if isinstance(node, list):
        return [from_json(v, get_array) for v in node]
    if not isinstance(node, dict):
        return node
    if "__tuple__" in node:
        return tuple(from_json(v, get_array) for v in node["__tuple__"])
    if "__pairs__" in node:
        return {from_json(k, get_array): from_json(v, get_array) for k, v in node["__pairs__"]}
    if "__np__" in node:
        return np.dtype(node["__np__"]).type(from_json(node["value"], get_array))
    if "__tensor__" in node:
        return get_array(node["__tensor__"])
    if "__float__" in node:
        return float(node["__float__"])
    if "__dict__" in node:
        node = node["__dict__"]
    return {k: from_json(v, get_array) for k, v in node.items()}
