"""Datasets: map-style and stream-style bases, array/concat helpers, and vision datasets."""

from minigrad.data.dataset import vision
from minigrad.data.dataset.base import ArrayDataset, ConcatDataset, Dataset, StreamDataset
from minigrad.data.dataset.vision import CIFAR10, CIFAR100, MNIST, ImageFolder, ImageNet

__all__ = [
    "Dataset", "StreamDataset", "ArrayDataset", "ConcatDataset", "CIFAR10", "CIFAR100",
    "ImageFolder", "ImageNet", "MNIST", "vision",
]
