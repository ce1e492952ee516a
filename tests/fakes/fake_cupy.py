"""A NumPy-backed stand-in for CuPy, so that minigrad's GPU code paths run (and can fail) in CI.

The fake models what minigrad's GPU code depends on, with CuPy's rules and error messages:

* CUDA's lazy initialisation: the first CUDA call of a process initialises it, and a process
  forked after that cannot use CUDA (``CUDARuntimeError``: ``cudaErrorInitializationError``);
* several devices and CUDA's *current device*, one per host thread (``cupy.cuda.Device`` as a
  context manager, ``use()``, ``runtime.getDevice/setDevice``); a new thread starts on device 0;
* arrays (``cupy.ndarray``) that live on one device. A kernel (a ufunc, a NumPy function, most
  methods, indexing with arrays) launched while another device is current raises CuPy's
  ``ValueError`` for devices without peer access, so an op that runs on the wrong device fails
  instead of silently crossing devices; ``copy()`` and ``asarray`` copy to the *current* device;
* no implicit conversion: ``np.asarray`` of a device array raises CuPy's ``TypeError``, and NumPy
  arrays as kernel operands raise ``TypeError('Unsupported type ...')``;
* host synchronisations: ``asnumpy``, ``get``, ``item``, ``tolist``, ``bool``/``float``/``int``,
  ``repr``, the ``synchronize`` methods and ops whose output size depends on the data (boolean
  mask indexing, ``nonzero``, ``unique``...) are appended to ``fake.syncs`` (and raise
  ``DeviceSynchronized`` inside ``cupyx.allow_synchronize(False)``, as CuPy's detector does);
  host-to-device copies are counted in ``fake.h2d``, device-to-host copies in ``fake.d2h``;
* streams and events, per device, with a current stream per thread and device; ``fake.events`` lists
  in order every kernel launch (``"launch multiply on gpu0:null"``), copy (``"h2d pinned on
  gpu0:s2"``), event record (``"record ev3 on gpu0:s2"``) and wait (``"gpu0:null waits ev3"``);
* the order of GPU work and CuPy's memory pool (``stream_order``): a block freed on a stream is
  handed out again to that stream's allocations, and a use of a block on one stream that no event
  chain (or host wait, or the legacy null stream) orders after another stream's conflicting use
  raises ``UnorderedAccess``; with ``manual_completion`` work completes only when the host waits
  for it or the test calls ``fake.release()`` (``event.done``, ``stream.done`` stay False);
* pinned host memory (``cuda.alloc_pinned_memory``, ``cupyx.empty_pinned``) and ``ndarray.set``;
* ``random.default_rng``: a generator bound to the device current when it was made;
* the copies CuPy's batched ``matmul`` makes of operands that are not C-contiguous (as ``copy``
  launches);
* the copies CuPy's batched ``matmul`` makes of operands that are not C-contiguous (as ``copy``
  launches);
* only the names CuPy has (``cupy_names``: the module's functions, ``ndarray``'s methods, the
  ufuncs' methods, ``Generator``'s draws; NumPy functions called on device arrays dispatch only to
  those) and only its dtypes (``ValueError('Unsupported dtype object')`` for objects, strings,
  datetimes and ``longdouble``);
* ``cuda.nccl`` (``fake_nccl``): communicators of several ranks, processes forked inside
  :func:`installed`, one GPU each; the unique id as CuPy 14 (``bytes``) or 13 (a tuple) has it.

Not modelled: CUDA C kernels (``ElementwiseKernel``, ``ReductionKernel`` and ``RawKernel`` can be
built but raise ``NotImplementedError`` when called, unless ``cuda_on_cpu.install(fake)`` gives the
fake kernel classes that run the CUDA C on the CPU; ``fuse`` returns the function unchanged), the
ordering of peer copies between devices and of NCCL's buffers (passed as pointers), byte counts of
the pools.
minigrad's fused kernels (``minigrad.backend.kernels``, CUDA C on a GPU) run their CPU versions on
the fake arrays' data instead (with the same device checks), so every op can run on the fake: the
fake registers them with ``kernels.register_kernels`` (it patches no minigrad module).

This is a test double: it lives with the tests (``tests/fakes``), not in the ``minigrad`` package.

Example::

    with fake_cupy.installed(n_devices=2) as fake:
        x = mg.tensor([1.0, 2.0], device="gpu1")
        y = (x * 2).numpy()
        assert fake.syncs == ["asnumpy"]
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import shutil
import sys
import tempfile
import threading
import types

import numpy as np
import scipy.special
from numpy.lib.mixins import NDArrayOperatorsMixin

from fakes import cupy_names
from fakes.fake_nccl import make_nccl
from fakes.stream_order import MemoryPool, UnorderedAccess, merge
from minigrad.backend import kernels
from minigrad.backend.transfer import is_pinned
from minigrad.backend.xp import use_cupy

__all__ = ["DeviceSynchronized", "FakeCupy", "UnorderedAccess", "installed"]

#: CUDA's status for a device index that does not exist.
CUDA_ERROR_INVALID_DEVICE = 101
#: CUDA's status in a process forked after its parent initialised CUDA.
CUDA_ERROR_INITIALIZATION = 3
_NAMES = itertools.count(1)  # stream and event numbers, unique in the process
# functions whose output size depends on the data (CuPy synchronises to learn it)
_SIZE_FROM_DATA = frozenset({"nonzero", "flatnonzero", "argwhere", "unique", "compress",
                             "extract"})
# kernels that write into their first operand
_IN_PLACE = frozenset({"setitem", "scatter_add", "fill"})  # and every ufunc's ``.at``
# functions that only allocate memory (no kernel writes it)
_ALLOCATION_ONLY = frozenset({"empty", "empty_like"})
# methods that only build a view (no kernel in CuPy for contiguous arrays)
_VIEW_METHODS = frozenset({"reshape", "view", "transpose", "swapaxes", "squeeze", "ravel"})


class CUDARuntimeError(RuntimeError):
    """``cupy.cuda.runtime.CUDARuntimeError``: carries CUDA's ``status``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class DeviceSynchronized(RuntimeError):
    """``cupyx.DeviceSynchronized``: a host synchronisation inside ``allow_synchronize(False)``."""

    def __init__(self, what: str):
        super().__init__(f"Device synchronization was detected while disallowed ({what})")


