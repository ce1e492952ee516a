"""RingExchange: hops arrive from the previous rank in issue order, sends larger than the
transport's buffer do not deadlock the ring, overlap off gives the same messages, and a peer that
never answers raises instead of hanging."""

import os

import numpy as np

import minigrad.distributed as dist
from minigrad.distributed import sequence_parallel as sp
from minigrad.testing.distributed import run_workers


def _hops_body(n_hops):
    os.environ["MINIGRAD_DIST_SHM_CHUNK"] = "4096"   # every message below is 16x larger
    return {overlap: _hops(n_hops, overlap) for overlap in (True, False)}


def _hops(n_hops, overlap):
    rank, world = dist.get_rank(), dist.get_world_size()
    got = []
    with sp.RingExchange(dist.WORLD, overlap=overlap) as ring:
        assert (ring.next_rank, ring.prev_rank) == ((rank + 1) % world, (rank - 1) % world)
        pending = []
        for hop in range(n_hops):  # several hops in flight at once, of different sizes
            size = 8192 * (1 + hop % 2)
            pending.append(ring.shift([np.full(size, 100.0 * rank + hop),
                                       np.arange(hop + 1) + rank]))
        for p in pending:
            got.append([(a.shape, float(a[0]), float(a[-1])) for a in p.wait()])
    return got


def test_hops_arrive_in_order_without_deadlock():
    world, n_hops = 3, 4
    res = run_workers(_hops_body, world, n_hops, timeout=60)
    for rank, by_overlap in enumerate(res):
        prev = (rank - 1) % world
        assert set(by_overlap) == {True, False}
        for got in by_overlap.values():
            assert got == [
                [((8192 * (1 + hop % 2),), 100.0 * prev + hop, 100.0 * prev + hop),
                 ((hop + 1,), float(prev), float(prev + hop))]
                for hop in range(n_hops)
            ]


def _silent_peer_body():
    if dist.get_rank() == 1:
        return None  # never takes part
    try:
        with sp.RingExchange(dist.WORLD) as ring:
            ring.shift([np.ones(4)]).wait()
    except Exception as exc:  # noqa: BLE001 - the test reports what was raised
        return type(exc).__name__
    return "no error"


def test_a_peer_that_never_sends_raises_instead_of_hanging():
    res = run_workers(_silent_peer_body, 2, timeout=60, collective_timeout=1)
    # the channel is never set up (StoreTimeout) or the peer is gone (CollectiveError)
    assert res[0] in ("CollectiveError", "CollectiveTimeoutError", "StoreTimeout")
