"""Multi-process GPU jobs, each a check that raises when something is wrong.

``test_gpu_distributed.py`` runs them on the fake CuPy in CI (the forked ranks inherit it) and,
marked ``gpu``, on CUDA through ``python tests/distributed/gpu_jobs.py NAME``: a fresh interpreter
whose ranks are forked before anything initialises CUDA (the pytest process may already have, for
its single-process GPU tests, and forked children cannot use CUDA after that).

    python tests/distributed/gpu_jobs.py nccl_world_size_one cupy_collectives data_parallel pipeline

The parent process never touches a GPU: in a fresh interpreter its default device is gpu0, so
references are computed in a forked rank on cpu0 (``_reference_on_cpu``); had the parent made a
GPU current, the launcher would make every rank's first GPU request fail.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import test_comm  # noqa: E402
import test_data_parallel  # noqa: E402
import test_pipeline  # noqa: E402

import minigrad as mg  # noqa: E402
import minigrad.autodiff as ad  # noqa: E402
import minigrad.distributed as dist  # noqa: E402
from minigrad.distributed import comm  # noqa: E402
from minigrad.testing.distributed import run_workers  # noqa: E402

SHAPES = [(), (3,), (5, 4)]
#: Seconds each launched job may run: the first CUDA kernels of a rank compile or load from a
#: cold cache, which alone can take a minute.
JOB_TIMEOUT = 300


def _cupy():
    import cupy  # noqa: PLC0415  (the real or the fake one, whichever is installed)

    return cupy


# -- NCCL at world size 1: every collective, every dtype, 0-d shapes -----------------------------


def _nccl_rank() -> int:
    cp = _cupy()
    assert dist.WORLD.context().route(True) == "nccl", "CuPy arrays must go through NCCL"
    checked = 0
    for d, dtype in enumerate(comm.DTYPES):
        for s, shape in enumerate(SHAPES):
            host = np.random.default_rng(10 * d + s).integers(0, 5, shape).astype(dtype)
            x = cp.asarray(host)
            ops = ["sum", "max", "min", "product"] + (["avg"] if dtype.startswith("f") else [])
            results = [comm.all_reduce(x.copy(), op) for op in ops]
            results += [comm.all_reduce(x.copy(), "sum", async_op=True).wait(),
                        comm.broadcast(x.copy(), root=0), comm.reduce(x.copy(), "sum", root=0),
                        comm.scatter([x]), comm.reduce_scatter([x]),
                        comm.reduce_scatter([x], async_op=True).wait()]
            results += comm.all_gather(x) + comm.gather(x) + comm.all_to_all([x])
            results.append(comm.all_gather_into(cp.empty(shape, dtype), x))  # n = 1: x's size
            for y in results:
                where = f"{dtype} {shape}"
                assert isinstance(y, cp.ndarray) and y.device.id == 0, where
                assert y.shape == shape and y.dtype == host.dtype, f"{where}: {y.shape} {y.dtype}"
                np.testing.assert_array_equal(cp.asnumpy(y), host, err_msg=where)
                checked += 1
    return checked


def nccl_world_size_one() -> None:
    """One rank: NCCL is used, results equal the input (world size 1) with shape and dtype."""
    (checked,) = run_workers(_nccl_rank, 1, backend="auto", timeout=JOB_TIMEOUT)
    per_shape = sum(15 if dtype.startswith("float") else 14 for dtype in comm.DTYPES)  # avg
    assert checked == per_shape * len(SHAPES), checked


# -- two ranks sharing GPU 0 over the cpu backend ------------------------------------------------


def _on_gpu0(fn, *args):
    mg.set_default_device("gpu0")  # parameters and batches of this rank live on GPU 0
    return fn(*args)


def _on_cpu0(fn, *args):
    mg.set_default_device("cpu0")
    return fn(*args)


def _reference_on_cpu(fn, *args):
    """``fn(*args)`` computed in a forked process on cpu0: never on the parent's default device
    (gpu0 in a fresh interpreter), where it would initialise CUDA before the ranks are forked."""
    (result,) = run_workers(_on_cpu0, 1, fn, *args, timeout=JOB_TIMEOUT)
    return result


def data_parallel() -> None:
    """Data parallelism with CuPy tensors (staged through host memory): equal to one process on
    the CPU in float64, whether the gradients go in one bucket or one all-reduce each."""
    ref_params, ref_losses = _reference_on_cpu(test_data_parallel._reference, 2)
    for bucket_mb in (10.0, 0.0):
        out = run_workers(_on_gpu0, 2, test_data_parallel._dp_worker, bucket_mb,
                          timeout=JOB_TIMEOUT)
        for params, losses in out:
            for p, q in zip(params, ref_params):
                np.testing.assert_allclose(p, q, rtol=1e-10, atol=1e-12)
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)


def _staged_copies(bucket_mb: float) -> int:
    """Device-to-host copies of one data-parallel backward (the fake CuPy counts them)."""
    cp = _cupy()
    params = [mg.Parameter(np.ones(s), dtype="float64") for s in [(5, 7), (7,), (7, 3), (3,)]]
    gm = ad.GradManager().attach(
        params, callbacks=[dist.make_allreduce_cb("mean", bucket_size_mb=bucket_mb)])
    cp.clear()
    with gm:
        gm.backward((mg.tensor(np.ones((2, 5))) @ params[0] + params[1]).sum()
                    + (mg.tensor(np.ones((2, 7))) @ params[2] + params[3]).sum())
    return len(cp.d2h)


def staging_per_bucket() -> None:
    """GPU gradients over the cpu backend: one staged copy per bucket, not one per gradient."""
    assert run_workers(_on_gpu0, 2, _staged_copies, 10.0, timeout=JOB_TIMEOUT) == [1, 1]
    assert run_workers(_on_gpu0, 2, _staged_copies, 0.0, timeout=JOB_TIMEOUT) == [4, 4]


def pipeline() -> None:
    """A two-stage pipeline (remote_send/remote_recv, five micro-batches) with CuPy tensors:
    gradients equal one process on the CPU."""
    ref = _reference_on_cpu(test_pipeline.single_process_two_stages)
    out = run_workers(_on_gpu0, 2, test_pipeline._microbatch_worker, 5, timeout=JOB_TIMEOUT)
    for got, want in zip(out, ref):
        np.testing.assert_allclose(got, want, rtol=1e-10)


def cupy_collectives() -> None:
    """all_reduce, broadcast and an async all_reduce of CuPy arrays: one rank over NCCL, two ranks
    sharing GPU 0 over the cpu backend."""
    test_comm.check_cupy_arrays(1, "auto", timeout=JOB_TIMEOUT)
    test_comm.check_cupy_arrays(2, "cpu", timeout=JOB_TIMEOUT)


JOBS = {f.__name__: f for f in (nccl_world_size_one, cupy_collectives, data_parallel,
                                staging_per_bucket, pipeline)}

if __name__ == "__main__":
    for name in sys.argv[1:]:
        JOBS[name]()
        print(f"{name}: passed", flush=True)
