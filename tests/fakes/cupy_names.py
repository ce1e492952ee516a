"""The NumPy names that real CuPy (13 and 14) has, per namespace: the fake CuPy offers these and no
others, so that code relying on a NumPy name CuPy lacks fails on the fake as it would on a GPU.

The lists hold CuPy's NumPy-compatible API as documented ("API reference": array creation,
manipulation, binary, indexing, linear algebra, logic, math, sorting, statistics routines, the
ufuncs and the scalar types), limited to what minigrad and its tests could plausibly call; a name
missing here that CuPy does have is added when a test needs it. CuPy's own functions (``asnumpy``,
``get_array_module``, ``fuse``...) and modules (``cuda``, ``random``) are the fake's attributes.
"""

from __future__ import annotations

_UFUNCS = """
add subtract multiply divide true_divide floor_divide negative positive power float_power
remainder mod fmod divmod absolute fabs rint sign heaviside conj conjugate exp exp2 log log2 log10
expm1 log1p sqrt square cbrt reciprocal sin cos tan arcsin arccos arctan arctan2 hypot sinh cosh
tanh arcsinh arccosh arctanh deg2rad rad2deg degrees radians bitwise_and bitwise_or bitwise_xor
invert bitwise_not left_shift right_shift greater greater_equal less less_equal not_equal equal
logical_and logical_or logical_xor logical_not maximum minimum fmax fmin isfinite isinf isnan
signbit copysign nextafter modf ldexp frexp floor ceil trunc logaddexp logaddexp2 matmul
""".split()

_ROUTINES = """
abs around round clip fix
array asarray asanyarray ascontiguousarray asfortranarray copy empty empty_like zeros zeros_like
ones ones_like full full_like eye identity arange linspace logspace meshgrid diag diagflat tri tril
triu indices ix_
reshape ravel moveaxis rollaxis swapaxes transpose atleast_1d atleast_2d atleast_3d broadcast_to
broadcast_arrays expand_dims squeeze concatenate stack vstack hstack dstack column_stack split
array_split hsplit vsplit dsplit tile repeat append resize unique trim_zeros flip fliplr flipud
roll rot90 copyto pad
sum prod mean var std max min amax amin argmax argmin all any cumsum cumprod nansum nanprod nanmax
nanmin nanmean nanvar nanstd nanargmax nanargmin median nanmedian percentile quantile ptp average
count_nonzero diff cross histogram bincount digitize searchsorted sort argsort lexsort partition
argpartition nonzero flatnonzero argwhere where extract compress take take_along_axis put place
putmask choose select diagonal trace dot vdot inner outer tensordot einsum kron allclose isclose
array_equal isscalar result_type can_cast promote_types common_type min_scalar_type
dtype finfo iinfo ndim shape
""".split()

_SCALAR_TYPES = """
bool_ int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 complex64
complex128 intp uintp byte ubyte short ushort intc uintc int_ uint longlong ulonglong half single
double csingle cdouble number integer floating complexfloating generic signedinteger
unsignedinteger inexact
""".split()

_CONSTANTS = "inf nan pi e newaxis".split()

#: namespace -> the names it has
NAMES: dict[str, frozenset] = {
    "cupy": frozenset(_UFUNCS + _ROUTINES + _SCALAR_TYPES + _CONSTANTS + ["linalg", "fft", "lib"]),
    "cupy.linalg": frozenset("""
        norm inv solve det slogdet eigh eigvalsh svd qr cholesky pinv lstsq matrix_power
        matrix_rank tensorinv tensorsolve multi_dot""".split()),
    "cupy.fft": frozenset("""
        fft ifft rfft irfft fft2 ifft2 rfft2 irfft2 fftn ifftn rfftn irfftn hfft ihfft fftfreq
        rfftfreq fftshift ifftshift""".split()),
    "cupy.lib": frozenset(["stride_tricks"]),
    "cupy.lib.stride_tricks": frozenset(["as_strided"]),
}

#: the attributes of ``cupy.ndarray`` beyond those the fake defines itself
ARRAY_ATTRIBUTES = frozenset("""
all any argmax argmin argsort argpartition base choose clip compress conj conjugate cumprod cumsum
diagonal dot flatten max mean min nonzero partition prod ptp put ravel repeat reshape round sort
squeeze std sum swapaxes take trace transpose var view real imag
""".split())

#: the methods of CuPy's ufuncs
UFUNC_METHODS = frozenset(["reduce", "accumulate", "reduceat", "outer", "at", "nin", "nout",
                           "nargs", "types"])

#: the methods of ``cupy.random.Generator``
GENERATOR_METHODS = frozenset("""
random integers standard_normal uniform exponential standard_exponential gamma standard_gamma beta
binomial poisson chisquare geometric dirichlet
""".split())

#: dtype kinds CuPy has no arrays of (objects, strings, bytes, datetimes, structured void)
UNSUPPORTED_KINDS = frozenset("OSUVMm")


def numpy_function_namespace(module_name: str) -> str:
    """The CuPy namespace of a NumPy function's module (``numpy.linalg`` -> ``cupy.linalg``; the
    private ``numpy._core...`` modules of NumPy's top-level functions -> ``cupy``)."""
    parts = module_name.split(".")
    public = [p for p in parts[1:] if not p.startswith("_")]
    if parts[0] != "numpy" or len(public) != len(parts) - 1:
        return "cupy"
    return ".".join(["cupy", *public])
