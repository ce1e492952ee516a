"""MegEngine's distributed helpers: ``bcast_list_`` (sync initial weights), ``make_allreduce_cb``
(bucketed, overlapped gradient all-reduce, the callback attached to a GradManager),
``synchronized`` (run on rank 0, everyone waits), ``param_pack_split``/``param_pack_concat``
(parameters in one flat buffer) and ``get_device_count_by_fork``.

Gradients become final in the same order on every rank (the backward engine is deterministic), so
every rank fills the same buckets in the same order: each full bucket is packed into one flat buffer
and its all-reduce starts at once, while backward goes on; the GradManager's after-backward hook
flushes the rest and unpacks the results before gradients are accumulated into ``.grad``.
The reduced gradients are views of the bucket's flat buffer (``comm.flat_buffer``), which is
reused on a later step once no gradient views it any more (fresh multi-megabyte buffers cost a
page fault per 4 KiB every step). Host buckets are allocated with ``comm.shared_empty``: on one
host the all-reduce reads every rank's bucket in place instead of copying it through exchange
buffers. "mean" is the collective's ``ReduceOp.AVG``.

Gradients computed in place (PyTorch DDP's ``gradient_as_bucket_view``, DeepSpeed's contiguous
gradients): from the second step on, the callback offers each parameter's slot in the bucket it
filled the step before (``grad_buffer``, which the GradManager hands to the ops, see
``Function.grad_buffer``): ``Linear`` and ``conv2d`` compute their weight gradients there, and
packing the bucket copies only the gradients that are not in place already. A bucket whose
parameters arrive in another order than the step before is packed into a new buffer, as without
the offer.
"""

from __future__ import annotations

import functools

import numpy as np

from minigrad import functional as F
from minigrad.autodiff.grad_manager import get_backwarding_grad_manager
from minigrad.autodiff.tensor import Tensor
from minigrad.backend.device import get_device_count
from minigrad.backend.dtypes import as_float_dtype, is_floating
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.collectives import all_gather_object
from minigrad.distributed.comm.flat_buffer import BufferPool, FlatBuffer, group_by_layout
from minigrad.distributed.comm.group import (
    WORLD,
    get_world_size,
    is_distributed,
    resolve_group,
)
from minigrad.distributed.comm.providers import BACKENDS

# 10 MB buckets (MegEngine's default; PyTorch DDP uses 25 MB): the first all-reduce starts after
# 10 MB of gradients, so it overlaps most of backward even for small models, while each bucket is
# still large enough that the per-call cost (~50 us) stays under 1% of its transfer time.
DEFAULT_BUCKET_MB = 10.0
REDUCE_METHODS = ("sum", "mean")


def bcast_list_(inps, group=WORLD) -> None:
    """Overwrite every tensor in ``inps`` with the group root's value (one broadcast per dtype).

    Example: ``dist.bcast_list_(model.tensors())`` before training, so every rank starts equal."""
    group = resolve_group(group)
    inps = list(inps)
    if not is_distributed() or group.size == 1 or not inps:
        return
    for tensors in group_by_layout(inps).values():
        flat = FlatBuffer.of([t.data for t in tensors])
        comm.broadcast(flat.data, group.root, group)
        for t, value in zip(tensors, flat.views()):
            t.set_value(value)


