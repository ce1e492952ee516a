"""minigrad's CUDA C kernels, run on the CPU: CuPy's kernel classes for the fake CuPy.

The fake CuPy (``fake_cupy``) cannot run CUDA C, so on it minigrad's fused kernels run their CPU
versions, and the CUDA C of ``minigrad/backend/kernels/gpu.py`` is only compiled (by NVRTC, in
``tests/backend/test_gpu_kernel_sources.py``). Here that CUDA C runs: each kernel is turned into
C++, compiled with g++ into a shared library and called through ``ctypes`` on the fake arrays'
NumPy data, so a wrong index, a wrong formula or a wrong launch configuration in ``gpu.py`` shows
in CI as a wrong number.

What each class reproduces of CuPy's semantics:

* :class:`ElementwiseKernel`: inputs then (optionally) outputs; the non-``raw`` arrays broadcast
  together, ``i`` runs over the broadcast size, an output not given is allocated with the dtype of
  its type placeholder; Python and NumPy scalars are by-value parameters; a ``raw`` array is
  indexed by its C-order flat index (CuPy's ``CArray``). Outputs are read as well as written, as
  on a GPU (a body may read its output's old value).
* :class:`ReductionKernel`: the inputs broadcast, ``axis`` (an int, a tuple or None) reduced,
  ``keepdims``; ``map_expr`` per element (the inputs in scope), ``REDUCE(a, b)``, ``POST_MAP(a)``
  (only the outputs in scope), ``identity`` as the start. The order of the sum is sequential,
  not a GPU's tree, so float results agree with a GPU's to rounding, not to the bit.
* :class:`RawModule` / :class:`RawKernel`: the source compiles as C++20 against a small model
  of CUDA's execution (:data:`EMULATION_HEADER`): blocks run one after the other, the threads of a
  block are OS threads, ``__syncthreads()`` is a barrier of the block, ``__shfl_down_sync`` an
  exchange through a barrier of the warp, ``__shared__`` memory is shared by the running block.
  Arguments are checked as a GPU would need them, against the sizes the compiler gives: an array
  must have the item size its pointer parameter reads, and a by-value parameter takes a NumPy
  scalar of its size (a Python number's conversion by CuPy need not match the parameter: ``1``
  is not a ``long long``) or, for a struct, a host NumPy array of one item of the struct's size
  (CuPy passes such an array's bytes by value).

Libraries are cached by the hash of their source under ``$TMPDIR/minigrad-cuda-on-cpu``.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

CXX = shutil.which("g++")
CACHE_DIR = os.path.join(tempfile.gettempdir(), "minigrad-cuda-on-cpu")

# CuPy's names of concrete types in kernel parameter lists, as C types
C_TYPES = {
    "float16": "half", "float32": "float", "float64": "double", "bool": "bool",
    "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long",
}

# The CUDA a kernel body may use, for C++ (elementwise and reduction bodies need only the math).
MATH_HEADER = r"""
#include <cmath>
#include <cstddef>
#include <cstring>
using namespace std;
"""

EMULATION_HEADER = MATH_HEADER + r"""
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

struct dim3 { unsigned x = 1, y = 1, z = 1; };

namespace emu {
struct Block {
    explicit Block(unsigned n) : all(n), lanes(n) {
        for (unsigned w = 0; w * 32 < n; ++w)
            warps.emplace_back(new std::barrier<>(std::min(32u, n - w * 32)));
        slots.resize(n * 16);
    }
    std::barrier<> all;
    unsigned lanes;
    std::vector<std::unique_ptr<std::barrier<>>> warps;
    std::vector<unsigned char> slots;  // 16 bytes per thread for warp exchanges
};
inline thread_local dim3 tid, bid;
inline thread_local unsigned linear;
inline dim3 bdim, gdim;
inline Block* block;

inline void launch(const unsigned* d, const std::function<void()>& body) {
    gdim = {d[0], d[1], d[2]};
    bdim = {d[3], d[4], d[5]};
    const unsigned n = bdim.x * bdim.y * bdim.z;
    for (unsigned bz = 0; bz < gdim.z; ++bz)
        for (unsigned by = 0; by < gdim.y; ++by)
            for (unsigned bx = 0; bx < gdim.x; ++bx) {
                Block current(n);
                block = &current;
                std::vector<std::thread> threads;
                for (unsigned t = 0; t < n; ++t)
                    threads.emplace_back([&, t] {
                        linear = t;
                        tid = {t % bdim.x, (t / bdim.x) % bdim.y, t / (bdim.x * bdim.y)};
                        bid = {bx, by, bz};
                        body();
                    });
                for (auto& th : threads) th.join();
            }
}
}  // namespace emu

