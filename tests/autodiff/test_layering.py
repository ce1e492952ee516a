"""The autodiff/tensor layer imports only downwards (backend), and only at module level: the one
link up to ``minigrad.functional`` is the ``install_functional`` seam in ``tensor.py``."""

import ast
import pathlib
import subprocess
import sys

import pytest

import minigrad

ROOT = pathlib.Path(minigrad.__file__).parent
LAYER = sorted(ROOT.glob("autodiff/*.py")) + [ROOT / "tensor.py"]
ALLOWED = {
    "tensor.py": ("minigrad.backend", "minigrad.autodiff.state"),
    "autodiff": ("minigrad.backend", "minigrad.tensor", "minigrad.autodiff", "minigrad.random"),
}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node, node.module or ""
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node, alias.name


@pytest.mark.parametrize("path", LAYER, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_lower_layers_at_module_level(path):
    tree = ast.parse(path.read_text())
    allowed = ALLOWED["tensor.py" if path.name == "tensor.py" else "autodiff"]
    top_level = {id(n) for n in tree.body}
    for node, module in _imports(tree):
        assert id(node) in top_level, f"{path.name}:{node.lineno}: import inside a function"
        if module.startswith("minigrad"):
            assert module.startswith(allowed), f"{path.name}:{node.lineno}: imports {module}"


def test_random_stays_below_functional():
    """checkpointing imports minigrad.random, which must not import anything above tensor."""
    tree = ast.parse((ROOT / "random.py").read_text())
    for _, module in _imports(tree):
        if module.startswith("minigrad"):
            assert module.startswith(("minigrad.backend", "minigrad.tensor")), module


def test_tensor_operators_work_in_a_fresh_interpreter():
    code = "from minigrad.tensor import Tensor; print((Tensor([1.0, 2.0]) * 2 + 1).tolist())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[3.0, 5.0]"
