"""minigrad's NCCL backend with two ranks, each on its own GPU, on the fake CuPy (whose NCCL
exchanges the ranks' buffers between processes), for CuPy 13's unique id (a tuple) and CuPy 14's
(``bytes``): the collectives equal NumPy's on the two ranks' inputs."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import fake_cupy

import minigrad as mg
import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.testing.distributed import run_workers


def _rank_collectives():
    import cupy  # noqa: PLC0415  (the fake)

    rank = dist.get_rank()
    mg.set_default_device(f"gpu{rank}")
    with cupy.cuda.Device(rank):
        x = cupy.arange(4.0) + 10 * rank
        out = {
            "route": dist.WORLD.context().route(True),
            "device": x.device.id,
            "sum": comm.all_reduce(x.copy(), "sum"),
            "max": comm.all_reduce(x.copy(), "max"),
            "gather": cupy.concatenate(comm.all_gather(x)),
            "gather_into": comm.all_gather_into(cupy.empty(8), x),
            "broadcast": comm.broadcast(x.copy(), root=1),
            "reduce_scatter": comm.reduce_scatter([x[:2].copy(), x[2:].copy()]),
            "all_to_all": cupy.concatenate(comm.all_to_all([x[:2].copy(), x[2:].copy()])),
        }
        return {k: cupy.asnumpy(v).tolist() if isinstance(v, cupy.ndarray) else v
                for k, v in out.items()}


@pytest.mark.parametrize("cupy_version", [13, 14])
def test_two_nccl_ranks_on_two_gpus(cupy_version):
    with fake_cupy.installed(2, cupy_version=cupy_version):
        got = run_workers(_rank_collectives, 2, backend="auto")
    x = [np.arange(4.0), np.arange(4.0) + 10]
    for rank, out in enumerate(got):
        half = slice(2 * rank, 2 * rank + 2)
        assert out == {
            "route": "nccl", "device": rank,
            "sum": (x[0] + x[1]).tolist(), "max": np.maximum(x[0], x[1]).tolist(),
            "gather": np.concatenate(x).tolist(), "gather_into": np.concatenate(x).tolist(),
            "broadcast": x[1].tolist(),
            "reduce_scatter": (x[0] + x[1])[half].tolist(),
            "all_to_all": np.concatenate([x[0][half], x[1][half]]).tolist(),
        }, rank