#define threadIdx emu::tid
#define blockIdx emu::bid
#define blockDim emu::bdim
#define gridDim emu::gdim
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static

inline void __syncthreads() { emu::block->all.arrive_and_wait(); }

template <class V>
V __shfl_down_sync(unsigned, V v, int delta) {
    static_assert(sizeof(V) <= 16, "warp exchange of a value over 16 bytes");
    const unsigned me = emu::linear, lane = me & 31u, warp = me >> 5;
    const unsigned width = std::min(32u, emu::block->lanes - warp * 32);
    unsigned char* slots = emu::block->slots.data();
    std::memcpy(slots + me * 16, &v, sizeof(V));
    emu::block->warps[warp]->arrive_and_wait();
    V out = v;
    if (lane + delta < width) std::memcpy(&out, slots + (me + delta) * 16, sizeof(V));
    emu::block->warps[warp]->arrive_and_wait();
    return out;
}
"""


class KernelCompileError(RuntimeError):
    """g++ refused a kernel's C++ (its message is in the exception)."""


def _compile(source: str) -> ctypes.CDLL:
    """A shared library of ``source`` (C++20), compiled once per distinct source."""
    if CXX is None:
        raise KernelCompileError("g++ is not installed: CUDA kernels cannot run on the CPU")
    digest = hashlib.sha1(source.encode()).hexdigest()[:20]
    os.makedirs(CACHE_DIR, exist_ok=True)
    lib = os.path.join(CACHE_DIR, f"k{digest}.so")
    if not os.path.exists(lib):
        src = os.path.join(CACHE_DIR, f"k{digest}.{os.getpid()}.cpp")
        with open(src, "w") as f:
            f.write(source)
        tmp = f"{lib}.{os.getpid()}"
        done = subprocess.run([CXX, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                               "-o", tmp, src], capture_output=True, text=True)
        os.unlink(src)
        if done.returncode:
            raise KernelCompileError(f"g++ failed:\n{done.stderr}\n--- source:\n{source}")
        os.replace(tmp, lib)  # atomic: parallel test processes may compile the same kernel
    return ctypes.CDLL(lib)


# -------------------------------------------------------------------------------------------------
# parameter lists of ElementwiseKernel / ReductionKernel ("raw T x, int64 n")


class _Param:
    def __init__(self, text: str):
        words = text.split()
        self.raw = words[0] == "raw"
        if self.raw:
            words = words[1:]
        if len(words) != 2:
            raise ValueError(f"kernel parameter {text!r}: expected '[raw] <type> <name>'")
        self.type, self.name = words
        self.placeholder = self.type not in C_TYPES


def _params(text: str) -> list[_Param]:
    return [_Param(p) for p in text.split(",") if p.strip()]


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float, bool, np.generic))


class _TemplateKernel:
    """What ElementwiseKernel and ReductionKernel share: parameters, type placeholders, the fake's
    arrays in and out, compiled libraries per signature."""

    def __init__(self, fake, in_params: str, out_params: str, name: str, preamble: str):
        self.fake, self.name, self.preamble = fake, name, preamble
        self.inputs, self.outputs = _params(in_params), _params(out_params)
        self._libs: dict = {}

    def _types(self, args: list) -> dict:
        """Each placeholder's dtype: that of the first array argument declared with it."""
        types: dict = {}
        for p, a in zip(self.inputs + self.outputs, args):
            if p.placeholder and p.type not in types and isinstance(a, np.ndarray):
                types[p.type] = a.dtype
        for p, a in zip(self.inputs, args):
            if p.placeholder and p.type not in types and a is not None:
                types[p.type] = np.asarray(a).dtype
        return types

    def _dtype(self, p: _Param, types: dict) -> np.dtype:
        if not p.placeholder:
            return np.dtype(p.type)
        if p.type not in types:
            raise TypeError(f"{self.name}: cannot tell the type {p.type} of {p.name}")
        return types[p.type]

    def _typedefs(self, types: dict) -> str:
        return "".join(f"typedef {C_TYPES[np.dtype(t).name]} {name};\n"
                       for name, t in types.items())

    def _library(self, key, build) -> ctypes.CDLL:
        lib = self._libs.get(key)
        if lib is None:
            lib = self._libs[key] = _compile(build())
        return lib

    def _launch(self, fn, args):
        return self.fake._launch(f"kernel {self.name}", fn, args, {})

    @staticmethod
    def _ctype(p: _Param) -> str:
        """The C type of a parameter (a placeholder is typedef'd to its dtype)."""
        return p.type if p.placeholder else C_TYPES[p.type]


