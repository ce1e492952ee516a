"""Where ranks come from: launcher, torchrun, mpiexec and srun environments; what each launched
rank is told (including its GPU); jobs started without minigrad's launcher."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import minigrad.distributed as dist
from minigrad.backend.device import GpuProbe
from minigrad.distributed.comm import group
from minigrad.distributed.comm.providers import nccl
from minigrad.distributed.runtime import env

# the module (``minigrad.distributed.runtime.launcher`` the attribute is the decorator class)
launcher = importlib.import_module("minigrad.distributed.runtime.launcher")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "variables, expect",
    [
        ({}, ("none", 0, 1, 0, None, False)),
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"},
         ("minigrad", 3, 8, 1, None, False)),
        ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6",
          "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"},
         ("openmpi", 5, 6, 2, None, True)),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
          "PMI_FD": "9"}, ("mpich", 1, 2, 1, None, True)),
        ({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "4"},
         ("mvapich", 0, 4, 0, None, True)),
        # srun step without an MPI plugin: Slurm's own variables
        ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_STEP_NUM_TASKS": "8",
          "SLURM_LOCALID": "3", "SLURM_STEP_ID": "0", "SLURM_NNODES": "4",
          "SLURM_STEP_NUM_NODES": "2"}, ("slurm", 7, 8, 3, 2, False)),
        # srun --mpi=pmix: Slurm variables plus PMIx, so MPI knows the job too
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "3",
          "PMIX_RANK": "1"}, ("slurm", 1, 2, 1, None, True)),
        # a batch script's own process sees SLURM_NTASKS but is not one of the tasks
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "99"},
         ("none", 0, 1, 0, None, False)),
        # srun running the launch CLI: the launcher's variables win
        ({"RANK": "2", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
          "SLURM_STEP_ID": "0"}, ("minigrad", 2, 4, 0, None, False)),
    ],
)
def test_detect(variables, expect):
    info = env.detect(variables)
    assert (info.source, info.rank, info.world_size, info.local_rank, info.num_nodes,
            info.mpi) == expect
    assert info.external == (expect[2] > 1)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="PMI_SIZE='two'"):
        env.detect({"PMI_RANK": "0", "PMI_SIZE": "two"})


def test_slurm_store_address_and_hostlists():
    assert env.first_host("node[03-05,9],gpu1") == "node03"
    assert env.first_host("login2") == "login2"
    assert env.first_host("a-b[1,3]") == "a-b1"
    info = env.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"})
    variables = {"SLURM_JOB_NODELIST": "cn[12-13]", "SLURM_JOB_ID": "123456"}
    assert env.store_address(info, variables) == ("cn12", 20000 + 123456 % 20000)
    variables.update(MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    assert env.store_address(info, variables) == ("10.0.0.1", 29500)


def test_each_launched_rank_gets_its_gpu_and_the_job():
    e = env.rank_environment(5, 1, 8, 4, "10.1.1.1", 29500, "s3cret", "job1", "gpu1")
    assert e["RANK"] == "5" and e["LOCAL_RANK"] == "1" and e["WORLD_SIZE"] == "8"
    assert e["LOCAL_WORLD_SIZE"] == "4" and e["MINIGRAD_DEFAULT_DEVICE"] == "gpu1"
    assert e["MASTER_ADDR"] == "10.1.1.1" and e["MASTER_PORT"] == "29500"
    assert e["MINIGRAD_DIST_SECRET"] == "s3cret" and e["MINIGRAD_DIST_STORE"] == "external"
    info = env.detect(e)
    assert (info.rank, info.world_size, info.local_rank) == (5, 8, 1)


class _FakeCupy:
    """Records which CUDA device a rank makes current."""

    def __init__(self):
        self.used = []
        fake = self

        class Device:
            def __init__(self, index):
                self.index = index

            def use(self):
                fake.used.append(self.index)

        self.cuda = type("cuda", (), {"Device": Device})


def test_bind_device_selects_the_ranks_gpu(monkeypatch):
    fake, defaults = _FakeCupy(), []
    monkeypatch.setattr(group, "cupy_or_none", lambda: fake)
    monkeypatch.setattr(group, "set_default_device", defaults.append)
    group.bind_device("gpu3")
    group.bind_device(1)
    group.bind_device("cpu0")
    assert fake.used == [3, 1] and defaults == ["gpu3", "gpu1", "cpu0"]


def test_launcher_never_reads_a_failed_gpu_count_as_zero(monkeypatch):
    """A broken GPU setup is reported: raised for device_type="gpu", a warning for "xpu"."""
    broken = GpuProbe(0, "cannot count GPUs: /proc/driver/nvidia/gpus is unreadable", failed=True)
    monkeypatch.setattr(launcher, "probe_gpus", lambda: broken)
    with pytest.raises(RuntimeError, match="device_type='gpu'.*unreadable"):
        launcher.visible_gpu_count("gpu")
    with pytest.warns(UserWarning, match="running on the CPU.*unreadable"):
        assert launcher.visible_gpu_count("xpu") == 0
    monkeypatch.setattr(launcher, "probe_gpus", lambda: GpuProbe(2))
    assert launcher.visible_gpu_count("gpu") == 2


def test_nccl_says_why_it_is_unavailable(monkeypatch):
    monkeypatch.setattr(nccl, "cupy_or_none", lambda: None)
    monkeypatch.setattr(nccl, "cupy_import_error", lambda: "ImportError: No module named 'cupy'")
    assert "No module named 'cupy'" in nccl.unavailable_reason()
    assert not nccl.is_available()


SRUN_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import minigrad.distributed as dist
    dist.init_process_group()          # no arguments: everything comes from srun's variables
    x = np.full(3, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    print(dist.get_rank(), dist.get_world_size(), dist.get_local_rank(), dist.get_node_size(),
          x[0], dist.WORLD.context().host_route, flush=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_srun_style_job_runs_without_the_launcher(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SRUN_SCRIPT)
    port = _free_port()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "PMI", "SLURM"))}
    procs = []
    for r in range(2):
        e = dict(base, PYTHONPATH=str(ROOT), SLURM_PROCID=str(r), SLURM_NTASKS="2",
                 SLURM_STEP_ID="0", SLURM_LOCALID=str(r), SLURM_NNODES="1",
                 SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID=str(port - 20000),
                 MINIGRAD_DIST_SECRET="shared")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=e, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=60) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        assert out.split() == [str(r), "2", str(r), "1", "3.0", "cpu"]


def test_init_joins_a_user_started_server(tmp_path):
    # MegEngine: server = dist.Server(port); every rank calls init_process_group(ip, port, ...)
    server = dist.Server(0)
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(
        f"""
        import sys, numpy as np
        import minigrad.distributed as dist
        r = int(sys.argv[1])
        dist.init_process_group("127.0.0.1", {server.py_server_port}, 2, r, device="cpu0")
        x = np.ones(2) * (r + 1)
        dist.all_reduce(x)
        print(x[0], flush=True)
        dist.destroy_process_group()
        """
    ))
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER"))}
    e["PYTHONPATH"] = str(ROOT)
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], env=e, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        server.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert out.strip() == "3.0"
    assert server.port == server.py_server_port
