"""The package's layers import one way only: backend -> autodiff/tensor -> functional -> module ->
optimizer/data -> distributed (-> testing).

Two independent checks:

* at run time, each layer's modules are imported in a fresh interpreter, in dependency order,
  with the top-level ``minigrad/__init__.py`` left out (it imports everything on purpose): every
  ``minigrad`` module that gets loaded must belong to the same layer or one below;
* statically, from the source: every import of a ``minigrad`` module sits at the top of its file
  (a function-local import is how a cycle gets hidden), points to the same layer or one below, and
  the module-level imports between minigrad's modules form no cycle.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minigrad"

# The layer order; a module belongs to the layer of the longest prefix that names it.
LAYERS = [
    ("minigrad.seams", "minigrad.aliases", "minigrad.backend", "minigrad.config",
     "minigrad.logger"),
    ("minigrad.autodiff",),
    ("minigrad.functional",),
    ("minigrad.module",),
    ("minigrad.optimizer", "minigrad.data", "minigrad.serialization",
     "minigrad.megengine_checkpoint", "minigrad.utils", "minigrad.hub"),
    ("minigrad.distributed",),
    ("minigrad.amp",),  # GradScaler agrees on overflow over process groups
    ("minigrad.distributed.deepspeed",),  # DeepSpeed's entry: its fp16 builds amp's GradScaler
    ("minigrad.testing",),
]
FACADE = "minigrad"  # the top-level package: re-exports only, nothing imports it
# Deliberate exceptions, each with its reason: {(importing module, imported module): why}. The
# static checks skip these pairs; keep it empty unless a link is documented in the code as the one
# unavoidable exception (upward calls go through minigrad.seams instead).
ALLOWED: dict[tuple[str, str], str] = {}
LAYER_NAMES = ["/".join(p.split(".")[-1] for p in layer) for layer in LAYERS]


def all_modules() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(
            f"{module} belongs to no layer: add it to LAYERS in tests/test_layering.py"
        )
    return best


def test_every_module_has_a_layer():
    for module in all_modules():
        if module != FACADE:
            layer_of(module)


# -- run time: a fresh interpreter per layer ---------------------------------------------------

_PROBE = r"""
import importlib, json, sys, types
package = types.ModuleType("minigrad")  # stands in for minigrad/__init__.py, which imports all
package.__path__ = [sys.argv[1]]
sys.modules["minigrad"] = package
loaded_by = {}
for name in json.loads(sys.argv[2]):
    before = set(sys.modules)
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:  # a module of an optional extra (CuPy, mpi4py) not here
        if exc.name.split(".")[0] not in {"cupy", "cupyx", "mpi4py", "matplotlib"}:
            raise
    for new in set(sys.modules) - before:
        if new.startswith("minigrad."):
            loaded_by[new] = name