class ElementwiseKernel(_TemplateKernel):
    """``cupy.ElementwiseKernel`` run on the CPU (see the module docstring)."""

    def __init__(self, fake, in_params, out_params, operation, name="kernel", reduce_dims=True,
                 preamble="", loop_prep="", after_loop="", **_):
        super().__init__(fake, in_params, out_params, name, preamble)
        self.operation, self.loop_prep, self.after_loop = operation, loop_prep, after_loop
        if any(p.name == "i" for p in self.inputs + self.outputs):
            raise ValueError(f"{name}: a parameter may not be named i (CuPy reserves it)")

    def __call__(self, *args, size=None):
        n_in, n_out = len(self.inputs), len(self.outputs)
        if len(args) not in (n_in, n_in + n_out):
            raise TypeError(f"{self.name}: takes {n_in} inputs and optionally {n_out} outputs, "
                            f"got {len(args)} arguments")
        return self._launch(lambda *a: self._run(list(a), size), args)

    def _run(self, args: list, size):
        n_in = len(self.inputs)
        types = self._types(args)
        shaped = [a for p, a in zip(self.inputs + self.outputs, args)
                  if not p.raw and isinstance(a, np.ndarray)]
        if shaped:
            shape = np.broadcast_shapes(*(a.shape for a in shaped))
        elif size is not None:
            shape = (size,)
        else:
            raise ValueError(f"{self.name}: no array to take the size from and no size=")
        outs = args[n_in:] or [np.empty(shape, self._dtype(p, types)) for p in self.outputs]
        for p, o in zip(self.outputs, outs):
            if not p.raw and o.shape != shape:
                raise ValueError(f"{self.name}: output {p.name} has shape {o.shape}, the "
                                 f"broadcast shape is {shape}")
        n = int(np.prod(shape))
        buffers, keep, copy_back = [], [], []
        for p, a in zip(self.inputs, args[:n_in]):
            if _is_scalar(a) and not p.raw:
                value = np.array(a, self._dtype(p, types))
            elif p.raw:
                value = np.ascontiguousarray(a, self._dtype(p, types))
            else:
                value = np.ascontiguousarray(np.broadcast_to(
                    np.asarray(a, self._dtype(p, types)), shape))
            keep.append(value)
            buffers.append(value.ctypes.data)
        for p, o in zip(self.outputs, outs):
            if o.dtype != self._dtype(p, types):
                raise TypeError(f"{self.name}: output {p.name} is {o.dtype}, the kernel "
                                f"writes {self._dtype(p, types)}")
            work = o if o.flags.c_contiguous else np.ascontiguousarray(o)
            if work is not o:
                copy_back.append((o, work))
            keep.append(work)
            buffers.append(work.ctypes.data)
        scalars = tuple(_is_scalar(a) for a in args[:n_in])
        key = (tuple(np.dtype(t).name for t in types.values()), scalars)
        lib = self._library(key, lambda: self._source(types, scalars))
        pointers = (ctypes.c_void_p * len(buffers))(*buffers)
        lib.run(pointers, ctypes.c_ssize_t(n))
        for o, work in copy_back:
            o[...] = work
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _source(self, types: dict, scalars: tuple) -> str:
        lines, binds, k = [], [], 0
        for p, scalar in zip(self.inputs, scalars):
            c = self._ctype(p)
            if p.raw:
                lines.append(f"const {c}* {p.name} = (const {c}*)_args[{k}];")
            elif scalar:
                lines.append(f"const {c} {p.name} = *(const {c}*)_args[{k}];")
            else:
                lines.append(f"const {c}* _p_{p.name} = (const {c}*)_args[{k}];")
                binds.append(f"const {c} &{p.name} = _p_{p.name}[i];")
            k += 1
        for p in self.outputs:
            c = self._ctype(p)
            if p.raw:
                lines.append(f"{c}* {p.name} = ({c}*)_args[{k}];")
            else:
                lines.append(f"{c}* _p_{p.name} = ({c}*)_args[{k}];")
                binds.append(f"{c} &{p.name} = _p_{p.name}[i];")
            k += 1
        body = "\n    ".join(lines)
        bound = "\n        ".join(binds)
        return (f"{MATH_HEADER}{self._typedefs(types)}{self.preamble}\n"
                f'extern "C" void run(void** _args, ptrdiff_t _n) {{\n    {body}\n'
                f"    {self.loop_prep}\n"
                f"    for (ptrdiff_t i = 0; i < _n; ++i) {{\n        {bound}\n"
                f"        {self.operation}\n    ;}}\n    {self.after_loop}\n}}\n")


