"""Shared buffers (``comm.shared_empty``) and the zero-copy collectives that read them in place:
the heap's blocks and their lifetimes, all-reduce and reduce-scatter results against NumPy
reductions in member order, all-gathers against concatenation, every mix of shared and private
arrays, mismatches and bad offsets raising on every rank, and the data-parallel buckets taking the
zero-copy path."""

from __future__ import annotations

import gc
import glob
import os

import numpy as np
import pytest

import minigrad.distributed as dist
from minigrad.distributed import comm
from minigrad.distributed.comm.group import WORLD
from minigrad.distributed.comm.providers.base import CollectiveError, divide_by_count
from minigrad.distributed.comm.providers.cpu import algorithms
from minigrad.distributed.comm.providers.cpu.shared_heap import PAGE, SharedHeap, heap_bytes
from minigrad.testing.distributed import run_workers

SIZE, SMALL = 30_001, 500  # in rounds of 4 KiB (the fixture below): many rounds, and one
OPS = ["sum", "avg", "max", "min", "product"]
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]


# ------------------------------------------------------------------------------ the heap alone


@pytest.fixture
def heap():
    path = f"/dev/shm/mg-test-heap-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    os.ftruncate(fd, PAGE + 8 * PAGE)
    h = SharedHeap(fd, PAGE, 8 * PAGE)
    yield h
    h.close()
    os.close(fd)


def test_blocks_are_pages_first_fit_and_coalesce_when_freed(heap):
    a, b, c = heap.allocate(1), heap.allocate(PAGE + 1), heap.allocate(PAGE)
    assert (len(a), len(b), len(c)) == (PAGE, 2 * PAGE, PAGE)
    assert heap.free_bytes() == 4 * PAGE
    assert heap.allocate(5 * PAGE) is None  # more than is left: no block, no error
    arrays = [np.frombuffer(m, np.uint8) for m in (a, b, c)]
    assert [heap.locate(x) for x in arrays] == [0, PAGE, 3 * PAGE]
    assert heap.locate(arrays[1][PAGE + 5 :]) == 2 * PAGE + 5  # a view inside a block
    assert heap.locate(np.zeros(4)) is None  # private memory
    del a, c, arrays
    gc.collect()
    assert heap.free_bytes() == 6 * PAGE
    d = heap.allocate(PAGE)  # first fit: the freed first page
    assert heap.locate(np.frombuffer(d, np.uint8)) == 0
    del b, d
    gc.collect()
    assert heap.free_bytes() == 8 * PAGE
    assert heap.allocate(8 * PAGE) is not None  # the freed blocks merged back into one


def test_a_block_lives_as_long_as_any_view_of_it(heap):
    block = heap.allocate(PAGE)
    view = np.frombuffer(block, np.float32)[10:20]
    view[:] = 7
    del block
    gc.collect()
    assert heap.free_bytes() == 7 * PAGE  # still held by the view
    assert heap.locate(view) == 40
    del view
    gc.collect()
    assert heap.free_bytes() == 8 * PAGE
    fresh = np.frombuffer(heap.allocate(PAGE), np.float32)
    assert not fresh.any()  # the freed pages went back to the system: a new block reads zeros


def test_a_forked_child_dropping_a_block_leaves_it_to_the_parent(heap):
    # a data-loader worker forked from a rank inherits the gradient buckets and their finalizers
    block = heap.allocate(PAGE)
    x = np.frombuffer(block, np.float64)
    x[:] = 3.0
    pid = os.fork()
    if pid == 0:  # the child drops its copies, collects, and leaves
        del x, block
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert (x == 3.0).all() and heap.free_bytes() == 7 * PAGE  # the pages are still the parent's
    del x, block
    gc.collect()
    assert heap.free_bytes() == 8 * PAGE


