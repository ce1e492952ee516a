"""Data loading: datasets, rank-aware samplers, transforms, collation and the DataLoader.

Layout: ``dataset/`` (what the samples are), ``sampler`` (which indices form each batch on this
rank), ``transform`` (per-sample augmentation), ``collator`` (samples -> batch arrays) and
``dataloader`` (ties them together, optionally with worker processes). NumPy only.
"""

from minigrad.data import dataset, sampler, transform
from minigrad.data.collator import Collator
from minigrad.data.dataloader import DataLoader, get_worker_info
from minigrad.data.sampler import (
    Infinite,
    MapSampler,
    RandomSampler,
    ReplacementSampler,
    Sampler,
    SequentialSampler,
    StreamSampler,
)

__all__ = [
    "Collator",
    "DataLoader",
    "Infinite",
    "MapSampler",
    "RandomSampler",
    "ReplacementSampler",
    "Sampler",
    "SequentialSampler",
    "StreamSampler",
    "dataset",
    "get_worker_info",
    "sampler",
    "transform",
]