class ReductionKernel(_TemplateKernel):
    """``cupy.ReductionKernel`` run on the CPU (see the module docstring)."""

    def __init__(self, fake, in_params, out_params, map_expr, reduce_expr, post_map_expr,
                 identity, name="reduce_kernel", reduce_type=None, preamble="", **_):
        super().__init__(fake, in_params, out_params, name, preamble)
        self.map_expr, self.reduce_expr, self.post_map_expr = map_expr, reduce_expr, post_map_expr
        self.identity, self.reduce_type = identity, reduce_type
        if len(self.outputs) != 1:
            raise NotImplementedError(f"{name}: one output is modelled")

    def __call__(self, *args, axis=None, keepdims=False):
        if len(args) != len(self.inputs):
            raise TypeError(f"{self.name}: takes {len(self.inputs)} inputs, got {len(args)}")
        return self._launch(lambda *a: self._run(list(a), axis, keepdims), args)

    def _run(self, args: list, axis, keepdims: bool):
        types = self._types(args)
        shape = np.broadcast_shapes(*(np.shape(a) for a in args if isinstance(a, np.ndarray)))
        ndim = len(shape)
        axes = tuple(range(ndim)) if axis is None else tuple(
            a % ndim for a in ((axis,) if isinstance(axis, int) else axis))
        kept = [d for d in range(ndim) if d not in axes]
        n_out = int(np.prod([shape[d] for d in kept]))
        n_red = int(np.prod([shape[d] for d in axes]))
        buffers, keep, scalars = [], [], []
        for p, a in zip(self.inputs, args):
            dtype = self._dtype(p, types)
            scalar = _is_scalar(a)
            if scalar:
                value = np.array(a, dtype)
            else:
                full = np.broadcast_to(np.asarray(a, dtype), shape)
                value = np.ascontiguousarray(np.transpose(full, kept + list(axes)))
            scalars.append(scalar)
            keep.append(value)
            buffers.append(value.ctypes.data)
        out_p = self.outputs[0]
        out = np.empty(n_out, self._dtype(out_p, types))
        buffers.append(out.ctypes.data)
        key = (tuple(np.dtype(t).name for t in types.values()), tuple(scalars))
        lib = self._library(key, lambda: self._source(types, tuple(scalars)))
        pointers = (ctypes.c_void_p * len(buffers))(*buffers)
        lib.run(pointers, ctypes.c_ssize_t(n_out), ctypes.c_ssize_t(n_red))
        out_shape = tuple(1 if d in axes else shape[d] for d in range(ndim)) if keepdims else \
            tuple(shape[d] for d in kept)
        return out.reshape(out_shape)

    def _source(self, types: dict, scalars: tuple) -> str:
        lines, binds = [], []
        for k, (p, scalar) in enumerate(zip(self.inputs, scalars)):
            c = self._ctype(p)
            if scalar:  # in scope in the map expression only, as in CuPy's generated code
                lines.append(f"const {c} _v_{p.name} = *(const {c}*)_args[{k}];")
                binds.append(f"const {c} {p.name} = _v_{p.name};")
            else:
                lines.append(f"const {c}* _p_{p.name} = (const {c}*)_args[{k}];")
                binds.append(f"const {c} {p.name} = _p_{p.name}[_j * _n_red + _k];")
        out = self.outputs[0]
        c_out = self._ctype(out)
        reduce_type = self.reduce_type or c_out
        body = "\n    ".join(lines)
        bound = "\n            ".join(binds)
        return (f"{MATH_HEADER}{self._typedefs(types)}typedef {reduce_type} _type_reduce;\n"
                f"{self.preamble}\n"
                f"#define REDUCE(a, b) ({self.reduce_expr})\n"
                f"#define POST_MAP(a) ({self.post_map_expr})\n"
                f'extern "C" void run(void** _args, ptrdiff_t _n_out, ptrdiff_t _n_red) {{\n'
                f"    {body}\n"
                f"    {c_out}* _p_{out.name} = ({c_out}*)_args[{len(self.inputs)}];\n"
                f"    for (ptrdiff_t _j = 0; _j < _n_out; ++_j) {{\n"
                f"        _type_reduce _s = _type_reduce({self.identity});\n"
                f"        for (ptrdiff_t _k = 0; _k < _n_red; ++_k) {{\n            {bound}\n"
                f"            const _type_reduce _a = static_cast<_type_reduce>("
                f"{self.map_expr});\n"
                f"            _s = REDUCE(_s, _a);\n        }}\n"
                f"        {c_out} &{out.name} = _p_{out.name}[_j];\n"
                f"        POST_MAP(_s);\n    }}\n}}\n")


