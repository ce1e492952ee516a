"""minigrad: a small, readable deep-learning framework on NumPy (CPU) and CuPy (GPU), with a real
distributed runtime. Public names mirror MegEngine, so MegEngine programs run with only the import
changed::

    import minigrad as mg
    import minigrad.autodiff as ad
    import minigrad.functional as F
"""

from minigrad.backend.allocator import tune_malloc_unless_disabled

tune_malloc_unless_disabled()

from minigrad import autodiff, functional, random  # noqa: E402
from minigrad.autodiff import Function, GradManager, enable_grad, no_grad  # noqa: E402
from minigrad.backend import (  # noqa: E402
    get_default_device,
    get_device_count,
    get_num_threads,
    is_cuda_available,
    set_default_device,
    set_num_threads,
)
from minigrad.functional.creation import (  # noqa: E402
    arange,
    eye,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    zeros,
    zeros_like,
)
from minigrad.serialization import load, save  # noqa: E402
from minigrad.tensor import Parameter, Tensor, tensor  # noqa: E402, I001

float16, float32, float64 = "float16", "float32", "float64"
int8, int32, int64, uint8, bool_ = "int8", "int32", "int64", "uint8", "bool"

__version__ = "0.1.0"

__all__ = [
    "Function",
    "GradManager",
    "Parameter",
    "Tensor",
    "arange",
    "autodiff",
    "enable_grad",
    "eye",
    "full",
    "full_like",
    "functional",
    "get_default_device",
    "get_device_count",
    "get_num_threads",
    "is_cuda_available",
    "linspace",
    "load",
    "no_grad",
    "ones",
    "ones_like",
    "random",
    "save",
    "set_default_device",
    "set_num_threads",
    "tensor",
    "zeros",
    "zeros_like",
]
