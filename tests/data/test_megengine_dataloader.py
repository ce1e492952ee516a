"""DataLoader behaviour MegEngine code relies on: ``timeout=`` also bounds the wait for a
``StreamDataset`` (MegEngine: "the timeout value (second) for collecting a batch"), and a stream's
own errors still surface."""

import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

from minigrad.data import DataLoader, StreamSampler
from minigrad.data.dataset import StreamDataset

pytestmark = pytest.mark.timeout(60)


class Stuck(StreamDataset):
    """Yields ``n`` items, then blocks (like a socket with no more data) until released."""

    def __init__(self, n):
        self.n, self.release = n, threading.Event()

    def __iter__(self):
        for i in range(self.n):
            yield np.full(2, i), i
        self.release.wait(600)  # far longer than any loaded machine needs for the 0.5 s timeout


class Broken(StreamDataset):
    def __iter__(self):
        yield np.zeros(2), 0
        raise OSError("connection reset by peer")


class Slow(StreamDataset):
    def __iter__(self):
        for i in range(5):
            time.sleep(0.02)
            yield np.full(2, i), i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_blocked_stream_times_out(num_workers):
    """Two items then silence, batches of 3: the loader raises after ``timeout`` instead of
    hanging, and no worker process is left behind."""
    ds = Stuck(2)
    loader = DataLoader(ds, StreamSampler(batch_size=3), num_workers=num_workers, timeout=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"timed out after 0.5s waiting for the "
                                               r"StreamDataset"):
            list(loader)
        assert time.monotonic() - start < 120  # the loader's timeout ended the wait
        assert not [p for p in mp.active_children() if p.name.startswith("minigrad-dataloader")]
    finally:
        ds.release.set()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_with_timeout_gives_the_same_batches(num_workers):
    """A slow but live stream is not cut off, batches match the loader without a timeout, and an
    exhausted iterator stays exhausted."""
    want = [(x.tolist(), y.tolist()) for x, y in DataLoader(Slow(), StreamSampler(batch_size=2))]
    it = iter(DataLoader(Slow(), StreamSampler(batch_size=2), num_workers=num_workers, timeout=2))
    got = [(x.tolist(), y.tolist()) for x, y in it]
    assert got == want and [y for _, y in got] == [[0, 1], [2, 3], [4]]
    assert next(it, None) is None


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stream_error_surfaces(num_workers):
    """An error raised by the stream itself (read in the main process) keeps its type."""
    loader = DataLoader(Broken(), StreamSampler(batch_size=2), num_workers=num_workers,
                        timeout=5)
    with pytest.raises(OSError, match="connection reset by peer"):
        list(loader)


def test_default_transform_is_the_identity_pseudo_transform():
    """MegEngine: a DataLoader built without a transform holds a PseudoTransform (the identity);
    batches are the collated samples unchanged."""
    from minigrad.data.dataset import ArrayDataset
    from minigrad.data.transform import PseudoTransform

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    loader = DataLoader(ArrayDataset(x))
    assert isinstance(loader.transform, PseudoTransform)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in loader]), x)
    assert "transform" not in repr(loader)
