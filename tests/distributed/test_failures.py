"""A failing rank of an MPI-started job tells its peers (``runtime.failures``): the hook posts the
failure, dumps the flight recorder and ends the job; every wait raises once a peer posted.
The whole path under mpiexec is in test_mpi.py."""

from __future__ import annotations

import sys
import time

import pytest

from minigrad.distributed.comm.providers.base import CollectiveError
from minigrad.distributed.comm.providers.waiting import Watchdog
from minigrad.distributed.runtime import failures
from minigrad.distributed.runtime.store import Client, Server


@pytest.fixture()
def store():
    server = Server(0, secret="s")
    client = Client("127.0.0.1", server.port, secret="s", timeout=5)
    yield client
    failures.disarm()
    client.close()
    server.close()


def _arm(client, rank, world_size, calls):
    failures.arm(client, "job1", rank, world_size, abort=lambda: calls.append("abort"),
                 dump=lambda reason: calls.append(f"dump {reason}"))


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
