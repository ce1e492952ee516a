"""Every CUDA kernel minigrad ships compiles with NVRTC for sm_90, without CuPy and without a GPU.

CuPy compiles a kernel the first time it is launched, so a typo or a type error in a kernel body
of ``minigrad/backend/kernels/gpu.py`` would otherwise show only on a GPU machine. Here the
kernels are read statically (``ast``: the ``ElementwiseKernel``, ``ReductionKernel``,
``RawKernel`` and ``RawModule`` constructions and the module-level strings they are built from;
nothing is imported), put into a CUDA source that gives the body what CuPy's generated code gives
it, and compiled by NVRTC (``nvrtc_compiler``, the ``nvidia-cuda-nvrtc`` wheel) for every dtype
the kernel is used with. ``SPIN_SOURCE`` of ``tests/distributed/gpu_check.py`` is compiled too.

What the harness reproduces of CuPy 13/14's generated code (``cupy/_core/_kernel.pyx``,
``_reduction.pyx``, ``include/cupy/carray.cuh``), which is what a body can see:

* ``typedef <ctype> T;`` for every one-letter type placeholder; concrete types as CuPy spells them
  (``int64`` -> ``long long``, ``int32`` -> ``int``, ``bool``); float16 is not modelled (the
  kernels compute in float32/float64: half arrays are cast before they reach them);
* the kernel is ``extern "C" __global__`` with the kernel's name; inputs are ``const``;
* a non-raw array parameter ``x`` is an element reference: ``const T &x`` for inputs (elementwise),
  ``const T x`` by value for reduction inputs, ``T &y`` for outputs; a scalar argument is a
  ``const T x`` kernel parameter; a ``raw`` parameter is a ``CArray`` indexable with ``x[k]``
  (``const`` for inputs, so only outputs can be written); every kernel is compiled twice, with
  its non-raw inputs as arrays and as scalars, since a call may pass either;
* ElementwiseKernel: the grid-stride loop index ``i`` (``ptrdiff_t``), the indexer ``_ind``
  (``_ind.size()``, ``_ind.get()``), ``preamble``, ``loop_prep``/``after_loop``; a parameter
  named ``i`` is refused, as CuPy refuses it;
* ReductionKernel: ``#define REDUCE(a, b)`` and ``#define POST_MAP(a)`` around the reduce and
  post-map expressions, ``_type_reduce`` (``reduce_type``, else the first output's type) with
  ``_type_reduce(identity)`` as the start value, ``static_cast<_type_reduce>(map_expr)`` with the
  inputs in scope, the block-level combination through ``REDUCE`` of two ``_type_reduce``, then
  ``POST_MAP(_s)`` with only the outputs in scope; the indexers ``_in_ind``/``_out_ind``,
  ``_block_stride`` and ``IndexT``;
* CuPy's compiler options ``--std=c++17 -ftz=true``.

Not reproduced: CuPy's headers (``complex.cuh``, ``atomics.cuh``, ``math_constants.h``):
a kernel that starts using one of their helpers fails here and the harness needs it added.
RawKernel/RawModule sources compile as they are, and the PTX must define every kernel name
that ``RawKernel(code, name)`` or ``module.get_function(name)`` asks for.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import nvrtc_compiler
import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_MODULE = ROOT / "minigrad" / "backend" / "kernels" / "gpu.py"
GPU_CHECK = ROOT / "tests" / "distributed" / "gpu_check.py"

# The dtypes gpu.py's ElementwiseKernel/ReductionKernel kernels run with: ``T`` is float or
# double (minigrad.backend.kernels casts float16/bfloat16 to float32 before calling them, and the
# optimizer kernels are used only for float32/float64 parameters).
KERNEL_DTYPES = ("float32", "float64")
KERNEL_CLASSES = ("ElementwiseKernel", "ReductionKernel", "RawKernel", "RawModule")
# CuPy's other ways to make a kernel, which the harness does not model (a use must add them)
UNMODELLED_APIS = ("fuse", "rawkernel", "create_ufunc", "create_reduction_func")
# the constructors' signatures (CuPy 13/14), to name positional arguments
SIGNATURES = {
    "ElementwiseKernel": ("in_params", "out_params", "operation", "name", "reduce_dims",
                          "preamble", "no_return", "return_tuple"),
    "ReductionKernel": ("in_params", "out_params", "map_expr", "reduce_expr", "post_map_expr",
                        "identity", "name", "reduce_type", "reduce_dims", "preamble", "options"),
    "RawKernel": ("code", "name", "options", "backend"),
    "RawModule": (),  # keyword-only
}
# the arguments the harness understands; others (jitify, name_expressions, ...) fail loudly
MODELLED_ARGUMENTS = {
    "ElementwiseKernel": {"in_params", "out_params", "operation", "name", "reduce_dims",
                          "preamble", "no_return", "return_tuple", "options", "loop_prep",
                          "after_loop"},
    "ReductionKernel": {"in_params", "out_params", "map_expr", "reduce_expr", "post_map_expr",
                        "identity", "name", "reduce_type", "reduce_dims", "preamble", "options"},
    "RawKernel": {"code", "name", "options", "backend"},
    "RawModule": {"code", "options", "backend"},
}
CTYPES = {"float64": "double", "float32": "float", "int64": "long long", "int32": "int",
          "int16": "short", "int8": "signed char", "uint64": "unsigned long long",
          "uint32": "unsigned int", "uint16": "unsigned short", "uint8": "unsigned char",
          "bool": "bool"}


# --------------------------------------------------------------------------------------------------
# reading kernel definitions without importing the module


class _Unresolved(Exception):
    pass


def _evaluate(node: ast.AST, names: dict):
    """The value of a constant expression: literals, names of known values, ``+``, f-strings,
    subscripts. Raises ``_Unresolved`` for anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise _Unresolved(node.id)
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _evaluate(node.left, names) + _evaluate(node.right, names)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                if value.conversion != -1 or value.format_spec is not None:
                    raise _Unresolved(ast.unparse(value))
                parts.append(str(_evaluate(value.value, names)))
            else:
                parts.append(_evaluate(value, names))
        return "".join(parts)
    if isinstance(node, ast.Subscript):
        return _evaluate(node.value, names)[_evaluate(node.slice, names)]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_evaluate(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return {_evaluate(k, names): _evaluate(v, names) for k, v in zip(node.keys, node.values)}
    raise _Unresolved(ast.unparse(node))


def _module_constants(tree: ast.Module) -> dict:
    """Module-level names bound to constant expressions (strings, dicts, tuples)."""
    constants: dict = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                constants[target.id] = _evaluate(value, constants)
            except (_Unresolved, KeyError, TypeError):
                pass
    return constants


def _bindings(nodes: list[ast.AST], constants: dict) -> list[dict]:
    """The values a kernel's free names take: a name ``v`` only used as ``TABLE[v]`` with
    ``TABLE`` a module-level dict ranges over the table's keys (``_ROW_TYPES[dtype_name]``
    -> float32, float64). One binding without free names."""
    free = sorted({n.id for node in nodes for n in ast.walk(node)
                   if isinstance(n, ast.Name) and n.id not in constants})
    choices = []
    for name in free:
        tables = {s.value.id for node in nodes for s in ast.walk(node)
                  if isinstance(s, ast.Subscript) and isinstance(s.value, ast.Name)
                  and isinstance(s.slice, ast.Name) and s.slice.id == name
                  and isinstance(constants.get(s.value.id), dict)}
        if len(tables) != 1:
            raise _Unresolved(name)
        choices.append([(name, key) for key in constants[tables.pop()]])
    return [dict(combination) for combination in itertools.product(*choices)]


@dataclass(frozen=True)
class KernelDefinition:
    """One kernel construction read from a source file, with its arguments' values."""

    kind: str  # one of KERNEL_CLASSES
    where: str  # "gpu.py:123"
    arguments: dict
    binding: dict = field(default_factory=dict)  # values of free names (e.g. dtype_name)
    entries: tuple = ()  # kernel names the compiled code must define

    @property
    def label(self) -> str:
        name = self.arguments.get("name")
        if name is None and self.entries:
            name = "+".join(self.entries)
        return "-".join([str(name)] + [str(v) for v in self.binding.values()])


def _parents(tree: ast.AST) -> dict:
    return {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}


def _requested_functions(call: ast.Call, parents: dict, constants: dict) -> tuple:
    """The names passed to ``module.get_function(...)`` where ``module = <call>``, in the
    function (or module) that makes the call."""
    assign = parents.get(call)
    if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)):
        return ()
    scope = assign
    while scope in parents and not isinstance(scope, (ast.FunctionDef, ast.Module)):
        scope = parents[scope]
    variable = assign.targets[0].id
    return tuple(_evaluate(n.args[0], constants) for n in ast.walk(scope)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and n.func.attr == "get_function" and isinstance(n.func.value, ast.Name)
                 and n.func.value.id == variable and n.args)


