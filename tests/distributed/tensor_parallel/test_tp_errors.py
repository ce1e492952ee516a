"""Misuse of tensor-parallel layers fails on every rank, before any collective, naming the layer,
the expected and the actual value."""

import numpy as np

import minigrad as mg
import minigrad.distributed as dist
from minigrad.distributed import tensor_parallel as tp
from minigrad.testing.distributed import run_workers


def _message(fn):
    try:
        fn()
    except (ValueError, TypeError, IndexError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _errors_2d():
    dist.init_parallel(dict(tensor=dict(size=4, mode="2d")))
    x = mg.tensor(np.ones((4, 3, 8)))
    fc = tp.Linear(8, 8)
    return dict(
        features=_message(lambda: fc(x)),
        batch=_message(lambda: tp.split_input(np.ones((3, 8)))),
        heads=_message(lambda: tp.TransformerBlock(12, 3)),
        bias=_message(lambda: tp.Linear2D(8, 6)),
        mode=_message(lambda: tp.Linear1DCol(8, 8)),
        ids_dtype=_message(lambda: tp.Embedding(8, 8)(mg.tensor(np.zeros((2, 3))))),
        ids_range=_message(lambda: tp.Embedding(8, 8)(mg.tensor(np.full((2, 3), 8)))),
        labels=_message(lambda: tp.cross_entropy(tp.Classifier(8, 8)(tp.split_input(x)),
                                                 np.full((2, 3), 9))),
    )


def test_misuse_in_2d_names_layer_expected_and_actual():
    for errors in run_workers(_errors_2d, 4):
        assert "Linear2D(in_features=8" in errors["features"]
        assert "expected input of shape (..., 4) on this rank, got (4, 3, 8)" in errors["features"]
        assert "axis 0 of shape (3, 8) is not divisible by the 2 ranks" in errors["batch"]
        assert "num_heads 3 is not divisible by the 2 ranks" in errors["heads"]
        assert "Linear2D bias: dimension 0 of shape (6,) is not divisible by 4" in errors["bias"]
        assert "Linear1DCol needs tensor mode '1d', but the parallel context has mode '2d'" in (
            errors["mode"])
        assert "ids must be an integer tensor, got dtype float64" in errors["ids_dtype"]
        assert "ids must be in [0, 8), got min 8 max 8" in errors["ids_range"]
        assert "labels must be in [0, 8), got min 9 max 9" in errors["labels"]


def _errors_1d():
    dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
    tp.Linear(8, 16)  # column-parallel: its output is split
    return dict(
        norm=_message(lambda: tp.LayerNorm(16)),
        head=_message(lambda: tp.Classifier(16, 8)),
        chunks=_message(lambda: tp.Linear(16, 24, out_chunks=3)),
    )


def test_1d_layers_that_need_a_whole_input_refuse_a_split_one():
    for errors in run_workers(_errors_1d, 2):
        assert "tp.LayerNorm in 1D needs a whole (replicated) input" in errors["norm"]
        assert "tp.Classifier in 1D needs a whole (replicated) input" in errors["head"]
        assert "out_chunks needs a column-parallel layer" in errors["chunks"]