# -------------------------------------------------------------------------------------------------
# devices, streams, events


class _Device:
    """``cupy.cuda.Device``: an index, a context manager that makes it current, ``use()``."""

    fake: FakeCupy

    def __init__(self, device=None):
        self.id = self.fake.current_device() if device is None else int(device)

    def __enter__(self):
        fake = self.fake
        previous = fake.current_device()
        fake.set_device(self.id)
        fake._state().device_stack.append(previous)
        return self

    def __exit__(self, *exc):
        self.fake.set_device(self.fake._state().device_stack.pop())
        return False

    def use(self):
        self.fake.set_device(self.id)
        return self

    def synchronize(self) -> None:
        self.fake.sync("Device.synchronize", self.fake.device_clock(self.id))

    compute_capability = "80"

    def __int__(self) -> int:
        return self.id

    def __eq__(self, other) -> bool:
        return isinstance(other, _Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


class _Event:
    """``cupy.cuda.Event``: recorded on a stream (it keeps the stream's vector clock: what is
    ordered before it), waited on by another; ``done`` once the work before it has completed."""

    fake: FakeCupy

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.fake.init_cuda()
        self.name = f"ev{next(_NAMES)}"
        self.ptr = id(self)
        self.clock: dict[str, int] = {}  # empty until recorded: waiting on it orders nothing
        self._stream = None

    def record(self, stream=None) -> None:
        stream = self.fake.cuda.get_current_stream() if stream is None else stream
        self.fake.issue(stream)
        self.clock, self._stream = dict(stream.clock), stream
        self.fake.events.append(f"record {self.name} on {stream.name}")

    @property
    def done(self) -> bool:
        """Whether the work recorded before the event has completed (``cudaEventQuery``)."""
        stream = self._stream
        return stream is None or stream.completed >= self.clock[stream.name]

    def synchronize(self) -> None:
        self.fake.sync("Event.synchronize", self.clock)


class _Stream:
    """``cupy.cuda.Stream``: made on the current device; ``with stream:`` makes it current there
    (CuPy's RuntimeError when another device is current)."""

    fake: FakeCupy

    def __init__(self, null=False, non_blocking=False, ptds=False, *, _device=None):
        fake = self.fake
        self.device_id = fake.current_device() if _device is None else _device
        self.name = f"gpu{self.device_id}:" + ("null" if null else f"s{next(_NAMES)}")
        self.ptr = 0 if null else id(self)
        fake._by_name[self.name] = self
        self.null, self.blocking = bool(null), not (null or non_blocking)
        self.clock: dict[str, int] = {}  # stream name -> its work ordered before our next launch
        self.issued = 0  # launches (and records) issued on the stream
        self._completed = 0
        fake.streams[self.ptr, self.device_id] = self

    @property
    def completed(self) -> int:
        """How many of the stream's launches have completed (all of them unless the fake is in
        the manual completion mode)."""
        return self._completed if self.fake.manual_completion else self.issued

    @property
    def done(self) -> bool:
        """Whether all work issued on the stream has completed (``cudaStreamQuery``)."""
        return self.completed >= self.issued

    def _check_device(self) -> None:
        current = self.fake.current_device()
        if self.device_id != current:
            raise RuntimeError(
                f"The device that the stream is created on ({self.device_id}) does not match "
                f"with the current device ({current})"
            )

    def __enter__(self):
        self._check_device()
        self.fake._state().streams.setdefault(self.device_id, []).append(self)
        return self

    def __exit__(self, *exc):
        self.fake._state().streams[self.device_id].pop()
        return False

    def use(self):
        self._check_device()
        streams = self.fake._state().streams.setdefault(self.device_id, [])
        streams[:] = [self]
        return self

    def record(self, event=None):
        event = self.fake.cuda.Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event) -> None:
        merge(self.clock, event.clock)
        self.fake.events.append(f"{self.name} waits {event.name}")

    def synchronize(self) -> None:
        self.fake.sync("Stream.synchronize", self.clock)

    def __repr__(self) -> str:
        return f"<Stream {self.name}>"


