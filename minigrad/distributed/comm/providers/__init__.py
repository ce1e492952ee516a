"""Collective backends behind one interface (:class:`~.base.Backend`), and the rule that picks one.

``"cpu"`` (:mod:`.cpu`) moves NumPy arrays over shared memory on one host or TCP between hosts;
``"mpi"`` (:mod:`.mpi`) goes through MPI (mpiexec/Slurm jobs); ``"nccl"`` (:mod:`.nccl`) moves CuPy
arrays with NCCL. :func:`resolve_routes` is the one rule that maps a process group's backend setting
to the backend used for host arrays and for GPU arrays; every rank evaluates it the same way, and
receivers follow what the sender announces, so both ends of every transfer agree.
"""

from __future__ import annotations

from typing import Callable

from minigrad.distributed.comm.providers.base import Backend
from minigrad.distributed.comm.providers.cpu import CpuBackend
from minigrad.distributed.comm.providers.mpi import MpiBackend
from minigrad.distributed.comm.providers.nccl import NcclBackend

BACKENDS = ("cpu", "mpi", "nccl")
SETTINGS = BACKENDS + ("auto",)

_CLASSES = {"cpu": CpuBackend, "mpi": MpiBackend, "nccl": NcclBackend}


def choose_backend(
    setting: str, on_gpu: bool, mpi_job: bool, nccl_usable: Callable[[], bool]
) -> str:
    """The backend that moves an array, for a group whose backend setting is ``setting``.

    ======== ======================= ==========================================================
    setting  host (NumPy) arrays     GPU (CuPy) arrays
    ======== ======================= ==========================================================
    cpu      cpu                     cpu (staged through host memory)
    mpi      mpi                     mpi (CUDA-aware MPI, else staged through host memory)
    nccl     cpu                     nccl
    auto     mpi in an MPI job,      nccl when usable, else the host arrays' backend
             else cpu
    ======== ======================= ==========================================================

    ``mpi_job``: the job was started by mpiexec/srun and mpi4py is installed;
    ``nccl_usable()``: whether NCCL works in this process (asked only for GPU arrays under auto).
    """
    if setting not in SETTINGS:
        raise ValueError(f"unknown distributed backend {setting!r}: expected one of {SETTINGS}")
    if setting in ("cpu", "mpi"):
        return setting
    host = "mpi" if setting == "auto" and mpi_job else "cpu"
    if on_gpu and (setting == "nccl" or nccl_usable()):
        return "nccl"
    return host


def create_backend(name: str, ctx) -> Backend:
    """Backend ``name`` for the group context ``ctx`` (see ``group.GroupContext``)."""
    if name not in _CLASSES:
        raise ValueError(f"unknown distributed backend {name!r}: expected one of {BACKENDS}")
    return _CLASSES[name](ctx)
