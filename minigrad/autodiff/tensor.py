"""``Tensor``: a backend array, its device, its gradient and its place in the recorded graph.

A Tensor only holds data; every computation goes through ``minigrad.functional``, so there is one
place where an op is defined. That is the one link in the package that points upwards, and it is
made through a seam (:data:`minigrad.seams.FUNCTIONAL`): Tensor's operators and methods call the
module that ``minigrad.functional`` installs there once it is imported. Imports stay
one-way: backend -> ``autodiff.recording`` -> tensor -> the rest of autodiff -> functional -> ...

Graph-related behaviour (``requires_grad``, ``backward``) asks the node that produced the tensor,
so this module needs nothing from autodiff but its recording state: ``backward`` goes to the
manager of the node's recording (a ``GradManager``, or the eager autograd of
``minigrad.autodiff.eager`` bound to ``recording.EAGER``).

Global tensors (OneFlow's cluster-wide view, ``minigrad.distributed.global_tensor``) reach this
layer only through duck typing, never through an import: ``to_global`` and the ``placement=`` /
``sbp=`` arguments of the constructor and the creation functions call methods of the placement
object the user passes (``placement.to_global(tensor, sbp, ...)`` and ``placement.make_global(
tensor, sbp, logical)``), and a global tensor is a subclass that sets the class-level
``__minigrad_dispatch__`` hook read by ``Function.__call__``.
"""

from __future__ import annotations

import numbers
import weakref

import numpy as np

from minigrad import seams
from minigrad.autodiff.recording import EAGER, EAGER_TAPE, is_recording
from minigrad.backend.device import Device, as_device, get_default_device_obj
from minigrad.backend.device_checks import raise_deferred_errors
from minigrad.backend.dtypes import is_floating, parse_extra_dtype
from minigrad.backend.xp import cupy_or_none, get_array_module, to_numpy

_F = seams.FUNCTIONAL.value  # minigrad.functional once it is imported (minigrad.seams)


def _use_functional(module) -> None:
    """Bind the functional ops: ``_F`` for the methods, and the four arithmetic operators straight
    to their ops (``a + b`` is ``add(a, b)`` without a method frame in between: ~60 ns of the
    ~1.8 us a recorded op on a tiny tensor costs)."""
    global _F
    _F = module
    Tensor.__add__, Tensor.__sub__ = module.add, module.sub
    Tensor.__mul__, Tensor.__truediv__ = module.mul, module.div


seams.FUNCTIONAL.watch(_use_functional)


_DTYPE_ALIASES = {"float": "float32", "int": "int32", "half": "float16", "double": "float64",
                  "long": "int64"}


