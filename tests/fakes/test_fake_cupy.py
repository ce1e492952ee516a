"""The fake CuPy follows CuPy's rules where minigrad's GPU code depends on them (what the tests
built on it can catch): the current device per thread, kernels only on the current device, no
implicit conversion to NumPy, host synchronisations counted, streams and events in order, NCCL for
one rank."""

from __future__ import annotations

import ast
import os
import threading

import numpy as np
import pytest

from fakes.fake_cupy import CUDARuntimeError, DeviceSynchronized, UnorderedAccess, installed
from minigrad.backend.xp import cupy_or_none


@pytest.fixture
def fake():
    with installed(2) as cp:
        yield cp


def test_it_is_minigrads_cupy_and_cuda_sees_its_devices(fake):
    import cupy  # noqa: PLC0415  (the fake, installed for the block)

    assert cupy is fake and cupy_or_none() is fake
    assert fake.cuda.runtime.getDeviceCount() == 2
    with pytest.raises(CUDARuntimeError, match="invalid device ordinal"):
        fake.cuda.Device(2).use()


def test_the_current_device_is_per_thread_and_restored(fake):
    with fake.cuda.Device(1):
        assert fake.cuda.runtime.getDevice() == 1
        seen = []
        t = threading.Thread(target=lambda: seen.append(fake.cuda.runtime.getDevice()))
        t.start()
        t.join()
        assert seen == [0]  # a new thread starts on device 0, as with CUDA
        with fake.cuda.Device(0):
            assert fake.cuda.runtime.getDevice() == 0
        assert fake.cuda.runtime.getDevice() == 1
    assert fake.cuda.runtime.getDevice() == 0


def test_kernels_run_only_on_the_current_device(fake):
    with fake.cuda.Device(1):
        a = fake.arange(3.0)
    assert a.device.id == 1 and a.data.device_id == 1
    with pytest.raises(ValueError, match=r"resides \(1\) is different from the current device "
                                         r"\(0\)"):
        a * 2
    with pytest.raises(ValueError, match="resides"):
        a.sum()
    with fake.cuda.Device(1):
        b = (a * 2).sum()
    assert b.shape == () and isinstance(b, fake.ndarray) and b.device.id == 1  # 0-d, no scalar
    c = a.copy()  # copy() copies to the *current* device
    assert c.device.id == 0 and fake.asarray(a).device.id == 0
    assert a.reshape(3, 1).device.id == 1  # a view stays where its data is


def test_no_implicit_host_copies_and_numpy_operands_refused(fake):
    a = fake.ones(3)
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        a + np.ones(3)
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        a[...] = np.ones(3)
    assert (a + np.float32(1)).dtype == np.float64  # NumPy scalars are fine
    assert fake.asnumpy(a[np.array([0, 0, 2])]).tolist() == [1.0, 1.0, 1.0]  # index arrays copy


def test_host_synchronisations_are_counted_and_can_be_forbidden(fake):
    a = fake.arange(4.0)
    fake.clear()
    float(a[1]), a.sum().item(), bool(a[2] > 1), fake.asnumpy(a)
    assert fake.syncs == ["float", "item", "bool", "get"] and fake.d2h == [(4,)]
    with fake.cupyx.allow_synchronize(False):
        b = a * 2  # launching is fine
        with pytest.raises(DeviceSynchronized, match="item"):
            b[0].item()
    assert fake.asnumpy(b).tolist() == [0.0, 2.0, 4.0, 6.0]


def test_streams_and_events_are_logged_in_order(fake):
    side = fake.cuda.Stream(non_blocking=True)
    with pytest.raises(RuntimeError, match=r"stream is created on \(0\) does not match with the "
                                           r"current device \(1\)"):
        with fake.cuda.Device(1), side:
            pass
    fake.clear()
    a = fake.empty(3)
    a.set(np.zeros(3), stream=side)
    ev = fake.cuda.Event(disable_timing=True)
    ev.record(side)
    fake.cuda.get_current_stream().wait_event(ev)
    with side:
        a += 1
    assert fake.events == ["launch empty on gpu0:null", f"h2d pageable on {side.name}",
                           f"record {ev.name} on {side.name}", f"gpu0:null waits {ev.name}",
                           f"launch add on {side.name}"]