# -------------------------------------------------------------------------------------------------
# RawModule / RawKernel

_GLOBAL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')


class _Signature:
    """A ``__global__`` function's parameters (their C types, as written); the compiled library
    tells each one's size (of the pointed-to item for a pointer)."""

    def __init__(self, name: str, params: str):
        self.name = name
        self.types = [re.sub(r"\s*\b\w+\s*$", "", p.strip()).strip()  # drop the name
                      for p in params.split(",") if p.strip()]
        self.pointer = ["*" in t for t in self.types]

    def launcher(self) -> str:
        args = ", ".join(f"*({t}*)_args[{k}]" for k, t in enumerate(self.types))
        sizes = "".join(
            f"    out[{k}] = sizeof(std::remove_cv_t<std::remove_pointer_t<{t}>>);\n"
            for k, t in enumerate(self.types))
        return (f'extern "C" void _launch_{self.name}(const unsigned* _dims, void** _args) {{\n'
                f"    emu::launch(_dims, [&] {{ {self.name}({args}); }});\n}}\n"
                f'extern "C" void _sizes_{self.name}(unsigned long long* out) {{\n{sizes}}}\n')


class RawModule:
    """``cupy.RawModule(code=...)`` run on the CPU (see the module docstring)."""

    def __init__(self, fake, code: str, options=(), name_expressions=None, **_):
        self.fake, self.code = fake, code
        self.signatures = {m.group(1): _Signature(m.group(1), m.group(2))
                           for m in _GLOBAL.finditer(code)}
        self._lib = None

    def library(self) -> ctypes.CDLL:
        if self._lib is None:
            launchers = "".join(s.launcher() for s in self.signatures.values())
            self._lib = _compile(EMULATION_HEADER + self.code + "\n" + launchers)
        return self._lib

    def get_function(self, name: str) -> RawFunction:
        if name not in self.signatures:
            raise KeyError(f"no __global__ function {name!r} in the module")
        return RawFunction(self, self.signatures[name])


class RawFunction:
    """One kernel of a :class:`RawModule`: ``kernel(grid, block, args)``."""

    def __init__(self, module: RawModule, signature: _Signature):
        self.module, self.signature = module, signature

    def __call__(self, grid, block, args, shared_mem=0):
        sig = self.signature
        if len(args) != len(sig.types):
            raise TypeError(f"{sig.name}: takes {len(sig.types)} arguments, got {len(args)}")
        # a host NumPy array of one item is passed by value (CuPy's way to pass a struct)
        args = [_ByValue(a) if isinstance(a, np.ndarray) else a for a in args]
        self.module.fake._launch(f"kernel {sig.name}",
                                 lambda *a: self._run(_dims(grid), _dims(block), a), args, {})

    def _sizes(self) -> list[int]:
        lib, n = self.module.library(), len(self.signature.types)
        out = (ctypes.c_ulonglong * max(1, n))()
        getattr(lib, f"_sizes_{self.signature.name}")(out)
        return list(out[:n])

    def _run(self, grid, block, args) -> None:
        sig, sizes, values = self.signature, self._sizes(), []
        for k, a in enumerate(args):
            if sig.pointer[k]:
                if not isinstance(a, np.ndarray):
                    raise TypeError(f"{sig.name}: argument {k} must be an array, got "
                                    f"{type(a).__name__}")
                if a.dtype.itemsize != sizes[k]:
                    raise TypeError(f"{sig.name}: argument {k} is a {a.dtype} array, the "
                                    f"parameter {sig.types[k]!r} reads {sizes[k]}-byte items")
                values.append(ctypes.c_void_p(a.ctypes.data))
            else:
                if not isinstance(a, (_ByValue, np.number, np.bool_)):
                    raise TypeError(f"{sig.name}: argument {k} must be a NumPy scalar of "
                                    f"{sizes[k]} bytes ({sig.types[k]}), got {type(a).__name__}")
                if a.dtype.itemsize != sizes[k]:
                    raise TypeError(f"{sig.name}: argument {k} is {a.dtype}, the parameter "
                                    f"{sig.types[k]!r} has {sizes[k]} bytes")
                raw = a.tobytes()
                values.append(ctypes.create_string_buffer(raw, len(raw)))
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *(ctypes.addressof(v) for v in values))
        dims = (ctypes.c_uint * 6)(*grid, *block)
        getattr(self.module.library(), f"_launch_{sig.name}")(dims, pointers)


