"""minigrad: a small, readable deep-learning framework on NumPy (CPU) and CuPy (GPU), with a real
distributed runtime. Public names mirror MegEngine, so MegEngine programs run with only the import
changed::

    import minigrad as mg
    import minigrad.autodiff as ad
    import minigrad.functional as F

    x = mg.tensor([[1.0, 2.0]])
    (x * 2).sum().item()   # 6.0

Importing minigrad also tunes glibc's allocator for NumPy temporaries
(``minigrad.backend.allocator``; ``MINIGRAD_MALLOC=default`` turns that off).
"""

import importlib

# First, before anything imports NumPy: minigrad.backend sets OpenBLAS's thread-waiting policy,
# which OpenBLAS reads once, when NumPy loads it (see minigrad.backend.threads).
from minigrad import backend  # isort: split

from minigrad import aliases  # noqa: F401  (installs MegEngine's import paths: minigrad.aliases)

# isort: split
import minigrad.config as config
import minigrad.device as device  # MegEngine's module paths, served by minigrad.aliases
import minigrad.random as random
import minigrad.tensor  # noqa: F401  (imported before the line below makes mg.tensor the class)
from minigrad import autodiff, functional
from minigrad.autodiff import Function, GradManager, enable_grad, no_grad
from minigrad.autodiff.tensor import Parameter, Tensor, tensor
from minigrad.backend import (
    get_default_device,
    get_device_count,
    get_num_threads,
    is_cuda_available,
    set_default_device,
    set_num_threads,
)
from minigrad.backend.allocator import tune_malloc_unless_disabled
from minigrad.functional import creation as _creation
from minigrad.functional.creation import *  # noqa: F403  (mg.zeros, mg.arange... as MegEngine)
from minigrad.functional.random import rand, randint, randn
from minigrad.serialization import load, save

tune_malloc_unless_disabled()

_GLOBAL_VIEW = ("Graph", "placement", "sbp")  # OneFlow's names, from the distributed layer


#: PyTorch's and OneFlow's module names (``flow.optim.SGD``, ``flow.utils.data.DataLoader``,
#: ``flow.cuda.is_available()``), loaded on first use (see minigrad.aliases)
_LAZY_MODULES = {"hub": "minigrad.hub", "logger": "minigrad.logger", "optim": "minigrad.optim",
                 "utils": "minigrad.utils", "cuda": "minigrad.cuda",
                 "accelerator": "minigrad.accelerator"}


def __getattr__(name: str):
    """``mg.placement``, ``mg.sbp`` and ``mg.Graph`` (global tensors) load the distributed runtime
    on first use, so that ``import minigrad`` alone stays light; so do ``mg.hub``, ``mg.logger``
    and ``mg.get_logger`` (the ``logging`` package costs milliseconds to import), and PyTorch's
    and OneFlow's ``mg.optim``, ``mg.utils``, ``mg.cuda`` and ``mg.accelerator``."""
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    if name == "get_logger":
        return importlib.import_module("minigrad.logger").get_logger
    if name in _GLOBAL_VIEW:
        value = getattr(importlib.import_module("minigrad.distributed.global_tensor"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'minigrad' has no attribute {name!r}")

float16, float32, float64, bfloat16 = "float16", "float32", "float64", "bfloat16"
int8, int32, int64, uint8, bool_ = "int8", "int32", "int64", "uint8", "bool"
# PyTorch's other names (torch.float is float32, torch.long int64): t.type(mg.float)
float, double, long = "float32", "float64", "int64"  # noqa: A001

__version__ = "0.1.0"

__all__ = [
    "Function",
    "GradManager",
    "Parameter",
    "Tensor",
    "autodiff",
    "backend",
    "config",
    "device",
    "enable_grad",
    "functional",
    "get_default_device",
    "get_device_count",
    "get_logger",  # noqa: F405  (module __getattr__)
    "get_num_threads",
    "is_cuda_available",
    "load",
    "logger",  # noqa: F405  (module __getattr__)
    "no_grad",
    "rand",
    "randint",
    "randn",
    "random",
    "save",
    "set_default_device",
    "set_num_threads",
    "tensor",
    *_creation.__all__,
    *_GLOBAL_VIEW,
]
