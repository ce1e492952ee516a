"""Data-parallel helpers: ``bcast_list_`` (sync initial weights) and ``make_allreduce_cb``
(bucketed, overlapped gradient all-reduce, the callback MegEngine attaches to a GradManager).

Gradients become final in the same order on every rank (the backward engine is deterministic), so
every rank fills the same buckets in the same order: each full bucket is packed into one flat buffer
and its all-reduce starts at once, while backward goes on; the GradManager's after-backward hook
flushes the rest and unpacks the results before gradients are accumulated into ``.grad``.
"""

from __future__ import annotations

from minigrad.autodiff.grad_manager import get_backwarding_grad_manager
from minigrad.backend.xp import get_array_module
from minigrad.distributed import comm
from minigrad.distributed.group import WORLD, is_distributed
from minigrad.tensor import Tensor

DEFAULT_BUCKET_MB = 10.0


def _pack(arrays):
    """Concatenate arrays (all of one backend and dtype) into one flat buffer."""
    xp = get_array_module(arrays[0])
    return xp.concatenate([a.reshape(-1) for a in arrays])


def bcast_list_(inps, group=WORLD) -> None:
    """Overwrite every tensor in ``inps`` with the group root's value (one broadcast per dtype)."""
    group = WORLD if group is None else group
    inps = list(inps)
    if not is_distributed() or group.size == 1 or not inps:
        return
    by_dtype: dict = {}
    for t in inps:
        by_dtype.setdefault((str(t.dtype), str(t.device)), []).append(t)
    for tensors in by_dtype.values():
        flat = comm.broadcast(_pack([t._data for t in tensors]), group.root, group)
        offset = 0
        for t in tensors:
            n = t._data.size
            t._data = flat[offset : offset + n].reshape(t.shape)
            offset += n


class AllreduceCallback:
    """``cb(param, grad) -> grad``: packs gradients into per-dtype buckets of about
    ``bucket_size_mb`` and all-reduces each bucket asynchronously as soon as it is full.

    Example::

        gm = GradManager().attach(model.parameters(), callbacks=[dist.make_allreduce_cb("mean")])
    """

    def __init__(
        self,
        reduce_method: str = "sum",
        group=WORLD,
        backend=None,
        bucket_size_mb: float = DEFAULT_BUCKET_MB,
    ):
        if reduce_method not in ("sum", "mean"):
            raise ValueError(
                f"make_allreduce_cb: reduce_method must be 'sum' or 'mean', got {reduce_method!r}"
            )
        if bucket_size_mb <= 0:
            raise ValueError(
                f"make_allreduce_cb: bucket_size_mb must be positive, got {bucket_size_mb}"
            )
        self.reduce_method = reduce_method
        self.group = WORLD if group is None else group
        self.bucket_bytes = int(bucket_size_mb * 1024 * 1024)
        self._buckets: dict = {}  # key -> list of (placeholder, array)
        self._bucket_bytes: dict = {}
        self._works: list = []
        self._flush_registered = False

    def __call__(self, param: Tensor, grad: Tensor) -> Tensor:
        n = self.group.size if is_distributed() else 1
        if n == 1:
            return grad
        if not self._flush_registered:
            gm = get_backwarding_grad_manager()
            if gm is None:
                raise RuntimeError("allreduce callback: must be called from GradManager.backward")
            gm.register_after_backward_callback(self._flush)
            self._flush_registered = True
        placeholder = Tensor._wrap(grad._data, grad._device)  # its data is replaced at flush
        key = (str(grad.dtype), str(grad.device))
        self._buckets.setdefault(key, []).append((placeholder, grad._data))
        self._bucket_bytes[key] = self._bucket_bytes.get(key, 0) + grad._data.nbytes
        if self._bucket_bytes[key] >= self.bucket_bytes:
            self._start(key)
        return placeholder

    def _start(self, key) -> None:
        items = self._buckets.pop(key)
        self._bucket_bytes.pop(key)
        flat = _pack([a for _, a in items])
        self._works.append((comm.all_reduce_async(flat, "sum", self.group), items))

    def _flush(self) -> None:
        try:
            for key in list(self._buckets):
                self._start(key)
            n = self.group.size
            for work, items in self._works:
                flat = work.wait()
                if self.reduce_method == "mean":
                    flat = flat / n if flat.dtype.kind == "f" else flat // n
                offset = 0
                for placeholder, array in items:
                    size = array.size
                    placeholder._data = flat[offset : offset + size].reshape(array.shape)
                    offset += size
        finally:
            self._works = []
            self._buckets = {}
            self._bucket_bytes = {}
            self._flush_registered = False


def make_allreduce_cb(
    reduce_method: str = "sum", group=WORLD, backend=None, bucket_size_mb: float = DEFAULT_BUCKET_MB
) -> AllreduceCallback:
    """A GradManager callback that all-reduces gradients over ``group`` ("sum" or "mean")."""
    return AllreduceCallback(reduce_method, group, backend, bucket_size_mb)