def test_pinned_memory_and_cupyx(fake):
    host = fake.cupyx.empty_pinned((2, 3), np.float32)
    view = np.frombuffer(fake.cuda.alloc_pinned_memory(8), np.float32)
    assert host.shape == (2, 3) and view.shape == (2,)
    a = fake.zeros(3)
    fake.cupyx.scatter_add(a, np.array([0, 0, 5]), 1.0)  # repeats add up; CuPy wraps 5 to 2
    assert fake.asnumpy(a).tolist() == [2.0, 0.0, 1.0]
    with pytest.raises(NotImplementedError, match="cannot run CUDA C kernels \\(scale\\)"):
        fake.ElementwiseKernel("T x", "T y", "y = 2 * x", "scale")(a)


def test_generators_draw_on_their_own_device(fake):
    with fake.cuda.Device(1):
        rng = fake.random.default_rng(0)
        x = rng.standard_normal(3)
    assert x.device.id == 1
    with pytest.raises(ValueError, match="resides"):
        rng.standard_normal(3)


def test_nccl_of_one_rank_copies_between_the_buffers(fake):
    nccl = fake.cuda.nccl
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    src, dst = fake.arange(4, dtype=np.int64), fake.zeros(4, np.int64)
    stream = fake.cuda.Stream(non_blocking=True)
    comm.allReduce(src.data.ptr, dst.data.ptr, 4, nccl.NCCL_INT64, nccl.NCCL_SUM, stream.ptr)
    assert fake.asnumpy(dst).tolist() == [0, 1, 2, 3]
    assert fake.events[-2] == f"nccl allReduce on {stream.name}"
    assert comm.size() == 1 and comm.rank_id() == 0 and comm.device_id() == 0


@pytest.mark.parametrize("version, id_type, other", [(14, bytes, tuple), (13, tuple, bytes)])
def test_the_nccl_unique_id_is_the_cupy_versions(version, id_type, other):
    with installed(1, cupy_version=version) as fake:
        nccl = fake.cuda.nccl
        uid = nccl.get_unique_id()
        assert type(uid) is id_type and len(uid) == 128 and fake.__version__.startswith(
            str(version))
        if id_type is tuple:
            assert all(-128 <= v < 128 for v in uid)  # signed chars
        nccl.NcclCommunicator(1, uid, 0)
        wrong = bytes(np.array(uid, np.int8)) if other is bytes else tuple(uid)
        with pytest.raises(TypeError, match=f"'commId' has incorrect type \\(expected "
                                            f"{id_type.__name__}, got {other.__name__}\\)"):
            nccl.NcclCommunicator(1, wrong, 0)