def test_heap_size_setting(monkeypatch):
    monkeypatch.setenv("MINIGRAD_DIST_SHM_HEAP", "10000")
    assert heap_bytes("/dev/shm") == 3 * PAGE  # whole pages
    monkeypatch.setenv("MINIGRAD_DIST_SHM_HEAP", "0")
    assert heap_bytes("/dev/shm") == 0
    for bad in ("1G", "-5", ""):
        monkeypatch.setenv("MINIGRAD_DIST_SHM_HEAP", bad)
        with pytest.raises(ValueError, match=f"MINIGRAD_DIST_SHM_HEAP={bad!r}: expected a number "
                                             "of bytes"):
            heap_bytes("/dev/shm")
    monkeypatch.delenv("MINIGRAD_DIST_SHM_HEAP")
    fs = os.statvfs("/dev/shm")
    assert heap_bytes("/dev/shm") == min(64 << 30, fs.f_blocks * fs.f_frsize // PAGE * PAGE)
    assert heap_bytes(None) == 0


@pytest.mark.parametrize("n", [2, 3, 4, 8, 1024, 3.0, 5, 6, 7])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_average_divides_bitwise_like_true_division(n, dtype):
    n = int(n)
    rng = np.random.default_rng(n)
    tiny = np.finfo(dtype).smallest_subnormal
    x = np.concatenate([rng.standard_normal(10_000) * 1e3, [tiny, 3 * tiny, -0.0, np.inf,
                                                           np.nan, np.finfo(dtype).max]])
    x = x.astype(dtype)
    got = x.copy()
    divide_by_count(got, n)
    assert np.array_equal(got.view(np.uint8), (x / np.asarray(n, dtype)).view(np.uint8))
    ints = np.arange(-20, 20, dtype=np.int32)
    divide_by_count(ints, n)
    np.testing.assert_array_equal(ints, np.arange(-20, 20) // n)


# ------------------------------------------------------------------------ the zero-copy all-reduce


def values(rank: int, case: int, dtype: str, size: int = SIZE) -> np.ndarray:
    """Seeded inputs: normal floats (so that sums round, and the order of the members shows),
    integers in [-8, 8] ([0, 3] unsigned)."""
    rng = np.random.default_rng(100 * rank + case)
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(size) * 4).astype(dtype)
    lo = 0 if np.dtype(dtype).kind == "u" else -8
    return rng.integers(lo, 4 if lo == 0 else 9, size).astype(dtype)


def in_member_order(xs: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction as the backend promises it: member 0 op member 1 op ..., then / n."""
    ufunc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
             "product": np.multiply}[op]
    out = xs[0].copy()
    for x in xs[1:]:
        ufunc(out, x, out=out)
    if op == "avg":
        out = out / np.asarray(len(xs), out.dtype) if out.dtype.kind == "f" else out // len(xs)
    return out


@pytest.fixture(autouse=True)
def small_rounds(monkeypatch):
    """Rounds of 4 KiB, so that small arrays take the paths of large ones."""
    monkeypatch.setenv("MINIGRAD_DIST_SHM_CHUNK", "4096")


def count_zero_copy(path: str = "_all_reduce_shared") -> list:
    """Wrap one of the backend's zero-copy paths in this rank; returns the list of whether each
    call took it (the all-reduce and all-gather return False, the reduce-scatter None, if not)."""
    taken: list = []
    original = getattr(algorithms.CpuBackend, path)

    def spy(self, *args):
        result = original(self, *args)
        taken.append(result is not None and result is not False)
        return result

    setattr(algorithms.CpuBackend, path, spy)
    return taken


def _every_dtype_and_op(shared_ranks):
    r = dist.get_rank()
    taken = count_zero_copy()
    out = {}
    for c, dtype in enumerate(DTYPES):
        for op in OPS:
            for size in (SIZE, SMALL):
                x = comm.shared_empty(size, dtype) if r in shared_ranks else np.empty(size, dtype)
                x[:] = values(r, c, dtype, size)
                out[dtype, op, size] = comm.all_reduce(x, op).copy()
    return out, taken


@pytest.mark.parametrize("n", [2, 3])
def test_shared_arrays_reduce_in_place_bitwise_in_member_order(n):
    res = run_workers(_every_dtype_and_op, n, set(range(n)), timeout=120)
    for out, taken in res:
        # the arrays of more than one round went the zero-copy way, the small ones the transport's
        assert taken == [True] * (len(DTYPES) * len(OPS)), taken
        for c, dtype in enumerate(DTYPES):
            for op in OPS:
                for size in (SIZE, SMALL):
                    ref = in_member_order([values(j, c, dtype, size) for j in range(n)], op)
                    got = out[dtype, op, size]
                    assert got.dtype == np.dtype(dtype)
                    assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), (dtype, op)
                    assert np.array_equal(got.view(np.uint8), res[0][0][dtype, op, size]
                                          .view(np.uint8))


@pytest.mark.parametrize("n, shared", [(2, {0}), (2, {1}), (3, {0, 2}), (3, set())])
def test_shared_and_private_arrays_mix(n, shared):
    # a member whose array is private (heap full, another transport) makes everyone copy
    res = run_workers(_every_dtype_and_op, n, shared, timeout=120)
    for out, taken in res:
        assert taken == [False] * (len(DTYPES) * len(OPS))
        for c, dtype in enumerate(DTYPES):
            for op in OPS:
                ref = in_member_order([values(j, c, dtype) for j in range(n)], op)
                assert np.array_equal(out[dtype, op, SIZE].view(np.uint8), ref.view(np.uint8))


def _average_both_ways():
    # one member through the waited fast path, the other asynchronously: the same fingerprint
    x = comm.shared_empty(SIZE, "float32")
    x[:] = values(dist.get_rank(), 0, "float32")
    if dist.get_rank() == 0:
        return comm.all_reduce(x, "avg").copy()
    return comm.all_reduce(x, "avg", async_op=True).wait().copy()


def test_averaging_waited_and_async_members_agree():
    res = run_workers(_average_both_ways, 2)
    ref = in_member_order([values(j, 0, "float32") for j in range(2)], "avg")
    for got in res:
        assert np.array_equal(got, ref)


def _offsets_in_more_than_one_round():
    # rounds of 16 bytes: 3 members' offsets (24 bytes) do not fit one, so all of them copy
    WORLD.context().host_backend().transport.chunk = 16
    taken = count_zero_copy()
    x = comm.shared_empty(1000, "float32")
    x[:] = values(dist.get_rank(), 0, "float32", 1000)
    return comm.all_reduce(x, "avg").copy(), taken


def test_offsets_too_large_for_one_round_make_every_member_copy():
    res = run_workers(_offsets_in_more_than_one_round, 3)
    ref = in_member_order([values(j, 0, "float32", 1000) for j in range(3)], "avg")
    for got, taken in res:
        assert taken == [False]
        assert np.array_equal(got, ref)


def _mismatch(kind):
    r = dist.get_rank()
    x = comm.shared_empty(SIZE, "float32")
    x[:] = 1
    try:
        if r == 0:
            comm.all_reduce(x)
        elif kind == "broadcast":
            comm.broadcast(x, root=1)
        else:
            comm.all_reduce(comm.shared_empty(SIZE + 1, "float32"))
    except CollectiveError as exc:
        try:  # the group is unusable now: the next call says so, and why
            comm.all_reduce(x)
        except RuntimeError as later:
            return type(exc).__name__, str(exc), str(later)
    return None


@pytest.mark.parametrize("kind", ["broadcast", "shape"])
def test_mismatched_calls_raise_on_every_rank(kind):
    res = run_workers(_mismatch, 2, kind, timeout=60)
    for rank, (name, message, later) in enumerate(res):
        assert name == "CollectiveMismatchError"
        assert "all_reduce" in message and "float32" in message
        assert ("broadcast" in message) if kind == "broadcast" else (str(SIZE + 1) in message)
        assert later == (f"group [0, 1] is unusable after an earlier collective error on rank "
                         f"{rank} (CollectiveMismatchError: {message}); create the process "
                         f"group again")


def world_heap():
    """This rank's shared heap in the WORLD group."""
    return WORLD.context().host_backend().transport.heap


def _bad_offset():
    r = dist.get_rank()
    if r == 1:  # this rank claims an array far beyond the end of its heap
        heap = world_heap()
        heap.locate = lambda x: heap.size * 2
    x = comm.shared_empty(SIZE, "float32")
    x[:] = r
    try:
        comm.all_reduce(x)
    except CollectiveError as exc:
        return str(exc)
    return None


def test_a_bad_offset_raises_on_every_rank():
    res = run_workers(_bad_offset, 3, timeout=60, collective_timeout=20)
    for message in (res[0], res[2]):
        assert "all_reduce" in message and "rank 1 named bytes" in message
    assert res[1] is not None and "aborted" in res[1]  # the rank whose offset was bad hears it too


def _fallbacks():
    """shared_empty where no block can be had: still an array, private."""
    big = comm.shared_empty(1 << 20, "float64")  # 8 MiB against a 1 MiB heap
    small = comm.shared_empty(1000, "float64")
    heap = world_heap()
    return (heap.locate(big) is None, heap.locate(small) is not None, big.shape, big.dtype.name)


def test_a_full_heap_gives_private_arrays(monkeypatch):
    monkeypatch.setenv("MINIGRAD_DIST_SHM_HEAP", str(1 << 20))
    assert run_workers(_fallbacks, 2) == [(True, True, (1 << 20,), "float64")] * 2


def test_shared_empty_outside_a_job_is_an_ordinary_array():
    x = comm.shared_empty(5, "int32")
    assert isinstance(x, np.ndarray) and x.shape == (5,) and x.dtype == np.int32
    with pytest.raises(ValueError, match="count must be >= 0"):
        comm.shared_empty(-1, "float32")


def _reduce_scatter_chunks(shared_ranks):
    r, n = dist.get_rank(), dist.get_world_size()
    taken = count_zero_copy("_reduce_scatter_shared")
    out = {}
    for c, dtype in enumerate(["float32", "float64", "int64"]):
        for op in ("sum", "avg", "max"):
            sizes = [SIZE // n + j for j in range(n)]  # chunks of different lengths
            flat = (comm.shared_empty(sum(sizes), dtype) if r in shared_ranks
                    else np.empty(sum(sizes), dtype))
            flat[:] = values(r, c, dtype, sum(sizes))
            bounds = np.cumsum([0] + sizes)
            chunks = [flat[bounds[j] : bounds[j + 1]] for j in range(n)]
            out[dtype, op] = comm.reduce_scatter(chunks, op)
    return out, taken


@pytest.mark.parametrize("n, shared", [(2, {0, 1}), (3, {0, 1, 2}), (3, {0, 2})])
def test_reduce_scatter_reads_shared_chunks_in_place(n, shared):
    res = run_workers(_reduce_scatter_chunks, n, shared, timeout=120)
    for r, (out, taken) in enumerate(res):
        assert taken == [len(shared) == n] * 9
        for c, dtype in enumerate(["float32", "float64", "int64"]):
            sizes = [SIZE // n + j for j in range(n)]
            bounds = np.cumsum([0] + sizes)
            xs = [values(j, c, dtype, sum(sizes))[bounds[r] : bounds[r + 1]] for j in range(n)]
            for op in ("sum", "avg", "max"):
                ref = in_member_order(xs, op)
                got = out[dtype, op]
                assert got.dtype == ref.dtype and got.shape == ref.shape
                assert np.array_equal(got.view(np.uint8), ref.view(np.uint8)), (dtype, op)


GATHER_DTYPES = ["float32", "float64", "float16", "int64", "uint8"]


def _gather_into(shared_ranks, in_place):
    r, n = dist.get_rank(), dist.get_world_size()
    taken = count_zero_copy("_all_gather_shared")
    out = {}
    for c, dtype in enumerate(GATHER_DTYPES):
        for size in (SIZE, SMALL):
            empty = comm.shared_empty if r in shared_ranks else np.empty
            if in_place:  # the input is this rank's slot of the output
                full = empty(n * size, dtype)
                x = full[r * size : (r + 1) * size]
            else:
                x, full = empty(size, dtype), np.full(n * size, 7, dtype)
            x[:] = values(r, c, dtype, size)
            if c % 2:
                assert comm.all_gather_into(full, x, async_op=True).wait() is full
            else:
                assert comm.all_gather_into(full, x) is full
            out[dtype, size] = full.copy()
    return out, taken


@pytest.mark.parametrize("n, shared, in_place", [
    (2, {0, 1}, False), (2, {0, 1}, True), (3, {0, 1, 2}, False), (3, {0, 2}, False),
    (2, set(), True)])
def test_all_gather_into_copies_shared_inputs_straight_from_the_peers(n, shared, in_place):
    res = run_workers(_gather_into, n, shared, in_place, timeout=120)
    for out, taken in res:
        # every gather of more than one round asked whether all inputs are shared: only when
        # they all are does it read them in place; everyone decides alike
        assert len(taken) >= len(GATHER_DTYPES) and set(taken) == {len(shared) == n}
        assert taken == res[0][1]
        for c, dtype in enumerate(GATHER_DTYPES):
            for size in (SIZE, SMALL):
                ref = np.concatenate([values(j, c, dtype, size) for j in range(n)])
                assert np.array_equal(out[dtype, size].view(np.uint8), ref.view(np.uint8))


def _gather_into_errors():
    r, n = dist.get_rank(), dist.get_world_size()
    errors = []
    for out, x in [(np.empty(2 * SIZE, "float64"), np.empty(SIZE, "float32")),  # dtype
                   (np.empty(2 * SIZE + 1, "float32"), np.empty(SIZE, "float32")),  # size
                   (np.empty((2, SIZE), "float32")[:, ::2], np.empty((SIZE + 1) // 2, "float32"))]:
        try:
            comm.all_gather_into(out, x)
        except ValueError as exc:
            errors.append(str(exc))
    x = comm.shared_empty(SIZE + r, "float32")  # a different size on each rank
    try:
        comm.all_gather_into(np.empty(n * x.size, "float32"), x)
    except CollectiveError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def test_all_gather_into_refuses_bad_outputs_and_unequal_inputs_on_every_rank():
    for errors in run_workers(_gather_into_errors, 2, timeout=60):
        assert len(errors) == 4
        assert errors[0] == (f"all_gather_into: out must hold 2 x {SIZE} = {2 * SIZE} elements "
                             f"of float32 (the input on 2 ranks), got {2 * SIZE} of float64")
        assert f"got {2 * SIZE + 1} of float32" in errors[1]
        assert "writable C-contiguous" in errors[2]
        assert errors[3].startswith("CollectiveMismatchError") and "all_gather_into" in errors[3]
        assert f"'float32', {SIZE}]" in errors[3] and f"'float32', {SIZE + 1}]" in errors[3]


# ------------------------------------------------------------------------------ data parallelism


def _dp_steps(steps):
    import minigrad as mg  # noqa: PLC0415
    import minigrad.autodiff as ad  # noqa: PLC0415
    import minigrad.functional as F  # noqa: PLC0415
    import minigrad.module as M  # noqa: PLC0415
    import minigrad.optimizer as optim  # noqa: PLC0415

    taken = count_zero_copy()
    mg.random.seed(0)
    model = M.Sequential(M.Linear(64, 300), M.ReLU(), M.Linear(300, 10))
    gm = ad.GradManager().attach(model.parameters(),
                                 callbacks=[dist.make_allreduce_cb("mean")])
    opt = optim.SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(dist.get_rank())
    kept, snapshots = [], []
    for step in range(steps):
        x = mg.tensor(rng.standard_normal((8, 64)).astype(np.float32))
        y = mg.tensor(rng.integers(0, 10, 8).astype(np.int32))
        with gm:
            gm.backward(F.nn.cross_entropy(model(x), y))
        if step == 1:
            kept = [p.grad for p in model.parameters()]  # alive across the next step
        snapshots.append([p.grad.numpy().copy() for p in model.parameters()])
        opt.step().clear_grad()
    return taken, [k.numpy() for k in kept], snapshots, [p.numpy() for p in model.parameters()]


def test_data_parallel_buckets_are_reduced_in_place():
    res = run_workers(_dp_steps, 2, 4)
    for taken, kept, snapshots, params in res:
        assert taken == [True] * 4  # one bucket a step, read in place
        # the same parameters on both ranks; gradients kept from step 1 are still step 1's
        # (the next steps' buckets did not reuse the buffer they view)
        assert all(np.array_equal(a, b) for a, b in zip(params, res[0][3]))
        assert all(np.array_equal(a, b) for a, b in zip(kept, snapshots[1]))
        assert not all(np.array_equal(a, b) for a, b in zip(kept, snapshots[3]))


def test_no_shared_memory_file_is_left_behind():
    before = set(glob.glob("/dev/shm/mg-*"))
    run_workers(_dp_steps, 2, 2)
    assert set(glob.glob("/dev/shm/mg-*")) <= before


def test_the_async_worker_keeps_nothing_of_a_finished_call():
    # a pooled buffer (a bucket, fully_shard's scratch) is reused only once nothing views it: the
    # worker thread must not hold the last call's closure while it waits for the next
    import time  # noqa: PLC0415
    import weakref  # noqa: PLC0415

    from minigrad.distributed.comm.providers.base import OrderedWorker  # noqa: PLC0415

    worker = OrderedWorker("test")
    try:
        buffer = np.zeros(10)
        alive = weakref.ref(buffer)
        view = buffer[2:]
        assert worker.submit(lambda v=view: float(v.sum())).wait() == 0.0
        del buffer, view
        deadline = time.monotonic() + 2
        while alive() is not None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert alive() is None
    finally:
        worker.close()


def _sharded_steps(mode, steps=3):
    import minigrad as mg  # noqa: PLC0415
    import minigrad.autodiff as ad  # noqa: PLC0415
    import minigrad.functional as F  # noqa: PLC0415
    import minigrad.module as M  # noqa: PLC0415
    import minigrad.optimizer as optim  # noqa: PLC0415
    from minigrad.distributed.data_parallel import fully_shard as fs  # noqa: PLC0415

    allocations = []
    shared_empty = fs.comm.shared_empty
    fs.comm.shared_empty = lambda *a: allocations.append(a) or shared_empty(*a)
    taken = count_zero_copy("_reduce_scatter_shared")
    mg.random.seed(0)
    net = M.Sequential(M.Linear(64, 300), M.Tanh(), M.Linear(300, 200), M.Tanh(),
                       M.Linear(200, 10))
    cbs = [dist.make_allreduce_cb("mean")] if mode == "ddp" else []
    if mode != "ddp":
        for layer in list(net.children()):
            dist.fully_shard(layer, reshard_after_forward=mode == "zero3")
        dist.fully_shard(net, reshard_after_forward=mode == "zero3")
    gm = ad.GradManager().attach(net.parameters(), callbacks=cbs)
    opt = optim.Adam(net.parameters(), lr=1e-2)
    rng = np.random.default_rng(dist.get_rank())
    first_step = None
    for _ in range(steps):
        x = mg.tensor(rng.standard_normal((8, 64)).astype(np.float32))
        with gm:
            gm.backward(F.tanh(net(x)).mean())
        opt.step().clear_grad()
        first_step = len(allocations) if first_step is None else first_step
    state = dist.full_state_dict(net) if mode != "ddp" else net.state_dict()
    state = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in state.items()}
    return state, (first_step, len(allocations)), taken


@pytest.mark.parametrize("mode", ["zero2", "zero3"])
def test_sharded_gradients_reduce_scatter_in_place_bitwise_ddp(mode):
    ddp = run_workers(_sharded_steps, 2, "ddp")[0][0]
    for state, allocations, taken in run_workers(_sharded_steps, 2, mode):
        # the scratch buffers serve every layer's gathered shard and full gradients: they grow
        # to the largest layer's gradients during the first step, nothing is allocated after
        first_step, total = allocations
        assert first_step == total <= 3
        assert taken == [True] * (3 * 3)  # three layers' gradients each step, read in place
        assert state.keys() == ddp.keys()
        for k in ddp:
            assert np.array_equal(state[k], ddp[k]), k


def _unmappable(rank_without_room):
    """One rank cannot map its peers' heaps (``ulimit -v``): every rank copies instead."""
    r = dist.get_rank()
    if r == rank_without_room:
        from minigrad.distributed.comm.providers.cpu import shm  # noqa: PLC0415

        def no_room(self, base):
            raise OSError(12, "Cannot allocate memory")

        shm.Segment.heap = no_room
    taken = count_zero_copy()
    x = comm.shared_empty(SIZE, "float64")
    x[:] = values(r, 0, "float64")
    return comm.all_reduce(x, "sum").copy(), taken


@pytest.mark.parametrize("rank_without_room", [0, 1])
def test_a_rank_that_cannot_map_its_peers_heaps_makes_everyone_copy(rank_without_room):
    res = run_workers(_unmappable, 2, rank_without_room)
    ref = in_member_order([values(j, 0, "float64") for j in range(2)], "sum")
    for got, taken in res:
        assert taken == [False] and np.array_equal(got, ref)
