"""The package runs on its minimum Python, 3.10 (``requires-python`` in pyproject.toml), although
the suite may run on a newer one: no API from 3.11 or later may creep into ``minigrad/``.

Two independent checks: ``vermin`` (a test dependency) knows the version of most standard-library
modules, functions and syntax; it cannot know the type of an object, so it misses methods such as
``BaseException.add_note``, which a small AST scan of a list of 3.11+ names catches.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minigrad"
MINIMUM = "3.10"

# Names first available in Python 3.11 or later.
NEW_MODULES = {"tomllib", "wsgiref.types"}
NEW_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
NEW_METHODS = {"add_note"}  # BaseException.add_note: an attribute of any object, whatever its name
NEW_IN_MODULES = {
    "asyncio": {"TaskGroup", "timeout", "timeout_at", "Runner", "Barrier"},
    "contextlib": {"chdir"},
    "datetime": {"UTC"},
    "enum": {"StrEnum", "ReprEnum", "verify", "member", "nonmember", "global_enum",
             "EnumCheck", "FlagBoundary"},
    "hashlib": {"file_digest"},
    "inspect": {"getmembers_static", "markcoroutinefunction"},
    "itertools": {"batched"},
    "math": {"cbrt", "exp2", "sumprod"},
    "operator": {"call"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "assert_type", "reveal_type",
               "Required", "NotRequired", "TypeVarTuple", "Unpack", "dataclass_transform",
               "override", "get_overloads", "clear_overloads", "TypeAliasType"},
}


VERMIN = "import sys; from vermin import main; sys.exit(main())"  # vermin has no __main__


def _newer_than_minimum(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every use of a 3.11+ name or syntax in ``tree``."""
    found = []
    modules: dict[str, str] = {}  # local name -> module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEW_MODULES:
                    found.append((node.lineno, f"import {alias.name}"))
                modules[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in NEW_MODULES:
                found.append((node.lineno, f"from {node.module} import"))
            for alias in node.names:
                if alias.name in NEW_IN_MODULES.get(node.module, ()):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr in NEW_METHODS:
                found.append((node.lineno, f".{node.attr}"))
            if isinstance(node.value, ast.Name):
                module = modules.get(node.value.id)
                if module and node.attr in NEW_IN_MODULES.get(module, ()):
                    found.append((node.lineno, f"{module}.{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            found.append((node.lineno, node.id))
        elif type(node).__name__ in ("TryStar", "TypeAlias", "TypeVar", "ParamSpec"):
            found.append((node.lineno, f"{type(node).__name__} syntax"))
    return found


def test_scan_catches_what_vermin_misses():
    source = (
        "import typing, tomllib\nfrom datetime import UTC\n"
        "try:\n    pass\nexcept ValueError as e:\n    e.add_note('x')\n"
        "def f() -> typing.Self: raise ExceptionGroup('g', [])\n"
    )
    whats = sorted(what for _, what in _newer_than_minimum(ast.parse(source)))
    assert whats == [".add_note", "ExceptionGroup", "datetime.UTC", "import tomllib",
                     "typing.Self"]


def test_no_api_newer_than_the_minimum_python_in_the_package():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in
                _newer_than_minimum(tree)]
    assert not bad, f"Python > {MINIMUM} API in minigrad (requires-python >= {MINIMUM}):\n" + \
        "\n".join(bad)


def test_vermin_finds_nothing_newer_than_the_minimum_python():
    proc = subprocess.run(
        [sys.executable, "-c", VERMIN, f"--target={MINIMUM}-", "--violations", "--no-tips",
         str(PACKAGE)],
        capture_output=True, text=True, timeout=600,
    )
    assert "No module named 'vermin'" not in proc.stderr, 'no vermin: pip install -e ".[test]"'
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
