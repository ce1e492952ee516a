"""The NCCL backend without a GPU: a fake CuPy (streams and events that log what they do) and a
stub NCCL communicator check communicator creation for CuPy 13 and 14, the order of stream events,
0-d shapes and per-pair point-to-point communicators."""

from __future__ import annotations

import contextlib
import gc
import itertools
import threading
import types
import weakref

import numpy as np
import pytest

from minigrad.distributed.comm.providers.base import ReduceOp
from minigrad.distributed.comm.providers.nccl import (
    NcclBackend,
    unique_id_from_wire,
    unique_id_to_wire,
)


class DevArray(np.ndarray):
    """A NumPy array posing as a CuPy one (``a.data.ptr``)."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


class FakeCupy:
    """Just enough of CuPy for the backend; every stream operation is logged in order."""

    def __init__(self, log: list):
        self.log = log
        fake = self
        streams = itertools.count()
        self.default = self._stream("compute")
        self.current = [self.default]

        class Event:
            count = 0

            def __init__(self, disable_timing=True):
                Event.count += 1
                self.name, self.done = f"ev{Event.count}", True

            def record(self, stream):
                self.name += f"@{stream.name}"
                fake.log.append(f"record {self.name}")

        self.cuda = types.SimpleNamespace(
            Event=Event,
            Stream=lambda non_blocking: fake._stream(f"nccl{next(streams) or ''}"),
            get_current_stream=lambda: fake.current[-1],
            Device=lambda index: contextlib.nullcontext(),
            runtime=types.SimpleNamespace(getDevice=lambda: 0),
        )

    def _stream(self, name):
        fake = self

        class Stream:
            ptr = hash(name)

            def wait_event(self, ev):
                fake.log.append(f"{name} waits {ev.name}")

            def __enter__(self):
                fake.current.append(self)

            def __exit__(self, *exc):
                fake.current.pop()

        s = Stream()
        s.name = name
        return s

    def empty(self, shape, dtype):
        return np.empty(shape, dtype).view(DevArray)

    def empty_like(self, a):
        return np.empty_like(a).view(DevArray)

    def concatenate(self, arrays):
        self.log.append(f"launch concatenate on {self.current[-1].name}")
        out = np.concatenate(arrays).view(DevArray)
        self.packed = weakref.ref(out)  # tests see when the packed buffer is freed
        return out


class StubNccl:
    """``cupy.cuda.nccl`` with a communicator that logs calls (and copies for world size 1)."""

    def __init__(self, log: list, uid):
        self.log, self.uid, self.comms, self.streams = log, uid, [], []
        for i, name in enumerate(["FLOAT16", "FLOAT32", "FLOAT64", "INT8", "UINT8", "INT32",
                                  "INT64", "SUM", "PROD", "MIN", "MAX"]):
            setattr(self, f"NCCL_{name}", i)
        stub = self

        class NcclCommunicator:
            def __init__(self, n, comm_id, rank):
                if isinstance(stub.uid, bytes):  # CuPy 14 takes bytes ...
                    assert type(comm_id) is bytes and comm_id == stub.uid
                else:  # ... CuPy 13 a tuple of signed chars
                    assert type(comm_id) is tuple and comm_id == stub.uid
                    assert all(-128 <= v <= 127 for v in comm_id)
                self.n, self.rank = n, rank
                stub.comms.append(self)

            def __getattr__(self, op):
                def call(*args):
                    stub.log.append(f"nccl {op} n={self.n}")
                    stub.streams.append((op, args[-1]))  # every NCCL call ends with its stream

                return call

            def destroy(self):
                pass

        self.NcclCommunicator = NcclCommunicator

    def get_unique_id(self):
        return self.uid

    def groupStart(self):
        pass

    def groupEnd(self):
        pass


class FakeHost:
    """The host side of a one-rank group: fingerprints come back unchanged."""

    def __init__(self, log):
        self.log, self.fingerprints = log, []

    def send(self, x, dst, header):
        self.log.append(f"header to {dst}")

    def exchange_headers(self, fp, on_headers=None):
        self.log.append(f"headers {fp['op']}")
        self.fingerprints.append(fp)
        if on_headers is not None:
            on_headers([fp])
        return [fp]


class FakeCtx:
    def __init__(self, log, store, ranks=(0,), me=0):
        self.ranks, self.rank, self.global_rank = list(ranks), list(ranks).index(me), me
        self.gid, self.prefix, self.timeout, self.host_route = 0, "s1/g0", 5.0, "cpu"
        self.client = types.SimpleNamespace(
            set=store.__setitem__, get=lambda key, timeout=None: store[key]
        )
        self._host = FakeHost(log)

    def backend(self, name):
        assert name == "cpu"
        return self._host


CUPY13_ID = tuple(int(v) for v in np.arange(-64, 64, dtype=np.int8))
CUPY14_ID = bytes(range(128))


def make(uid=CUPY14_ID, ranks=(0,), me=0, store=None):
    log = []
    cp, nccl = FakeCupy(log), StubNccl(log, uid)
    be = NcclBackend(FakeCtx(log, {} if store is None else store, ranks, me), cp=cp, nccl=nccl)
    return be, cp, nccl, log


@pytest.mark.parametrize("uid", [CUPY13_ID, CUPY14_ID], ids=["cupy13-tuple", "cupy14-bytes"])
def test_communicator_gets_the_unique_id_in_this_cupys_form(uid):
    wire = unique_id_to_wire(uid)
    assert unique_id_from_wire(wire) == uid and type(unique_id_from_wire(wire)) is type(uid)
    be, cp, nccl, _ = make(uid)
    be.run(lambda: be.all_reduce(cp.empty((3,), "float32"), ReduceOp.SUM, 1))
    assert [c.n for c in nccl.comms] == [1]  # the stub asserted the id's type and value


def test_reduce_scatter_packs_its_input_before_nccl_is_ordered_after_it():
    be, cp, _, log = make()
    chunks = [cp.empty((2, 3), "float32")]
    be.run(lambda: be.reduce_scatter(chunks, ReduceOp.SUM, 1))
    pack = log.index("launch concatenate on compute")
    record = next(i for i, e in enumerate(log) if e.startswith("record") and "@compute" in e)
    ev = log[record].split()[1]
    waits = log.index(f"nccl waits {ev}")
    launch = log.index("nccl reduceScatter n=1")
    assert pack < record < waits < launch


def test_async_all_reduce_makes_the_caller_wait_only_in_work_wait():
    be, cp, _, log = make()
    x = cp.empty((4,), "float32")
    work = be.submit(lambda: be.all_reduce(x, ReduceOp.SUM, 1))
    end = next(e.split()[1] for e in log if e.startswith("record") and "@nccl" in e)
    assert "nccl allReduce n=1" in log and f"compute waits {end}" not in log
    assert work.wait() is None and log[-1] == f"compute waits {end}"
    be.run(lambda: be.all_reduce(x, ReduceOp.MAX, 2))  # synchronous: waits right away
    assert log[-1].startswith("compute waits ev") and log[-1].endswith("@nccl")


def test_zero_d_arrays_keep_their_shape():
    be, cp, _, _ = make()
    x = cp.empty((), "float32")
    assert be.run(lambda: be.broadcast(x, 0, 1)).shape == ()
    assert [y.shape for y in be.run(lambda: be.all_gather(x, 3))] == [()]
    assert be.run(lambda: be.reduce_scatter([x], ReduceOp.SUM, 4)).shape == ()
    assert [y.shape for y in be.run(lambda: be.all_to_all([x], 5))] == [()]


def test_check_strings_go_into_the_fingerprint_the_host_compares():
    be, cp, _, _ = make()
    x = cp.empty((2, 3), "float32")
    x[...] = np.arange(6).reshape(2, 3)
    be.run(lambda: be.all_reduce(x, ReduceOp.SUM, 1, "a"))
    be.run(lambda: be.broadcast(x, 0, 2, "b"))
    be.run(lambda: be.reduce_scatter([x], ReduceOp.SUM, 3, "c"))
    gathered = be.run(lambda: be.all_gather(x, 4, "d"))  # the base's, on exchange
    to_all = be.run(lambda: be.all_to_all([x], 5, "e"))
    gather = be.run(lambda: be.gather(x, 0, 6, "f"))
    scattered = be.run(lambda: be.scatter([x], 0, 7, "g"))
    be.run(lambda: be.all_gather(x, 8))
    fps = be.host.fingerprints
    assert [(fp["op"], fp["seq"], fp.get("check")) for fp in fps] == [
        ("all_reduce", 1, "a"), ("broadcast", 2, "b"), ("reduce_scatter", 3, "c"),
        ("all_gather", 4, "d"), ("all_to_all", 5, "e"), ("gather", 6, "f"), ("scatter", 7, "g"),
        ("all_gather", 8, None)]
    assert "check" not in fps[-1] and all(fp["backend"] == "nccl" for fp in fps)
    for y in [*gathered, *to_all, *gather, scattered]:
        np.testing.assert_array_equal(y, np.arange(6).reshape(2, 3))


def test_point_to_point_uses_a_communicator_of_the_two_peers_only():
    store = {}
    sender, cp, nccl0, log0 = make(ranks=(0, 1, 2), me=0, store=store)
    receiver, _, nccl2, log2 = make(ranks=(0, 1, 2), me=2, store=store)
    comm0, peer0 = sender._pair(2, sending=True)  # rank 1 takes no part: a 3-rank init would hang
    comm2, peer2 = receiver._pair(0, sending=False)
    assert (comm0.n, comm0.rank, peer0) == (2, 0, 1) and (comm2.n, comm2.rank, peer2) == (2, 1, 0)
    assert sender._comm is None and receiver._comm is None  # no WORLD communicator created
    assert list(store) == ["s1/g0/nccl-pair/0-2"]
    out = receiver.recv_payload(0, {"meta": [[], "float32"]})
    assert out.shape == () and "nccl recv n=2" in log2


def test_async_reduce_scatter_keeps_its_packed_buffer_until_wait():
    be, cp, _, log = make()
    work = be.submit(lambda: be.reduce_scatter([cp.empty((2, 3), "float32")], ReduceOp.SUM, 1))
    gc.collect()
    # NCCL still reads the packed copy: back in CuPy's pool now, the next allocation could reuse it
    assert cp.packed() is not None, "the packed buffer was freed before Work.wait()"
    work.wait()
    gc.collect()
    assert cp.packed() is None  # after wait() the caller's stream follows NCCL: free to reuse


def test_each_call_waits_on_its_own_end_event_when_another_thread_calls_meanwhile():
    be, cp, _, log = make()
    x = cp.empty((4,), "float32")

    def all_reduce_then_another_thread_calls():
        be.all_reduce(x, ReduceOp.SUM, 1)  # its end event is recorded now ...
        other = threading.Thread(target=lambda: be.run(lambda: be.all_reduce(x, ReduceOp.MAX, 2)))
        other.start()  # ... and a background call (an isend, say) ends before this call returns
        other.join()

    be.run(all_reduce_then_another_thread_calls)
    ends = [e.split()[1] for e in log if e.startswith("record") and e.endswith("@nccl")]
    assert len(ends) == 2 and log[-1] == f"compute waits {ends[0]}", log


def test_collectives_and_each_message_direction_run_on_their_own_stream():
    store = {}
    a, cp, nccl, log = make(ranks=(0, 1), me=0, store=store)
    b = make(ranks=(0, 1), me=1, store=store)[0]
    b._pair(0, sending=True)  # rank 1 creates the communicator of its messages to rank 0
    x = cp.empty((3,), "float32")
    a.run(lambda: a.all_reduce(x, ReduceOp.SUM, 1))
    a.run(lambda: a.send(x, 1, {}))
    a.run(lambda: a.recv_payload(1, {"meta": [[3], "float32"]}))
    a.run(lambda: a.all_reduce(x, ReduceOp.SUM, 2))
    ops = [op for op, _ in nccl.streams]
    assert ops == ["allReduce", "send", "recv", "allReduce"]
    streams = [s for _, s in nccl.streams]
    # a collective never queues behind a message, nor a send behind a receive (or the reverse)
    assert len(set(streams[:3])) == 3 and streams[3] == streams[0]
    assert sorted(store) == ["s1/g0/nccl-id", "s1/g0/nccl-pair/0-1", "s1/g0/nccl-pair/1-0"]
