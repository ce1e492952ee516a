"""Reading MegEngine checkpoints (``.mge``/``.pkl`` files written by ``megengine.save``) without
running any code from the file.

``megengine.save`` is ``pickle.dump``. What it writes for the objects checkpoints hold:

* ``Module.state_dict()``: an ``OrderedDict`` of parameter name -> NumPy array (norm layers'
  tensors flattened to ``(C,)``); ``Optimizer.state_dict()``: dicts and lists of numbers, strings
  and NumPy arrays;
* a ``Tensor``/``Parameter`` (when a whole module or raw tensors are saved): the class
  ``megengine.tensor.Tensor``/``Parameter`` created with ``__new__(cls, ndarray, dtype,
  device_name, is_const, no_cache, name, format)`` and then given the state ``{"qparams": None}``
  (files from MegEngine 1.1/1.2 give ``{"data", "device", "dtype"}`` instead);
* NumPy arrays, dtypes and scalars through NumPy's own pickle helpers.

Unpickling normally *imports and calls* whatever a file names, ``os.system`` as easily as
``numpy.dtype``. Every such reference goes through ``Unpickler.find_class``, so this reader
overrides it with a fixed allowlist: NumPy's array/dtype/scalar rebuilders (refusing object
dtypes, which could smuggle arbitrary Python objects), ``collections.OrderedDict``, the latin-1
``bytes`` helper of old protocols, and MegEngine's tensor classes, which are replaced by inert
records that become minigrad tensors afterwards. Anything else, and persistent ids, stop the load
*before* anything named is called (PyTorch's ``weights_only=True`` works the same way). Lists,
tuples, dicts, strings, numbers, booleans and None need no reference at all.

Use it through ``mg.load(path, format="megengine")`` (or plain ``mg.load``, which detects pickles).

Example::

    state = mg.load("resnet18.mge", format="megengine")  # an OrderedDict of NumPy arrays
    net.load_state_dict(state)
"""

from __future__ import annotations

import io
import pickle
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from minigrad.autodiff.tensor import Parameter, Tensor

__all__ = ["MegEngineCheckpointError", "RefusedPickleError", "load_megengine"]


class MegEngineCheckpointError(ValueError):
    """The file is not a readable MegEngine checkpoint (not a pickle, truncated, malformed)."""


class RefusedPickleError(MegEngineCheckpointError):
    """The file asks for something outside the allowlist (it could run code): nothing was run."""


def _refuse(what: str) -> RefusedPickleError:
    return RefusedPickleError(
        f"the file refers to {what}, which a MegEngine checkpoint never needs and which could run "
        "code when rebuilt; it was refused before anything was called"
    )


# -- the allowlist: what each permitted global becomes ------------------------------------------


def _safe_dtype(*args) -> np.dtype:
    """``numpy.dtype(...)`` that refuses object dtypes (their arrays hold Python objects)."""
    dtype = np.dtype(*args)
    if dtype.hasobject:
        raise _refuse(f"an array of Python objects (dtype {dtype})")
    return dtype


class _NdarrayClass:
    """Stands for ``numpy.ndarray`` in a pickle: only NumPy's array rebuilders may receive it."""

    def __new__(cls, *args, **kwargs):
        raise _refuse("a direct call of numpy.ndarray")


def _reconstruct(subtype, shape, dtype) -> np.ndarray:
    """NumPy's ``_reconstruct``: an empty array whose data the following BUILD fills in."""
    if not (isinstance(subtype, type) and issubclass(subtype, _NdarrayClass)):
        raise _refuse(f"an ndarray subclass ({subtype!r})")
    return np.ndarray(shape, dtype=_safe_dtype(dtype))


def _frombuffer(buffer, dtype, shape, order) -> np.ndarray:
    """NumPy's protocol-5 rebuilder: an array over the given bytes (copied, so it is writable)."""
    if not isinstance(buffer, (bytes, bytearray)):
        raise _refuse(f"an array buffer of type {type(buffer).__name__}")
    return np.frombuffer(buffer, dtype=_safe_dtype(dtype)).reshape(shape, order=order).copy()


def _scalar(dtype, data=None):
    """NumPy's ``scalar``: one value of ``dtype`` from its raw bytes."""
    dtype = _safe_dtype(dtype)
    if not isinstance(data, bytes):
        raise _refuse(f"a NumPy scalar built from {type(data).__name__}")
    return np.frombuffer(data, dtype=dtype, count=1)[0]


