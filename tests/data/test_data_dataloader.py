"""DataLoader: workers reproduce the single-process batches, errors/timeouts surface, no orphans."""

import gc
import os
import time

import numpy as np
import pytest

from minigrad.data.collator import Collator
from minigrad.data.dataloader import DataLoader, get_worker_info
from minigrad.data.dataset import ArrayDataset, Dataset, StreamDataset
from minigrad.data.sampler import Infinite, RandomSampler, SequentialSampler, StreamSampler
from minigrad.data.transform import Compose, Normalize, ToMode

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, size=(37, 4, 4, 1), dtype=np.uint8)
LABELS = RNG.integers(0, 10, size=37).astype(np.int32)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Slow(Dataset):
    """Variable per-item delay so that workers finish out of order."""

    def __len__(self):
        return 30

    def __getitem__(self, i):
        time.sleep(0.002 * ((i * 7) % 5))
        return np.full((2,), i), i


class BadSample(Exception):
    pass


class Raising(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 13:
            raise BadSample(f"bad sample {i}")
        return np.zeros(1), i


class OddError(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


class OddRaising(Raising):
    def __getitem__(self, i):
        raise OddError(1, 2)


class Sleepy(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            time.sleep(600)  # far longer than any loaded machine needs for the 0.5 s timeout
        return np.zeros(1)


class Crashing(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 1:
            os._exit(3)
        return np.zeros(1)


class RandomItems(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return np.random.randint(0, 2**31 - 1), -1 if info is None else info.id


class Counter(StreamDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield np.array([i, i * i]), i


def batches(loader):
    return [tuple(np.array(x) for x in b) for b in loader]


def test_single_process_matches_manual_reference():
    ds = ArrayDataset(IMAGES, LABELS)
    t = Compose([Normalize(30.0, 70.0), ToMode("CHW")])
    loader = DataLoader(ds, RandomSampler(ds, batch_size=8, seed=3), transform=t)
    ref_sampler = RandomSampler(ds, batch_size=8, seed=3)
    got = batches(loader)
    assert len(got) == len(loader) == 5
    for (x, y), idx in zip(got, ref_sampler, strict=True):
        ref = ((IMAGES[idx].astype(np.float64) - 30.0) / 70.0).transpose(0, 3, 1, 2)
        np.testing.assert_allclose(x, ref, rtol=1e-6)
        np.testing.assert_array_equal(y, LABELS[idx])
        assert x.dtype == np.float32 and y.dtype == np.int32


@pytest.mark.parametrize("num_workers", [1, 3])
def test_workers_match_single_process_and_keep_order(num_workers):
    ds = Slow()
    ref = batches(DataLoader(ds, SequentialSampler(ds, batch_size=4)))
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=4), num_workers=num_workers)
    for _ in range(2):  # two epochs, fresh workers each
        got = batches(loader)
        assert len(got) == len(ref) == 8
        for a, b in zip(got, ref, strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])


def test_default_sampler_is_sequential_batch_one():
    ds = ArrayDataset(IMAGES, LABELS)
    loader = DataLoader(ds)
    assert len(loader) == 37
    x, y = next(iter(loader))
    assert x.shape == (1, 4, 4, 1) and y.tolist() == [LABELS[0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_error_surfaces_with_original_type_and_traceback(num_workers):
    """In the main process the error is raised as is; from a worker it arrives as MegEngine's
    RuntimeError("Caught BadSample in DataLoader worker process ...") with the worker's traceback
    and the original exception as its cause."""
    loader = DataLoader(Raising(), SequentialSampler(Raising(), batch_size=4),
                        num_workers=num_workers)
    it = iter(loader)
    error = RuntimeError if num_workers else BadSample
    match = r"Caught BadSample in DataLoader worker process \d" if num_workers else "bad sample 13"
    with pytest.raises(error, match=match) as info:
        list(it)
    if num_workers:
        text = str(info.value)
        assert "Original Traceback" in text and "__getitem__" in text and "bad sample 13" in text
        assert isinstance(info.value.__cause__, BadSample)
        assert all(gone(pid) for pid in it.pids)


def test_unconstructible_exception_becomes_runtime_error():
    loader = DataLoader(OddRaising(), num_workers=1)
    with pytest.raises(RuntimeError, match=r"OddError: 1/2"):
        next(iter(loader))


def test_timeout_raises_clearly_and_cleans_up():
    ds = Sleepy()
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=1), num_workers=2, timeout=0.5)
    it = iter(loader)
    next(it), next(it)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 0.5s waiting for batch 2"):
        next(it)
    assert time.monotonic() - start < 120  # the loader's timeout ended the wait, not the item
    assert all(gone(pid) for pid in it.pids)


def test_crashed_worker_is_reported():
    loader = DataLoader(Crashing(), num_workers=2)
    with pytest.raises(RuntimeError, match="exited unexpectedly with exit code 3"):
        list(loader)


def test_no_orphans_after_break_exhaustion_and_gc():
    ds = Slow()
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2)
    it = iter(loader)
    for _ in it:
        break
    pids = it.pids
    assert len(pids) == 2 and not any(gone(p) for p in pids)
    del it
    gc.collect()
    assert all(gone(p) for p in pids)
    it = iter(loader)
    list(it)  # exhaustion
    assert all(gone(p) for p in it.pids)
    inf = DataLoader(ds, Infinite(SequentialSampler(ds, batch_size=4)), num_workers=2)
    it = iter(inf)
    got = [next(it)[1].tolist() for _ in range(10)]
    assert got[7] == [28, 29] and got[8] == [0, 1, 2, 3]  # second pass over the data
    pids = it.pids
    it.shutdown()
    assert all(gone(p) for p in pids)


def test_workers_have_distinct_rng_streams():
    ds = RandomItems()
    out = batches(DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2))
    by_worker = {}
    for vals, wids in out:
        by_worker.setdefault(int(wids[0]), []).extend(vals.tolist())
    assert sorted(by_worker) == [0, 1]
    assert by_worker[0] != by_worker[1]
    np.random.seed(11)
    first = batches(DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2))
    np.random.seed(11)
    second = batches(DataLoader(ds, SequentialSampler(ds, batch_size=2), num_workers=2))
    assert [b[0].tolist() for b in first] == [b[0].tolist() for b in second]


