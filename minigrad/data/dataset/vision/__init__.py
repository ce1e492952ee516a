"""Vision datasets (HWC uint8 images, MegEngine layout)."""

from minigrad.data.dataset.vision.cifar import CIFAR10, CIFAR100, read_cifar_batch
from minigrad.data.dataset.vision.folder import ImageFolder, ImageNet
from minigrad.data.dataset.vision.idx import IDXFormatError, parse_idx, read_idx
from minigrad.data.dataset.vision.image_file import is_image_file, read_image
from minigrad.data.dataset.vision.mnist import MIRRORS, MNIST, bundled_split, load_mnist

__all__ = [
    "CIFAR10", "CIFAR100", "ImageFolder", "ImageNet", "MNIST", "MIRRORS", "IDXFormatError",
    "bundled_split", "is_image_file", "load_mnist", "parse_idx", "read_cifar_batch", "read_idx",
    "read_image",
]