class PinnedMemoryPointer(bytearray):
    """``cupy.cuda.PinnedMemoryPointer``: page-locked host memory (a bytearray here) that NumPy
    arrays can be built on (``np.ndarray(shape, dtype, buffer=mem)``)."""

    @property
    def ptr(self) -> int:
        return ctypes.addressof(ctypes.c_char.from_buffer(self)) if len(self) else 0


class Flags:
    """What ``cupy.ndarray.flags`` has: the two contiguity flags and ``owndata``, readable as
    attributes or as ``flags["C_CONTIGUOUS"]``; no ``writeable`` (CuPy arrays are always
    writable), so code that asks NumPy's flags of a CuPy array fails here as on a GPU."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, numpy_flags):
        self.c_contiguous = numpy_flags.c_contiguous
        self.f_contiguous = numpy_flags.f_contiguous
        self.owndata = numpy_flags.owndata

    def __getitem__(self, key: str) -> bool:
        names = {"C_CONTIGUOUS": "c_contiguous", "F_CONTIGUOUS": "f_contiguous",
                 "OWNDATA": "owndata"}
        if key not in names:
            raise KeyError(key)
        return getattr(self, names[key])


class _MemoryPointer:
    """``ndarray.data``: the device pointer (the NumPy buffer's address) and the device."""

    def __init__(self, array: np.ndarray, device_id: int):
        self.ptr = array.ctypes.data if array.size else 0
        self.device_id = device_id


# -------------------------------------------------------------------------------------------------
# arrays


class _Array(NDArrayOperatorsMixin):
    """``cupy.ndarray``: a NumPy array and the device it lives on (see the module docstring)."""

    fake: FakeCupy

    def __init__(self, array: np.ndarray, device_id: int, block=None):
        _check_dtype(array.dtype)
        self._a = array
        self._device_id = device_id
        if block is None:  # new memory: from the pool arena of the stream current on the device
            stream = self.fake._current_stream(device_id)
            block = self.fake.pool.malloc(array.nbytes, stream.name)
        block.refs += 1
        self._block = block

    def __del__(self):
        block = self.__dict__.get("_block")
        if block is not None:
            block.refs -= 1
            if block.refs == 0:  # the last array on the block is gone: back to the pool
                self.fake.pool.free(block)

    # -- what CuPy arrays have without launching anything
    @property
    def device(self):
        return self.fake.cuda.Device(self._device_id)

    @property
    def data(self):
        return _MemoryPointer(self._a, self._device_id)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: Flags(self._a.flags))
    T = property(lambda self: self._view(self._a.T))

    def _view(self, array):
        return type(self)(array, self._device_id, self._block)

    def __len__(self) -> int:
        if self._a.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    # -- kernels
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if (ufunc.__name__ not in cupy_names.NAMES["cupy"]
                or method not in cupy_names.UFUNC_METHODS | {"__call__"}):
            return NotImplemented  # CuPy has no such ufunc (or method): NumPy raises TypeError
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        return self.fake._launch(name, getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        namespace = cupy_names.numpy_function_namespace(func.__module__ or "numpy")
        if func.__name__ not in cupy_names.NAMES.get(namespace, ()):
            return NotImplemented  # no CuPy function of that name: NumPy raises TypeError
        return self.fake._launch(func.__name__, func, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_a":  # no __array_interface__: no implicit copies
            raise AttributeError(name)
        if name not in cupy_names.ARRAY_ATTRIBUTES:
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")
        attr = getattr(self._a, name)
        if not callable(attr):
            return self._view(attr) if isinstance(attr, np.ndarray) else attr
        if name in _VIEW_METHODS:
            def view(*args, **kwargs):
                return self._view(attr(*args, **kwargs))
            return view

        def method(*args, **kwargs):
            return self.fake._launch(name, getattr(np.ndarray, name), (self, *args), kwargs)
        return method

    def __getitem__(self, key):
        if _has_array(key):
            if _has_mask(key):  # the result's size is on the device: CuPy reads it back
                self.fake.sync("boolean mask index")
            return self.fake._launch("getitem", _getitem, (self, self._index(key)), {})
        view = self._a[key]
        if isinstance(view, np.ndarray):
            return self._view(view)
        return self.fake._wrap(view, self._device_id)

    def __setitem__(self, key, value) -> None:
        if isinstance(value, np.ndarray) and value.ndim:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self.fake._launch("setitem", _setitem, (self, self._index(key), value), {})

    def _index(self, key):
        """CuPy copies NumPy arrays and lists used as indices to the current device."""
        if isinstance(key, tuple):
            return tuple(self._index(k) for k in key)
        if isinstance(key, (np.ndarray, list)):
            return self.fake.asarray(key)
        return key

    def copy(self, order="C"):
        """A copy on the *current* device (CuPy copies across devices here)."""
        fake = self.fake
        current = fake.current_device()
        if self._device_id != current:
            fake.events.append(f"peer copy gpu{self._device_id} -> gpu{current}")
        out = type(self)(self._a.copy(order), current)
        fake.stamp("copy", fake._current_stream(), reads=[self], writes=[out])
        return out

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if not copy and np.dtype(dtype) == self._a.dtype:
            return self
        return self.fake._launch("astype", np.ndarray.astype, (self, dtype), {"order": order})

    def fill(self, value) -> None:
        self.fake._launch("fill", np.ndarray.fill, (self, value), {})

    # -- transfers
    def get(self, stream=None, order="C", out=None, blocking=True):
        fake = self.fake
        stream = fake._current_stream(self._device_id) if stream is None else stream
        fake.d2h.append(self.shape)
        fake.stamp("d2h", stream, reads=[self])
        fake.events.append(f"d2h on {stream.name}")
        if blocking:
            fake.sync("get", stream.clock)
        host = np.array(self._a, order=order, copy=True)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        fake = self.fake
        stream = fake.cuda.get_current_stream() if stream is None else stream
        fake.h2d.append(self.shape)
        kind = "pinned" if is_pinned(arr) else "pageable"
        fake.stamp(f"h2d {kind}", stream, writes=[self])
        fake.events.append(f"h2d {kind} on {stream.name}")
        self._a[...] = arr

    # -- reading values on the host (each one a synchronisation)
    def _read(self, what: str) -> np.ndarray:
        stream = self.fake._current_stream(self._device_id)  # CuPy reads on the array's device
        self.fake.stamp(what, stream, reads=[self])
        self.fake.sync(what, stream.clock)
        return self._a

    def item(self):
        if self._a.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self._read("item").item()

    def tolist(self):
        return self._read("tolist").tolist()

    def __bool__(self) -> bool:
        return bool(self._read("bool"))

    def __float__(self) -> float:
        return float(self._read("float"))

    def __int__(self) -> int:
        return int(self._read("int"))

    def __complex__(self) -> complex:
        return complex(self._read("complex"))

    def __repr__(self) -> str:
        return repr(self._read("repr"))

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
            "construct a NumPy array explicitly."
        )

    __hash__ = None  # arrays are unhashable, as NumPy's are


def _check_dtype(dtype: np.dtype) -> None:
    """CuPy's arrays hold numbers and booleans only: no objects, strings, datetimes or structured
    types, and no extended precision (``longdouble``)."""
    if (dtype.kind in cupy_names.UNSUPPORTED_KINDS or (dtype.kind == "f" and dtype.itemsize > 8)
            or (dtype.kind == "c" and dtype.itemsize > 16)):
        raise ValueError(f"Unsupported dtype {dtype}")


def _arrays(x):
    """The device arrays in ``x`` (an array, or lists and tuples of them, or anything else)."""
    if isinstance(x, _Array):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _arrays(v)


def _getitem(a, key):
    return a[_wrapped(key, a.shape)]


def _setitem(a, key, value) -> None:
    a[_wrapped(key, a.shape)] = value


def _scatter_add(a, key, value) -> None:
    np.add.at(a, _wrapped(key, a.shape), value)


def _wrapped(key, shape):
    """CuPy wraps out-of-range integer-array indices around where NumPy raises (keys with ``...``
    or ``None`` are left as they are)."""
    keys = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis or k is None for k in keys):
        return key
    out, axis = [], 0
    for k in keys:
        if isinstance(k, np.ndarray) and k.dtype.kind in "iu" and axis < len(shape):
            out.append(k % shape[axis] if shape[axis] else k)
        else:
            out.append(k)
        axis += k.ndim if isinstance(k, np.ndarray) and k.dtype == bool else 1
    return tuple(out) if isinstance(key, tuple) else out[0]