print(json.dumps(loaded_by))
"""


@pytest.mark.parametrize("index", range(len(LAYERS)), ids=LAYER_NAMES)
def test_importing_a_layer_loads_nothing_above_it(index):
    aliases = {importer for importer, _ in ALLOWED}  # documented upward links, checked below
    modules = [m for m in all_modules()
               if m != FACADE and m not in aliases and layer_of(m) == index]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(PACKAGE), json.dumps(modules)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, f"importing layer {LAYER_NAMES[index]} failed:\n{proc.stderr}"
    loaded_by = json.loads(proc.stdout)
    upward = sorted(
        f"importing {importer} loaded {module} (layer {LAYER_NAMES[layer_of(module)]})"
        for module, importer in loaded_by.items() if layer_of(module) > index
    )
    assert not upward, f"layer {LAYER_NAMES[index]} reaches up:\n" + "\n".join(upward)


# -- static: where the imports are and where they point ----------------------------------------

def minigrad_imports(path: Path, module: str):
    """Yield (imported module, line, at top level?) for each import of a minigrad module."""
    tree = ast.parse(path.read_text(), str(path))
    top_level = {id(node) for node in tree.body}
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(anchor + ([base] if base else []))
            # `from minigrad.x import y` may import the submodule minigrad.x.y
            targets = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target == FACADE or target.startswith(FACADE + "."):
                yield target, node.lineno, id(node) in top_level


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _source_files():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize("index", range(len(LAYERS)), ids=LAYER_NAMES)
def test_imports_are_at_the_top_and_point_down(index):
    problems = []
    for path, module in _source_files():
        if module == FACADE or layer_of(module) != index:
            continue
        rel = path.relative_to(ROOT)
        for target, line, top in minigrad_imports(path, module):
            if (module, target) in ALLOWED:
                continue
            if not top:
                problems.append(f"{rel}:{line}: imports {target} inside a function or block")
            elif target == FACADE:
                problems.append(f"{rel}:{line}: imports the top-level package")
            elif layer_of(target) > index:
                problems.append(
                    f"{rel}:{line}: imports {target} (layer {LAYER_NAMES[layer_of(target)]})"
                )
    assert not problems, f"layer {LAYER_NAMES[index]}:\n" + "\n".join(problems)


def test_module_level_imports_form_no_cycle():
    graph = {module: set() for _, module in _source_files()}
    for path, module in _source_files():
        for target, _, top in minigrad_imports(path, module):
            if top and target in graph and target != module and (module, target) not in ALLOWED:
                graph[module].add(target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_the_whole_package_imports_in_a_fresh_interpreter():
    proc = subprocess.run(
        [sys.executable, "-c", "import minigrad, minigrad.module, minigrad.optimizer, "
         "minigrad.data, minigrad.distributed; print(minigrad.module.SyncBatchNorm.__module__)"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "minigrad.module.normalization"


def test_tensor_operators_work_in_a_fresh_interpreter():
    """``Tensor``'s operators reach ``minigrad.functional`` through the ``install_functional``
    seam (no import of a higher layer), so they work however the first import happens."""
    code = "from minigrad.tensor import Tensor; print((Tensor([1.0, 2.0]) * 2 + 1).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[3.0, 5.0]"


# -- the seams: the only run-time calls from a lower layer into a higher one --------------------

SEAM_USERS = {  # seam -> (modules that install into it, modules that watch it)
    "FUNCTIONAL": ({"minigrad.functional"}, {"minigrad.autodiff.tensor"}),
    "WORLD": ({"minigrad.distributed.comm.group"}, set()),
    "GLOBAL_IO": ({"minigrad.distributed.global_tensor"}, set()),
    "GPU_ARRAYS": ({"minigrad.backend.xp"}, {
        "minigrad.backend.device", "minigrad.backend.device_checks", "minigrad.backend.rng",
        "minigrad.backend.transfer"}),
    "TRACER": ({"minigrad.utils.profiler", "minigrad.amp.grad_scaler"}, {
        "minigrad.autodiff.function", "minigrad.autodiff.engine", "minigrad.module.module"}),
    "CHECKPOINT": ({"minigrad.distributed.checkpoint"}, set()),
}
# the dispatch hook is a class attribute (read on every op): who may name it, and why
DISPATCH_USERS = {
    "minigrad.seams": "names it",
    "minigrad.autodiff.tensor": "declares it (None) on Tensor",
    "minigrad.autodiff.function": "reads it in Function.__call__",
    "minigrad.distributed.global_tensor.tensor": "sets it on GlobalTensor",
}


def _seam_calls(path: Path):
    """Yield (seam name, method, line) for each ``seams.<SEAM>.install/watch(...)`` call."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and isinstance(node.func.value.value, ast.Name)
                and node.func.value.value.id == "seams"):
            yield node.func.value.attr, node.func.attr, node.lineno


def test_every_upward_call_goes_through_the_seams_module():
    from minigrad import seams

    assert {s.name.upper() for s in seams.SEAMS} == set(SEAM_USERS)
    problems = []
    for path, module in _source_files():
        rel = path.relative_to(ROOT)
        for seam, method, line in _seam_calls(path):
            if method not in ("install", "watch"):
                continue  # reading: seams.WORLD.value()
            allowed = SEAM_USERS[seam][0 if method == "install" else 1]
            if module not in allowed:
                problems.append(f"{rel}:{line}: {module} may not {method} seams.{seam}")
        source = path.read_text()
        if seams.DISPATCH_HOOK in source and module not in DISPATCH_USERS:
            problems.append(f"{rel}: names {seams.DISPATCH_HOOK} (only {sorted(DISPATCH_USERS)})")
        for old in ("install_functional", "set_world_provider", "install_global_io",
                    "on_cupy_change", "_world_provider", "_GLOBAL_IO"):
            if re.search(rf"\b{old}\b", source):
                problems.append(f"{rel}: {old} bypasses minigrad.seams")
    assert not problems, "\n".join(problems)


def test_a_seam_is_filled_by_the_layer_above_its_reader():
    """Each installing module sits in a higher layer than the module that reads the seam (the
    GPU swap is the one same-layer seam: xp announces it to its neighbours)."""
    readers = {"FUNCTIONAL": "minigrad.autodiff.tensor", "WORLD": "minigrad.data.sampler",
               "GLOBAL_IO": "minigrad.serialization", "TRACER": "minigrad.module.module"}
    for seam, reader in readers.items():
        for filler in SEAM_USERS[seam][0]:
            assert layer_of(filler) > layer_of(reader), (seam, filler, reader)


