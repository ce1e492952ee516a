"""The places where a lower layer calls a higher one at run time, named in one module.

minigrad's layers import one way (backend -> autodiff/tensor -> functional -> module ->
optimizer/data -> distributed), checked by ``tests/test_layering.py``. Seven behaviours still need
a lower layer to call code that lives above it. Each is a :class:`Seam` here: the lower layer
reads it, the higher layer fills it when it is imported, and nobody imports upward.

================= ============================= ============================= ====================
seam              read by                       filled by                     what for
================= ============================= ============================= ====================
``FUNCTIONAL``    ``autodiff.tensor``           ``functional`` (its import)   ``a + b``, ``t.sum()``
``WORLD``         ``data.sampler``              ``distributed.comm.group``    a sampler's shard
``GLOBAL_IO``     ``serialization``             ``distributed.global_tensor`` saving global tensors
``GPU_ARRAYS``    ``backend`` modules caching   ``backend.xp.use_cupy``       tests swap CuPy for
                  GPU objects (``watch``)       (tests)                       a stand-in
``DISPATCH_HOOK`` ``autodiff.function``         ``distributed.global_tensor`` ops on global tensors
``TRACER``        ``autodiff``, ``module``,     ``utils.profiler``            the profiler's events
                  ``data.dataloader``,
                  ``distributed.pipeline`` (and
                  ``comm``)
``CHECKPOINT``    ``distributed.pipeline``      ``distributed.checkpoint``    the engine's
                  (``PipelineEngine``)                                        ``save_checkpoint``
================= ============================= ============================= ====================

``CHECKPOINT`` joins two folders of ``distributed`` rather than two layers: the checkpoint
folder sits above every strategy (it must know their layouts), so DeepSpeed's
``engine.save_checkpoint`` on the pipeline engine reaches it through here.

``DISPATCH_HOOK`` is the one seam that is an attribute rather than a slot, because it is read on
every op: a Tensor subclass sets the class attribute named ``__minigrad_dispatch__`` and
``Function.__call__`` hands it the op (see :mod:`minigrad.autodiff.function`).

This module imports nothing from minigrad, so every layer may use it.

Example::

    from minigrad import seams
    seams.WORLD.install(lambda: (4, 1))   # samplers now see world size 4, rank 1
"""

from __future__ import annotations

from typing import Any, Callable


class Seam:
    """A named slot that a lower layer reads (``seam.value``) and a higher one fills.

    ``install(value)`` replaces the value, calls every watcher with it and returns the previous
    value (so a test can put it back); ``watch(callback)`` asks to be told about later installs.
    """

    def __init__(self, name: str, default: Any, reader: str, filler: str):
        self.name, self.reader, self.filler = name, reader, filler
        self.value = default
        self._watchers: list[Callable[[Any], None]] = []

    def install(self, value: Any) -> Any:
        """Fill the seam with ``value``; return what it held before."""
        previous, self.value = self.value, value
        for callback in self._watchers:
            callback(value)
        return previous

    def watch(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(value)`` on every later :meth:`install`."""
        self._watchers.append(callback)

    def __repr__(self) -> str:
        return f"Seam({self.name!r}: read by {self.reader}, filled by {self.filler})"


class _Missing:
    """Stands in for a higher layer that has not been imported; says which one on first use."""

    def __init__(self, what: str):
        self._what = what

    def __getattr__(self, name: str):
        raise RuntimeError(f"{self._what} (asked for {name!r}); import minigrad")


FUNCTIONAL = Seam(
    "functional", _Missing("Tensor operations need minigrad.functional"),
    reader="minigrad.autodiff.tensor", filler="minigrad.functional",
)
WORLD = Seam(
    "world", lambda: None,  # a callable returning (world_size, rank), or None: no process group
    reader="minigrad.data.sampler", filler="minigrad.distributed.comm.group",
)
GLOBAL_IO = Seam(
    "global_io", None,  # None: one process, rank 0, no global tensors
    reader="minigrad.serialization", filler="minigrad.distributed.global_tensor",
)
GPU_ARRAYS = Seam(
    "gpu_arrays", None,  # the (cupy, cupyx) pair in use, None: the real CuPy when installed
    reader="minigrad.backend (device, rng, transfer, device_checks)",
    filler="minigrad.backend.xp.use_cupy",
)
DISPATCH_HOOK = "__minigrad_dispatch__"

TRACER = Seam(
    "tracer", None,  # None, or the running profiler: see minigrad.utils.profiler.Tracer
    reader="minigrad.autodiff.function/engine, minigrad.module.module (they swap in traced "
           "versions of Function.__call__, the backward call and Module.__call__ while it is set, "
           "so tracing costs nothing when off); data.dataloader, distributed.pipeline",
    filler="minigrad.utils.profiler",
)

CHECKPOINT = Seam(
    "checkpoint", _Missing("engine checkpoints need minigrad.distributed.checkpoint"),
    reader="minigrad.distributed.pipeline.engine (save_checkpoint, load_checkpoint)",
    filler="minigrad.distributed.checkpoint",
)

SEAMS = (FUNCTIONAL, WORLD, GLOBAL_IO, GPU_ARRAYS, TRACER, CHECKPOINT)