def _has_mask(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(getattr(k, "dtype", None) == np.bool_ for k in keys)


def _has_array(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (_Array, np.ndarray, list)) for k in keys)


# -------------------------------------------------------------------------------------------------
# the modules


class _Ufunc:
    """A ufunc of the fake module: calls and methods (``reduce``...) launch through the fake."""

    def __init__(self, fake: FakeCupy, ufunc: np.ufunc):
        self._fake, self._ufunc = fake, ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        return self._fake._launch(self.__name__, self._ufunc, args, kwargs)

    def __getattr__(self, name):
        if name not in cupy_names.UFUNC_METHODS:
            raise AttributeError(f"'cupy.ufunc' object has no attribute '{name}'")
        if name == "at":  # in place, indices as in indexing (host arrays copied to the device)
            return self._at
        method = getattr(self._ufunc, name)
        if not callable(method):
            return method

        def call(*args, **kwargs):
            return self._fake._launch(f"{self.__name__}.{name}", method, args, kwargs)
        return call


    def _at(self, a, indices, b=None):
        def at(target, key, *value):
            self._ufunc.at(target, _wrapped(key, target.shape), *value)

        args = (a, a._index(indices)) + (() if b is None else (b,))
        self._fake._launch(f"{self.__name__}.at", at, args, {})