def as_dtype(dtype) -> np.dtype | None:
    """Normalise a dtype spec (``"float32"``, ``np.float32``, ``mg.float32``, ``"bfloat16"``) to
    ``np.dtype``; ``"bfloat16"`` comes from ``ml_dtypes`` (see ``minigrad.backend.dtypes``)."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        dtype = _DTYPE_ALIASES.get(dtype, dtype)
        extra = parse_extra_dtype(dtype)
        if extra is not None:
            return extra
    return np.dtype(dtype)


def _default_dtype(data) -> np.dtype | None:
    """Python data gets float32/int32/bool like MegEngine; arrays keep their dtype."""
    if hasattr(data, "dtype"):
        if data.dtype.kind == "V":
            is_floating(data.dtype)  # notes a bfloat16 array (backend.dtypes.SEEN)
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



#: NumPy ufuncs that are Python operators -> (the Tensor method for ``ufunc(tensor, other)``, the
#: one for ``ufunc(other, tensor)``); see ``Tensor.__array_ufunc__``.
_UFUNC_OPERATORS = {
    "add": ("__add__", "__radd__"), "subtract": ("__sub__", "__rsub__"),
    "multiply": ("__mul__", "__rmul__"), "true_divide": ("__truediv__", "__rtruediv__"),
    "divide": ("__truediv__", "__rtruediv__"),
    "floor_divide": ("__floordiv__", "__rfloordiv__"), "remainder": ("__mod__", "__rmod__"),
    "power": ("__pow__", "__rpow__"), "matmul": ("__matmul__", "__rmatmul__"),
    "bitwise_and": ("__and__", "__rand__"), "bitwise_or": ("__or__", "__ror__"),
    "bitwise_xor": ("__xor__", "__rxor__"), "left_shift": ("__lshift__", "__rlshift__"),
    "right_shift": ("__rshift__", "__rrshift__"), "equal": ("__eq__", "__eq__"),
    "not_equal": ("__ne__", "__ne__"), "less": ("__lt__", "__gt__"),
    "less_equal": ("__le__", "__ge__"), "greater": ("__gt__", "__lt__"),
    "greater_equal": ("__ge__", "__le__"),
}

class Tensor:
    """An n-dimensional array on a device, with autodiff support. ``mg.tensor`` is this class.

    Example::

        x = mg.tensor([[1.0, 2.0]], device="cpu0")
        (x * 2).sum().item()  # 6.0

    ``placement=`` and ``sbp=`` (OneFlow) make a global tensor whose logical value is ``data``
    (see ``minigrad.distributed.global_tensor``); ``Tensor(global_tensor)`` keeps its layout.

    What ops and the autodiff engine read and write (the op protocol): ``_data`` (the backend
    array), ``_device``, ``_node``/``_out_idx`` (the recorded node that produced this tensor and
    which of its outputs it is), ``_requires_grad`` (attached to a GradManager), ``_eager_grad``
    (outside GradManagers, ops on it are recorded for ``loss.backward()``: a trainable Parameter,
    a tensor given ``requires_grad=True``, or the output of such an op) and ``_wrap``.
    Tensors also take ad-hoc attributes (``param.grad_backup = ...``), as MegEngine's do.
    """

    __slots__ = (
        "_data",
        "_device",
        "_node",
        "_out_idx",
        "_requires_grad",
        "_eager_grad",
        "grad",
        "name",
        "__weakref__",
        "__dict__",
    )
    __array_priority__ = 1000  # make ndarray (+) Tensor defer to Tensor.__radd__
    #: Op dispatch hook of tensor subclasses (see ``minigrad.autodiff.function``); None: ops run
    #: on ``_data`` directly.
    __minigrad_dispatch__ = None

    def __init__(self, data=None, dtype=None, device=None, name: str | None = None, *,
                 placement=None, sbp=None, requires_grad: bool = False):
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
        self._eager_grad = False
        self.grad = None
        self.name = "" if name is None else name  # MegEngine: an unnamed tensor's name is ""
        if requires_grad:
            self.requires_grad_(True)
        if placement is not None or sbp is not None:
            place_new_tensor(self, placement, sbp, "tensor")
        elif isinstance(data, Tensor) and data.is_global:
            # OneFlow's nn.Parameter(global_tensor): the new tensor has the same pieces and layout
            data.placement.make_global(self, data.sbp, logical=False)

    @staticmethod
    def _wrap(array, device: Device | None) -> "Tensor":
        """Wrap a backend array without copying or checking (the fast path ops use; a static
        method: binding a class method cost 40-60 ns a call)."""
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
        t._eager_grad = False
        t.grad = None
        t.name = ""
        return t

    # -- basic properties -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """The shape, a tuple of ints."""
        return self._data.shape

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the elements."""
        return self._data.dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return self._data.ndim

    @property
    def size(self) -> int:
        """The number of elements."""
        return self._data.size

    @property
    def device(self) -> Device:
        """The device holding the data."""
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
        """True for a tensor attached to a GradManager, given ``requires_grad=True``, or produced
        by an op of a live recording, eager ones included (a :class:`Parameter` is True from the
        start, until frozen: see :meth:`Parameter.requires_grad_`)."""
        return self._eager_grad or self._in_graph()

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Mark this float leaf tensor as wanting a gradient (PyTorch's method; returns it):
        outside every GradManager, ops on it are then recorded and ``loss.backward()`` accumulates
        into its ``.grad`` (see ``minigrad.autodiff.eager``). Inside ``with gm:`` only
        ``gm.attach`` counts, as in MegEngine."""
        if requires_grad and not is_floating(self.dtype):
            raise RuntimeError(
                f"Tensor.requires_grad_: only float tensors can require gradients, got dtype "
                f"{self.dtype}"
            )
        if self._node is not None and self._node._tape is EAGER_TAPE:
            if requires_grad:
                return self  # the output of a recorded op requires gradients already
            raise RuntimeError(
                "Tensor.requires_grad_: this tensor is the output of a recorded op, not a leaf; "
                "use .detach() to get a tensor without gradients"
            )
        self._eager_grad = bool(requires_grad)
        return self

    def _in_graph(self) -> bool:
        """Attached to a GradManager, or produced by an op of a live recording: gradients may
        flow to or through this tensor right now."""
        node = self._node
        return self._requires_grad or (node is not None and node.is_live)

    def backward(self, gradient=None, retain_graph=None, create_graph: bool = False) -> None:
        """Back-propagate from this tensor (``gradient``, MegEngine's ``dy``, defaults to ones).

        Computed inside ``with gm:``, it goes to the most recently entered GradManager that
        recorded it and is still recording: ``gm.backward(self, gradient)``, which releases that
        manager's recording. Computed outside every GradManager from tensors that require
        gradients (parameters), it is PyTorch's eager backward (``minigrad.autodiff.eager``):
        gradients accumulate into the leaves' ``.grad`` and the graph is freed unless
        ``retain_graph=True``; a non-scalar tensor needs ``gradient``.

        Example::

            loss = loss_fn(model(x), y)   # no GradManager
            loss.backward()               # p.grad for every parameter p of model
            with gm:
                loss = model(x).mean()
                loss.backward()  # same as gm.backward(loss)
        """
        node = self._node
        recordings = () if node is None else node._tape
        if recordings is EAGER_TAPE or (node is None and self._eager_grad):
            EAGER.manager.backward(self, gradient, retain_graph=retain_graph,
                                   create_graph=create_graph)
            return
        managers = [r.manager for r in recordings if r.active and r.manager is not None]
        if not managers:
            raise RuntimeError(
                f"Tensor.backward: this tensor (shape {self.shape}, dtype {self.dtype}) was not "
                "produced by an op recorded by a GradManager that is still recording (compute "
                "it inside `with gm:` and call backward before the recording ends), nor by ops "
                "outside GradManagers on tensors that require gradients (parameters, or tensors "
                "given requires_grad=True, not under no_grad)"
            )
        if retain_graph or create_graph:
            raise ValueError(
                "Tensor.backward: retain_graph and create_graph apply to graphs recorded outside "
                "GradManagers; inside `with gm:` use gm.backward(y, dy, release=False), and "
                "nested GradManagers for higher-order gradients"
            )
        managers[-1].backward(self, gradient)

    def backward_seed(self, dy=None) -> "Tensor":
        """The gradient a backward pass starts from at this tensor: ``dy`` (already checked to
        have this tensor's shape) or ones. A global tensor returns this rank's share of it; this
        is the seam through which ``GradManager`` seeds a backward."""
        return self._ones_like() if dy is None else dy

    # -- global tensors (OneFlow): a local tensor's side of the protocol ---------------------------
    @property
    def is_global(self) -> bool:
        """False: a plain tensor lives on one process (a global tensor spans a placement)."""
        return False

    @property
    def placement(self):
        """Only global tensors have a placement; this raises for a local tensor."""
        raise RuntimeError(
            "Tensor.placement: this is a local tensor, only global tensors have a placement; "
            "make one with .to_global(placement, sbp)"
        )

    @property
    def sbp(self):
        """Only global tensors have an SBP; this raises for a local tensor."""
        raise RuntimeError(
            "Tensor.sbp: this is a local tensor, only global tensors have an SBP; make one with "
            ".to_global(placement, sbp)"
        )

    def to_global(self, placement=None, sbp=None, *, grad_sbp=None, check_meta: bool = True,
                  copy: bool = False) -> "Tensor":
        """A global tensor whose piece on this rank is this tensor (OneFlow's ``to_global``).

        ``placement`` is ``mg.placement(type, ranks)`` and ``sbp`` one ``mg.sbp`` value per mesh
        dimension: with ``split(0)`` this rank's rows are this tensor; with ``broadcast`` the data
        of the placement's first rank wins and overwrites the others' tensors (unless
        ``copy=True``); with ``partial_sum`` the logical value is the sum of the pieces.
        ``check_meta`` compares shapes and dtypes across ranks; ``grad_sbp`` fixes the SBP this
        tensor's gradient is taken in (default ``sbp``). Every rank must call it, in the same order.

        Example::

            x = mg.tensor(np.ones((2, 5))).to_global(mg.placement("cpu", [0, 1]), mg.sbp.split(0))
            x.shape   # (4, 5) on 2 ranks
        """
        if placement is None or sbp is None:
            raise RuntimeError(
                "Converting a local tensor to global tensor must have placement and sbp "
                "parameters."
            )
        _check_placement(placement, "Tensor.to_global")
        return placement.to_global(self, sbp, grad_sbp=grad_sbp, check_meta=check_meta,
                                   copy=copy)

    def to_local(self, copy: bool = False) -> "Tensor":
        """Only a global tensor has a local component; this raises for a local tensor."""
        raise RuntimeError(
            "Tensor.to_local: expected a global tensor but got a local tensor (shape "
            f"{self.shape}, dtype {self.dtype})"
        )

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
        """A host NumPy copy of the data. For a GPU tensor this waits for the GPU, and then raises
        what a deferred index check found (``minigrad.backend.device_checks``)."""
        out = to_numpy(self._data)
        if out is self._data:
            return out.copy()
        raise_deferred_errors()
        return out

    def item(self):
        """The single element as a Python number."""
        if self._data.size != 1:
            raise ValueError(
                f"Tensor.item: only one-element tensors can be converted, got shape {self.shape}"
            )
        return self.numpy().reshape(()).item()

    def tolist(self):
        """The data as nested Python lists."""
        return self.numpy().tolist()

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        """NumPy functions on Tensors (MegEngine's rule): ``np.add(t, a)``, ``np.equal(a, t)`` and
        the other ufuncs that are Python operators run as the operator, so they return Tensors
        (on ``t``'s device, differentiable). Any other use (``np.exp(t)``, ``out=``, ``reduce``)
        computes on the NumPy arrays and returns NumPy arrays, as before."""
        names = _UFUNC_OPERATORS.get(ufunc.__name__)
        if method == "__call__" and not kwargs and names is not None and len(inputs) == 2:
            a, b = inputs
            if isinstance(a, Tensor) and hasattr(a, names[0]):
                return getattr(a, names[0])(b)
            if not isinstance(a, Tensor) and hasattr(b, names[1]):
                return getattr(b, names[1])(a)
        plain = [x.__array__() if isinstance(x, Tensor) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(x.__array__() if isinstance(x, Tensor) else x
                                  for x in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)

    def __array__(self, dtype=None, copy=None):
        if self._device.kind != "cpu":
            raise TypeError(
                f"cannot convert a tensor on {self._device} to a NumPy array implicitly; "
                "use .numpy()"
            )
        return self._data if dtype is None else self._data.astype(dtype)

    def __format__(self, spec: str) -> str:
        """``f"{loss:>7f}"`` formats a one-element tensor as its number (PyTorch, OneFlow);
        an empty spec gives ``str(t)``; other specs on bigger tensors raise ``TypeError``."""
        if not spec:
            return str(self)
        if self._data.size != 1:
            raise TypeError(
                f"Tensor.__format__: format spec {spec!r} needs a one-element tensor, got shape "
                f"{self.shape}"
            )
        return format(self.item(), spec)

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

    def to(self, *args, device=None, dtype=None) -> "Tensor":
        """A copy on ``device`` and/or converted to ``dtype`` (differentiable), in PyTorch's and
        OneFlow's spellings: ``t.to("cpu")``, ``t.to(dtype=mg.int64)``, ``t.to("gpu0",
        "float16")``, ``t.to(other)`` (other's device and dtype). A device always copies; a dtype
        alone converts only when it differs; with neither, ``t`` itself.

        Example::

            x = x.to(DEVICE)
            labels = pred.argmax(1).to(dtype=mg.int64)
        """
        for arg in args:
            if isinstance(arg, Tensor):
                device, dtype = arg._device, arg.dtype
            elif isinstance(arg, Device):
                device = arg
            else:
                try:
                    dtype = as_dtype(arg)
                except TypeError:
                    device = arg
        out = self
        if dtype is not None and as_dtype(dtype) != self.dtype:
            out = _F.astype(out, dtype)
        if device is not None:
            out = _F.copy(out, device)
        return out

    def type(self, dtype=None):
        """PyTorch's ``t.type(dtype)``: the tensor converted to ``dtype`` (``t.type(mg.float)``);
        without a dtype, the name of this tensor's dtype."""
        if dtype is None:
            return self.dtype.name
        return self.to(dtype=dtype)

    def move_to_(self, device) -> "Tensor":
        """Move this tensor's data to ``device`` in place and return it: the object stays, so
        the modules and optimizers holding it keep working (``Module.to(device)`` does this to
        every parameter and buffer). Its ``.grad`` moves too. Only for leaves (tensors not
        produced by a recorded op) on one process."""
        dev = as_device(device)
        if dev == self._device:
            return self
        if self.is_global or self._node is not None:
            kind = "a global tensor" if self.is_global else "the output of a recorded op"
            raise RuntimeError(f"Tensor.move_to_: cannot move {kind} in place; use .to(device)")
        self._data = dev.put(to_numpy(self._data) if self._device.kind != "cpu" else self._data)
        self._device = dev
        if isinstance(self.grad, Tensor):
            self.grad.move_to_(dev)
        return self

    def cpu(self) -> "Tensor":
        """A copy on ``cpu0`` (differentiable)."""
        return self.to("cpu0")

    def detach(self) -> "Tensor":
        """The same data, cut from the graph (shares memory)."""
        return Tensor._wrap(self._data, self._device)

    def astype(self, dtype) -> "Tensor":
        """A copy converted to ``dtype`` (differentiable between float dtypes)."""
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

    def reset_zero(self) -> "Tensor":
        """Fill with zeros in place (MegEngine's ``reset_zero``); shape, dtype and device kept."""
        with self._device.context():
            self._data = self.xp.zeros(self.shape, self.dtype)
        return self

    @property
    def format(self) -> str:
        """MegEngine's memory-format tag: always ``"default"`` (minigrad keeps one layout)."""
        return "default"

    def __deepcopy__(self, memo) -> "Tensor":
        """An independent copy (``copy.deepcopy(model)`` for an EMA copy, say): same class,
        data, device, name and gradient, a frozen parameter still frozen; not attached to any
        GradManager and cut from any graph."""
        if type(self) not in (Tensor, Parameter):
            raise TypeError(f"copy.deepcopy: a {type(self).__name__} cannot be deep-copied; copy "
                            "its local piece (to_local()) or the module before to_global")
        with self._device.context():
            out = type(self)(self._data.copy(), device=self._device, name=self.name)
        memo[id(self)] = out
        if self.grad is not None:
            out.grad = self.grad.__deepcopy__(memo) if isinstance(self.grad, Tensor) else (
                self.grad.copy())
        if isinstance(self, Parameter) and not self.requires_grad:
            out.requires_grad_(False)
        elif self._eager_grad and self._node is None:
            out._eager_grad = True
        return out

    def set_(self, source) -> "Tensor":
        """Point this tensor at ``source`` (a backend array on its device, same shape and dtype)
        without copying: PyTorch's ``set_``. For memory another layer owns and fills, e.g. the
        gradient all-reduce hands each gradient a view of its reduced bucket."""
        if source.shape != self.shape or source.dtype != self.dtype:
            raise ValueError(
                f"set_: expected {self.shape} {self.dtype.name}, got {source.shape} "
                f"{source.dtype.name}"
            )
        self._data = source
        return self

    def _ones_like(self) -> "Tensor":
        with self._device.context():
            return Tensor._wrap(self.xp.ones(self.shape, self.dtype), self._device)

    # -- shape methods -----------------------------------------------------------------------------
    def reshape(self, *shape) -> "Tensor":
        """``F.reshape``: ``t.reshape(2, 3)`` or ``t.reshape((2, 3))``."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return _F.reshape(self, shape)

    def transpose(self, *axes) -> "Tensor":
        """``F.transpose``: permute the axes (reverse them when none are given)."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return _F.transpose(self, axes or None)

    @property
    def T(self) -> "Tensor":
        """The tensor with its axes reversed."""
        return _F.transpose(self, None)

    def flatten(self, start_axis: int = 0, end_axis: int = -1) -> "Tensor":
        """``F.flatten``: merge axes ``start_axis`` .. ``end_axis`` into one."""
        return _F.flatten(self, start_axis, end_axis)

    def __getitem__(self, index) -> "Tensor":
        return _F.getitem(self, index)

    def __setitem__(self, index, value) -> None:
        if self._in_graph() and is_recording():
            raise RuntimeError(
                "Tensor.__setitem__: cannot modify a tensor in place while it is being recorded "
                "for gradients; use F.where / F.scatter instead"
            )
        index = raw_index(index)
        if isinstance(value, Tensor):
            value = value._data
        elif not isinstance(value, numbers.Number):
            value = self._device.put(value)  # CuPy takes arrays of its own, or numbers
        with self._device.context():
            self._data[index] = value

    # -- reductions as methods ------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        """``F.sum`` over ``axis`` (all axes when None)."""
        return _F.sum(self, axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        """``F.mean`` over ``axis`` (all axes when None)."""
        return _F.mean(self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        """``F.max`` over ``axis`` (all axes when None)."""
        return _F.max(self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        """``F.min`` over ``axis`` (all axes when None)."""
        return _F.min(self, axis, keepdims)

    def prod(self, axis=None, keepdims=False):
        """``F.prod`` over ``axis`` (all axes when None)."""
        return _F.prod(self, axis, keepdims)

    def var(self, axis=None, keepdims=False):
        """``F.var`` (population variance) over ``axis``."""
        return _F.var(self, axis, keepdims)

    def std(self, axis=None, keepdims=False):
        """``F.std`` (population standard deviation) over ``axis``."""
        return _F.std(self, axis, keepdims)

    def argmax(self, axis=None, keepdims=False):
        """``F.argmax``: indices of the maxima along ``axis``."""
        return _F.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims=False):
        """``F.argmin``: indices of the minima along ``axis``."""
        return _F.argmin(self, axis, keepdims)

    def sum_to(self, shape) -> "Tensor":
        """``F.sum_to``: sum a broadcast tensor back down to ``shape`` (broadcasting's adjoint)."""
        return _F.sum_to(self, shape)

    # -- operators ------------------------------------------------------------------------------
    # __add__, __sub__, __mul__ and __truediv__ are F.add, F.sub, F.mul and F.div themselves
    # (set by _use_functional when minigrad.functional loads)

    def __radd__(self, other):
        return _F.add(other, self)

    def __rsub__(self, other):
        return _F.sub(other, self)

    def __rmul__(self, other):
        return _F.mul(other, self)

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

    def __lshift__(self, other):
        return _F.left_shift(self, other)

    def __rlshift__(self, other):
        return _F.left_shift(_F.full_like(self, other), self)

    def __rshift__(self, other):
        return _F.right_shift(self, other)

    def __rrshift__(self, other):
        return _F.right_shift(_F.full_like(self, other), self)

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


tensor = Tensor  # MegEngine: ``mge.tensor is mge.Tensor`` (``isinstance(x, mge.tensor)`` works)


class Parameter(Tensor):
    """A Tensor that is a trainable weight: modules collect these, optimizers update them.
    Parameters are float: integer or boolean data without an explicit dtype becomes float32, as in
    MegEngine.

    Example::

        w = mg.Parameter([[1, 2], [3, 4]])  # float32
    """

    __slots__ = ()

    def __init__(self, data=None, dtype=None, device=None, name: str | None = None):
        super().__init__(data, dtype=dtype, device=device, name=name)
        if not is_floating(self.dtype):
            if dtype is not None:
                raise TypeError(f"Parameter: parameters must be float, got dtype {self.dtype}")
            self._data = self._data.astype(np.float32)
        self._eager_grad = True  # trainable by default: eager autograd records ops on it

    @property
    def requires_grad(self) -> bool:
        """True unless frozen by ``requires_grad_(False)``: parameters are trainable by default, as
        in PyTorch, so ``[p for p in net.parameters() if p.requires_grad]`` selects them before
        any GradManager is attached. A frozen parameter gets no gradient, even when attached."""
        return not is_frozen(self)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> "Parameter":
        """Freeze (False) or unfreeze (True) this parameter in place; returns it (PyTorch's
        method). Frozen, it takes no part in recordings, so no GradManager computes or delivers
        its gradient and eager autograd (``loss.backward()`` outside GradManagers) records no op
        on it; unfrozen, both do again."""
        key = id(self)
        entry = _FROZEN.get(key)
        frozen = entry is not None and entry[0]() is self
        self._eager_grad = bool(requires_grad)
        if requires_grad and frozen:
            del _FROZEN[key]
            self._requires_grad = self._requires_grad or entry[1][0]
        elif not requires_grad and not frozen:
            ref = weakref.ref(self, lambda _r, key=key: _FROZEN.pop(key, None))
            _FROZEN[key] = (ref, [self._requires_grad])
            self._requires_grad = False
        return self

    def __repr__(self) -> str:
        return "Parameter" + super().__repr__()[len("Tensor") :]


#: Parameters frozen by ``requires_grad_(False)``: id -> (weak reference, [was attached]).
_FROZEN: dict[int, tuple[weakref.ref, list[bool]]] = {}


def is_frozen(t: Tensor) -> bool:
    """True for a Parameter frozen by ``requires_grad_(False)``."""
    entry = _FROZEN.get(id(t))
    return entry is not None and entry[0]() is t


def mark_attached(t: Tensor) -> None:
    """Let gradients flow to ``t`` (a GradManager attaches it); a frozen parameter only remembers
    it, and joins recordings when it is unfrozen."""
    entry = _FROZEN.get(id(t))
    if entry is not None and entry[0]() is t:
        entry[1][0] = True
    else:
        t._requires_grad = True


def _check_placement(placement, op: str) -> None:
    if not (hasattr(placement, "to_global") and hasattr(placement, "make_global")):
        raise TypeError(
            f"{op}: placement must be mg.placement(type, ranks), got {placement!r}"
        )


def place_new_tensor(tensor: Tensor, placement, sbp, op: str) -> Tensor:
    """Make a freshly created ``tensor``, which holds the whole logical value on every rank, a
    global tensor on ``placement`` with ``sbp`` (each rank keeps its piece; no communication):
    the ``placement=``/``sbp=`` arguments of the constructor and of the creation functions. Both
    must be given; ``tensor`` itself becomes the global tensor and is returned."""
    if placement is None or sbp is None:
        raise RuntimeError(
            f"{op}: creating a global tensor needs both placement and sbp, got placement="
            f"{placement!r} and sbp={sbp!r}"
        )
    _check_placement(placement, op)
    return placement.make_global(tensor, sbp, logical=True)


def raw_index(index):
    """An index with the Tensors inside it replaced by their backend arrays."""
    if isinstance(index, Tensor):
        return index._data
    if isinstance(index, tuple):
        return tuple(i._data if isinstance(i, Tensor) else i for i in index)
    if isinstance(index, list) and any(isinstance(i, Tensor) for i in index):
        return [i._data if isinstance(i, Tensor) else i for i in index]
    return index
