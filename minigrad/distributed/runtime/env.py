"""Where a rank learns who it is: the environment contract between launchers and ranks.

Writer: :func:`rank_environment` builds the variables ``@dist.launcher`` and ``python -m
minigrad.distributed.launch`` give each rank. Reader: :func:`detect` turns the environment back into
rank, world size and local rank for ``init_process_group()``; it also understands the variables of
the launchers users already run, so ``mpiexec -n 4 python train.py`` and ``srun python train.py``
need no code changes (first match wins):

================  ======================  ======================  ===========================
source            rank                    world size              local rank
================  ======================  ======================  ===========================
minigrad/torchrun ``RANK``                ``WORLD_SIZE``          ``LOCAL_RANK``
Open MPI          ``OMPI_COMM_WORLD_RANK`` ``OMPI_COMM_WORLD_SIZE`` ``OMPI_COMM_WORLD_LOCAL_RANK``
MPICH, Intel MPI  ``PMI_RANK``            ``PMI_SIZE``            ``MPI_LOCALRANKID``
MVAPICH2          ``MV2_COMM_WORLD_RANK``  ``MV2_COMM_WORLD_SIZE``  ``MV2_COMM_WORLD_LOCAL_RANK``
Slurm ``srun``    ``SLURM_PROCID``        ``SLURM_STEP_NUM_TASKS`` ``SLURM_LOCALID``
================  ======================  ======================  ===========================

Slurm variables count only inside an ``srun`` step (``SLURM_STEP_ID`` is set): a batch script's own
process also sees ``SLURM_NTASKS`` but is a single process.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass

from minigrad.distributed.runtime.settings import (
    JOB_ENV,
    LAUNCHED_ENV,
    PREFIXED_ENV,
    SECRET_ENV,
    STORE_ENV,
)

SLURM_PORT_BASE = 20000  # srun jobs without MASTER_PORT use 20000 + job id % 20000
SLURM_PORT_SPAN = 20000

# (source, rank, world size, local rank, local world size) variable names, in order of precedence
_SOURCES = (
    ("minigrad", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("mvapich", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
     "MV2_COMM_WORLD_LOCAL_SIZE"),
)
MPI_SOURCES = ("openmpi", "mpich", "mvapich")


@dataclass(frozen=True)
class LaunchInfo:
    """What the environment says about this process's place in the job.

    ``source`` names the launcher (``"minigrad"``, ``"openmpi"``, ``"mpich"``, ``"mvapich"``,
    ``"slurm"`` or ``"none"``); ``mpi`` says whether MPI itself knows the job (mpiexec, or srun with
    a PMI plugin), i.e. whether the mpi backend and the MPI rendezvous can be used.
    """

    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None = None
    num_nodes: int | None = None
    mpi: bool = False

    @property
    def external(self) -> bool:
        """True when another program started this process as one rank of a multi-rank job."""
        return self.source != "none" and self.world_size > 1


def _int(env, name: str, default=None):
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from exc


def detect(env=None) -> LaunchInfo:
    """Read rank, world size and local rank from ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    pmi = "PMI_RANK" in env or "PMIX_RANK" in env
    for source, rank, size, local, local_size in _SOURCES:
        if rank in env and size in env:
            return LaunchInfo(
                source,
                _int(env, rank),
                _int(env, size),
                _int(env, local, 0),
                _int(env, local_size),
                None,
                source in MPI_SOURCES or (source == "minigrad" and pmi),
            )
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        size = _int(env, "SLURM_STEP_NUM_TASKS", None) or _int(env, "SLURM_NTASKS", 1)
        nodes = _int(env, "SLURM_STEP_NUM_NODES", None) or _int(env, "SLURM_NNODES")
        return LaunchInfo(
            "slurm", _int(env, "SLURM_PROCID"), size, _int(env, "SLURM_LOCALID", 0), None, nodes,
            pmi,
        )
    return LaunchInfo("none", 0, 1, 0)


def mpi4py_installed() -> bool:
    """Whether ``mpi4py`` can be imported (checked without importing it: that would start MPI)."""
    return importlib.util.find_spec("mpi4py") is not None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``"node[03-05,9],gpu1"`` -> ``"node03"``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if m is None:
        raise ValueError(f"cannot read the Slurm host list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def store_address(info: LaunchInfo, env=None) -> tuple[str | None, int | None]:
    """``(MASTER_ADDR, MASTER_PORT)`` from the environment, filled in for srun jobs from the
    job's host list and id; ``None`` where nothing says (the caller decides what to do)."""
    env = os.environ if env is None else env
    addr, port = env.get("MASTER_ADDR"), _int(env, "MASTER_PORT")
    if info.source == "slurm":
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if addr is None and nodes:
            addr = first_host(nodes)
        job = _int(env, "SLURM_JOB_ID")
        if port is None and job is not None:
            port = SLURM_PORT_BASE + job % SLURM_PORT_SPAN
    return addr, port


def rank_environment(
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    secret: str,
    job: str,
    device: str,
) -> dict[str, str]:
    """The variables a launcher gives one rank: its place in the job, the store's address and
    secret, and its device (``gpu{local_rank}`` on GPU hosts: ``init_process_group`` makes it the
    current CUDA device, so each rank's arrays, streams and NCCL communicator use its own GPU)."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "MINIGRAD_DEFAULT_DEVICE": device,
        SECRET_ENV: secret,
        JOB_ENV: job,
        STORE_ENV: "external",
        LAUNCHED_ENV: "1",
        PREFIXED_ENV: "1",
    }
