"""MNIST: the bundled split against the raw files, and the download/cache path on a local server."""

import functools
import gzip
import hashlib
import http.server
import os
import struct
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from minigrad.data.dataset.vision import mnist as mnist_mod
from minigrad.data.dataset.vision.mnist import MNIST, bundled_split, default_root, load_mnist


def raw_idx(path) -> np.ndarray:
    """Independent reader: MNIST headers are 16 (images) / 8 (labels) bytes of big-endian ints."""
    data = gzip.decompress(open(path, "rb").read())
    magic, n = struct.unpack(">II", data[:8])
    if magic == 2051:
        return np.frombuffer(data, np.uint8, offset=16).reshape(n, 28, 28)
    return np.frombuffer(data, np.uint8, offset=8)


BUNDLED = mnist_mod.BUNDLED_DIR
RAW_IMAGES = raw_idx(BUNDLED / "t10k-images-idx3-ubyte.gz")
RAW_LABELS = raw_idx(BUNDLED / "t10k-labels-idx1-ubyte.gz")


def test_bundled_files_have_official_md5():
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        digest = hashlib.md5((BUNDLED / name).read_bytes()).hexdigest()
        assert digest == {"t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
                          "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"}[name]


def test_bundled_split_counts_items_and_histogram():
    train, test = MNIST(train=True, subset="bundled"), MNIST(train=False, subset="bundled")
    assert (len(train), len(test)) == (8000, 2000)
    image, label = train[0]
    assert image.shape == (28, 28, 1) and image.dtype == np.uint8
    assert isinstance(label, np.int32)
    # Together the two splits are exactly the raw file, class by class.
    raw_hist = np.bincount(RAW_LABELS, minlength=10)
    hist_tr = np.bincount(train.labels, minlength=10)
    hist_te = np.bincount(test.labels, minlength=10)
    np.testing.assert_array_equal(hist_tr + hist_te, raw_hist)
    assert raw_hist.min() > 800 and raw_hist.max() < 1200  # all 10 digits, roughly balanced
    # Stratified: every class is within one sample of its 20% share in the test split.
    assert np.all(np.abs(hist_te - raw_hist * 0.2) <= 1)


def test_bundled_split_matches_raw_images_and_is_disjoint():
    tr_idx, te_idx = bundled_split(RAW_LABELS)
    assert len(np.intersect1d(tr_idx, te_idx)) == 0
    np.testing.assert_array_equal(np.union1d(tr_idx, te_idx), np.arange(10000))
    test = MNIST(train=False, subset="bundled")
    np.testing.assert_array_equal(test.images[..., 0], RAW_IMAGES[te_idx])
    np.testing.assert_array_equal(test.labels, RAW_LABELS[te_idx])


def test_bundled_split_is_fixed():
    # The split is a contract (results must be comparable across machines and versions): this
    # fingerprint must only change together with a deliberate, documented change of the split.
    _, te_idx = bundled_split(RAW_LABELS)
    assert hashlib.md5(te_idx.astype("<i8").tobytes()).hexdigest() == (
        "32f1975b4ee6e9f05bb654c486acc28d"
    )


def test_default_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIGRAD_DATA", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("MINIGRAD_DATA")
    assert str(default_root()).endswith(os.path.join(".cache", "minigrad", "mnist"))


# -- download path against a local HTTP server --------------------------------------------------

def write_idx_gz(path, array, magic):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def fake_mnist(tmp_path):
    """A directory with tiny MNIST-format train/test files and their MD5s."""
    served = tmp_path / "served"
    served.mkdir()
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", 7), ("t10k", 3)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx_gz(served / f"{split}-images-idx3-ubyte.gz", images, 2051)
        write_idx_gz(served / f"{split}-labels-idx1-ubyte.gz", labels, 2049)
        arrays[split] = (images, labels)
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in served.iterdir()}
    return served, md5s, arrays


