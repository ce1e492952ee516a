"""The MNIST handwritten digits: the full 60k/10k set (cached download) or a bundled 8k/2k split.

Items are ``(image, label)`` with ``image`` a uint8 array of shape (28, 28, 1) (HWC, as MegEngine)
and ``label`` an ``np.int32``. Every file is checked against its MD5 before it is parsed, and a
download goes to a temporary file that is renamed only once its MD5 matches, so the cache never
holds a partial or corrupted file.

Without a network (and nothing cached), ``MNIST()`` does not fail: it warns in one line and
uses the 8000/2000 split of the real MNIST test set that ships with minigrad, so tutorials run
offline as written (``fallback=False`` raises instead).

Example::

    train = MNIST(train=True)                      # full set, downloads into the cache if needed
    small = MNIST(train=True, subset="bundled")     # 8000 real images that ship with minigrad
    ds = load_mnist(train=True)                     # full if cached, else bundled (no network)
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm

from minigrad.data.dataset.base import Dataset, _check_index
from minigrad.data.dataset.vision.idx import read_idx

__all__ = [
    "MNIST",
    "DownloadError",
    "MIRRORS",
    "MD5S",
    "BUNDLED_DIR",
    "default_root",
    "bundled_split",
    "load_mnist",
    "md5sum",
]

#: Base URLs tried in order; each must serve the four ``*.gz`` files by their official names.
MIRRORS: list[str] = [
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
]

FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

#: Official MD5 of each file.
MD5S: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}

NUM_SAMPLES: dict[str, int] = {"train": 60000, "test": 10000}
NUM_CLASSES = 10
IMAGES_MAGIC, LABELS_MAGIC = 2051, 2049
#: Bytes read at a time while hashing a file and while downloading one.
MD5_CHUNK_BYTES, DOWNLOAD_BLOCK_BYTES = 1 << 20, 1 << 16
#: Knuth's multiplicative hash constant (2**32 / golden ratio, odd: a bijection mod 2**32).
KNUTH_MULTIPLIER = 2654435761

#: The official 10k test set ships with the package; it is split into 8000 train / 2000 test.
BUNDLED_DIR: Path = Path(__file__).resolve().parents[2] / "bundled" / "mnist"
BUNDLED_SIZE = 10000  # the official test set, whole
BUNDLED_TEST_SIZE = 2000
BUNDLED_MD5S: dict[str, str] = {
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}


def default_root() -> Path:
    """Cache directory: ``$MINIGRAD_DATA`` if set, else ``~/.cache/minigrad/mnist``."""
    env = os.environ.get("MINIGRAD_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "minigrad" / "mnist"


def md5sum(path: str | os.PathLike, chunk: int = MD5_CHUNK_BYTES) -> str:
    """Hex MD5 of a file, read in chunks."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def bundled_split(labels: np.ndarray, n_test: int = BUNDLED_TEST_SIZE) -> tuple[np.ndarray, ...]:
    """Deterministic stratified split of ``labels`` into sorted (train, test) index arrays.

    No RNG is involved (its streams may change between NumPy versions): samples are ordered by a
    fixed multiplicative hash of their index (``KNUTH_MULTIPLIER``, a bijection mod 2**32), and each
    class gives its largest-remainder share of ``n_test`` from the front of that order.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if not 0 < n_test < n:
        raise ValueError(f"bundled_split: n_test must be in (0, {n}), got {n_test}")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * n_test / n
    quota = np.floor(exact).astype(np.int64)
    # Hand out the remaining slots to the largest fractional parts (ties: smaller class first).
    order = np.lexsort((classes, -(exact - quota)))
    quota[order[: n_test - int(quota.sum())]] += 1
    keys = (np.arange(n, dtype=np.uint64) * np.uint64(KNUTH_MULTIPLIER)) % np.uint64(2**32)
    test = []
    for c, q in zip(classes, quota, strict=True):
        idx = np.flatnonzero(labels == c)
        test.append(idx[np.argsort(keys[idx], kind="stable")][:q])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(n), test_idx)
    return train_idx, test_idx


class MNIST(Dataset):
    """MNIST digits as ``(image uint8 (28, 28, 1), label int32)`` items.

    Args:
        root: cache directory for the full set (default :func:`default_root`); unused for
            ``subset="bundled"``.
        train: training split (60000 / 8000 samples) or test split (10000 / 2000).
        download: fetch missing files from ``mirrors``; if False a missing file is an error.
        fallback: when a download fails (no network, no mirror serving the right MD5), use the
            bundled split with a one-line warning instead of raising (``self.subset`` then says
            ``"bundled"``).
        subset: ``"full"`` (official files) or ``"bundled"`` (the 10k test set shipped with
            minigrad, split 8000/2000 by :func:`bundled_split`).
        mirrors: base URLs tried in order (default: the module-level :data:`MIRRORS`).
        md5s: expected MD5 per file name (default :data:`MD5S`); tests pass their own.
        timeout: seconds per network operation while downloading.
        progress: show a tqdm progress bar while downloading.

    Attributes:
        images: uint8 array (N, 28, 28, 1), all samples in memory.
        labels: int32 array (N,).

    Example::

        train_set = MNIST(train=True)   # offline: the bundled 8000 images, with a warning
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        train: bool = True,
        download: bool = True,
        subset: str = "full",
        mirrors: Sequence[str] | None = None,
        md5s: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        progress: bool = True,
        fallback: bool = True,
    ) -> None:
        if subset not in ("full", "bundled"):
            raise ValueError(f"MNIST: subset must be 'full' or 'bundled', got {subset!r}")
        self.train, self.subset = bool(train), subset
        self.md5s = dict(MD5S if md5s is None else md5s)
        self.mirrors = list(MIRRORS if mirrors is None else mirrors)
        split = "train" if self.train else "test"
        self.root = Path(root).expanduser() if root is not None else default_root()
        if subset == "full":
            names = FILES[split]
            missing = [n for n in names if not (self.root / n).is_file()]
            if missing and not download:
                raise FileNotFoundError(self._where_to_put(missing, "download=False"))
            if missing:
                self.root.mkdir(parents=True, exist_ok=True)
            try:
                for name in missing:
                    self._download(name, timeout, progress)
            except DownloadError as exc:
                if not fallback:
                    raise
                warnings.warn(self._fallback_notice(split, exc), UserWarning, stacklevel=2)
                self.subset = "bundled"
        if self.subset == "bundled":
            images, labels = self._load_bundled()
        else:
            count = NUM_SAMPLES[split] if md5s is None else None
            images, labels = self._load(self.root, names, count, self.md5s)
        self.images = images[..., None]  # (N, 28, 28) -> HWC (N, 28, 28, 1)
        self.labels = labels.astype(np.int32)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int32]:
        i = _check_index(index, len(self), "MNIST")
        return self.images[i], self.labels[i]

    def __len__(self) -> int:
        return len(self.labels)

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"MNIST(subset={self.subset!r}, split={split!r}, n={len(self)}, root='{self.root}')"

    # -- files -----------------------------------------------------------------------------------

    def _load_bundled(self) -> tuple[np.ndarray, ...]:
        """This split's part of the official test set that ships with minigrad."""
        self.root = BUNDLED_DIR
        images, labels = self._load(BUNDLED_DIR, FILES["test"], BUNDLED_SIZE, BUNDLED_MD5S)
        train_idx, test_idx = bundled_split(labels)
        keep = train_idx if self.train else test_idx
        return images[keep], labels[keep]

    def _fallback_notice(self, split: str, exc: DownloadError) -> str:
        """The one-line warning of a failed download: why, what is used instead, how to get more."""
        first = " ".join(exc.errors[0].split()) if exc.errors else "no mirrors configured"
        more = f" and {len(exc.errors) - 1} more mirror(s)" if len(exc.errors) > 1 else ""
        where = ", ".join(str(self.root / n) for n in FILES[split])
        return (f"MNIST: could not download {exc.name} ({first}{more}); using the bundled "
                f"8000/2000 split of the official MNIST test set instead. For the full set put "
                f"the files at {where} (or set $MINIGRAD_DATA)")

    def _load(
        self, root: Path, names: Sequence[str], count: int | None, md5s: Mapping[str, str]
    ) -> tuple[np.ndarray, ...]:
        for name in names:
            self._verify(root / name, md5s)
        images = read_idx(root / names[0], IMAGES_MAGIC, (count, 28, 28))
        labels = read_idx(root / names[1], LABELS_MAGIC, (count,))
        if len(images) != len(labels):
            raise ValueError(
                f"MNIST: {root / names[0]} has {len(images)} images but {root / names[1]} has "
                f"{len(labels)} labels"
            )
        if labels.size and labels.max() >= NUM_CLASSES:
            raise ValueError(
                f"MNIST: {root / names[1]} has label {labels.max()}, expected 0..{NUM_CLASSES - 1}"
            )
        return images, labels

    @staticmethod
    def _verify(path: Path, md5s: Mapping[str, str]) -> None:
        expected = md5s.get(path.name)
        if expected is None:
            raise KeyError(f"MNIST: no expected MD5 for {path.name} (md5s has {sorted(md5s)})")
        actual = md5sum(path)
        if actual != expected:
            raise ValueError(
                f"MNIST: MD5 mismatch for {path}: expected {expected}, got {actual}. The file is "
                f"corrupted or incomplete; delete it and download again."
            )

    def _where_to_put(self, missing: Sequence[str], why: str) -> str:
        """What to do about missing files; ``download=True`` is suggested only when it was off."""
        paths = "\n".join(f"  {self.root / n}  (md5 {self.md5s.get(n, '?')})" for n in missing)
        options = "allow download=True, or use" if why == "download=False" else "or use"
        return (
            f"MNIST ({why}): missing files. Put them at\n{paths}\n(set root= or $MINIGRAD_DATA to "
            f"use another directory), {options} subset='bundled'."
        )

    def _download(self, name: str, timeout: float, progress: bool) -> None:
        """Fetch ``name`` from the first mirror that serves it with the right MD5."""
        target = self.root / name
        errors = []
        for base in self.mirrors:
            url = base if base.endswith("/") else base + "/"
            url += name
            try:
                actual = _fetch(url, target, timeout, progress)
            except (OSError, urllib.error.URLError, ValueError) as exc:
                errors.append(f"  {url}: {exc}")
                continue
            expected = self.md5s.get(name)
            if actual.md5 == expected:
                os.replace(actual.tmp, target)
                return
            os.unlink(actual.tmp)
            errors.append(f"  {url}: MD5 mismatch: expected {expected}, got {actual.md5}")
        tried = "\n".join(errors) if errors else "  (no mirrors configured)"
        raise DownloadError(
            f"MNIST: could not download {name}; tried:\n{tried}\n"
            + self._where_to_put([name], "download failed"),
            name, [e.strip() for e in errors],
        )


