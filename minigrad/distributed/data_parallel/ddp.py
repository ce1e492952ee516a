"""``DistributedDataParallel``: torch/OneFlow-style data parallelism as a module wrapper.

The wrapper broadcasts the root's parameters and buffers once, re-broadcasts buffers before each
forward (``broadcast_buffers``), and registers a gradient hook on every parameter that feeds the
same bucketed, overlapped all-reduce as ``make_allreduce_cb("mean")``. Whatever GradManager
the training loop uses, gradients come out averaged over the group. Inside ``no_sync()`` gradients
accumulate locally; the next synchronised backward all-reduces the accumulated sum. Outside
``no_sync()`` the hook also offers the reducer's bucket slots, so that ``Linear`` and ``conv2d``
compute weight gradients in the bucket (``make_allreduce_cb``'s ``grad_buffer``).
"""

from __future__ import annotations

import contextlib

from minigrad.autodiff.grad_manager import register_grad_hook
from minigrad.distributed.comm.group import WORLD, resolve_group
from minigrad.distributed.data_parallel.helper import (
    DEFAULT_BUCKET_MB,
    AllreduceCallback,
    bcast_list_,
)
from minigrad.module.module import Module


class DistributedDataParallel(Module):
    """Wrap ``module`` so that its gradients are averaged over ``group`` during backward.
    ``reduce_dtype`` (None: each gradient's own dtype) opts in to all-reducing the buckets in a
    lower precision such as ``"float16"`` (see ``make_allreduce_cb``).

    Example::

        model = dist.DistributedDataParallel(Net())
        gm = GradManager().attach(model.parameters())
        with gm:
            gm.backward(F.nn.cross_entropy(model(x), y))   # grads are now the group mean
    """

    def __init__(
        self,
        module: Module,
        broadcast_buffers: bool = True,
        bucket_cap_mb: float = DEFAULT_BUCKET_MB,
        group=WORLD,
        reduce_dtype=None,
    ):
        super().__init__()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self._group = resolve_group(group)
        self._reducer = AllreduceCallback("mean", self._group, bucket_size_mb=bucket_cap_mb,
                                          reduce_dtype=reduce_dtype)
        self._sync = True
        bcast_list_(list(module.tensors()), self._group)
        hook = _SyncHook(self)
        self._hooks = [register_grad_hook(p, hook) for p in module.parameters()]

    def forward(self, *args, **kwargs):
        """The wrapped module's forward, after re-broadcasting its buffers from the root."""
        if self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                bcast_list_(buffers, self._group)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Skip gradient synchronisation (gradient accumulation over several micro-steps)."""
        prev = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = prev


class _SyncHook:
    """The gradient hook of a :class:`DistributedDataParallel`'s parameters: hands each
    gradient to the reducer (outside ``no_sync()``), and offers the bucket slot the reducer
    lends for it (``grad_buffer``, as with ``make_allreduce_cb``)."""

    __slots__ = ("ddp",)

    def __init__(self, ddp: DistributedDataParallel):
        self.ddp = ddp

    def __call__(self, param, grad):
        ddp = self.ddp
        if not ddp._sync:
            return grad
        if param.grad is not None:  # fold in gradients accumulated under no_sync()
            grad = grad + param.grad
            param.grad = None
        return ddp._reducer(param, grad)

    def grad_buffer(self, param):
        """The reducer's offer, outside ``no_sync()`` (where the gradient stays local)."""
        ddp = self.ddp
        return ddp._reducer.grad_buffer(param) if ddp._sync else None
