"""The rendezvous store: values, blocking gets, counters, barriers, auth, hostile input."""

from __future__ import annotations

import pickle
import socket
import threading
import time

import pytest

from minigrad.distributed.runtime.store import Client, Server, StoreError, StoreTimeout
from minigrad.testing.wait import HANG, wait_until


@pytest.fixture()
def server():
    s = Server(0, secret="topsecret")
    yield s
    s.close()


def client(server, **kw):
    return Client("127.0.0.1", server.port, secret="topsecret", timeout=5, **kw)


def test_values_roundtrip_and_user_api(server):
    c = client(server)
    values = [("b", b"\x00\xffraw"), ("s", "text"), ("i", 42), ("j", {"a": [1, 2.5, None]})]
    for key, value in values:
        c.set(key, value)
        assert c.get(key) == value
    c.user_set("x", [1, 2])
    assert c.user_get("x") == [1, 2] and c.check("user/x")
    assert c.user_pop("x") == [1, 2] and not c.check("user/x")
    assert c.delete("s") and not c.delete("s")
    with pytest.raises(TypeError, match="JSON-able"):
        c.set("bad", object())


def test_pickles_come_back_as_inert_bytes(server):
    c = client(server)
    blob = pickle.dumps({"evil": 1})
    c.set("p", blob)
    assert c.get("p") == blob  # bytes, never unpickled


def test_blocking_get_waits_for_setter_and_times_out(server):
    c = client(server)
    threading.Timer(0.2, lambda: client(server).set("late", 7)).start()
    t = time.monotonic()
    assert c.get("late", timeout=HANG) == 7  # the deadline only bounds a hang
    assert 0.15 < time.monotonic() - t
    t = time.monotonic()
    with pytest.raises(StoreTimeout, match="'never' not set"):
        c.get("never", timeout=0.3)
    assert time.monotonic() - t >= 0.3


def test_add_is_atomic_across_threads(server):
    def work():
        c = client(server)
        for _ in range(50):
            c.add("ctr")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert client(server).add("ctr", 0) == 200


def test_barrier_reusable_and_times_out(server):
    arrived = []

    def member(i):
        c = client(server)
        for gen in range(3):
            c.barrier("b", 3)
            arrived.append((gen, i))

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    gens = [g for g, _ in arrived]
    assert len(arrived) == 9 and gens == sorted(gens)  # nobody passes generation g+1 early
    with pytest.raises(StoreTimeout, match="only 1 of 2"):
        client(server).barrier("lonely", 2, timeout=0.3)


def test_wrong_secret_rejected_and_server_keeps_serving(server):
    c = client(server)
    c.set("k", 1)
    with pytest.raises(StoreError, match="wrong secret"):
        Client("127.0.0.1", server.port, secret="nope", timeout=2)
    for garbage in (b"\x00" * 40, b"hello", bytes(range(256)) * 4):
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.recv(40)
            try:  # the server may already have dropped us: that is the point
                s.sendall(garbage)
                s.shutdown(socket.SHUT_WR)
                s.recv(10)
            except OSError:
                pass
    # an authenticated client sending a malformed frame is dropped too
    bad = client(server)
    bad._conn().sendall(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    wait_until(lambda: server.rejected >= 5, "the server to drop the 5 bad clients")
    assert server.rejected == 5  # wrong secret + 3 garbage connections + 1 malformed frame
    assert c.get("k") == 1 and client(server).get("k") == 1


def test_unreachable_server_and_port_in_use(server):
    with pytest.raises(OSError, match=f"port {server.port}"):
        Server(server.port)
    with pytest.raises(StoreError, match="cannot connect"):
        Client("127.0.0.1", server.port + 1 if server.port < 65535 else 1, timeout=0.3)


def test_a_silent_store_raises_within_the_bound_and_the_client_reconnects(server):
    c = client(server)
    c.set("k", 1)
    with server._cond:  # every request waits for this lock: the server is stuck (or ending)
        start = time.monotonic()
        with pytest.raises(StoreError, match=r"did not answer 'get' within 0.3 s \(the process "
                                             r"serving it hangs or is ending\)"):
            c.get("k", timeout=0, within=0.3)
        with pytest.raises(StoreError, match="did not answer 'add' within 0.2 s"):
            c.add("n", 1, within=0.2)
        assert time.monotonic() - start < 3
    # a new connection once it answers again (the dropped one's late answers are never read)
    assert c.get("k", timeout=0, within=1.0) == 1
