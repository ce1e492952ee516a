"""A failing rank of an MPI-started job tells its peers (``runtime.failures``): the hook posts the
failure, dumps the flight recorder and ends the job; every wait raises once a peer posted. A rank
whose program ends posts that too, and a wait for it raises; the rank serving the store serves it
until every rank has stopped; a store that stops answering makes a wait time out, not hang.
The whole path under mpiexec is in test_mpi.py."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from minigrad.distributed.comm.providers.base import CollectiveError, CollectiveTimeoutError
from minigrad.distributed.comm.providers.waiting import Watchdog
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime.store import Client, Server


@pytest.fixture()
def store():
    server = Server(0, secret="s")
    client = Client("127.0.0.1", server.port, secret="s", timeout=5)
    client.server = server  # for the tests that make it go silent
    yield client
    failures.disarm()
    client.close()
    server.close()


def _arm(client, rank, world_size, calls, serves_store=False):
    failures.arm(client, "job1", rank, world_size, abort=lambda: calls.append("abort"),
                 dump=lambda reason: calls.append(f"dump {reason}"), serves_store=serves_store)


def test_the_hook_prints_dumps_posts_and_ends_the_job(store, monkeypatch):
    calls = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: calls.append(f"printed {a[1]}"))
    previous = sys.excepthook
    _arm(store, 1, 1, calls)
    assert sys.excepthook is not previous
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    assert calls == ["printed boom", "dump RuntimeError: boom", "abort"]
    assert store.get("job1/failed", timeout=0) == "rank 1 failed: RuntimeError: boom"
    failures.disarm()
    assert sys.excepthook is previous and failures.posted() is None


def test_the_first_failure_stays_and_the_last_rank_to_fail_ends_the_job_at_once(store):
    calls = []
    store.set("job1/failed", "rank 0 failed: ValueError: first")
    store.add("job1/failed/count", 1)  # rank 0 already failed
    _arm(store, 1, 2, calls)
    start = time.monotonic()
    failures._report_and_abort(KeyError, KeyError("second"), None)
    assert time.monotonic() - start < 1.0  # every rank has failed: no grace period to wait out
    assert store.get("job1/failed", timeout=0) == "rank 0 failed: ValueError: first"
    assert calls[-1] == "abort"


def test_a_peer_busy_elsewhere_gets_the_grace_period_then_the_job_ends(store, monkeypatch):
    monkeypatch.setattr(failures, "FAILURE_GRACE", 0.3)
    calls = []
    _arm(store, 0, 3, calls)
    start = time.monotonic()
    failures._report_and_abort(RuntimeError, RuntimeError("x"), None)
    assert 0.3 <= time.monotonic() - start < 2.0 and calls[-1] == "abort"


def test_a_waiting_rank_raises_once_a_peer_posted(store):
    watchdog = Watchdog("all_reduce#4(sig=[[3], 'float32', 'sum']) in group [0, 1]", 300, 30, 0,
                        lambda: [1])
    watchdog.poll()  # not armed: nothing happens
    _arm(store, 0, 2, [])
    watchdog.poll()  # armed, nothing posted
    store.set("job1/failed", "rank 1 failed: RuntimeError: boom")
    with pytest.raises(CollectiveError) as info:
        watchdog.poll()
    assert str(info.value) == (
        "all_reduce#4(sig=[[3], 'float32', 'sum']) in group [0, 1]: rank 1 failed: "
        "RuntimeError: boom; rank 0 stops waiting"
    )


WAIT = "all_reduce#4(sig=[[3], 'float32', 'sum']) in group [0, 1, 2, 3]"


def test_a_waiting_rank_raises_once_a_rank_it_waits_for_has_ended(store):
    watchdog = Watchdog(WAIT, 300, 30, 0, lambda: [1, 2])
    _arm(store, 3, 4, [])
    failures._report_exit()  # rank 3 ended: it is not waited for
    _arm(store, 0, 4, [])
    watchdog.poll()
    _arm(store, 2, 4, [])
    failures._report_exit()  # rank 2 ended: it is
    assert store.add("job1/failed/count", 0) == 2  # both counted among the stopped ranks
    _arm(store, 0, 4, [])
    with pytest.raises(CollectiveError) as info:
        watchdog.poll()
    assert str(info.value) == (
        f"{WAIT}: rank(s) [2] ended their program (sys.exit, or the end of the script) without "
        "joining it; rank 0 stops waiting")


def test_an_ending_rank_that_failed_posts_nothing_more(store, monkeypatch):
    monkeypatch.setattr(failures, "FAILURE_GRACE", 0.1)
    _arm(store, 1, 2, [])
    failures._report_and_abort(RuntimeError, RuntimeError("x"), None)
    failures._report_exit()
    assert failures.exited([1]) == [] and store.add("job1/failed/count", 0) == 1


def test_the_rank_serving_the_store_serves_it_until_every_rank_has_stopped(store):
    _arm(store, 0, 3, [], serves_store=True)
    ended = threading.Event()
    hook = threading.Thread(target=lambda: (failures._report_exit(), ended.set()))
    hook.start()
    assert not ended.wait(0.3)  # ranks 1 and 2 still run: they may yet post through it
    store.add("job1/failed/count", 1)  # rank 1 ended
    assert not ended.wait(0.3)
    store.add("job1/failed/count", 1)  # rank 2 failed
    assert ended.wait(5)
    hook.join()


def test_a_silent_store_makes_the_wait_time_out_instead_of_hanging(store):
    watchdog = Watchdog(WAIT, 0.5, 30, 0, lambda: [1])
    _arm(store, 0, 2, [])
    with store.server._cond:  # the store's process hangs (or has gone into MPI_Finalize)
        start = time.monotonic()
        with pytest.raises(CollectiveTimeoutError, match="timed out after 0.5 s"):
            watchdog.poll()  # its look at the store is bounded by the wait's timeout (>= 1 s)
        assert time.monotonic() - start < 3
    assert failures.posted() is None  # the store is not asked again once it failed to answer