class _Namespace(types.ModuleType):
    """A NumPy namespace (``numpy``, ``numpy.linalg``...) seen through the fake: functions launch
    on the current device and return device arrays. Only the names real CuPy has
    (:mod:`fakes.cupy_names`) are there; others raise ``AttributeError`` as on CuPy."""

    def __init__(self, fake: FakeCupy, name: str, numpy_module):
        super().__init__(name)
        self._fake, self._numpy = fake, numpy_module

    def __getattr__(self, name):
        if name.startswith("__") or name not in cupy_names.NAMES.get(self.__name__, ()):
            raise AttributeError(f"module '{self.__name__}' has no attribute '{name}'")
        attr = getattr(self._numpy, name)
        if isinstance(attr, np.ufunc):
            attr = _Ufunc(self._fake, attr)
        elif callable(attr) and not isinstance(attr, type):
            attr = self._fake._function(name, attr)
        elif isinstance(attr, types.ModuleType):
            attr = _Namespace(self._fake, f"{self.__name__}.{name}", attr)
        setattr(self, name, attr)
        return attr


class _BitGenerator:
    """``Generator.bit_generator``: like CuPy's, its whole state is one device array (``_state``)
    that can be copied and written back; here it holds the words of NumPy's PCG64 state."""

    def __init__(self, fake: FakeCupy, bits: np.random.PCG64):
        self._bits = bits
        self._state = fake.ndarray(np.zeros(6, np.uint64), fake.current_device())
        self.save()

    def save(self) -> None:
        s = self._bits.state
        words = [s["state"]["state"] >> 64, s["state"]["state"], s["state"]["inc"] >> 64,
                 s["state"]["inc"], s["has_uint32"], s["uinteger"]]
        self._state._a[...] = [w & 0xFFFFFFFFFFFFFFFF for w in words]

    def load(self) -> None:
        w = [int(v) for v in self._state._a]
        self._bits.state = {"bit_generator": "PCG64", "has_uint32": w[4], "uinteger": w[5],
                            "state": {"state": w[0] << 64 | w[1], "inc": w[2] << 64 | w[3]}}


class _Generator:
    """``cupy.random.Generator``: draws with NumPy's generator, on the device current when it was
    made (drawing while another device is current is the peer-access error)."""

    def __init__(self, fake: FakeCupy, seed):
        self._fake, self._rng = fake, np.random.default_rng(seed)
        self.device_id = fake.current_device()
        self.bit_generator = _BitGenerator(fake, self._rng.bit_generator)

    def __getattr__(self, name):
        if name not in cupy_names.GENERATOR_METHODS:
            raise AttributeError(f"'Generator' object has no attribute '{name}'")
        method = getattr(self._rng, name)

        def draw(*args, **kwargs):
            fake = self._fake
            fake._check_current(self.device_id)
            self.bit_generator.load()  # the state may have been written back
            out = fake._launch(f"random.{name}", method, args, kwargs)
            self.bit_generator.save()
            return out if isinstance(out, _Array) else fake._wrap(np.asarray(out))
        return draw


class _MemoryPool:
    """``get_default_memory_pool()``/``get_default_pinned_memory_pool()``: no byte counts;
    ``free_all_blocks`` empties the fake's pool (``stream_order.MemoryPool``)."""

    def __init__(self, pool: MemoryPool):
        self._pool = pool

    def used_bytes(self) -> int:
        return 0

    total_bytes = used_bytes

    def free_all_blocks(self) -> None:
        self._pool.free_all_blocks()


class _Kernel:
    """``ElementwiseKernel``/``ReductionKernel``/``RawKernel``: built, but their CUDA C cannot
    run here."""

    def __init__(self, *args, **kwargs):
        names = [a for a in args if isinstance(a, str) and a.isidentifier()]
        self.name = kwargs.get("name") or (names[-1] if names else "kernel")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"the fake CuPy cannot run CUDA C kernels ({self.name})")


class _State(threading.local):
    """Per host thread: the current device, the devices saved by ``with Device``, the stream
    stacks per device."""

    def __init__(self):
        self.device = 0
        self.device_stack: list[int] = []
        self.streams: dict[int, list] = {}