def _two_ranks(fn) -> list:
    """``[repr(fn(0)), repr(fn(1))]`` run at the same time, rank 1 in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # rank 1: report, then leave without running pytest's teardown
        try:
            out = repr(fn(1))
        except BaseException as exc:  # noqa: BLE001  (reported to the parent)
            out = f"{type(exc).__name__}: {exc}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    try:
        mine = repr(fn(0))
    finally:
        with os.fdopen(read) as f:
            theirs = f.read()
        os.waitpid(pid, 0)
    return [mine, theirs]


def _collectives(fake, uid, rank: int, device: int):
    nccl = fake.cuda.nccl
    with fake.cuda.Device(device):
        comm = nccl.NcclCommunicator(2, uid, rank)
        stream = fake.cuda.Stream(non_blocking=True).ptr
        x = fake.arange(4, dtype=np.float32) + 10 * rank  # rank 0: 0..3, rank 1: 10..13
        f32, out = nccl.NCCL_FLOAT32, {}

        def run(name, n, call):
            y = fake.zeros(n, np.float32)
            call(y.data.ptr)
            out[name] = fake.asnumpy(y).tolist()

        p = x.data.ptr
        run("sum", 4, lambda y: comm.allReduce(p, y, 4, f32, nccl.NCCL_SUM, stream))
        run("max", 4, lambda y: comm.allReduce(p, y, 4, f32, nccl.NCCL_MAX, stream))
        run("gather", 8, lambda y: comm.allGather(p, y, 4, f32, stream))
        run("scatter", 2, lambda y: comm.reduceScatter(p, y, 2, f32, nccl.NCCL_SUM, stream))
        run("bcast", 4, lambda y: comm.broadcast(p, y, 4, f32, 1, stream))

        def exchange(y):
            nccl.groupStart()  # both ranks send first, then receive
            comm.send(p, 4, f32, 1 - rank, stream)
            comm.recv(y, 4, f32, 1 - rank, stream)
            nccl.groupEnd()
        run("swap", 4, exchange)
        return out


def test_two_ranks_of_nccl_in_two_processes(fake):
    uid = fake.cuda.nccl.get_unique_id()
    got = _two_ranks(lambda rank: _collectives(fake, uid, rank, device=rank))
    a, b = np.arange(4.0), np.arange(4.0) + 10
    common = {"sum": (a + b).tolist(), "max": b.tolist(), "gather": a.tolist() + b.tolist(),
              "bcast": b.tolist()}
    assert [ast.literal_eval(g) for g in got] == [
        {**common, "scatter": (a + b)[:2].tolist(), "swap": b.tolist()},
        {**common, "scatter": (a + b)[2:].tolist(), "swap": a.tolist()}]


def test_nccl_refuses_two_ranks_on_one_gpu(fake):
    uid = fake.cuda.nccl.get_unique_id()

    def rank_on_gpu0(rank):
        try:
            return _collectives(fake, uid, rank, device=0)
        except fake.cuda.nccl.NcclError as exc:
            return str(exc)
    got = _two_ranks(rank_on_gpu0)
    assert got == [repr("ncclInvalidUsage: Duplicate GPU detected: the ranks run on devices "
                        "[0, 0]")] * 2


def test_only_the_names_and_dtypes_cupy_has(fake):
    a = fake.arange(6.0).reshape(2, 3)
    assert fake.linalg.norm(a).shape == () and fake.lib.stride_tricks.as_strided is not None
    for name in ("ma", "nditer", "frompyfunc", "busday_count", "char"):  # NumPy only
        with pytest.raises(AttributeError, match=f"module 'cupy' has no attribute '{name}'"):
            getattr(fake, name)
    with pytest.raises(AttributeError, match="'cupy.linalg' has no attribute 'matrix_transpose'"):
        getattr(fake.linalg, "matrix_transpose")  # noqa: B009
    with pytest.raises(AttributeError, match="'cupy.ndarray' object has no attribute 'setflags'"):
        a.setflags(write=False)
    assert a.flags.c_contiguous and a.flags["C_CONTIGUOUS"] and not a.T.flags.c_contiguous
    with pytest.raises(AttributeError, match="'Flags' object has no attribute 'writeable'"):
        a.flags.writeable  # noqa: B018  (CuPy arrays are always writable)
    with pytest.raises(AttributeError, match="'cupy.ufunc' object has no attribute 'signature'"):
        getattr(fake.add, "signature")  # noqa: B009
    with pytest.raises(AttributeError, match="'Generator' object has no attribute 'spawn'"):
        fake.random.default_rng(0).spawn(2)
    # NumPy functions and ufuncs on device arrays dispatch only to what CuPy implements
    assert isinstance(np.sum(a), fake.ndarray) and isinstance(np.add(a, 1), fake.ndarray)
    with pytest.raises(TypeError, match="no implementation found for 'numpy.einsum_path'"):
        np.einsum_path("ij,jk", a, a.T)
    import scipy.special  # noqa: PLC0415

    with pytest.raises(TypeError, match="operand type.* NotImplemented"):
        scipy.special.erf(a)  # on CuPy: cupyx.scipy.special.erf
    for bad in (["a", "b"], np.array([object()]), np.zeros(2, np.longdouble),
                np.array(["2020-01-01"], "datetime64[D]")):
        with pytest.raises(ValueError, match="Unsupported dtype"):
            fake.asarray(bad)
    with pytest.raises(ValueError, match="Unsupported dtype object"):
        fake.zeros(2, dtype=object)


def _in_a_forked_child(fn) -> str:
    """What ``fn()`` gives (``repr``) or raises (type, status, message) in a forked child."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's teardown
        try:
            out = repr(fn())
        except BaseException as exc:  # noqa: BLE001  (reported to the parent)
            out = f"{type(exc).__name__} {getattr(exc, 'status', '')} {exc}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_a_child_forked_after_cuda_was_initialised_cannot_use_it(fake):
    # forked before any CUDA call: the child initialises CUDA itself
    assert _in_a_forked_child(lambda: fake.asnumpy(fake.ones(2)).tolist()) == "[1.0, 1.0]"
    assert fake.cuda_pid is None  # the parent still has not initialised CUDA
    fake.zeros(1)  # now it has
    error = "CUDARuntimeError 3 cudaErrorInitializationError: initialization error"
    for call in (lambda: fake.ones(2), fake.cuda.runtime.getDeviceCount,
                 lambda: fake.cuda.Device(1).use(), lambda: fake.cuda.Stream(),
                 lambda: fake.cupyx.empty_pinned(3)):
        assert _in_a_forked_child(call) == error
    assert fake.asnumpy(fake.ones(2)).tolist() == [1.0, 1.0]  # the parent goes on