def read_kernels(path: Path) -> list[KernelDefinition]:
    """Every kernel constructed in ``path`` (``cp.ElementwiseKernel(...)``,
    ``self.cp.RawKernel(...)``, ...), one definition per binding of its free names. Raises
    ``ValueError`` for a kernel whose arguments cannot be read statically or that uses what the
    harness does not model."""
    text = path.read_text()
    tree = ast.parse(text)
    constants, parents = _module_constants(tree), _parents(tree)
    found = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        kind, where = call.func.attr, f"{path.name}:{call.lineno}"
        if kind in UNMODELLED_APIS:
            raise ValueError(f"{where}: {kind} kernels are not modelled by this test's harness")
        if kind not in KERNEL_CLASSES:
            continue
        if len(call.args) > len(SIGNATURES[kind]) or any(k.arg is None for k in call.keywords):
            raise ValueError(f"{where}: cannot read the arguments of {kind}")
        nodes = dict(zip(SIGNATURES[kind], call.args))
        nodes.update({k.arg: k.value for k in call.keywords})
        unmodelled = set(nodes) - MODELLED_ARGUMENTS[kind]
        if unmodelled:
            raise ValueError(f"{where}: {kind} argument(s) {sorted(unmodelled)} not modelled")
        try:
            for binding in _bindings(list(nodes.values()), constants):
                names = {**constants, **binding}
                arguments = {k: _evaluate(v, names) for k, v in nodes.items()}
                if kind == "RawKernel":
                    entries = (arguments["name"],)
                elif kind == "RawModule":
                    entries = _requested_functions(call, parents, constants)
                else:
                    entries = (arguments.get("name", "kernel"),)
                found.append(KernelDefinition(kind, where, arguments, binding, entries))
        except (_Unresolved, KeyError, TypeError) as exc:
            raise ValueError(f"{where}: cannot read {kind}'s arguments statically ({exc})") from exc
    return found


