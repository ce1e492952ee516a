"""A missing optional dependency (mpi4py, CuPy) gives one clear line naming the extra to install,
not a traceback from inside the import machinery. Absence is simulated by hiding the module
(``sys.modules[name] = None`` makes ``import name`` fail), so these run whether or not the extra
is installed here. (matplotlib's case is in pipeline/test_pipeline_timeline.py.)"""

from __future__ import annotations

import sys

import pytest

import minigrad.distributed as dist
from minigrad.distributed.comm.providers import mpi


def _hide(monkeypatch, *names):
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def test_mpi_backend_without_mpi4py_names_the_extra(monkeypatch):
    _hide(monkeypatch, "mpi4py", "mpi4py.MPI")
    with pytest.raises(RuntimeError, match=r'needs mpi4py .*pip install -e "\.\[mpi\]"') as caught:
        mpi.mpi_module()
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "\n" not in str(caught.value)


def test_init_process_group_mpi_without_mpi4py_names_the_extra(monkeypatch):
    _hide(monkeypatch, "mpi4py", "mpi4py.MPI")
    monkeypatch.setenv("PMI_RANK", "0")  # looks like an mpiexec job: only mpi4py is missing
    monkeypatch.setenv("PMI_SIZE", "1")
    with pytest.raises(ValueError, match=r"backend='mpi'.*mpi4py installed "
                                         r"\(pip install -e '\.\[mpi\]'\)"):
        dist.init_process_group(backend="mpi")
    assert not dist.is_initialized()
