"""The pipeline's messages: each array of a message is exactly one ``comm.send``, the message's
fields riding in the header ``comm.send`` sends anyway (its ``tag``), and ``comm.send``'s tag
arrives with the array."""

from __future__ import annotations

import numpy as np

import minigrad.distributed as dist
import minigrad.functional as F
import minigrad.module as M
import minigrad.optimizer as optim
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.pipeline import LayerSpec, PipelineEngine, PipelineModule
from minigrad.distributed.pipeline.transport import Transport
from minigrad.testing.distributed import run_workers

M_BATCHES = 4


class Pair(M.Module):
    """x -> (x W, x): a stage output of two float tensors."""

    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)

    def forward(self, x):
        return self.fc(x), x


class Merge(M.Module):
    def __init__(self):
        super().__init__()
        self.fc = M.Linear(3, 3)

    def forward(self, pair):
        return self.fc(pair[0] + pair[1])


def _count_sends(layers, schedule):
    """Train one step of ``layers`` on two stages, counting every ``comm.send`` of this rank."""
    calls = []
    send = comm.send

    def counting_send(x, dst, group=None, *, tag=None):
        calls.append((tuple(np.shape(x)), tag))
        send(x, dst, group, tag=tag)

    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((2, 3)).astype("float32"), rng.integers(0, 3, 2).astype("int32"))
            for _ in range(M_BATCHES)]
    net = PipelineModule(layers, num_stages=2, loss_fn=F.nn.cross_entropy,
                         partition_method="uniform")
    engine = PipelineEngine(net, optim.SGD(net.parameters(), lr=0.1), M_BATCHES, schedule)
    comm.send = counting_send
    try:
        engine.train_batch(iter(data))
    finally:
        comm.send = send
    return calls


def _job():
    rank = dist.get_rank()
    out = {}
    # comm.send's tag travels with the array; without one, recv gives None
    if rank == 0:
        comm.send(np.arange(3.0), 1, tag={"kind": 0, "count": 2})
        comm.send(np.arange(2), 1)
    else:
        out["tagged"] = comm.recv(0, with_tag=True)
        out["untagged"] = comm.recv(0, with_tag=True)
    single = [LayerSpec(M.Linear, 3, 3), LayerSpec(M.Tanh), LayerSpec(M.Linear, 3, 3),
              LayerSpec(M.Tanh)]
    out["single"] = {s: _count_sends(single, s) for s in ("gpipe", "1f1b")}
    out["pair"] = _count_sends([LayerSpec(Pair), LayerSpec(Merge)], "1f1b")
    return out


def test_each_array_of_a_pipeline_message_is_one_send_carrying_the_message_fields():
    r0, r1 = run_workers(_job, 2, timeout=120)
    array, tag = r1["tagged"]
    assert np.array_equal(array, np.arange(3.0)) and tag == {"kind": 0, "count": 2}
    array, tag = r1["untagged"]
    assert np.array_equal(array, np.arange(2)) and tag is None
    for schedule in ("gpipe", "1f1b"):
        # one activation (stage 0) and one gradient (stage 1) per micro-batch: one send each
        for calls in (r0["single"][schedule], r1["single"][schedule]):
            assert len(calls) == M_BATCHES, (schedule, calls)
            assert all(shape == (2, 3) and tag == [0, 1, 0] for shape, tag in calls)
    # a tuple of two float tensors: two sends per message, the fields on the first only
    for calls in (r0["pair"], r1["pair"]):
        assert len(calls) == 2 * M_BATCHES
        assert [tag for _, tag in calls] == [[0, 2, int(calls is r0["pair"])], None] * M_BATCHES


def test_a_message_to_the_own_rank_keeps_its_arrays_and_fields():
    transport = Transport(rank=0)
    arrays = [np.ones(2), np.zeros((1, 3), np.int32)]
    transport.send(arrays, 0, as_tuple=True)
    transport.send([], 0)
    got, as_tuple = transport.recv(0)
    assert as_tuple and len(got) == 2 and all(a is b for a, b in zip(got, arrays))
    assert transport.recv(0) == ([], False)
