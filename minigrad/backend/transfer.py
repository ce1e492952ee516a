"""Host-to-GPU copies: pinned (page-locked) host memory and a copy stream per GPU.

From ordinary (pageable) host memory CUDA cannot copy directly: the data first goes through a
staging buffer, and the CPU waits for that. From pinned memory the GPU's copy engine reads the data
itself and the CPU goes on at once, so a batch can travel while the GPU still computes on the
previous one - provided the copy is queued on its own stream rather than behind the kernels of the
compute stream. Hence :func:`host_to_device` for a pinned array:

1. take the device memory from the compute stream's pool and make the copy stream wait for the
   compute stream's work queued so far: CuPy hands a block freed on the compute stream out again
   at once, while kernels queued there may still read it, and a copy on another stream must not
   overwrite it before they have run (the CPU does not wait);
2. queue the copy on the device's *copy stream*;
3. record an event after it there, and make the caller's (compute) stream wait on that event, so no
   kernel reads the batch before it has arrived (the CPU does not wait);
4. keep the host array alive until the event is done: its pinned buffer returns to CuPy's pool when
   it is freed, and must not be handed out again while the copy engine still reads it.

So the copy overlaps with compute work queued *after* it that does not need the batch: copying
the next batch before queuing the current step's kernels (prefetching one batch ahead) hides it.

``DataLoader(pin_memory=True)`` pins each batch (:func:`pin_memory`), and ``Device.put`` - so
``mg.tensor(batch, device="gpu0")`` - takes this path for pinned arrays; other host arrays go
through ``cupy.asarray`` on the compute stream.
"""

from __future__ import annotations

import collections

import numpy as np

from minigrad import seams
from minigrad.backend.xp import cupy_or_none

_copy_streams: dict[int, object] = {}  # GPU index -> its copy stream
_in_flight: collections.deque = collections.deque()  # (event, host array) of unfinished copies


def _forget() -> None:
    _copy_streams.clear()
    _in_flight.clear()


seams.GPU_ARRAYS.watch(lambda _arrays: _forget())  # CuPy swapped (tests)


def is_pinned(array) -> bool:
    """Whether the NumPy array ``array`` lives in pinned host memory (allocated by CuPy: its
    buffer chain ends in a ``cupy.cuda.PinnedMemoryPointer``). Asks no CUDA function."""
    cp = cupy_or_none()
    if cp is None or not isinstance(array, np.ndarray):
        return False
    pinned_type = cp.cuda.PinnedMemoryPointer
    obj = array
    while obj is not None:
        if isinstance(obj, pinned_type):
            return True
        obj = obj.obj if isinstance(obj, memoryview) else getattr(obj, "base", None)
    return False


def pin_memory(data):
    """``data`` with every non-empty NumPy array (also inside tuples, lists and dicts) copied into
    pinned host memory; other values are returned as they are. Needs CuPy.

    Example::

        images, labels = pin_memory((images, labels))   # then mg.tensor(images, device="gpu0")
    """
    if isinstance(data, np.ndarray):
        if data.nbytes == 0 or data.dtype.hasobject or is_pinned(data):
            return data
        mem = cupy_or_none().cuda.alloc_pinned_memory(data.nbytes)
        out = np.ndarray(data.shape, data.dtype, buffer=mem)
        out[...] = data
        return out
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(pin_memory(v) for v in data))
    if isinstance(data, (tuple, list)):
        return type(data)(pin_memory(v) for v in data)
    if isinstance(data, dict):
        return {k: pin_memory(v) for k, v in data.items()}
    return data


def host_to_device(array, dtype, device_index: int):
    """``array`` (host data) as a CuPy array on the current device, ``device_index``: a pinned,
    C-contiguous NumPy array of the right dtype is copied on the device's copy stream (see the
    module docstring); anything else goes through ``cupy.asarray`` on the current stream."""
    cp = cupy_or_none()
    if (not isinstance(array, np.ndarray) or (dtype is not None and array.dtype != dtype)
            or not array.flags.c_contiguous or not is_pinned(array)):
        return cp.asarray(array, dtype=dtype)
    stream = _copy_streams.get(device_index)
    if stream is None:
        stream = _copy_streams[device_index] = cp.cuda.Stream(non_blocking=True)
    while _in_flight and _in_flight[0][0].done:  # copies that finished release their buffers
        _in_flight.popleft()
    compute = cp.cuda.get_current_stream()
    out = cp.empty(array.shape, array.dtype)  # a block of the compute stream's pool
    freed = cp.cuda.Event(disable_timing=True)  # past the kernels that may still read the block
    freed.record(compute)
    stream.wait_event(freed)
    out.set(array, stream=stream)
    arrived = cp.cuda.Event(disable_timing=True)
    arrived.record(stream)
    compute.wait_event(arrived)
    _in_flight.append((arrived, array))
    return out
