"""Datasets: map-style and stream-style bases, array/concat helpers, and vision datasets."""

from minigrad.data.dataset import vision
from minigrad.data.dataset.base import ArrayDataset, ConcatDataset, Dataset, StreamDataset
from minigrad.data.dataset.vision import MNIST

__all__ = ["Dataset", "StreamDataset", "ArrayDataset", "ConcatDataset", "MNIST", "vision"]