# --------------------------------------------------------------------------------------------------
# the harness: CUDA source that gives a kernel body what CuPy's generated code gives it

# CuPy's CArray and CIndexer (include/cupy/carray.cuh) as far as a kernel body can use them,
# written here: size/shape/strides, an element by linear index (through the strides) or by an
# index vector, const access for const arrays; the indexer's size, set and get.
PRELUDE = r"""
template <typename T, int ndim>
class CArray {
  T* data_;
  ptrdiff_t size_, shape_[ndim], strides_[ndim];  // strides in bytes
 public:
  __device__ ptrdiff_t size() const { return size_; }
  __device__ const ptrdiff_t* shape() const { return shape_; }
  __device__ const ptrdiff_t* strides() const { return strides_; }
  __device__ T* data() const { return data_; }
  __device__ const T& operator[](ptrdiff_t k) const {
    ptrdiff_t offset = 0;
    for (int d = ndim - 1; d > 0; --d) {
      offset += strides_[d] * (k % shape_[d]);
      k /= shape_[d];
    }
    offset += strides_[0] * k;
    return *reinterpret_cast<const T*>(reinterpret_cast<const char*>(data_) + offset);
  }
  __device__ T& operator[](ptrdiff_t k) {
    return const_cast<T&>(static_cast<const CArray&>(*this)[k]);
  }
  __device__ const T& operator[](const ptrdiff_t (&index)[ndim]) const {
    ptrdiff_t offset = 0;
    for (int d = 0; d < ndim; ++d) offset += strides_[d] * index[d];
    return *reinterpret_cast<const T*>(reinterpret_cast<const char*>(data_) + offset);
  }
  __device__ T& operator[](const ptrdiff_t (&index)[ndim]) {
    return const_cast<T&>(static_cast<const CArray&>(*this)[index]);
  }
};

template <int ndim>
class CIndexer {
  ptrdiff_t size_, shape_[ndim], index_[ndim];
 public:
  __device__ ptrdiff_t size() const { return size_; }
  __device__ void set(ptrdiff_t k) {
    for (int d = ndim - 1; d > 0; --d) {
      index_[d] = k % shape_[d];
      k /= shape_[d];
    }
    index_[0] = k;
  }
  __device__ const ptrdiff_t (&get() const)[ndim] { return index_; }
};
"""