class FakeCupy(_Namespace):
    """The fake ``cupy`` module (see the module docstring); ``fake.cupyx`` is the fake ``cupyx``.

    Inspection: ``events`` (launches, copies, records, waits in order), ``syncs`` (host
    synchronisations), ``h2d``/``d2h`` (the shapes copied each way); :meth:`clear` empties them.
    """

    def __init__(self, n_devices: int = 2, manual_completion: bool = False,
                 cupy_version: int = 14, scratch: str | None = None):
        super().__init__(self, "cupy", np)
        self.n_devices = n_devices
        self.__version__ = f"{cupy_version}.0.0"
        self.scratch = scratch or tempfile.gettempdir()  # where NCCL's ranks exchange buffers
        self.manual_completion = manual_completion
        self.pool = MemoryPool()  # device memory, one arena per stream (``stream_order``)
        self.host_clock: dict[str, int] = {}  # the GPU work the host has waited for
        self._by_name: dict[str, _Stream] = {}
        self.events: list[str] = []
        self.syncs: list[str] = []
        self.h2d: list[tuple] = []
        self.d2h: list[tuple] = []
        self._tls = _State()
        self.streams: dict[tuple, _Stream] = {}  # (ptr, device) -> every stream made
        self._sync_allowed = threading.local()
        self.ndarray = type("ndarray", (_Array,), {"fake": self, "__module__": "cupy"})
        device = type("Device", (_Device,), {"fake": self})
        stream = type("Stream", (_Stream,), {"fake": self})
        event = type("Event", (_Event,), {"fake": self})
        self._null = {}
        self.cuda_pid: int | None = None  # the process that initialised CUDA (None: none yet)
        runtime = types.SimpleNamespace(
            getDevice=self.current_device, setDevice=self.set_device,
            getDeviceCount=self._device_count, CUDARuntimeError=CUDARuntimeError,
            deviceSynchronize=lambda: self.sync("deviceSynchronize",
                                                self.device_clock(self.current_device())),
        )
        self.cuda = types.ModuleType("cupy.cuda")
        self.cuda.__dict__.update(
            Device=device, Stream=stream, Event=event, runtime=runtime,
            get_current_stream=self._current_stream, PinnedMemoryPointer=PinnedMemoryPointer,
            alloc_pinned_memory=self._alloc_pinned, nccl=make_nccl(self, cupy_version),
        )
        self.random = types.ModuleType("cupy.random")
        self.random.__dict__.update(default_rng=lambda seed=None: _Generator(self, seed),
                                    Generator=_Generator)
        self.ElementwiseKernel = self.ReductionKernel = self.RawKernel = _Kernel
        pool = _MemoryPool(self.pool)
        self.get_default_memory_pool = self.get_default_pinned_memory_pool = lambda: pool
        self.fuse = _fuse
        self.cupyx = _fake_cupyx(self)

    # -- the current device and stream (per thread)
    def _state(self) -> _State:
        return self._tls

    def init_cuda(self) -> None:
        """CUDA's lazy initialisation, which every CUDA call makes: the first one initialises
        CUDA in its process; in a process forked after its parent had initialised CUDA, every
        call fails with CUDA's initialization error (a forked child cannot use its parent's CUDA
        state, and CUDA cannot be initialised again there)."""
        pid = os.getpid()
        if self.cuda_pid is None:
            self.cuda_pid = pid
        elif self.cuda_pid != pid:
            raise CUDARuntimeError(CUDA_ERROR_INITIALIZATION,
                                   "cudaErrorInitializationError: initialization error")

    def current_device(self) -> int:
        """CUDA's current device of the calling thread (``cudaGetDevice``: a CUDA call)."""
        self.init_cuda()
        return self._tls.device

    def _device_count(self) -> int:
        self.init_cuda()
        return self.n_devices

    def _alloc_pinned(self, size: int) -> PinnedMemoryPointer:
        self.init_cuda()  # cudaHostAlloc
        return PinnedMemoryPointer(size)

    def set_device(self, index: int) -> None:
        """``cudaSetDevice``: CUDA's error for an index that does not exist."""
        self.init_cuda()
        index = int(index)
        if not 0 <= index < self.n_devices:
            raise CUDARuntimeError(CUDA_ERROR_INVALID_DEVICE,
                                   "cudaErrorInvalidDevice: invalid device ordinal")
        self._tls.device = index

    def _current_stream(self, device_id: int = -1):
        device_id = self.current_device() if device_id == -1 else device_id
        stack = self._tls.streams.get(device_id)
        if stack:
            return stack[-1]
        null = self._null.get(device_id)
        if null is None:
            null = self._null[device_id] = self.cuda.Stream(null=True, _device=device_id)
        return null

    # -- ordering and completion (``stream_order``)
    def issue(self, stream) -> None:
        """Issue one launch on ``stream``: it is ordered after what the host waited for and, by
        CUDA's legacy null stream rules, after the null stream's work (a blocking stream) or the
        blocking streams' work (the null stream)."""
        merge(stream.clock, self.host_clock)
        if stream.null:
            for other in self._by_name.values():
                if other.blocking and other.device_id == stream.device_id:
                    merge(stream.clock, other.clock)
        elif stream.blocking:
            null = self._null.get(stream.device_id)
            if null is not None:
                merge(stream.clock, null.clock)
        stream.issued += 1
        stream.clock[stream.name] = stream.issued

    def stamp(self, what: str, stream, reads=(), writes=()) -> None:
        """Issue ``what`` on ``stream``, reading the blocks of the arrays ``reads`` and writing
        those of ``writes``: ``UnorderedAccess`` for a use that another stream's use of a block
        is not ordered before (uses of another device's arrays, peer copies, are not checked)."""
        self.issue(stream)
        for arrays, write in ((reads, False), (writes, True)):
            for a in arrays:
                if a._device_id == stream.device_id:  # peer copies are not checked
                    a._block.use(stream.name, stream.clock, write, what)

    def device_clock(self, device_id: int) -> dict:
        """All the work issued so far on the device's streams (what a device sync waits for)."""
        clock: dict[str, int] = {}
        for stream in self._by_name.values():
            if stream.device_id == device_id:
                merge(clock, stream.clock)
        return clock

    def release(self, stream=None) -> None:
        """Complete the work issued so far on ``stream`` (and what it waits for), or on every
        stream: the test lets the GPU finish (the manual completion mode)."""
        streams = list(self._by_name.values()) if stream is None else [stream]
        for s in streams:
            self._complete(s.clock)

    def _complete(self, clock: dict) -> None:
        for name, n in clock.items():
            stream = self._by_name[name]
            stream._completed = max(stream._completed, n)

    # -- bookkeeping
    def sync(self, what: str, clock: dict | None = None) -> None:
        """Note a host synchronisation (``DeviceSynchronized`` where they are disallowed) that
        waits for the work in the vector clock ``clock`` (the current stream's by default): the
        host's later launches are ordered after it, and it has completed."""
        self.syncs.append(what)
        if not getattr(self._sync_allowed, "value", True):
            raise DeviceSynchronized(what)
        clock = self._current_stream().clock if clock is None else clock
        merge(self.host_clock, clock)
        self._complete(clock)

    def clear(self) -> None:
        """Forget the log, the synchronisations and the copies noted so far."""
        self.events.clear()
        self.syncs.clear()
        self.h2d.clear()
        self.d2h.clear()

    def _check_current(self, device_id: int) -> None:
        current = self.current_device()
        if device_id != current:
            raise ValueError(
                f"The device where the array resides ({device_id}) is different from the "
                f"current device ({current}). Peer access is unavailable between these devices."
            )

    # -- launching kernels
    def _operand(self, x):
        """A kernel operand: a device array of the current device (its NumPy array), a scalar, or
        containers/None of those; NumPy arrays are refused as CuPy refuses them."""
        if isinstance(x, _Array):
            self._check_current(x._device_id)
            return x._a
        if isinstance(x, np.ndarray):
            raise TypeError(f"Unsupported type {type(x)}")
        if isinstance(x, (list, tuple)):
            return type(x)(self._operand(v) for v in x)
        return x

    def _wrap(self, result, device_id: int | None = None, inputs=()):
        """Device arrays for a kernel's results: new memory, or the block of the input array
        ``result`` is a view of."""
        device_id = self.current_device() if device_id is None else device_id
        if isinstance(result, np.ndarray):
            for a in inputs:
                if np.may_share_memory(result, a._a):
                    return self.ndarray(result, device_id, a._block)
            return self.ndarray(result, device_id)
        if isinstance(result, np.generic):  # CuPy's reductions and indexing give 0-d arrays
            return self.ndarray(np.asarray(result), device_id)
        if isinstance(result, (list, tuple)):
            return type(result)(self._wrap(r, device_id, inputs) for r in result)
        return result

    def _launch(self, name: str, fn, args, kwargs):
        if name in _SIZE_FROM_DATA:
            self.sync(name)  # the output's size depends on the values: CuPy reads it back
        out = kwargs.get("out")
        reads = list(_arrays((args, [v for k, v in kwargs.items() if k != "out"])))
        if name in _IN_PLACE or name.endswith(".at"):  # the first operand is written, not read
            writes, reads = reads[:1], reads[1:]
        else:
            writes = list(_arrays(out))
        args = self._operand(tuple(args))
        kwargs = {k: self._operand(v) for k, v in kwargs.items()}
        stream = self._current_stream()
        if name == "matmul" and max(np.ndim(a) for a in args[:2]) > 2:
            for a in args[:2]:  # CuPy's batched product copies an operand that is not C-ordered
                if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
                    self.events.append(f"launch copy on {stream.name}")
        self.events.append(f"launch {name} on {stream.name}")
        result = fn(*args, **kwargs)
        if out is not None:
            self.stamp(name, stream, reads, writes)
            return out if not isinstance(out, tuple) or len(out) != 1 else out[0]
        wrapped = self._wrap(result, inputs=reads)
        shared = {id(a._block) for a in reads}
        if name not in _ALLOCATION_ONLY:
            writes += [a for a in _arrays(wrapped) if id(a._block) not in shared]
        self.stamp(name, stream, reads, writes)
        return wrapped

    def _function(self, name: str, fn):
        def call(*args, **kwargs):
            return self._launch(name, fn, args, kwargs)
        call.__name__ = name
        return call

    # -- CuPy's own functions
    def asarray(self, a, dtype=None, order=None, *, blocking=False):
        """Device arrays of the current device stay (cast if asked); those of another device are
        copied here; host data is copied to the current device."""
        if isinstance(a, _Array):
            if a._device_id != self.current_device():
                a = a.copy()
            return a.astype(dtype, copy=False) if dtype is not None else a
        host = np.asarray(a, dtype=dtype, order=order)
        self.h2d.append(host.shape)
        kind = "pinned" if is_pinned(host) else "pageable"
        stream = self._current_stream()
        out = self.ndarray(np.array(host, copy=True), self.current_device())
        self.stamp(f"h2d {kind}", stream, writes=[out])
        self.events.append(f"h2d {kind} on {stream.name}")
        if blocking:
            self.sync("asarray(blocking=True)")
        return out

    def array(self, obj, dtype=None, copy=True, order="K", subok=False, ndmin=0,
              *, blocking=False):
        if isinstance(obj, _Array):
            out = self.asarray(obj, dtype)
            return out.copy() if copy and out is obj else out
        return self.asarray(np.array(obj, dtype=dtype, order=order, ndmin=ndmin),
                            blocking=blocking)

    def ascontiguousarray(self, a, dtype=None):
        return self._launch("ascontiguousarray", np.ascontiguousarray, (a,), {"dtype": dtype})

    def asnumpy(self, a, stream=None, order="C", out=None, *, blocking=True):
        if isinstance(a, _Array):
            return a.get(stream=stream, order=order, out=out, blocking=blocking)
        return np.asarray(a, order=order)

    def get_array_module(self, *args):
        return self if any(isinstance(a, _Array) for a in args) else np


