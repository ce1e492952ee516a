"""The PyTorch/OneFlow-style API on ``minigrad.distributed``: collectives in place on tensors and
arrays, sync and async, against NumPy; objects; messages; groups; helpers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from collective_cases import check_rank, run_cases

import minigrad as mg
import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.testing.distributed import run_workers


@pytest.mark.parametrize("n", [2, 3])
def test_every_torch_style_collective_equals_numpy(n):
    res = run_workers(run_cases, n, timeout=120)
    assert all(check_rank(got, r, n) > 150 for r, got in enumerate(res))


def _keyword_calls():
    """Each collective called with PyTorch's keyword names, as torch scripts write them."""
    r, n = dist.get_rank(), dist.get_world_size()
    t = mg.tensor(np.full(2, r + 1.0))
    out = {}
    tensor_list = [mg.tensor(np.zeros(2)) for _ in range(n)]
    dist.all_gather(tensor_list=tensor_list, tensor=t)
    out["all_gather"] = [x.numpy() for x in tensor_list]
    output = mg.tensor(np.zeros(2))
    dist.reduce_scatter(output=output, input_list=[mg.tensor(np.full(2, 10.0 * j + r))
                                                   for j in range(n)], op=dist.ReduceOp.SUM)
    out["reduce_scatter"] = output.numpy()
    gather_list = [mg.tensor(np.zeros(2)) for _ in range(n)] if r == 0 else None
    dist.gather(tensor=t, gather_list=gather_list, dst=0)
    out["gather"] = None if gather_list is None else [x.numpy() for x in gather_list]
    got = mg.tensor(np.zeros(2))
    dist.scatter(tensor=got, scatter_list=[mg.tensor(np.full(2, 7.0 * j)) for j in range(n)]
                 if r == 0 else None, src=0)
    out["scatter"] = got.numpy()
    output_tensor_list = [mg.tensor(np.zeros(2)) for _ in range(n)]
    dist.all_to_all(output_tensor_list=output_tensor_list,
                    input_tensor_list=[mg.tensor(np.full(2, 100.0 * r + j)) for j in range(n)])
    out["all_to_all"] = [x.numpy() for x in output_tensor_list]
    b = mg.tensor(np.full(2, float(r)))
    dist.broadcast(tensor=b, src=1)
    out["broadcast"] = b.numpy()
    red = mg.tensor(np.full(2, r + 1.0))
    dist.reduce(tensor=red, dst=1, op=dist.ReduceOp.MAX)
    out["reduce"] = red.numpy()
    return r, out


def test_collectives_take_pytorch_keyword_names():
    n = 3
    for r, out in run_workers(_keyword_calls, n, timeout=60):
        full = lambda v: np.full(2, float(v))  # noqa: E731
        for j, x in enumerate(out["all_gather"]):
            np.testing.assert_array_equal(x, full(j + 1))
        reduced = sum(10.0 * r + k for k in range(n))  # rank k sent 10 r + k to rank r
        np.testing.assert_array_equal(out["reduce_scatter"], full(reduced))
        if r == 0:
            for j, x in enumerate(out["gather"]):
                np.testing.assert_array_equal(x, full(j + 1))
        np.testing.assert_array_equal(out["scatter"], full(7.0 * r))
        for j, x in enumerate(out["all_to_all"]):
            np.testing.assert_array_equal(x, full(100.0 * j + r))
        np.testing.assert_array_equal(out["broadcast"], full(1))
        if r == 1:
            np.testing.assert_array_equal(out["reduce"], full(n))


