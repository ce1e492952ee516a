"""Directional finite-difference gradient checks in float64 (Chainer's idea: project the gradient on
a random direction, so one check costs two extra forward passes whatever the input size)."""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.grad_manager import GradManager
from minigrad.tensor import Tensor


def _loss(fn, arrays, args_kind, device, weights):
    with_tensors = [Tensor(a, device=device) if k else a for a, k in zip(arrays, args_kind)]
    out = fn(*with_tensors)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(float((o.numpy().astype(np.float64) * w).sum()) for o, w in zip(outs, weights))


def numeric_directional_derivative(fn, arrays, directions, args_kind, device, weights, eps):
    plus = [a + eps * d if d is not None else a for a, d in zip(arrays, directions)]
    minus = [a - eps * d if d is not None else a for a, d in zip(arrays, directions)]
    return (
        _loss(fn, plus, args_kind, device, weights) - _loss(fn, minus, args_kind, device, weights)
    ) / (2 * eps)


def check_grad(
    fn,
    *inputs,
    device="cpu0",
    eps: float = 1e-6,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    seed: int = 0,
    n_directions: int = 2,
    wrt=None,
) -> None:
    """Assert that minigrad's gradient of ``fn`` matches central differences.

    ``inputs`` are NumPy arrays (float ones are cast to float64 and differentiated unless ``wrt``
    lists the indices to differentiate) or non-array constants passed through unchanged. The output
    (or each output) is contracted with a random weight so every output element matters.
    """
    rng = np.random.default_rng(seed)
    arrays, kinds = [], []
    for x in inputs:
        if isinstance(x, np.ndarray):
            arrays.append(x.astype(np.float64) if x.dtype.kind == "f" else x)
            kinds.append(True)
        else:
            arrays.append(x)
            kinds.append(False)
    diff = [i for i, (a, k) in enumerate(zip(arrays, kinds)) if k and a.dtype.kind == "f"]
    if wrt is not None:
        diff = [i for i in diff if i in wrt]

    tensors = [Tensor(a, device=device) if k else a for a, k in zip(arrays, kinds)]
    gm = GradManager().attach([tensors[i] for i in diff])
    with gm:
        out = fn(*tensors)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        weights = [rng.standard_normal(o.shape) for o in outs]
        gm.backward(outs, [Tensor(w.astype(o.dtype), device=device) for o, w in zip(outs, weights)])
    grads = {
        i: (tensors[i].grad.numpy() if tensors[i].grad is not None else np.zeros_like(arrays[i]))
        for i in diff
    }
    for i in diff:
        assert grads[i].shape == arrays[i].shape, (
            f"grad of input {i}: shape {grads[i].shape} != {arrays[i].shape}"
        )

    for _ in range(n_directions):
        dirs = [rng.standard_normal(a.shape) if i in diff else None for i, a in enumerate(arrays)]
        analytic = sum(float((grads[i] * dirs[i]).sum()) for i in diff)
        numeric = numeric_directional_derivative(fn, arrays, dirs, kinds, device, weights, eps)
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol + rtol * 1e-2), (
            f"gradient check failed: analytic directional derivative {analytic!r} vs "
            f"finite differences {numeric!r}"
        )
