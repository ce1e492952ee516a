"""Vision datasets (HWC uint8 images, MegEngine layout)."""

from minigrad.data.dataset.vision.idx import IDXFormatError, parse_idx, read_idx
from minigrad.data.dataset.vision.mnist import MIRRORS, MNIST, bundled_split, load_mnist

__all__ = [
    "MNIST", "MIRRORS", "IDXFormatError", "bundled_split", "load_mnist", "parse_idx", "read_idx",
]