def _fuse(*args, **kwargs):
    """``cupy.fuse``: the function itself (its ufunc calls launch one by one here)."""
    if args and callable(args[0]):
        return args[0]
    return lambda fn: fn


def _fake_cupyx(fake: FakeCupy) -> types.ModuleType:
    cupyx = types.ModuleType("cupyx")

    def scatter_add(a, slices, value) -> None:
        fake._launch("scatter_add", _scatter_add, (a, a._index(slices), value), {})

    def empty_pinned(shape, dtype=float, order="C"):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.ndarray(shape, dtype, buffer=fake.cuda.alloc_pinned_memory(nbytes), order=order)

    @contextlib.contextmanager
    def allow_synchronize(allow: bool):
        old = getattr(fake._sync_allowed, "value", True)
        fake._sync_allowed.value = allow
        try:
            yield
        finally:
            fake._sync_allowed.value = old

    special = types.ModuleType("cupyx.scipy.special")
    special.erf = _Ufunc(fake, scipy.special.erf)
    cupyx.scipy = types.ModuleType("cupyx.scipy")
    cupyx.scipy.special = special
    cupyx.__dict__.update(scatter_add=scatter_add, empty_pinned=empty_pinned,
                          allow_synchronize=allow_synchronize,
                          DeviceSynchronized=DeviceSynchronized)
    return cupyx