class DownloadError(RuntimeError):
    """No mirror served ``name`` with the right MD5; ``errors`` says what each mirror answered."""

    def __init__(self, message: str, name: str, errors: list[str]) -> None:
        super().__init__(message)
        self.name, self.errors = name, errors


class _Fetched:
    def __init__(self, tmp: str, md5: str) -> None:
        self.tmp, self.md5 = tmp, md5


def _fetch(url: str, target: Path, timeout: float, progress: bool) -> _Fetched:
    """Stream ``url`` into a temporary file next to ``target``; return it with its MD5."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    h = hashlib.md5()
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "minigrad"})
        with urllib.request.urlopen(request, timeout=timeout) as response, os.fdopen(fd, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name,
                      disable=not progress, leave=False) as bar:
                for block in iter(lambda: response.read(DOWNLOAD_BLOCK_BYTES), b""):
                    f.write(block)
                    h.update(block)
                    bar.update(len(block))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return _Fetched(tmp, h.hexdigest())


def load_mnist(
    root: str | os.PathLike | None = None,
    train: bool = True,
    prefer: str = "full",
    download: bool = False,
    quiet: bool = False,
) -> MNIST:
    """MNIST for examples: the full set when available, else the bundled split (with a notice).

    ``prefer="full"`` uses the cached full files in ``root`` when present; if they are missing it
    downloads them only when ``download=True`` (never touching the network otherwise) and falls
    back to ``subset="bundled"`` on any failure, printing one line to stderr saying why.
    ``prefer="bundled"`` always uses the bundled split.
    """
    if prefer not in ("full", "bundled"):
        raise ValueError(f"load_mnist: prefer must be 'full' or 'bundled', got {prefer!r}")
    if prefer == "full":
        try:
            return MNIST(root, train=train, download=download, subset="full", fallback=False)
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            reason = " ".join(str(exc).split())  # one line
            if not quiet:
                print(
                    f"load_mnist: using the bundled 8000/2000 split of the official MNIST test "
                    f"set because the full set is unavailable: {reason}",
                    file=sys.stderr,
                )
    return MNIST(train=train, subset="bundled")