@dataclass(frozen=True)
class Param:
    """One parameter of a kernel's signature: ``[raw] [_non_const] type name``."""

    name: str
    type: str  # a placeholder ("T") or a dtype name ("int64")
    raw: bool
    const: bool

    def ctype(self) -> str:
        return self.type if len(self.type) == 1 else CTYPES[np.dtype(self.type).name]


def parse_params(text: str, inputs: bool) -> list[Param]:
    """The parameters of ``"T x, raw T y, int64 n"``, as CuPy reads them (inputs are const)."""
    params = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        words = item.split()
        if len(words) < 2 or any(w not in ("raw", "_non_const") for w in words[:-2]):
            raise ValueError(f"syntax error in kernel parameter {item!r}")
        dtype = words[-2]
        if len(dtype) > 1 and np.dtype(dtype).name not in CTYPES:
            raise ValueError(f"kernel parameter {item!r}: {dtype} is not modelled (float16?)")
        params.append(Param(words[-1], dtype, "raw" in words[:-2],
                            inputs and "_non_const" not in words[:-2]))
    return params


def _typedefs(params: list[Param], ctype: str, extra: str = "") -> str:
    placeholders = sorted({p.type for p in params if len(p.type) == 1})
    return "".join(f"typedef {ctype} {t};\n" for t in placeholders) + extra


def _signature(params: list[Param], scalar_inputs: bool, rest: list[str]) -> str:
    """Kernel parameters as CuPy declares them: arrays as ``CArray`` (named ``_raw_x`` unless
    raw), scalars by value, ``const`` for inputs."""
    declared = []
    for p in params:
        const = "const " if p.const else ""
        if p.raw:
            declared.append(f"{const}CArray<{p.ctype()}, 1> {p.name}")
        elif p.const and scalar_inputs:
            declared.append(f"{const}{p.ctype()} {p.name}")
        else:
            declared.append(f"{const}CArray<{p.ctype()}, 1> _raw_{p.name}")
    return ", ".join(declared + rest)


def elementwise_source(arguments: dict, ctype: str, scalar_inputs: bool) -> str:
    """The CUDA source of an ``ElementwiseKernel`` with ``T`` = ``ctype``."""
    ins = parse_params(arguments["in_params"], True)
    outs = parse_params(arguments["out_params"], False)
    if "i" in [p.name for p in ins + outs]:
        raise ValueError("Can not use 'i' as a parameter name (CuPy refuses it)")
    elements = [f"{'const ' if p.const else ''}{p.ctype()} &{p.name} = _raw_{p.name}[_ind.get()];"
                for p in ins + outs if not p.raw and not (p.const and scalar_inputs)]
    body = "\n    ".join(elements + [arguments["operation"]])
    return (PRELUDE + _typedefs(ins + outs, ctype) + arguments.get("preamble", "") + f"""
extern "C" __global__ void {arguments.get("name", "kernel")}(
    {_signature(ins + outs, scalar_inputs, ["CIndexer<1> _ind"])}) {{
  {arguments.get("loop_prep", "")};
  for (ptrdiff_t i = static_cast<ptrdiff_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < _ind.size(); i += static_cast<ptrdiff_t>(blockDim.x) * gridDim.x) {{
    _ind.set(i);
    {body};
  }}
  {arguments.get("after_loop", "")};
}}
""")


