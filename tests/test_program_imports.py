"""Every ``minigrad`` name that the programs outside the package import (``benchmarks/``,
``examples/``) exists, including imports inside functions that only run in a full benchmark: a
rename in the package must not leave a program that fails an hour into ``benchmarks/report.py``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/*.py")])


def minigrad_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) for every import of a minigrad module or name in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "minigrad" or node.module.startswith("minigrad.")):
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names
                      if alias.name == "minigrad" or alias.name.startswith("minigrad.")]
    return found


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_program_imports_resolve(path):
    missing = []
    for line, module, name in minigrad_imports(path):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name.split(".")[0] in {"cupy", "cupyx", "mpi4py", "matplotlib"}:
                continue  # an optional extra not installed here
            missing.append(f"line {line}: import {module}: {exc}")
            continue
        if name is not None and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ModuleNotFoundError:
                missing.append(f"line {line}: from {module} import {name}: no such name")
    assert not missing, f"{path.name}:\n" + "\n".join(missing)


def test_the_check_sees_function_local_imports(tmp_path):
    program = tmp_path / "program.py"
    program.write_text(
        "def main():\n    from minigrad.distributed.runtime.log import nothing_here\n")
    assert minigrad_imports(program) == [(2, "minigrad.distributed.runtime.log", "nothing_here")]
    with pytest.raises(AssertionError, match="line 2: from minigrad.distributed.runtime.log import "
                                             "nothing_here: no such name"):
        test_program_imports_resolve(program)
