"""``Embedding``: a lookup table of ``num_embeddings`` vectors of size ``embedding_dim``."""

from __future__ import annotations

import numpy as np

import minigrad.functional as F
from minigrad.autodiff.tensor import Parameter, Tensor
from minigrad.backend.device_checks import check_range
from minigrad.module import init
from minigrad.module.module import Module


class Embedding(Module):
    """Map integer ids ``(...)`` to vectors ``(..., embedding_dim)``; weight initialised N(0, 1).

    ``initial_weight`` (array or Tensor of shape ``(num_embeddings, embedding_dim)``) replaces the
    random initialisation, as in MegEngine; ``Embedding.from_pretrained`` does the same.
    """

    @staticmethod
    def count_parameters(num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                         initial_weight=None, **kwargs) -> int:
        """The number of trainable parameters of this layer built with these arguments, computed
        without building it (a pipeline stage partitions layers that it never builds)."""
        return num_embeddings * embedding_dim

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 initial_weight=None, **kwargs):
        super().__init__(**kwargs)
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.padding_idx = padding_idx
        self.weight = Parameter(np.zeros((self.num_embeddings, self.embedding_dim), np.float32))
        if initial_weight is None:
            init.normal_(self.weight)
            if padding_idx is not None:
                self.weight.data[padding_idx] = 0
        else:
            w = initial_weight.numpy() if isinstance(initial_weight, Tensor) else initial_weight
            if tuple(np.shape(w)) != self.weight.shape:
                raise ValueError(
                    f"Embedding: initial_weight must have shape {self.weight.shape}, got "
                    f"{tuple(np.shape(w))}"
                )
            self.weight.set_value(np.asarray(w, np.float32))

    @classmethod
    def from_pretrained(cls, embeddings, freeze: bool = True, padding_idx: int | None = None):
        """An Embedding holding ``embeddings`` (``freeze`` is accepted for API parity: what is
        trained is decided by what the GradManager and optimizer are given)."""
        shape = tuple(embeddings.shape)
        return cls(shape[0], shape[1], padding_idx=padding_idx, initial_weight=embeddings)

    def forward(self, ids: Tensor) -> Tensor:
        if not isinstance(ids, Tensor):
            ids = Tensor(np.asarray(ids), device=self.weight.device)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"Embedding: ids must be an integer tensor, got dtype {ids.dtype}")
        n, dim = self.num_embeddings, self.embedding_dim
        check_range(ids.data, 0, n, lambda lo, hi: IndexError(
            f"Embedding({n}, {dim}): ids must be in [0, {n}), got min {lo} max {hi}"))
        return F.embedding(ids, self.weight, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