class AllreduceCallback:
    """``cb(param, grad) -> grad``: packs gradients into per-dtype buckets of about
    ``bucket_size_mb`` and all-reduces each bucket asynchronously as soon as it is full.

    ``reduce_method``: ``"sum"`` or ``"mean"`` (any case); ``bucket_size_mb=0``: one all-reduce per
    gradient; ``backend``: None (the group's routing) or a backend name for these all-reduces;
    ``reduce_dtype``: None (default) reduces each gradient in its own dtype; a floating dtype
    (``"float16"``, ``"bfloat16"``) casts each floating bucket to it for the all-reduce and the
    result back to the gradients' dtype (half the bytes on the wire from float32, at the cost of
    rounding the gradients and summing in that dtype: opt-in, see ``docs/amp.md``).

    Example::

        gm = GradManager().attach(model.parameters(), callbacks=[dist.make_allreduce_cb("mean")])
    """

    def __init__(
        self,
        reduce_method: str = "sum",
        group=WORLD,
        backend=None,
        bucket_size_mb: float = DEFAULT_BUCKET_MB,
        reduce_dtype=None,
    ):
        method = str(reduce_method).lower()
        if method not in REDUCE_METHODS:
            raise ValueError(
                f"make_allreduce_cb: reduce_method must be 'sum' or 'mean', got {reduce_method!r}"
            )
        if bucket_size_mb < 0:
            raise ValueError(
                f"make_allreduce_cb: bucket_size_mb must be >= 0 (0: one all-reduce per gradient), "
                f"got {bucket_size_mb}"
            )
        if backend is not None and backend not in BACKENDS:
            raise ValueError(
                f"make_allreduce_cb: backend must be None or one of {BACKENDS}, got {backend!r}"
            )
        self.reduce_method = method
        self.reduce_dtype = (None if reduce_dtype is None
                             else as_float_dtype(reduce_dtype, "make_allreduce_cb: reduce_dtype"))
        if self.reduce_dtype is not None and self.reduce_dtype.name not in comm.DTYPES:
            raise ValueError(
                f"make_allreduce_cb: reduce_dtype {self.reduce_dtype.name}: the collectives "
                "cannot reduce it; use float16, or None (each gradient's own dtype)")
        self.backend = backend
        self.group = resolve_group(group)
        self.bucket_bytes = int(bucket_size_mb * 1024 * 1024)
        self._buckets: dict = {}  # key -> list of (id(param), placeholder, array)
        self._bucket_bytes: dict = {}
        self._works: list = []
        self._flush_registered = False
        # (key, n-th bucket of the step) -> buffer of an earlier step; host buckets in shared
        # memory, which the all-reduce reads in place (comm.shared_empty)
        self._pool = BufferPool(host_empty=self._shared_empty)
        self._started: dict = {}  # key -> buckets started in this backward
        # gradients computed in place: each bucket's parameter ids in the last step (and this
        # step's so far), id(param) -> (bucket, index) from the last step, the buffers whose
        # slots this backward offered, and the slots offered (id(param) -> view)
        self._layouts: dict = {}
        self._next_layouts: dict = {}
        self._slots: dict = {}
        self._lent: dict = {}
        self._offered: dict = {}

    def __call__(self, param: Tensor, grad: Tensor) -> Tensor:
        n = self.group.size if is_distributed() else 1
        if n == 1:
            return grad
        self._register_flush()
        placeholder = grad.detach()  # pointed at its slice of the reduced bucket at flush
        data = grad.data
        key = (data.dtype, grad.device)  # (str(grad.dtype) would cost 2 us a gradient)
        self._buckets.setdefault(key, []).append((id(param), placeholder, data))
        self._bucket_bytes[key] = self._bucket_bytes.get(key, 0) + data.nbytes
        if self._bucket_bytes[key] >= self.bucket_bytes:
            self._start(key)
        return placeholder

    def grad_buffer(self, param: Tensor):
        """Where ``param``'s gradient may be computed (the GradManager asks, see
        ``Function.grad_buffer``): its slot in the bucket it filled the step before, when that
        bucket's buffer is free (no gradient of that step views it) and its all-reduce has not
        started in this backward; else None. Not offered when buckets are reduced in
        ``reduce_dtype`` (a cast copy is packed anyway)."""
        slot = self._slots.get(id(param))
        if slot is None or self.reduce_dtype is not None:
            return None
        bucket, index = slot
        key, nth = bucket
        if self._started.get(key, 0) > nth:
            return None
        flat = self._lent.get(bucket)
        if flat is None:
            flat = self._pool.kept(bucket)
            if flat is None or not flat.is_free():
                return None
            self._register_flush()  # resets the offers, whatever the callbacks receive
            self._lent[bucket] = flat
        view = self._offered[id(param)] = flat.view(index)
        return view

    def _register_flush(self) -> None:
        """Have the backward in progress call ``_flush`` at its end (once)."""
        if not self._flush_registered:
            gm = get_backwarding_grad_manager()
            if gm is None:
                raise RuntimeError("allreduce callback: must be called from GradManager.backward")
            gm.register_after_backward_callback(self._flush)
            self._flush_registered = True

    def _start(self, key, async_op: bool = True) -> tuple:
        """All-reduce the bucket ``key`` (asynchronously, or now); returns ``(work or None,
        items, flat buffer)``, also kept in ``_works`` when asynchronous."""
        items = self._buckets.pop(key)
        self._bucket_bytes.pop(key)
        nth = self._started.get(key, 0)
        self._started[key] = nth + 1
        bucket = (key, nth)
        ids = tuple(pid for pid, _, _ in items)
        self._next_layouts[bucket] = ids
        arrays = [a for _, _, a in items]
        cast = self._cast_to(arrays[0].dtype)
        if cast is not None:  # reduced in reduce_dtype: the casts' copies are what is packed
            arrays = [a.astype(cast) for a in arrays]
        flat = self._lent.get(bucket)
        if (flat is not None and self._layouts.get(bucket) == ids
                and flat.shapes == [a.shape for a in arrays]):
            # the buffer whose slots were offered, the same parameters in the same order: copy
            # in only the gradients that were not computed in place
            offered = self._offered
            for i, (pid, _, a) in enumerate(items):
                if offered.get(pid) is not a:
                    flat.view(i)[...] = a
        else:  # this bucket's buffer of an earlier step when no gradient views it any more
            flat = self._pool.get(bucket, arrays)
        op = "avg" if self.reduce_method == "mean" else "sum"
        work = comm.all_reduce(flat.data, op, self.group, async_op=async_op, backend=self.backend)
        if not async_op:
            return None, items, flat
        self._works.append((work, items, flat))
        return work, items, flat

    def _shared_empty(self, count: int, dtype):
        """A host bucket: shared with the group's other ranks when this callback's all-reduces
        may go through the cpu backend (``backend`` None or ``"cpu"``)."""
        if self.backend in (None, "cpu"):
            return comm.shared_empty(count, dtype, self.group)
        return np.empty(count, dtype)

    def _cast_to(self, dtype):
        """The dtype a bucket of ``dtype`` gradients is all-reduced in when it is not their own
        (``reduce_dtype`` given, the gradients floating and of another dtype); else None."""
        rd = self.reduce_dtype
        if rd is None or dtype == rd or not is_floating(dtype):
            return None
        return rd

    def _flush(self) -> None:
        layouts = {}  # after a failure: no offers on the next step
        try:
            for work, items, flat in self._works:
                work.wait()  # reduced in place: the views below see the result
                self._deliver(items, flat)
            # the buckets still open are reduced now, on this thread (after the started ones, as
            # on every rank): handing them to the async worker only to wait for it would cost two
            # thread switches, 0.1 to 1 ms on a busy machine
            for key in list(self._buckets):
                self._deliver(*self._start(key, async_op=False)[1:])
            layouts = self._next_layouts
        finally:
            self._works = []
            self._buckets = {}
            self._bucket_bytes = {}
            self._started = {}
            self._flush_registered = False
            self._layouts, self._next_layouts = layouts, {}
            self._slots = {pid: (bucket, i) for bucket, ids in layouts.items()
                           for i, pid in enumerate(ids)}
            self._lent, self._offered = {}, {}

    @staticmethod
    def _deliver(items, flat) -> None:
        """Point each gradient's placeholder at its slice of the reduced bucket (cast back to the
        gradient's dtype when the bucket was reduced in ``reduce_dtype``)."""
        for (_, placeholder, grad), value in zip(items, flat.views()):
            placeholder.set_(value if value.dtype == grad.dtype else value.astype(grad.dtype))


