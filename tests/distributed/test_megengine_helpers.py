"""MegEngine's distributed helpers that its programs call: ``dist.helper.param_pack_split`` /
``param_pack_concat`` / ``get_device_count_by_fork``, ``dist.group_start`` / ``group_end`` and
``Group.key`` (issue 27)."""

import numpy as np
import pytest

import minigrad as mg
import minigrad.distributed as dist
import minigrad.functional as F
from minigrad.autodiff import GradManager
from minigrad.testing.distributed import run_workers


def test_param_pack_split_and_concat_as_documented():
    a = mg.tensor(np.arange(10, dtype=np.float32))
    b, c = dist.helper.param_pack_split(a, [0, 1, 1, 10], [(1,), (3, 3)])
    np.testing.assert_array_equal(b.numpy(), [0.0])
    np.testing.assert_array_equal(c.numpy(), np.arange(1, 10, dtype=np.float32).reshape(3, 3))
    offsets = dist.helper.get_offsets([(1,), (3, 3)])
    assert offsets == [0, 1, 1, 10]
    packed = dist.helper.param_pack_concat([b, c], mg.tensor(offsets, dtype="int32"), offsets)
    np.testing.assert_array_equal(packed.numpy(), a.numpy())
    # gaps between the pieces are zeros (aligned packs)
    gapped = dist.helper.param_pack_concat([b, c], [0, 1, 3, 12])
    np.testing.assert_array_equal(gapped.numpy(), np.r_[0.0, 0.0, 0.0, np.arange(1, 10)])
    with pytest.raises(ValueError, match=r"\[1, 9\) holds 8 values, shape \(3, 3\) needs 9"):
        dist.helper.param_pack_split(a, [0, 1, 1, 9], [(1,), (3, 3)])
    with pytest.raises(ValueError, match="offsets must hold 2 \\* 2 values"):
        dist.helper.param_pack_concat([b, c], [0, 1, 1])


def test_param_pack_is_differentiable():
    w = mg.Parameter(np.arange(5, dtype=np.float32))
    gm = GradManager().attach([w])
    with gm:
        x, y = dist.helper.param_pack_split(w, [0, 2, 2, 5], [(2,), (3,)])
        packed = dist.helper.param_pack_concat([y * 2, x * 3], [0, 3, 4, 6])
        gm.backward(F.sum(packed * mg.tensor(np.arange(1, 7, dtype=np.float32))))
    # packed = [2*w2, 2*w3, 2*w4, 0, 3*w0, 3*w1] weighted by 1..6
    np.testing.assert_allclose(w.grad.numpy(), [15.0, 18.0, 2.0, 4.0, 6.0])


def test_get_device_count_by_fork_counts_like_get_device_count():
    assert dist.helper.get_device_count_by_fork("cpu") == 1
    assert dist.helper.get_device_count_by_fork("gpu") == mg.get_device_count("gpu")


def _exchange():
    rank = dist.get_rank()
    peer = 1 - rank
    group = dist.new_group([0, 1])
    dist.group_start()
    F.distributed.remote_send(mg.tensor(np.full(3, rank + 1.0, np.float32)), peer)
    got = F.distributed.remote_recv(peer, (3,), "float32")
    dist.group_end()
    try:
        dist.group_end()
    except RuntimeError as exc:
        unbalanced = str(exc)
    else:
        unbalanced = None
    return got.numpy(), group.key, dist.WORLD.key, unbalanced


def test_group_start_end_exchange_and_group_key():
    out = run_workers(_exchange, 2)
    for rank, (got, key, world_key, unbalanced) in enumerate(out):
        np.testing.assert_array_equal(got, np.full(3, 2.0 - rank))  # the peer's value
        assert key == "0,1" and world_key == "0,1"
        assert "no group_start() is open" in unbalanced


def test_numbered_device_is_megengine_xpu_gpu_if_any_else_cpu(monkeypatch):
    """MegEngine's init_process_group(ip, port, world, rank, device) takes ``device`` as a number
    of ``device_type`` "xpu": a GPU where there is one, else the CPU; "gpu" insists on a GPU and
    "cpu" names a CPU device; other types are an error."""
    from minigrad.distributed.comm import group

    before = mg.get_default_device()
    try:
        monkeypatch.setattr(group, "is_cuda_available", lambda: False)
        group.bind_device(1, "xpu")
        assert str(mg.get_default_device()) == "cpu0"
        group.bind_device(1, "cpu")
        assert str(mg.get_default_device()) == "cpu1"
        chosen = []
        monkeypatch.setattr(group, "set_default_device", chosen.append)
        monkeypatch.setattr(group, "is_cuda_available", lambda: True)
        monkeypatch.setattr(group, "cupy_or_none", lambda: pytest.fail("no CUDA here"))
        with pytest.raises(pytest.fail.Exception):
            group.bind_device(1, "xpu")
        assert chosen == ["gpu1"]
        with pytest.raises(ValueError, match="device_type must be 'xpu', 'gpu' or 'cpu'"):
            group.bind_device(0, "tpu")
    finally:
        mg.set_default_device(before)


def test_init_process_group_with_a_numbered_device_runs_on_cpu_without_gpus():
    """The launcher's workers call init_process_group themselves; here two plain processes use
    MegEngine's positional form with device=rank on this GPU-less machine."""
    import multiprocessing as mp
    import socket

    if mg.is_cuda_available():
        pytest.skip("this machine has GPUs: device=rank means a GPU there")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_numbered_device_worker, args=(port, r, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == [(0, "cpu0"), (1, "cpu0")]


def _numbered_device_worker(port, rank, q):
    dist.init_process_group("127.0.0.1", port, 2, rank, rank)
    dist.group_barrier()
    q.put((rank, str(mg.get_default_device())))
    dist.group_barrier()
