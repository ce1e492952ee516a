"""``minigrad.cuda`` and ``minigrad.accelerator``: the ``torch.cuda`` / ``oneflow.cuda`` and
``torch.accelerator`` queries that PyTorch and OneFlow programs make before choosing a device
(``DEVICE = "cuda" if flow.cuda.is_available() else "cpu"``). ``"cuda"`` names the first GPU here
(``as_device("cuda")`` is ``gpu0``); the only accelerators are CUDA GPUs.

Example::

    import minigrad as flow
    DEVICE = "cuda" if flow.cuda.is_available() else "cpu"
"""

from __future__ import annotations

from minigrad.backend import device as _backend

__all__ = ["current_accelerator", "device_count", "is_available"]


def is_available() -> bool:
    """True when a CUDA GPU can be used (``mg.is_cuda_available``)."""
    return _backend.is_cuda_available()


def device_count() -> int:
    """The number of visible CUDA GPUs (``mg.get_device_count("gpu")``)."""
    return _backend.get_device_count("gpu")


def current_accelerator():
    """``torch.accelerator.current_accelerator()``: the first GPU (its ``.type`` is ``"cuda"``),
    or None on a machine without one."""
    return _backend.as_device("gpu0") if is_available() else None