def reduction_source(arguments: dict, ctype: str, scalar_inputs: bool) -> str:
    """The CUDA source of a ``ReductionKernel`` with ``T`` = ``ctype``: each thread folds a
    strided share of its output's inputs, the block combines the partial results in shared
    memory, and one thread per output applies the post-map."""
    ins = parse_params(arguments["in_params"], True)
    outs = parse_params(arguments["out_params"], False)
    reduce_type = arguments.get("reduce_type") or outs[0].ctype()
    inputs = "\n      ".join(
        f"{'const ' + p.ctype() if p.const else p.ctype() + '&'} {p.name} = "
        f"_raw_{p.name}[_in_ind.get()];"
        for p in ins if not p.raw and not (p.const and scalar_inputs))
    outputs = "\n      ".join(f"{p.ctype()} &{p.name} = _raw_{p.name}[_out_ind.get()];"
                              for p in outs if not p.raw)
    rest = ["CIndexer<1> _in_ind", "CIndexer<1> _out_ind", "const int _block_stride"]
    block = 512
    return (PRELUDE + _typedefs(ins + outs, ctype, "typedef int IndexT;\n")
            + arguments.get("preamble", "") + f"""
#define REDUCE(a, b) ({arguments["reduce_expr"]})
#define POST_MAP(a) ({arguments["post_map_expr"]})
typedef {reduce_type} _type_reduce;

extern "C" __global__ void {arguments.get("name", "reduce_kernel")}(
    {_signature(ins + outs, scalar_inputs, rest)}) {{
  __shared__ char _shared[{block} * sizeof(_type_reduce)];
  _type_reduce* _partial = reinterpret_cast<_type_reduce*>(_shared);
  const unsigned int _tid = threadIdx.x;
  const IndexT _lane = _tid / _block_stride, _lanes = {block} / _block_stride;
  for (ptrdiff_t _first = static_cast<ptrdiff_t>(blockIdx.x) * _block_stride;
       _first < _out_ind.size(); _first += static_cast<ptrdiff_t>(gridDim.x) * _block_stride) {{
    const ptrdiff_t _i = _first + _tid % _block_stride;
    _type_reduce _s = _type_reduce({arguments["identity"]});
    for (ptrdiff_t _j = _i + _lane * _out_ind.size(); _j < _in_ind.size();
         _j += _lanes * _out_ind.size()) {{
      _in_ind.set(_j);
      {inputs}
      _type_reduce _a = static_cast<_type_reduce>({arguments["map_expr"]});
      _s = REDUCE(_s, _a);
    }}
    _partial[_tid] = _s;
    __syncthreads();
    for (unsigned int _half = {block} / 2; _half >= _block_stride; _half >>= 1) {{
      if (_tid < _half) {{
        _type_reduce _a = _partial[_tid], _b = _partial[_tid + _half];
        _partial[_tid] = REDUCE(_a, _b);
      }}
      __syncthreads();
    }}
    if (_tid < _block_stride && _i < _out_ind.size()) {{
      _s = _partial[_tid];
      _out_ind.set(_i);
      {outputs}
      POST_MAP(_s);
    }}
  }}
}}
""")


def kernel_source(kernel: KernelDefinition, dtype: str | None, scalar_inputs: bool) -> str:
    """The source NVRTC compiles for ``kernel`` (RawKernel/RawModule code as it is)."""
    if kernel.kind == "ElementwiseKernel":
        return elementwise_source(kernel.arguments, CTYPES[dtype], scalar_inputs)
    if kernel.kind == "ReductionKernel":
        return reduction_source(kernel.arguments, CTYPES[dtype], scalar_inputs)
    return kernel.arguments["code"]


