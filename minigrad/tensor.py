"""``Tensor``: a backend array, its device, its gradient and its place in the recorded graph.

A Tensor only holds data; every computation goes through ``minigrad.functional`` (the Python
operators below delegate there), so there is one place where an op is defined.
"""

from __future__ import annotations

import numbers

import numpy as np

from minigrad.autodiff.state import STATE
from minigrad.backend.device import Device, as_device, get_default_device_obj
from minigrad.backend.xp import cupy_or_none, get_array_module, to_numpy

_DTYPE_ALIASES = {"float": "float32", "int": "int32", "half": "float16", "double": "float64"}


def as_dtype(dtype) -> np.dtype | None:
    """Normalise a dtype spec (``"float32"``, ``np.float32``, ``mg.float32``) to ``np.dtype``."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        dtype = _DTYPE_ALIASES.get(dtype, dtype)
    return np.dtype(dtype)


def _default_dtype(data) -> np.dtype | None:
    """Python data gets float32/int32/bool like MegEngine; arrays keep their dtype."""
    if hasattr(data, "dtype"):
        return None
    if isinstance(data, bool):
        return np.dtype(bool)
    if isinstance(data, numbers.Integral):
        return np.dtype(np.int32)
    if isinstance(data, numbers.Real):
        return np.dtype(np.float32)
    arr = np.asarray(data)
    if arr.dtype.kind == "f":
        return np.dtype(np.float32)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize == 8:
        return np.dtype(np.int32)
    return None


class Tensor:
    """An n-dimensional array on a device, with autodiff support.

    Example::

        x = mg.tensor([[1.0, 2.0]], device="cpu0")
        (x * 2).sum().item()  # 6.0
    """

    __slots__ = (
        "_data",
        "_device",
        "_node",
        "_out_idx",
        "_requires_grad",
        "grad",
        "name",
        "__weakref__",
    )
    __array_priority__ = 1000  # make ndarray (+) Tensor defer to Tensor.__radd__

    def __init__(self, data=None, dtype=None, device=None, name: str | None = None):
        if data is None:
            data = []
        dev = as_device(device) if device is not None else None
        dtype = as_dtype(dtype)
        if isinstance(data, Tensor):
            if dev is None:
                dev = data._device
            array = data._data
        else:
            array = data
            if dtype is None:
                dtype = _default_dtype(data)
            if dev is None:
                cp = cupy_or_none()
                if cp is not None and isinstance(data, cp.ndarray):
                    dev = as_device(f"gpu{data.device.id}")
                else:
                    dev = get_default_device_obj()
        array = dev.put(array, dtype)
        if array is data or (isinstance(data, Tensor) and array is data._data):
            array = array.copy()
        self._data = array
        self._device = dev
        self._node = None
        self._out_idx = 0
        self._requires_grad = False
        self.grad = None
        self.name = name

    @classmethod
    def _wrap(cls, array, device: Device | None) -> "Tensor":
        """Wrap a backend array without copying or checking (the fast path ops use)."""
        if device is None:
            xp = get_array_module(array)
            device = as_device("cpu0") if xp is np else as_device(f"gpu{array.device.id}")
        if array.__class__ is not np.ndarray and device.kind == "cpu":
            array = np.asarray(array)  # NumPy scalars and Python numbers from reductions
        t = object.__new__(Tensor)
        t._data = array
        t._device = device
        t._node = None
        t._out_idx = 0
        t._requires_grad = False
        t.grad = None
        t.name = None
        return t

    # -- basic properties -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.dtype

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return self._data.size

    @property
    def device(self) -> Device:
        return self._device

    @property
    def xp(self):
        """The array module (numpy or cupy) of this tensor's data."""
        return self._device.xp

    @property
    def data(self):
        """The underlying backend array (no copy); mutate only outside recording."""
        return self._data

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad or (self._node is not None and self._node._epoch == STATE.epoch)

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype}, device={self._device})"

    # -- conversion ------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host NumPy copy of the data."""
        out = to_numpy(self._data)
        return out.copy() if out is self._data else out

    def item(self):
        if self._data.size != 1:
            raise ValueError(
                f"Tensor.item: only one-element tensors can be converted, got shape {self.shape}"
            )
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def __array__(self, dtype=None, copy=None):
        if self._device.kind != "cpu":
            raise TypeError(
                f"cannot convert a tensor on {self._device} to a NumPy array implicitly; "
                "use .numpy()"
            )
        return self._data if dtype is None else self._data.astype(dtype)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}")
        return int(self.item())

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise ValueError(
                f"the truth value of a tensor with {self._data.size} elements is ambiguous"
            )
        return bool(self.item())

    def to(self, device) -> "Tensor":
        """A copy on ``device`` (differentiable)."""
        return _F.copy(self, device)

    def cpu(self) -> "Tensor":
        return self.to("cpu0")

    def detach(self) -> "Tensor":
        """The same data, cut from the graph (shares memory)."""
        return Tensor._wrap(self._data, self._device)

    def astype(self, dtype) -> "Tensor":
        return _F.astype(self, dtype)

    def set_value(self, value) -> "Tensor":
        """Replace the data (shape and dtype kept) with a copy that this tensor owns: optimizers
        update parameters in place, which must never write into the caller's array (a state dict
        loaded with ``load_state_dict`` stays as it was)."""
        if isinstance(value, Tensor):
            value = value._data
        arr = self._device.put(value, self.dtype)
        if arr is value or getattr(arr, "base", None) is not None:
            arr = arr.copy()
        if arr.shape != self.shape:
            raise ValueError(
                f"set_value: shape {arr.shape} does not match tensor shape {self.shape}"
            )
        self._data = arr
        return self

    _reset = set_value

    def _ones_like(self) -> "Tensor":
        return Tensor._wrap(self.xp.ones(self.shape, self.dtype), self._device)

    @staticmethod
    def _zeros_for(node, idx) -> "Tensor":
        shape, dtype, device = node._out_meta[idx]
        return Tensor._wrap(device.xp.zeros(shape, dtype), device)

    # -- shape methods -----------------------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _F.reshape(self, shape)

    def transpose(self, *axes) -> "Tensor":
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _F.transpose(self, axes or None)

    @property
    def T(self) -> "Tensor":
        return _F.transpose(self, None)

    def flatten(self, start_axis: int = 0, end_axis: int = -1) -> "Tensor":
        return _F.flatten(self, start_axis, end_axis)

    def __getitem__(self, index) -> "Tensor":
        return _F.getitem(self, index)

    def __setitem__(self, index, value) -> None:
        if self.requires_grad and STATE.recording and STATE.enabled:
            raise RuntimeError(
                "Tensor.__setitem__: cannot modify a tensor in place while it is being recorded "
                "for gradients; use F.where / F.scatter instead"
            )
        index = _F.shape._raw_index(index)
        if isinstance(value, Tensor):
            value = value._data
        self._data[index] = value

    # -- reductions as methods ------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        return _F.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return _F.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _F.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return _F.min(self, axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        return _F.prod(self, axis, keepdims)

    def var(self, axis=None, keepdims=False):
        return _F.var(self, axis, keepdims)

    def std(self, axis=None, keepdims=False):
        return _F.std(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False):
        return _F.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False):
        return _F.argmin(self, axis, keepdims)

    # -- operators ------------------------------------------------------------------------------
    def __add__(self, other):
        return _F.add(self, other)

    def __radd__(self, other):
        return _F.add(other, self)

    def __sub__(self, other):
        return _F.sub(self, other)

    def __rsub__(self, other):
        return _F.sub(other, self)

    def __mul__(self, other):
        return _F.mul(self, other)

    def __rmul__(self, other):
        return _F.mul(other, self)

    def __truediv__(self, other):
        return _F.div(self, other)

    def __rtruediv__(self, other):
        return _F.div(other, self)

    def __floordiv__(self, other):
        return _F.floor_div(self, other)

    def __rfloordiv__(self, other):
        return _F.floor_div(other, self)

    def __mod__(self, other):
        return _F.mod(self, other)

    def __pow__(self, other):
        return _F.pow(self, other)

    def __rpow__(self, other):
        return _F.pow(other, self)

    def __matmul__(self, other):
        return _F.matmul(self, other)

    def __rmatmul__(self, other):
        return _F.matmul(other, self)

    def __neg__(self):
        return _F.neg(self)

    def __pos__(self):
        return self

    def __abs__(self):
        return _F.abs(self)

    def __invert__(self):
        return _F.logical_not(self)

    def __and__(self, other):
        return _F.logical_and(self, other)

    def __or__(self, other):
        return _F.logical_or(self, other)

    def __xor__(self, other):
        return _F.logical_xor(self, other)

    def __lt__(self, other):
        return _F.less(self, other)

    def __le__(self, other):
        return _F.less_equal(self, other)

    def __gt__(self, other):
        return _F.greater(self, other)

    def __ge__(self, other):
        return _F.greater_equal(self, other)

    def __eq__(self, other):  # noqa: D105  (elementwise, like NumPy)
        return _F.equal(self, other)

    def __ne__(self, other):
        return _F.not_equal(self, other)


class Parameter(Tensor):
    """A Tensor that is a trainable weight: modules collect these, optimizers update them."""

    __slots__ = ()

    def __init__(self, data=None, dtype=None, device=None, name: str | None = None):
        super().__init__(data, dtype=dtype, device=device, name=name)
        if self.dtype.kind != "f":
            raise TypeError(f"Parameter: parameters must be float, got dtype {self.dtype}")

    def __repr__(self) -> str:
        return "Parameter" + super().__repr__()[len("Tensor") :]


def tensor(data, dtype=None, device=None) -> Tensor:
    """Create a tensor (copying ``data``). Python floats become float32, Python ints int32."""
    return Tensor(data, dtype=dtype, device=device)


from minigrad import functional as _F  # noqa: E402  (functional needs Tensor defined first)