# -------------------------------------------------------------------------------------------------
# installing it

_MODULES = ("cupy", "cupy.cuda", "cupy.cuda.nccl", "cupy.random", "cupyx", "cupyx.scipy",
            "cupyx.scipy.special")


class _HostKernels:
    """The GPU side of minigrad's fused kernels on the fake: each function runs its CPU version on
    the fake arrays' data (a launch on the current device, like any kernel). Registered for the
    fake's arrays with ``minigrad.backend.kernels.register_kernels``."""

    def __init__(self, fake: FakeCupy, cpu_kernels):
        self._fake, self._cpu = fake, cpu_kernels

    def __getattr__(self, name):
        fn = getattr(self._cpu, name)
        return lambda *args: self._fake._launch(f"kernel {name}", fn, args, {})


@contextlib.contextmanager
def installed(n_devices: int = 2, manual_completion: bool = False, cupy_version: int = 14):
    """Run minigrad on a fake CuPy with ``n_devices`` devices inside the block (GPU work completes
    only at host synchronisations and ``fake.release()`` with ``manual_completion``; NCCL's unique
    id as ``cupy_version``, 13 or 14, has it): it becomes
    minigrad's GPU array module and ``import cupy`` (``CUDA_VISIBLE_DEVICES`` lists the fake
    devices, so GPU counting sees them), and minigrad's fused kernels run their CPU versions on its
    arrays; everything is restored afterwards. Processes forked inside the block (``run_workers``)
    inherit the fake.

    Example::

        with installed(1) as fake:
            mg.tensor([1.0], device="gpu0")
    """
    scratch, installer = tempfile.mkdtemp(prefix="fake-cupy-"), os.getpid()
    fake = FakeCupy(n_devices, manual_completion, cupy_version, scratch)
    modules = dict(zip(_MODULES, (fake, fake.cuda, fake.cuda.nccl, fake.random, fake.cupyx,
                                  fake.cupyx.scipy, fake.cupyx.scipy.special)))
    saved_modules = {name: sys.modules.get(name) for name in _MODULES}
    saved_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    sys.modules.update(modules)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n_devices))
    kernels.register_kernels(fake.ndarray, _HostKernels(fake, kernels.backend_for(np.empty(0))))
    try:
        with use_cupy(fake, fake.cupyx):
            yield fake
    finally:
        kernels.unregister_kernels(fake.ndarray)
        if os.getpid() == installer:  # not in a forked rank leaving the block
            shutil.rmtree(scratch, ignore_errors=True)
        for name, module in saved_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        if saved_env is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved_env