def make_allreduce_cb(
    reduce_method: str = "sum",
    group=WORLD,
    backend=None,
    bucket_size_mb: float = DEFAULT_BUCKET_MB,
    reduce_dtype=None,
) -> AllreduceCallback:
    """A GradManager callback that all-reduces gradients over ``group`` ("sum" or "mean");
    ``reduce_dtype`` (e.g. ``"float16"``) opts in to reducing them in a lower precision (the
    gradients come back in their own dtype), see :class:`AllreduceCallback`.

    Example::

        gm = GradManager().attach(model.parameters(), callbacks=[dist.make_allreduce_cb("mean")])
    """
    return AllreduceCallback(reduce_method, group, backend, bucket_size_mb, reduce_dtype)


def synchronized(func):
    """Decorator (MegEngine's): ``func`` runs on every rank, and no rank returns before every
    rank has finished it (MegEngine uses it so that ranks downloading into one cache do not race,
    e.g. around ``hub.load``). Each rank gets its own return value. If it raises on any rank,
    every rank raises (its own error, or a RuntimeError naming the rank that failed) instead of
    waiting forever at the barrier.

    Example::

        @dist.synchronized
        def fetch():
            return hub.load("megengine/models", "resnet18", pretrained=True)
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not is_distributed():
            return func(*args, **kwargs)
        result, error, status = None, None, None
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            error, status = exc, f"{type(exc).__name__}: {exc}"
        statuses = [None] * get_world_size()
        all_gather_object(statuses, status)  # also the barrier: every rank has finished
        if error is not None:
            raise error
        failed = [(r, s) for r, s in enumerate(statuses) if s is not None]
        if failed:
            rank, what = failed[0]
            raise RuntimeError(f"synchronized {func.__qualname__}: rank {rank} failed: {what}")
        return result

    return wrapper


def get_device_count_by_fork(device_type: str = "gpu") -> int:
    """How many devices of ``device_type`` there are, without initialising CUDA in this process
    (MegEngine asks a forked child so that the parent can still fork GPU ranks afterwards). The
    count here comes from the operating system and never touches CUDA, so no child is needed."""
    return get_device_count(device_type)


def get_offsets(shapes) -> list[int]:
    """``[begin0, end0, begin1, end1, ...]``: where each of ``shapes`` lies when the tensors are
    packed back to back into one flat buffer (the ``offsets`` of the param-pack functions)."""
    offsets, offset = [], 0
    for shape in shapes:
        offsets.append(offset)
        offset += int(np.prod(shape, dtype=np.int64))
        offsets.append(offset)
    return offsets


def _pairs(where: str, offsets, count: int) -> list[tuple[int, int]]:
    offsets = [int(v) for v in (offsets.numpy() if isinstance(offsets, Tensor) else offsets)]
    if len(offsets) != 2 * count:
        raise ValueError(f"{where}: offsets must hold 2 * {count} values [begin0, end0, ...], "
                         f"got {len(offsets)}")
    pairs = list(zip(offsets[0::2], offsets[1::2], strict=True))
    position = 0
    for begin, end in pairs:
        if begin < position or end < begin:
            raise ValueError(f"{where}: offsets must be increasing, non-overlapping "
                             f"[begin, end) pairs, got {offsets}")
        position = end
    return pairs


def param_pack_split(inp: Tensor, offsets, shapes) -> list[Tensor]:
    """The tensors packed in the flat ``inp``: the i-th is ``inp[begin_i:end_i]`` reshaped to
    ``shapes[i]`` (``offsets`` as :func:`get_offsets` gives them). Differentiable.

    Example::

        b, c = param_pack_split(mg.ones(10), [0, 1, 1, 10], [(1,), (3, 3)])
    """
    pairs = _pairs("param_pack_split", offsets, len(shapes))
    out = []
    for (begin, end), shape in zip(pairs, shapes, strict=True):
        if end - begin != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"param_pack_split: [{begin}, {end}) holds {end - begin} values, "
                             f"shape {tuple(shape)} needs {int(np.prod(shape))}")
        out.append(F.reshape(inp[begin:end], tuple(shape)))
    return out


def param_pack_concat(inps, offsets, offsets_val=None) -> Tensor:
    """One flat tensor holding each of ``inps`` at its ``[begin, end)`` of ``offsets_val``
    (``offsets`` in MegEngine is the same list as a device tensor; either may be given), gaps
    filled with zeros. Differentiable: the inverse of :func:`param_pack_split`."""
    inps = list(inps)
    pairs = _pairs("param_pack_concat", offsets if offsets_val is None else offsets_val,
                   len(inps))
    pieces, position = [], 0
    for (begin, end), t in zip(pairs, inps, strict=True):
        if end - begin != t.size:
            raise ValueError(f"param_pack_concat: [{begin}, {end}) holds {end - begin} values, "
                             f"the tensor of shape {t.shape} has {t.size}")
        if begin > position:
            pieces.append(F.zeros((begin - position,), dtype=t.dtype, device=t.device))
        pieces.append(F.flatten(t))
        position = end
    return F.concat(pieces)
