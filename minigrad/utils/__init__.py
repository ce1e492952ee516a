"""Tools around models, by MegEngine's paths: :mod:`.module_stats` (parameters, FLOPs and
activation sizes per layer). ``mg.utils.data`` is :mod:`minigrad.data` under PyTorch's and
OneFlow's name (``flow.utils.data.DataLoader``; see minigrad.aliases)."""

import importlib


def __getattr__(name: str):
    """``mg.utils.data`` loads :mod:`minigrad.data` on first use (PyTorch's and OneFlow's path)."""
    if name == "data":
        return importlib.import_module("minigrad.utils.data")
    raise AttributeError(f"module 'minigrad.utils' has no attribute {name!r}")