def _latin1_bytes(text, encoding) -> bytes:
    """``_codecs.encode(text, "latin1")``: how protocols 0-2 spell a ``bytes`` object."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise _refuse(f"_codecs.encode with {type(text).__name__} and {encoding!r}")
    return text.encode("latin-1")


class _TensorRecord:
    """What a pickled MegEngine Tensor holds (its ``__new__`` arguments and state); it becomes a
    minigrad Tensor once the whole file has been read."""

    def __new__(cls, *args, **kwargs):
        record = object.__new__(cls)
        record.args, record.state = args, {}
        return record

    def __setstate__(self, state) -> None:
        if not isinstance(state, dict) or not set(state) <= {"qparams", "qdict", "data",
                                                              "device", "dtype"}:
            raise _refuse(f"a MegEngine tensor state with {sorted(state)}")
        qdict = state.get("qdict")  # MegEngine 1.1/1.2: {"mode": None, ...} when not quantised
        if state.get("qparams") is not None or (qdict is not None and (
                not isinstance(qdict, dict) or any(v is not None for v in qdict.values()))):
            raise _refuse("quantisation parameters (QParams) of a MegEngine tensor")
        self.state = state

    def array_and_device(self) -> tuple[np.ndarray, str]:
        data = self.args[0] if self.args else self.state.get("data")
        dtype = self.args[1] if len(self.args) > 1 else self.state.get("dtype")
        device = self.args[2] if len(self.args) > 2 else self.state.get("device", "cpu0")
        if not isinstance(data, np.ndarray) or not isinstance(device, str):
            raise MegEngineCheckpointError(
                f"a MegEngine tensor record holds {type(data).__name__} data on a "
                f"{type(device).__name__} device, expected a NumPy array and a device name"
            )
        return (data if dtype is None else data.astype(_safe_dtype(dtype), copy=False)), device


class _ParameterRecord(_TensorRecord):
    """A pickled MegEngine Parameter."""


#: NumPy's scalar types, which MegEngine 1.1/1.2 pickled as a tensor's dtype (``numpy.int8``). They
#: are C types (a file cannot change their attributes) and calling one only makes a number.
_SCALAR_TYPES = {("numpy", t.__name__): t for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64)}


def _allowlist() -> dict[tuple[str, str], Any]:
    """The permitted globals, made afresh for every load: a pickle's BUILD opcode can set
    attributes on any object it holds, classes and functions included, so nothing shared between
    loads is ever handed out (a file cannot leave anything behind for the next one)."""

    def fresh(fn):
        def call(*args, **kwargs):
            return fn(*args, **kwargs)

        return call

    numpy = {(f"numpy.{core}.{module}", name): fresh(fn)  # NumPy 1: numpy.core, 2: numpy._core
             for core in ("core", "_core")
             for module, name, fn in (("multiarray", "_reconstruct", _reconstruct),
                                      ("multiarray", "scalar", _scalar),
                                      ("numeric", "_frombuffer", _frombuffer))}
    tensor = type("Tensor", (_TensorRecord,), {})
    parameter = type("Parameter", (_ParameterRecord,), {})
    return {
        ("collections", "OrderedDict"): OrderedDict,  # a C type: its attributes are read-only
        ("_codecs", "encode"): fresh(_latin1_bytes),
        ("numpy", "dtype"): fresh(_safe_dtype),
        ("numpy", "ndarray"): type("ndarray", (_NdarrayClass,), {}),
        **numpy,
        **_SCALAR_TYPES,
        ("megengine.tensor", "Tensor"): tensor,
        ("megengine.tensor", "Parameter"): parameter,
        ("megengine", "Tensor"): tensor,
        ("megengine", "Parameter"): parameter,
    }


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file, encoding: str = "ASCII"):
        super().__init__(file, encoding=encoding)
        self._allowed = _allowlist()

    def find_class(self, module: str, name: str):
        target = self._allowed.get((module, name))
        if target is None:
            raise _refuse(f"{module}.{name}")
        return target

    def persistent_load(self, pid):
        raise _refuse(f"a persistent object id ({pid!r})")


# -- turning the result into minigrad values ---------------------------------------------------


def _default_tensor(array: np.ndarray, device: str, parameter: bool):
    return (Parameter if parameter else Tensor)(array, device=device)


def _convert(obj, make_tensor, memo: dict):
    """Replace tensor records by tensors (a shared record by one shared tensor) and check that
    only plain values remain."""
    if isinstance(obj, (type(None), bool, int, float, complex, str, bytes, np.dtype)):
        return obj
    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.hasobject:
            raise _refuse(f"an array of Python objects (dtype {obj.dtype})")
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, _TensorRecord):  # base-class method and type test: BUILD cannot fake them
        array, device = _TensorRecord.array_and_device(obj)
        out = make_tensor(array, device, isinstance(obj, _ParameterRecord))
    elif isinstance(obj, list):
        out = [_convert(v, make_tensor, memo) for v in obj]
    elif isinstance(obj, tuple):
        out = tuple(_convert(v, make_tensor, memo) for v in obj)
    elif isinstance(obj, dict):
        items = [(_convert(k, make_tensor, memo), _convert(v, make_tensor, memo))
                 for k, v in obj.items()]
        out = OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
    else:
        raise _refuse(f"a value of type {type(obj).__name__}")
    memo[key] = out
    return out


def load_megengine(f, make_tensor: Callable[[np.ndarray, str, bool], Any] | None = None,
                   encoding: str = "ASCII") -> Any:
    """Read a checkpoint written by ``megengine.save`` from a path, a binary file object or bytes,
    without running code from it (see the module docstring). NumPy arrays and plain containers come
    back as they were; MegEngine tensors become ``make_tensor(array, device_name, is_parameter)``
    (default: a minigrad Tensor/Parameter on the device it was saved from).

    ``encoding`` decodes Python 2 ``str`` objects, as in :func:`pickle.load`: ``"latin1"`` reads
    Python 2 pickles of NumPy arrays, such as the CIFAR batch files, with the same allowlist."""
    if isinstance(f, (bytes, bytearray)):
        payload = bytes(f)
    elif hasattr(f, "read"):
        payload = f.read()
    else:
        with open(f, "rb") as handle:
            payload = handle.read()
    try:
        raw = _RestrictedUnpickler(io.BytesIO(payload), encoding).load()
    except RefusedPickleError:
        raise
    except Exception as exc:  # truncated, not a pickle, a rebuilder given nonsense
        raise MegEngineCheckpointError(
            f"not a readable MegEngine checkpoint: {type(exc).__name__}: {exc}"
        ) from None
    return _convert(raw, make_tensor or _default_tensor, {})