def test_worker_init_fn_error_propagates():
    def init(worker_id):
        raise ValueError(f"init failed in {worker_id}")

    loader = DataLoader(Slow(), num_workers=1, worker_init_fn=init)
    with pytest.raises(RuntimeError, match=r"Caught ValueError in DataLoader worker process 0 "
                                           r"(?s:.*)init failed in 0"):
        next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_dataset(num_workers):
    loader = DataLoader(Counter(7), StreamSampler(batch_size=3), num_workers=num_workers)
    got = batches(loader)
    assert [b[1].tolist() for b in got] == [[0, 1, 2], [3, 4, 5], [6]]
    np.testing.assert_array_equal(got[0][0], [[0, 0], [1, 1], [2, 4]])
    rank1 = DataLoader(Counter(7), StreamSampler(batch_size=2, drop_last=True, world_size=2,
                                                 rank=1))
    assert [b[1].tolist() for b in rank1] == [[1, 3]]
    with pytest.raises(TypeError, match="no length"):
        len(loader)


def test_custom_callable_collator():
    ds = ArrayDataset(LABELS)
    loader = DataLoader(ds, SequentialSampler(ds, batch_size=5),
                        collator=lambda samples: sum(int(s[0]) for s in samples))
    assert next(iter(loader)) == int(LABELS[:5].sum())
    assert isinstance(DataLoader(ds).collator, Collator)


def test_bad_arguments():
    ds = ArrayDataset(LABELS)
    with pytest.raises(ValueError, match="num_workers must be an int >= 0, got -1"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="timeout"):
        DataLoader(ds, timeout=-1)
    with pytest.raises(TypeError, match="StreamSampler only works with a StreamDataset"):
        DataLoader(ds, StreamSampler())
    with pytest.raises(TypeError, match="needs a StreamSampler"):
        DataLoader(Counter(3), SequentialSampler(ds))
    with pytest.raises(TypeError, match="apply_batch"):
        DataLoader(ds, transform=lambda x: x)


def test_dataloader_repr_names_its_parts():
    ds = ArrayDataset(np.zeros((10, 2), np.float32), np.arange(10))
    loader = DataLoader(ds, RandomSampler(ds, batch_size=4, seed=3),
                        transform=Compose([Normalize(1.0, 2.0)]), num_workers=2, timeout=5)
    assert repr(loader) == (
        "DataLoader(\n"
        "  dataset=ArrayDataset(n=10, arrays=[(10, 2), (10,)]),\n"
        "  sampler=RandomSampler(n=10, batch_size=4, drop_last=False, world_size=1, rank=0, "
        "shuffle=True, seed=3, epoch=0),\n"
        f"  transform={loader.transform!r},\n"
        "  collator=Collator(),\n"
        "  num_workers=2,\n"
        "  prefetch_factor=2,\n"
        "  timeout=5,\n"
        ")")
    assert "Normalize(" in repr(loader.transform)
