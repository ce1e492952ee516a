"""Pipeline checkpoints: one file per global layer index.

The state of layer ``i`` is named ``"i.weight"``, ``"i.bias"``..., exactly like an
``M.Sequential`` of the same layers, and stored in ``layer_05-model_states.mgc`` (DeepSpeed's
layout). A checkpoint written with any number of stages can therefore be read with any other, or
by a single-process model: ``seq.load_state_dict(load_layer_states(path))``.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from typing import Any

from minigrad import serialization

__all__ = ["layer_state_path", "load_layer_states", "save_layer_states"]


def layer_state_path(directory: str, index: int) -> str:
    """The file that holds the state of global layer ``index`` in a pipeline checkpoint."""
    return os.path.join(directory, f"layer_{index:02d}-model_states.mgc")


def save_layer_states(state_dict: dict, save_dir: str) -> list[str]:
    """Split a state dict keyed by global layer index (``"5.weight"`` — a pipeline stage's or an
    ``M.Sequential``'s) into one file per layer under ``save_dir``; returns the paths written."""
    by_layer: dict[int, OrderedDict] = {}
    for name, value in state_dict.items():
        head = name.split(".", 1)[0]
        if not head.isdigit():
            raise ValueError(
                f"save_layer_states: {name!r} does not start with a layer index (expected names "
                f"like '5.weight')"
            )
        by_layer.setdefault(int(head), OrderedDict())[name] = value
    os.makedirs(save_dir, exist_ok=True)
    paths = []
    for index in sorted(by_layer):
        paths.append(layer_state_path(save_dir, index))
        serialization.save(by_layer[index], paths[-1])
    return paths


def load_layer_states(load_dir: str) -> "OrderedDict[str, Any]":
    """Every layer file of a pipeline checkpoint merged into one state dict keyed by global
    layer index, ready for a single-process model: ``seq.load_state_dict(load_layer_states(d))``.
    """
    pattern = re.compile(r"layer_(\d+)-model_states\.mgc")
    files = sorted((int(m.group(1)), name) for name in os.listdir(load_dir)
                   if (m := pattern.fullmatch(name)))
    if not files:
        raise FileNotFoundError(f"load_layer_states: no layer_*-model_states.mgc in {load_dir}")
    state: OrderedDict = OrderedDict()
    for _, name in files:
        state.update(serialization.load(os.path.join(load_dir, name)))
    return state