# -- distributed/: folders that read bottom-up, a handful of loose files -----------------------

# each loose file beside the folders, and why it is not in one
DISTRIBUTED_LOOSE_FILES = {
    "__init__.py": "the public API: MegEngine's and PyTorch's names, re-exported",
    "launch.py": "`python -m minigrad.distributed.launch`, torchrun's command path",
    "flight_recorder.py": "`python -m minigrad.distributed.flight_recorder DIR`, its command path",
}
DISTRIBUTED_FOLDERS = [  # bottom-up, as the code depends
    "runtime", "comm", "data_parallel", "mesh",
    "pipeline", "tensor_parallel", "sequence_parallel", "global_tensor", "checkpoint",
    "deepspeed",
]
#: Folders above every strategy that may import any folder below them, strategies included:
#: checkpoint/ must know how each strategy lays out its tensors (tensor-parallel shard specs,
#: global tensors' SBP) to save and reshard them; no strategy may import checkpoint/. deepspeed/
#: wires DeepSpeed's config onto the pipeline engine, data parallelism, ZeRO and checkpoints.
DISTRIBUTED_TOP_FOLDERS = {"checkpoint", "deepspeed"}


def test_distributed_has_folders_and_no_loose_modules():
    root = PACKAGE / "distributed"
    entries = {p.name for p in root.iterdir() if p.name != "__pycache__"}
    loose = {name for name in entries if (root / name).is_file()}
    assert loose == set(DISTRIBUTED_LOOSE_FILES), (
        f"loose files in minigrad/distributed/: {sorted(loose - set(DISTRIBUTED_LOOSE_FILES))} "
        "belong in one of its folders (or in DISTRIBUTED_LOOSE_FILES, with a reason)")
    assert entries - loose == set(DISTRIBUTED_FOLDERS)


# (module, folder it imports against the order): why
DISTRIBUTED_FOLDER_EXCEPTIONS = {
    ("minigrad.distributed.runtime.launcher", "comm"): (
        "the launcher is the top of the runtime: each rank it forks joins the process group, and "
        "it removes the job's shared-memory segments when the ranks are gone"),
    ("minigrad.distributed.runtime.launch", "comm"): (
        "removes the job's shared-memory segments when the ranks are gone"),
    ("minigrad.distributed.global_tensor.graph", "pipeline"): (
        "mg.Graph runs its pipeline stages on the pipeline package's schedules (data)"),
}


def test_distributed_folders_import_only_folders_below_them():
    """runtime <- comm <- data_parallel <- mesh <- the strategies: a folder imports only folders
    listed before it, and the strategies do not import each other (exceptions above, with why)."""
    order = {name: i for i, name in enumerate(DISTRIBUTED_FOLDERS)}
    strategies = set(DISTRIBUTED_FOLDERS[4:]) - DISTRIBUTED_TOP_FOLDERS
    problems = []
    for path, module in _source_files():
        parts = module.split(".")
        if parts[:2] != ["minigrad", "distributed"] or len(parts) < 3 or parts[2] not in order:
            continue
        for target, line, _ in minigrad_imports(path, module):
            tparts = target.split(".")
            if tparts[:2] != ["minigrad", "distributed"] or len(tparts) < 3:
                continue
            here, there = parts[2], tparts[2]
            if there not in order or there == here:
                continue
            if (module, there) in DISTRIBUTED_FOLDER_EXCEPTIONS:
                continue
            if order[there] > order[here] or (here in strategies and there in strategies):
                problems.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {there}")
    assert not problems, "\n".join(problems)


def test_alias_paths_are_the_modules_they_name():
    """MegEngine's module paths (minigrad.aliases) give the defining module itself."""
    code = ("import importlib, minigrad\n"
            "from minigrad.aliases import ALIASES\n"
            "for alias, real in ALIASES.items():\n"
            "    a, r = importlib.import_module(alias), importlib.import_module(real)\n"
            "    assert a is r and a.__name__ == real == a.__spec__.name, alias\n"
            "import minigrad.functional.elemwise as E, minigrad.distributed.helper as H\n"
            "from minigrad.tensor import Tensor\n"
            "assert minigrad.tensor is Tensor and E.add is minigrad.functional.add\n"
            "assert H.bcast_list_ is minigrad.distributed.bcast_list_\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