def _groups_and_errors():
    r = dist.get_rank()
    g = dist.new_group([2, 0], timeout=12, backend="gloo")
    info = {
        "world": repr(dist.WORLD),
        "group": repr(g),
        "ranks": (dist.get_rank(g), dist.get_world_size(g), dist.get_local_rank(),
                  dist.get_node_size(), dist.get_backend(g), dist.is_initialized()),
    }
    errors = []
    x = np.ones((2, 3), np.float32)
    for call in (
        lambda: dist.all_reduce(x, op="prod"),
        lambda: dist.all_reduce(np.ones(2, bool), op=dist.ReduceOp.AVG),
        lambda: dist.all_reduce([1.0, 2.0]),
        lambda: dist.all_gather([np.zeros(3)] * 3, x),
        lambda: dist.all_gather([np.zeros((2, 3), np.int32)] * 3, x),
        lambda: dist.all_gather_into_tensor(np.zeros((5, 3), np.float32), x),
        lambda: dist.send(x, 1, tag=3),
        lambda: dist.broadcast(x, src=7),
        lambda: comm.all_reduce(np.ones(2, ">f4")),
    ):
        try:
            call()
        except (ValueError, TypeError) as exc:
            errors.append(str(exc))
    t = mg.tensor(np.full(3, r, np.float32))
    dist.all_reduce(t, op="MAX")  # names are case-insensitive
    info["max"] = t.numpy()
    n = dist.get_world_size()  # a ring exchanged in one batch (PyTorch's batching API)
    got = np.zeros(2, np.int64)
    ops = [dist.P2POp(dist.isend, np.array([r, 7 * r]), (r + 1) % n),
           dist.P2POp(dist.irecv, got, (r - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    info["ring"] = got
    if r == 1:
        time.sleep(0.3)
    entered = time.time()
    dist.barrier()
    info["barrier"] = (entered, time.time())
    return info, errors


def test_groups_reprs_and_argument_errors():
    res = run_workers(_groups_and_errors, 3, timeout=60)
    info, errors = res[0]
    assert info["world"] == "Group(WORLD, ranks=[0, 1, 2], rank=0, backend='cpu', timeout=60 s)"
    assert info["group"] == "Group(ranks=[2, 0], rank=1, backend='cpu', timeout=12 s)"
    assert info["ranks"] == (1, 2, 0, 1, "cpu", True)
    assert res[1][0]["ranks"][0] == -1 and res[2][0]["ranks"][:3] == (0, 2, 2)
    assert "unknown reduce op 'prod'" in errors[0] and "'product'" in errors[0]
    assert "AVG is not defined for bool" in errors[1]
    assert "expected a NumPy or CuPy array, got list" in errors[2]
    assert "output is [3] float64, the result [2, 3] float32" in errors[3]
    assert "output is [2, 3] int32, the result [2, 3] float32" in errors[4]
    assert "neither the stacked [3, 2, 3] nor the concatenated [6, 3]" in errors[5]
    assert "tags are not supported" in errors[6] and "root rank 7 is not in group" in errors[7]
    assert "non-native byte order" in errors[8] and "float32" in errors[8]
    assert len(errors) == 9
    for r, (info, _) in enumerate(res):
        np.testing.assert_array_equal(info["max"], [2.0, 2.0, 2.0])
        np.testing.assert_array_equal(info["ring"], [(r - 1) % 3, 7 * ((r - 1) % 3)])
    last_entry = max(info["barrier"][0] for info, _ in res)
    assert all(info["barrier"][1] >= last_entry for info, _ in res)


def _exits(code):
    if dist.get_rank() == 1:
        sys.exit(code)
    if dist.get_rank() == 2:
        os._exit(0)  # leaves without returning anything: None, with a warning
    return "value"


def test_rank_that_exits_with_status_zero_returns_none(capfd):
    assert run_workers(_exits, 3, 0) == ["value", None, None]
    assert "rank 2 exited with code 0 without returning a value" in capfd.readouterr().err
    with pytest.raises(dist.LaunchError, match="rank 1 failed"):
        run_workers(_exits, 3, 4)


def _synchronized(tmp):
    calls = []

    @dist.synchronized
    def write(value):
        if dist.get_rank() == 0:
            time.sleep(0.3)  # rank 0 is slow: rank 1 must still wait for it
            with open(tmp, "w") as f:
                f.write(value)
        calls.append(dist.get_rank())
        return f"written by {dist.get_rank()}"

    result = write("hello")
    with open(tmp) as f:  # every rank sees rank 0's file complete after the call
        seen = f.read()

    @dist.synchronized
    def fail():
        if dist.get_rank() == 0:
            raise OSError("disk full")
        return "fine"

    try:
        fail()
        error = None
    except (OSError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return result, calls, seen, error


def test_synchronized_runs_on_every_rank_and_none_returns_before_all_finished(tmp_path):
    # MegEngine's semantics: the function runs on every rank, then a barrier
    res = run_workers(_synchronized, 2, str(tmp_path / "f.txt"), timeout=60)
    assert res[0][:3] == ("written by 0", [0], "hello")
    assert res[1][:3] == ("written by 1", [1], "hello")
    assert res[0][3] == "OSError: disk full"
    assert res[1][3] == "RuntimeError: synchronized _synchronized.<locals>.fail: rank 0 failed: " \
        "OSError: disk full"


def _allreduce_cb_calls(method, bucket_mb):
    r = dist.get_rank()
    params = [mg.Parameter(np.full(s, r + 1.0)) for s in [(3,), (2, 2), (5,)]]
    gm = mg.autodiff.GradManager().attach(
        params, callbacks=[dist.make_allreduce_cb(method, bucket_size_mb=bucket_mb, backend="cpu")]
    )
    seq = dist.WORLD.context().seq
    with gm:
        gm.backward(sum((p * p).sum() for p in params))
    return dist.WORLD.context().seq - seq, [p.grad.numpy() for p in params]


@pytest.mark.parametrize("bucket_mb, calls", [(0, 3), (10.0, 1)])
def test_allreduce_callback_buckets_and_mean_in_any_case(bucket_mb, calls):
    res = run_workers(_allreduce_cb_calls, 2, "MEAN", bucket_mb)
    for n_calls, grads in res:
        assert n_calls == calls  # bucket size 0: one all-reduce per gradient
        for g in grads:
            np.testing.assert_array_equal(g, np.full(g.shape, 3.0))  # mean of 2*1 and 2*2


def test_allreduce_callback_checks_its_arguments():
    with pytest.raises(ValueError, match="reduce_method must be 'sum' or 'mean'"):
        dist.make_allreduce_cb("median")
    with pytest.raises(ValueError, match=r"bucket_size_mb must be >= 0"):
        dist.make_allreduce_cb("sum", bucket_size_mb=-1)
    with pytest.raises(ValueError, match="backend must be None or one of"):
        dist.make_allreduce_cb("sum", backend="gloo2")


def _reinit_with(setting):
    mine = setting if dist.get_rank() == 0 else "auto"
    dist.destroy_process_group()
    try:
        dist.init_process_group(backend=mine)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_ranks_must_agree_on_the_backend():
    for msg in run_workers(_reinit_with, 2, "cpu"):
        assert "ranks asked for different backends: rank 0: 'cpu', rank 1: 'auto'" in msg


def _broken_close():
    ctx = dist.WORLD.context()
    backend = ctx.backend(ctx.host_route)
    backend.close = lambda: (_ for _ in ()).throw(OSError("segment busy"))
    try:
        dist.destroy_process_group()
    except RuntimeError as exc:
        return str(exc), dist.is_initialized(), repr(dist.WORLD)
    return "no error"


def test_destroy_process_group_closes_everything_then_reports_failures():
    msg, initialised, world = run_workers(_broken_close, 1)[0]
    assert "1 part(s) failed to close: OSError: segment busy" in msg
    assert not initialised and world == "Group(WORLD, not initialised)"


TORCH_STYLE = textwrap.dedent(
    """
    import sys
    import minigrad as mg, minigrad.distributed as dist
    port, rank = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    t = mg.tensor([1.0, 2.0]) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    print(dist.get_backend(), t.numpy().tolist(), flush=True)
    dist.destroy_process_group()
    """
)


def test_torch_style_init_with_a_tcp_init_method(tmp_path):
    script = tmp_path / "torch_style.py"
    script.write_text(TORCH_STYLE)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD", "MASTER"))}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    procs = [subprocess.Popen([sys.executable, str(script), str(port), str(r)], env=env,
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert out.strip() == "cpu [1.5, 3.0]"