def _options(kernel: KernelDefinition) -> tuple:
    return nvrtc_compiler.CUPY_OPTIONS + tuple(kernel.arguments.get("options", ()))


def _compile(kernel: KernelDefinition, dtype: str | None = None,
             scalar_inputs: bool = False) -> set:
    source = kernel_source(kernel, dtype, scalar_inputs)
    ptx = nvrtc_compiler.compile_to_ptx(source, f"{kernel.label}.cu", options=_options(kernel))
    return nvrtc_compiler.ptx_entries(ptx)


# --------------------------------------------------------------------------------------------------
# the tests

_NO_NVRTC = nvrtc_compiler.skip_reason()
needs_nvrtc = pytest.mark.skipif(_NO_NVRTC is not None, reason=_NO_NVRTC or "")

GPU_KERNELS = read_kernels(GPU_MODULE)
TEMPLATE_CASES = [pytest.param(k, dtype, scalars, id=f"{k.label}-{dtype}-"
                               + ("scalar-inputs" if scalars else "array-inputs"))
                  for k in GPU_KERNELS if k.kind in ("ElementwiseKernel", "ReductionKernel")
                  for dtype in KERNEL_DTYPES for scalars in (False, True)]
RAW_CASES = [pytest.param(k, id=k.label) for k in GPU_KERNELS + read_kernels(GPU_CHECK)
             if k.kind in ("RawKernel", "RawModule")]


def test_every_kernel_of_the_gpu_module_is_read():
    """The ``ast`` reader finds as many kernel constructions as a plain text search (so a kernel
    written in a way the reader misses fails here), and each ``RawModule`` with its kernels (once
    per dtype where it is made per dtype)."""
    text = GPU_MODULE.read_text()
    constructions = len(re.findall(r"\bcp\.(?:ElementwiseKernel|ReductionKernel|RawKernel|"
                                   r"RawModule)\(", text))
    assert constructions > 0
    assert len({k.where for k in GPU_KERNELS}) == constructions
    modules = {}
    for k in GPU_KERNELS:
        if k.kind == "RawModule":
            modules.setdefault(k.entries, []).append(k.binding.get("dtype_name"))
    rows = ("softmax_forward", "softmax_backward", "cross_entropy_forward_i32",
            "cross_entropy_forward_i64", "attention_softmax", "attention_softmax_backward",
            "squared_error_sum", "layer_norm_forward", "layer_norm_backward",
            "layer_norm_param_grads", "column_sums")
    assert {entries: sorted(map(str, dtypes)) for entries, dtypes in modules.items()} == {
        rows: ["float32", "float64"],
        ("sgd_steps", "adam_steps", "unscale_grads"): ["float32", "float64"],
        ("min_max_i32", "min_max_i64"): ["None"]}


@needs_nvrtc
@pytest.mark.parametrize("kernel, dtype, scalar_inputs", TEMPLATE_CASES)
def test_cupy_kernel_compiles_for_sm90(kernel, dtype, scalar_inputs):
    """An ElementwiseKernel/ReductionKernel of gpu.py compiles in CuPy's frame for sm_90."""
    assert set(kernel.entries) <= _compile(kernel, dtype, scalar_inputs)


@needs_nvrtc
@pytest.mark.parametrize("kernel", RAW_CASES)
def test_raw_kernel_compiles_for_sm90(kernel):
    """A RawKernel/RawModule source (the row kernels per dtype, gpu_check's spin) compiles for sm_90
    and defines every kernel name that is asked of it."""
    entries = _compile(kernel)
    missing = set(kernel.entries) - entries
    assert not missing, f"{kernel.where}: asks for {sorted(missing)}, not in {sorted(entries)}"


def _definition(kind: str, **arguments) -> KernelDefinition:
    return KernelDefinition(kind, "test", arguments, entries=(arguments.get("name", "k"),))


