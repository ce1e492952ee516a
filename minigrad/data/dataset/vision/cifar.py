"""CIFAR-10 and CIFAR-100 from their "python version" batch files (MegEngine's ``CIFAR10`` and
``CIFAR100``).

The batch files are Python 2 pickles of a dict holding a ``(N, 3072)`` uint8 array and lists of
labels. They are read with the restricted reader of :mod:`minigrad.megengine_checkpoint`, which
rebuilds only NumPy arrays, strings, numbers, lists and dicts and refuses anything else before it
is called, so a tampered batch file cannot run code.

Items are ``(image, label)`` for CIFAR-10 and ``(image, coarse_label, fine_label)`` for CIFAR-100,
as in MegEngine: ``image`` a uint8 ``(32, 32, 3)`` HWC array in BGR channel order (OpenCV's, which
MegEngine's transforms assume), labels ``np.int32``.

Files are looked for in ``root/<folder>`` (``cifar-10-batches-py``, ``cifar-100-python``); when
missing, the archive ``root/<name>-python.tar.gz`` is extracted, after it is downloaded (with
``download=True``) and its MD5 checked. Only the archive's regular files inside its own folder are
extracted. ``root`` defaults to ``$MINIGRAD_DATA/<name>``, else ``~/.cache/minigrad/<name>``.

Example::

    train = CIFAR10("/data/cifar", train=True, download=False)
    image, label = train[0]          # (32, 32, 3) uint8 BGR, np.int32
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np

from minigrad.data.dataset.base import Dataset, _check_index
from minigrad.data.dataset.vision.mnist import _fetch, md5sum
from minigrad.megengine_checkpoint import load_megengine

__all__ = ["CIFAR10", "CIFAR100", "read_cifar_batch"]

SIDE, CHANNELS = 32, 3


def read_cifar_batch(path: str | os.PathLike) -> dict:
    """One batch file as a dict with ``str`` keys (``"data"``, ``"labels"``...), read without
    unpickling anything but arrays and plain values (see the module docstring)."""
    raw = load_megengine(path, encoding="latin1")
    if not isinstance(raw, dict):
        raise ValueError(f"CIFAR: {os.fspath(path)!r} holds a {type(raw).__name__}, not a dict")
    return {(k.decode("latin-1") if isinstance(k, bytes) else k): v for k, v in raw.items()}


def _text(value) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


class CIFAR10(Dataset):
    """The 50000 training or 10000 test images of CIFAR-10 with their class (0..9)."""

    name = "cifar10"
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    archive = "cifar-10-python.tar.gz"
    archive_md5 = "c58f30108f718f92721af3b95e74349a"
    folder = "cifar-10-batches-py"
    train_files = tuple(f"data_batch_{i}" for i in range(1, 6))
    test_files = ("test_batch",)
    meta_file = "batches.meta"
    label_keys = ("labels",)
    meta_names = ("label_names",)

    def __init__(self, root: str | os.PathLike | None = None, train: bool = True,
                 download: bool = True, timeout: float = 500, progress: bool = True) -> None:
        if root is None:
            env = os.environ.get("MINIGRAD_DATA")
            root = Path(env) / self.name if env else Path.home() / ".cache" / "minigrad" / self.name
        self.root, self.train = Path(root).expanduser(), bool(train)
        files = self.train_files if self.train else self.test_files
        folder = self.root / self.folder
        if not all((folder / f).is_file() for f in files):
            self._extract(download, timeout, progress, files)
        images, labels = [], [[] for _ in self.label_keys]
        for f in files:
            batch = read_cifar_batch(folder / f)
            data = np.asarray(batch.get("data"))
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != SIDE * SIDE * CHANNELS:
                raise ValueError(f"{type(self).__name__}: {str(folder / f)!r} holds data of shape "
                                 f"{data.shape} and dtype {data.dtype}, expected (N, 3072) uint8")
            images.append(data)
            for store, key in zip(labels, self.label_keys, strict=True):
                store.extend(batch[key])
        rgb = np.concatenate(images).reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1)
        self.images = np.ascontiguousarray(rgb[..., ::-1])  # BGR, as OpenCV and MegEngine
        self.labels = tuple(np.asarray(store, dtype=np.int32) for store in labels)
        meta = folder / self.meta_file
        self.meta = {}
        if meta.is_file():
            raw = read_cifar_batch(meta)
            self.meta = {k: [_text(v) for v in raw[k]] for k in self.meta_names if k in raw}

    def _extract(self, download: bool, timeout: float, progress: bool, files) -> None:
        archive = self.root / self.archive
        if not archive.is_file():
            if not download:
                raise FileNotFoundError(
                    f"{type(self).__name__}: {', '.join(files)} not found in "
                    f"{str(self.root / self.folder)!r} and no {self.archive} in "
                    f"{str(self.root)!r}; pass download=True or put the archive there")
            self.root.mkdir(parents=True, exist_ok=True)
            fetched = _fetch(self.url, archive, timeout, progress)
            if fetched.md5 != self.archive_md5:
                os.unlink(fetched.tmp)
                raise ValueError(f"{type(self).__name__}: {self.url} has MD5 {fetched.md5}, "
                                 f"expected {self.archive_md5}")
            os.replace(fetched.tmp, archive)
        actual = md5sum(archive)
        if actual != self.archive_md5:
            raise ValueError(f"{type(self).__name__}: {str(archive)!r} has MD5 {actual}, "
                             f"expected {self.archive_md5}")
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if not member.isfile() or not parts or parts[0] != self.folder or ".." in parts:
                    continue
                source = tar.extractfile(member)
                target = self.root.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read())

    def __getitem__(self, index: int) -> tuple:
        i = _check_index(index, len(self), type(self).__name__)
        return (self.images[i],) + tuple(labels[i] for labels in self.labels)

    def __len__(self) -> int:
        return len(self.images)


class CIFAR100(CIFAR10):
    """The 50000 training or 10000 test images of CIFAR-100: ``(image, coarse_label,
    fine_label)``, the coarse label one of 20 superclasses, the fine one of 100 classes."""

    name = "cifar100"
    url = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    archive = "cifar-100-python.tar.gz"
    archive_md5 = "eb9058c3a382ffc7106e4002c42a8d85"
    folder = "cifar-100-python"
    train_files = ("train",)
    test_files = ("test",)
    meta_file = "meta"
    label_keys = ("coarse_labels", "fine_labels")
    meta_names = ("coarse_label_names", "fine_label_names")