class _ByValue:
    """A one-item host array given as a kernel argument: CuPy passes its bytes by value."""

    def __init__(self, array: np.ndarray):
        if array.size != 1:
            raise TypeError(f"a host NumPy array of shape {array.shape} as a kernel argument: "
                            f"only arrays of one item are passed (by value)")
        self.dtype, self._bytes = array.dtype, array.tobytes()

    def tobytes(self) -> bytes:
        return self._bytes


def RawKernel(fake, code: str, name: str, **kwargs):  # noqa: N802 (CuPy's name)
    """``cupy.RawKernel(code, name)``: one kernel of a module of ``code``."""
    return RawModule(fake, code, **kwargs).get_function(name)


def _dims(d) -> tuple[int, int, int]:
    d = (d,) if isinstance(d, int) else tuple(d)
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


def install(fake) -> None:
    """Give ``fake`` (a ``fake_cupy.FakeCupy``) these kernel classes in place of its own, which
    cannot run CUDA C."""
    fake.ElementwiseKernel = lambda *a, **k: ElementwiseKernel(fake, *a, **k)
    fake.ReductionKernel = lambda *a, **k: ReductionKernel(fake, *a, **k)
    fake.RawModule = lambda *a, **k: RawModule(fake, *a, **k)
    fake.RawKernel = lambda *a, **k: RawKernel(fake, *a, **k)


#: fake CuPy calls that launch no kernel on a GPU: views, allocations and (for counting under
#: :func:`gpu_kernels_counted`) ``ascontiguousarray``, whose real copies are ``copy`` events
NO_LAUNCH = ("reshape", "swapaxes", "broadcast_to", "empty", "empty_like", "ascontiguousarray")


@contextlib.contextmanager
def gpu_kernels_counted(fake, module):
    """Within the block ``module`` (``gpu.py`` loaded on ``fake``) is minigrad's kernels for the
    fake's arrays and every ``ascontiguousarray`` that copies is logged as a ``copy`` launch (CuPy
    returns an array that already is C-contiguous as it is); then the fake's CPU kernels are back.
    """
    from minigrad.backend import kernels

    ascontiguousarray = fake.ascontiguousarray

    def copy_if_needed(a, dtype=None):
        if not (a.flags.c_contiguous and (dtype is None or a.dtype == dtype)):
            fake.events.append(f"launch copy on {fake._current_stream().name}")
        return ascontiguousarray(a, dtype)

    kernels.register_kernels(fake.ndarray, module)
    fake.ascontiguousarray = copy_if_needed
    try:
        yield
    finally:
        fake.ascontiguousarray = ascontiguousarray
        kernels.register_kernels(fake.ndarray, fake_cpu_kernels(fake))


def fake_cpu_kernels(fake):
    """The fake's own kernels (their CPU versions), as ``fake_cupy.installed`` registers them."""
    from fakes import fake_cupy
    from minigrad.backend import kernels

    return fake_cupy._HostKernels(fake, kernels.backend_for(np.empty(0)))


def load_gpu_module(fake):
    """``minigrad/backend/kernels/gpu.py`` as a module of its own, on ``fake`` (with these kernel
    classes installed)."""
    import importlib.util

    from minigrad.backend import kernels

    install(fake)
    path = os.path.join(os.path.dirname(kernels.__file__), "gpu.py")
    spec = importlib.util.spec_from_file_location("gpu_kernels_on_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def use_gpu_kernels(fake):
    """Install these kernel classes on ``fake`` and make ``minigrad/backend/kernels/gpu.py``
    (loaded as a module of its own, on the fake CuPy) minigrad's kernels for the fake's arrays:
    every op then runs the CUDA C. Returns that module."""
    from minigrad.backend import kernels

    module = load_gpu_module(fake)
    kernels.register_kernels(fake.ndarray, module)
    return module