def test_work_completes_only_when_the_test_releases_it_or_the_host_waits():
    with installed(1, manual_completion=True) as fake:
        side = fake.cuda.Stream(non_blocking=True)
        with side:
            a = fake.ones(3) * 2
        ev = side.record()
        assert not ev.done and not side.done
        fake.release(side)
        assert ev.done and side.done
        fake.cuda.get_current_stream().wait_event(ev)
        b = a + 1  # the null stream: not done until the host reads the value
        assert not fake.cuda.get_current_stream().done
        assert fake.asnumpy(b).tolist() == [3.0, 3.0, 3.0]  # a synchronisation
        assert fake.cuda.get_current_stream().done
        with side:
            fake.zeros(2)
        later = side.record()
        assert not later.done
        later.synchronize()
        assert later.done
    with installed(1) as fake:  # by default work completes as it is issued
        fake.ones(3)
        assert fake.cuda.Event().done and fake.cuda.get_current_stream().record().done


def test_the_pool_hands_blocks_out_again_per_stream(fake):
    side = fake.cuda.Stream(non_blocking=True)
    a = fake.ones(100)
    block = a._block
    del a  # back to the null stream's arena
    with side:
        b = fake.ones(100)  # another stream's allocation: another block
    c = fake.ones(100)  # the null stream's: the same block again
    assert b._block is not block and c._block is block and fake.pool.reused == [block]
    assert c[1:]._block is block and c.reshape(10, 10)._block is block  # views share it


def test_uses_on_two_streams_need_an_event_between_them(fake):
    side = fake.cuda.Stream(non_blocking=True)
    a = fake.ones(4)
    y = a * 2  # the null stream reads a
    with pytest.raises(UnorderedAccess, match=r"fill on gpu0:s\d+ writes block \d+ \(pool arena "
                                              r"gpu0:null\) while the write #1 on gpu0:null"):
        with side:
            a.fill(0)  # write after read (and write) on another stream, nothing orders them
    ev = fake.cuda.get_current_stream().record()
    side.wait_event(ev)
    with side:
        a.fill(0)  # ordered after the null stream's uses by the event
        z = fake.zeros(4)
    with pytest.raises(UnorderedAccess, match=r"add on gpu0:null reads block \d+ .* the write"):
        y + z  # read after the side stream's write, without an event
    fake.cuda.get_current_stream().wait_event(side.record())
    assert fake.asnumpy(y + z).tolist() == [2.0] * 4
    blocking = fake.cuda.Stream()  # CUDA's legacy null stream orders blocking streams with it
    with blocking:
        z += 1
    assert fake.asnumpy(z).tolist() == [1.0] * 4
    side.synchronize()  # the host waited: later work on any stream comes after
    with side:
        y.fill(5)
    fake.cuda.runtime.deviceSynchronize()
    assert fake.asnumpy(y).tolist() == [5.0] * 4


def test_uninstalled_afterwards():
    before = cupy_or_none()
    with installed(1) as fake:
        assert cupy_or_none() is fake
    assert cupy_or_none() is before


def test_fused_kernels_run_their_cpu_versions_on_the_fake(fake):
    pytest.importorskip("minigrad.backend.kernels")  # where this minigrad has fused kernels
    import minigrad as mg  # noqa: PLC0415
    import minigrad.functional as F  # noqa: PLC0415

    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    for fn in (F.gelu, lambda t: F.softmax(t, -1)):
        got = fn(mg.tensor(x, device="gpu1"))  # device 0 stays current: kernels must follow
        assert got.device == "gpu1" and got.data.device.id == 1
        np.testing.assert_allclose(got.numpy(), fn(mg.tensor(x, device="cpu0")).numpy(),
                                   rtol=1e-6)
    assert any(e.startswith("launch kernel ") for e in fake.events)
