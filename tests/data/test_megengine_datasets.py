"""MegEngine's CIFAR10/CIFAR100 (python-version batch files, read without unpickling arbitrary
objects), ImageFolder and ImageNet (folder layout), against files written here in the formats
those datasets ship in."""

from __future__ import annotations

import hashlib
import io
import pickle
import struct
import tarfile
import zlib

import numpy as np
import pytest

from minigrad.data.dataset import CIFAR10, CIFAR100, ImageFolder, ImageNet
from minigrad.data.dataset.vision import read_image
from minigrad.megengine_checkpoint import RefusedPickleError

RNG = np.random.default_rng(0)


class _Py2Pickler(pickle._Pickler):
    """Writes ``bytes`` as Python 2 wrote its ``str`` (BINSTRING opcodes), as in the CIFAR files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str


def _py2_pickle(obj) -> bytes:
    out = io.BytesIO()
    _Py2Pickler(out, protocol=2).dump(obj)
    return out.getvalue()


def _cifar_batch(n, label_keys, classes):
    data = RNG.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    batch = {b"batch_label": b"training batch", b"data": data,
             b"filenames": [b"img_%d.png" % i for i in range(n)]}
    labels = {}
    for key, count in zip(label_keys, classes, strict=True):
        labels[key] = [int(v) for v in RNG.integers(0, count, size=n)]
        batch[key.encode()] = labels[key]
    return batch, data, labels


def _expected_image(row):
    """Pixel (y, x), channel c (BGR) of a CIFAR row: the row stores R plane, G plane, B plane."""
    image = np.empty((32, 32, 3), np.uint8)
    for y in range(32):
        for x in range(32):
            for c in range(3):
                image[y, x, c] = row[(2 - c) * 1024 + y * 32 + x]
    return image


def test_cifar10_reads_python2_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train_data, train_labels = [], []
    for i in range(1, 6):
        batch, data, labels = _cifar_batch(3, ["labels"], [10])
        (folder / f"data_batch_{i}").write_bytes(_py2_pickle(batch))
        train_data.append(data)
        train_labels += labels["labels"]
    batch, test_data, test_labels = _cifar_batch(2, ["labels"], [10])
    (folder / "test_batch").write_bytes(_py2_pickle(batch))
    names = [b"airplane", b"automobile"] + [b"c%d" % i for i in range(8)]
    (folder / "batches.meta").write_bytes(_py2_pickle({b"label_names": names,
                                                       b"num_vis": 3072}))
    train = CIFAR10(str(tmp_path), train=True, download=False)
    assert len(train) == 15 and train.meta["label_names"][:2] == ["airplane", "automobile"]
    rows = np.concatenate(train_data)
    for i in (0, 7, 14):
        image, label = train[i]
        assert image.shape == (32, 32, 3) and image.dtype == np.uint8
        np.testing.assert_array_equal(image, _expected_image(rows[i]))
        assert label == train_labels[i] and isinstance(label, np.int32)
    test = CIFAR10(tmp_path, train=False, download=False)
    assert len(test) == 2 and test[1][1] == test_labels["labels"][1]
    np.testing.assert_array_equal(test[-1][0], _expected_image(test_data[1]))


def test_cifar100_items_are_image_coarse_fine(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    batch, data, labels = _cifar_batch(4, ["coarse_labels", "fine_labels"], [20, 100])
    (folder / "test").write_bytes(_py2_pickle(batch))
    ds = CIFAR100(tmp_path, train=False, download=False)
    image, coarse, fine = ds[2]
    np.testing.assert_array_equal(image, _expected_image(data[2]))
    assert (coarse, fine) == (labels["coarse_labels"][2], labels["fine_labels"][2])


def test_cifar_extracts_its_archive_and_names_missing_files(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"test_batch not found .* no cifar-10-python"):
        CIFAR10(tmp_path, train=False, download=False)
    batch, data, _ = _cifar_batch(2, ["labels"], [10])
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, payload in (("cifar-10-batches-py/test_batch", _py2_pickle(batch)),
                              ("../escape", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ValueError, match="has MD5"):
        CIFAR10(tmp_path, train=False, download=False)  # not the official archive
    monkeypatch.setattr(CIFAR10, "archive_md5", hashlib.md5(archive.read_bytes()).hexdigest())
    ds = CIFAR10(tmp_path, train=False, download=False)
    np.testing.assert_array_equal(ds[0][0], _expected_image(data[0]))
    assert not (tmp_path.parent / "escape").exists()


def test_a_batch_file_that_would_run_code_is_refused(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    evil = (b"\x80\x02}q\x00U\x04dataq\x01cos\nsystem\nq\x02U\x04trueq\x03\x85q\x04Rq\x05s.")
    (folder / "test_batch").write_bytes(evil)
    with pytest.raises(RefusedPickleError, match="os.system"):
        CIFAR10(tmp_path, train=False, download=False)


# -- image files and folders --------------------------------------------------------------------


def _png(image: np.ndarray, filters=(0, 1, 2, 3, 4)) -> bytes:
    """Encode (H, W, C) uint8 as PNG, cycling through the five row filters."""
    h, w, c = image.shape
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    rows, previous = [], np.zeros(w * c, np.int64)
    for y in range(h):
        line = image[y].reshape(-1).astype(np.int64)
        kind = filters[y % len(filters)]
        out = np.empty_like(line)
        for x in range(w * c):
            a = line[x - c] if x >= c else 0
            b = previous[x]
            d = previous[x - c] if x >= c else 0
            p = a + b - d
            paeth = min((abs(p - a), 0, a), (abs(p - b), 1, b), (abs(p - d), 2, d))[2]
            guess = [0, a, b, (a + b) // 2, paeth][kind]
            out[x] = (line[x] - guess) % 256
        rows.append(bytes([kind]) + out.astype(np.uint8).tobytes())
        previous = line

    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    header = struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_read_image_decodes_png_as_opencv_bgr(tmp_path, channels):
    image = RNG.integers(0, 256, size=(5, 7, channels), dtype=np.uint8)
    path = tmp_path / "a.png"
    path.write_bytes(_png(image))
    out = read_image(path)
    expected = np.repeat(image[..., :1], 3, -1) if channels < 3 else image[..., 2::-1]
    assert out.shape == (5, 7, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)


def test_read_image_ppm_and_unknown_formats(tmp_path):
    image = RNG.integers(0, 256, size=(3, 4, 3), dtype=np.uint8)
    (tmp_path / "a.ppm").write_bytes(b"P6\n# comment\n4 3\n255\n" + image.tobytes())
    np.testing.assert_array_equal(read_image(tmp_path / "a.ppm"), image[..., ::-1])
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    try:
        import cv2  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match=r"b\.jpg.*needs OpenCV"):
            read_image(tmp_path / "b.jpg")


def _folder(root, layout):
    images = {}
    for cls, count in layout.items():
        for i in range(count):
            image = RNG.integers(0, 256, size=(4, 3, 3), dtype=np.uint8)
            path = root / cls / ("sub" if i % 2 else "") / f"img_{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_png(image))
            images[str(path)] = image
    return images


def test_image_folder_numbers_sorted_classes(tmp_path):
    images = _folder(tmp_path, {"dog": 3, "cat": 2})
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    ds = ImageFolder(tmp_path)
    assert ds.classes == ["cat", "dog"] and len(ds) == 5
    labels = [int(ds.samples[i][1]) for i in range(5)]
    assert labels == [0, 0, 1, 1, 1]
    for i, (path, label) in enumerate(ds.samples):
        image, got = ds[i]
        np.testing.assert_array_equal(image, images[path][..., ::-1])
        assert got == label and isinstance(got, np.int32)
    assert ImageFolder(tmp_path, class_name=True)[4][2] == "dog"
    only_sub = ImageFolder(tmp_path, check_valid_func=lambda p: "sub" in p)
    assert len(only_sub) == 2
    with pytest.raises(FileNotFoundError, match="has no class folders"):
        ImageFolder(tmp_path / "cat" / "sub")


def test_imagenet_reads_the_split_folder(tmp_path):
    _folder(tmp_path / "val", {"n01440764": 1, "n01443537": 2})
    ds = ImageNet(tmp_path, train=False)
    assert ds.classes == ["n01440764", "n01443537"] and len(ds) == 3
    with pytest.raises(FileNotFoundError, match=r"train.* does not exist; extract ILSVRC2012"):
        ImageNet(tmp_path, train=True)
