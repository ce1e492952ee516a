"""Megatron's 1D options that the default layer pairs do not use: a column-parallel Linear with
``gather_output=True`` followed by a row-parallel Linear with ``input_is_parallel=False`` (each
rank takes its part of the whole input itself) equal the single-device model in float64."""

import numpy as np

import minigrad as mg
import minigrad.autodiff as ad
import minigrad.distributed as dist
import minigrad.module as M
from minigrad.distributed import tensor_parallel as tp
from minigrad.testing.distributed import run_workers

X = np.random.default_rng(0).standard_normal((3, 8))
DY = np.random.default_rng(1).standard_normal((3, 6))


def _run(parallel):
    mg.random.seed(0)
    if parallel:
        dist.init_parallel(dict(tensor=dict(size=2, mode="1d")))
        tp.reset_layout()
        model = M.Sequential(tp.Linear1DCol(8, 12, gather_output=True), M.GELU(),
                             tp.Linear1DRow(12, 6, input_is_parallel=False))
    else:  # the single-device model, drawn from the same seed
        model = M.Sequential(M.Linear(8, 12), M.GELU(), M.Linear(12, 6))
    model = _float64(model)
    x = mg.tensor(X)
    gm = ad.GradManager().attach(list(model.parameters()) + [x])
    with gm:
        y = model(x)  # whole input, whole output: no split_input / gather_output
        gm.backward((y * mg.tensor(DY)).sum())
    grads = (tp.full_grads(model) if parallel
             else {name: p.grad.numpy() for name, p in model.named_parameters()})
    return y.numpy(), x.grad.numpy(), grads


def _float64(model):
    for t in model.tensors():
        t._data = t._data.astype(np.float64)
    return model


def test_gather_output_and_unsplit_row_input_equal_one_device():
    ref_y, ref_dx, ref_grads = _run(False)
    for y, dx, grads in run_workers(_run, 2, True, timeout=60):
        np.testing.assert_allclose(y, ref_y, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dx, ref_dx, rtol=1e-10, atol=1e-12)
        assert grads.keys() == ref_grads.keys()
        for name in ref_grads:
            np.testing.assert_allclose(grads[name], ref_grads[name], rtol=1e-10, atol=1e-12)