# The harness must refuse what CuPy's generated code refuses, or it proves nothing.
REFUSED = {
    "undefined function": _definition("ElementwiseKernel", in_params="T x", out_params="T y",
                                      operation="y = erfcc(x)", name="k"),
    "written input": _definition("ElementwiseKernel", in_params="T x", out_params="T y",
                                 operation="x = y", name="k"),
    "written raw input": _definition("ElementwiseKernel", in_params="raw T x", out_params="T y",
                                     operation="x[i] = y", name="k"),
    "undeclared name": _definition("ElementwiseKernel", in_params="T x", out_params="T y",
                                   operation="y = x * scale", name="k"),
    "pointer for value": _definition("ElementwiseKernel", in_params="T x", out_params="T y",
                                     operation="T* p = x; y = *p", name="k"),
    "input in the post-map": _definition("ReductionKernel", in_params="T x", out_params="T s",
                                         map_expr="x", reduce_expr="a + b",
                                         post_map_expr="s = a / x", identity="0", name="k"),
    "output in the map": _definition("ReductionKernel", in_params="T x", out_params="T s",
                                     map_expr="x + s", reduce_expr="a + b",
                                     post_map_expr="s = a", identity="0", name="k"),
}
ACCEPTED = {
    "indexer and raw index": _definition(
        "ElementwiseKernel", in_params="raw T x, int64 n", out_params="T y",
        operation="y = x[(i + 1) % _ind.size()] + x[_ind.get()] + T(n)", name="k"),
    "preamble helper": _definition(
        "ElementwiseKernel", in_params="T x", out_params="T y", operation="y = twice(x)",
        preamble="template <typename U> __device__ U twice(U v) { return v + v; }\n", name="k"),
    "reduction with inputs a and b": _definition(
        "ReductionKernel", in_params="T a, T b", out_params="T s", map_expr="a * b",
        reduce_expr="a > b ? a : b", post_map_expr="s = a", identity="-1", name="k"),
    "reduce_type and _in_ind": _definition(
        "ReductionKernel", in_params="T x", out_params="T s", map_expr="x * _in_ind.size()",
        reduce_expr="a + b", post_map_expr="s = T(a)", identity="0", name="k",
        reduce_type="double"),
}


@needs_nvrtc
@pytest.mark.parametrize("case", REFUSED)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_harness_refuses_what_cupy_refuses(case, dtype):
    """A kernel body that CuPy's generated code would not compile does not compile here."""
    with pytest.raises(nvrtc_compiler.CompileError, match="error"):
        _compile(REFUSED[case], dtype)


@needs_nvrtc
@pytest.mark.parametrize("case", ACCEPTED)
@pytest.mark.parametrize("scalar_inputs", [False, True])
def test_harness_accepts_cupy_idioms(case, scalar_inputs):
    """What a body may use in CuPy (indexers, raw indexing, preamble, reduce_type) compiles."""
    assert _compile(ACCEPTED[case], "float32", scalar_inputs) == {"k"}


def test_harness_refuses_a_parameter_named_i():
    """``i`` is the loop index: CuPy refuses it as a parameter name, and so does the harness."""
    kernel = _definition("ElementwiseKernel", in_params="T i", out_params="T y",
                         operation="y = i", name="k")
    with pytest.raises(ValueError, match="'i'"):
        kernel_source(kernel, "float32", False)


@needs_nvrtc
def test_raw_module_missing_a_requested_function_fails(tmp_path):
    """The reader ties ``module.get_function(name)`` to the module's code: a name the code does
    not define is reported."""
    source = tmp_path / "kernels.py"
    source.write_text('import cupy as cp\nCODE = r"""\nextern "C" __global__ void f() {}\n"""\n'
                      "def load():\n    module = cp.RawModule(code=CODE)\n"
                      '    return module.get_function("f"), module.get_function("g")\n')
    (kernel,) = read_kernels(source)
    assert kernel.entries == ("f", "g")
    assert _compile(kernel) == {"f"}