@pytest.fixture
def server(fake_mnist, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(fake_mnist[0]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.timeout = 5
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_download_caches_verified_files(tmp_path, fake_mnist, server):
    _, md5s, arrays = fake_mnist
    root = tmp_path / "cache"
    mirrors = [server + "/missing/", server + "/"]  # the first mirror 404s, the second works
    ds = MNIST(root, train=True, download=True, mirrors=mirrors, md5s=md5s, progress=False)
    images, labels = arrays["train"]
    assert len(ds) == 7
    np.testing.assert_array_equal(ds.images[..., 0], images)
    np.testing.assert_array_equal(ds.labels, labels.astype(np.int32))
    assert sorted(os.listdir(root)) == ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    # Cached now: no mirrors and no download needed.
    again = MNIST(root, train=True, download=False, mirrors=[], md5s=md5s)
    np.testing.assert_array_equal(again.labels, ds.labels)
    test = MNIST(root, train=False, mirrors=[server], md5s=md5s, progress=True)
    assert len(test) == 3


def test_download_wrong_md5_leaves_nothing(tmp_path, fake_mnist, server):
    _, md5s, _ = fake_mnist
    bad = dict(md5s, **{"train-images-idx3-ubyte.gz": "0" * 32})
    root = tmp_path / "cache"
    with pytest.raises(RuntimeError) as info:
        MNIST(root, train=True, mirrors=[server], md5s=bad, progress=False, fallback=False)
    msg = str(info.value)
    assert "MD5 mismatch" in msg and "0" * 32 in msg
    assert str(root / "train-images-idx3-ubyte.gz") in msg  # says where to put the file
    assert not (root / "train-images-idx3-ubyte.gz").exists()
    assert not [p for p in os.listdir(root) if p.endswith(".part")]


def test_missing_without_download_names_exact_paths(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        MNIST(tmp_path, train=False, download=False)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        assert str(tmp_path / name) in str(info.value)


def test_unreachable_mirror_lists_url(tmp_path):
    with pytest.raises(RuntimeError, match=r"127\.0\.0\.1:9/t10k-images") as info:
        MNIST(tmp_path, train=False, mirrors=["http://127.0.0.1:9/"], timeout=2, progress=False,
              fallback=False)
    # download was on: the advice is where to put the files, not to turn download on
    assert "download=True" not in str(info.value) and "subset='bundled'" in str(info.value)


def test_no_network_and_no_cache_falls_back_to_the_bundled_split(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setenv("MINIGRAD_DATA", str(tmp_path))
    with pytest.warns(UserWarning) as caught:
        ds = MNIST(train=False)  # MegEngine's tutorial line, offline, no extra argument
    assert ds.subset == "bundled" and len(ds) == 2000
    np.testing.assert_array_equal(ds.labels, MNIST(train=False, subset="bundled").labels)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "\n" not in text  # one line
    assert text.startswith("MNIST: could not download t10k-images-idx3-ubyte.gz (https://")
    assert "Temporary failure in name resolution" in text and "and 2 more mirror(s)" in text
    assert "using the bundled 8000/2000 split of the official MNIST test set instead" in text
    assert str(tmp_path / "t10k-images-idx3-ubyte.gz") in text and "download=True" not in text
    assert caught[0].filename == __file__  # points at the caller's line
    with pytest.warns(UserWarning, match="could not download train-images"):
        assert len(MNIST(train=True)) == 8000


def test_corrupt_cached_file_is_reported(tmp_path, fake_mnist):
    served, md5s, _ = fake_mnist
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (tmp_path / name).write_bytes((served / name).read_bytes())
    data = (tmp_path / "train-labels-idx1-ubyte.gz").read_bytes()
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(data[:-3])
    with pytest.raises(ValueError, match=r"MD5 mismatch for .*train-labels-idx1-ubyte\.gz"):
        MNIST(tmp_path, train=True, download=False, md5s=md5s)


def forbid_network(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("load_mnist must not touch the network when download=False")
    monkeypatch.setattr(urllib.request, "urlopen", boom)


def test_load_mnist_falls_back_to_bundled_without_network(tmp_path, monkeypatch, capsys):
    forbid_network(monkeypatch)
    ds = load_mnist(root=tmp_path, train=False)
    assert ds.subset == "bundled" and len(ds) == 2000
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bundled" in err
    assert str(tmp_path / "t10k-images-idx3-ubyte.gz") in err


def test_load_mnist_prefers_full_when_cached(tmp_path, monkeypatch, fake_mnist, capsys):
    forbid_network(monkeypatch)
    served, md5s, arrays = fake_mnist
    for p in served.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(mnist_mod, "MD5S", md5s)
    monkeypatch.setattr(mnist_mod, "NUM_SAMPLES", {"train": 7, "test": 3})
    ds = load_mnist(root=tmp_path, train=True)
    assert ds.subset == "full" and len(ds) == 7
    assert capsys.readouterr().err == ""
    assert load_mnist(root=tmp_path, prefer="bundled").subset == "bundled"


def test_bad_arguments():
    with pytest.raises(ValueError, match="subset"):
        MNIST(subset="tiny")
    with pytest.raises(ValueError, match="prefer"):
        load_mnist(prefer="fast")
    with pytest.raises(IndexError, match="MNIST: index 2000 out of range"):
        MNIST(train=False, subset="bundled")[2000]
