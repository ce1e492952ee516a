"""Directional finite-difference gradient checks in float64 (Chainer's idea: project the gradient on
a random direction, so one check costs two extra forward passes whatever the input size)."""

from __future__ import annotations

import numpy as np

from minigrad.autodiff.grad_manager import GradManager
from minigrad.autodiff.recording import no_grad
from minigrad.autodiff.tensor import Tensor

#: Nested managers compute the first derivative with the same ops as a plain backward, so in
#: float64 the two may differ only by round-off.
FIRST_DERIVATIVE_RTOL, FIRST_DERIVATIVE_ATOL = 1e-7, 1e-10
#: An absolute slack of ``rtol`` times this, for directional derivatives that are close to zero
#: (where a relative tolerance alone would demand more than central differences can give).
NEAR_ZERO_SLACK = 1e-2


def _loss(fn, arrays, args_kind, device, weights):
    with_tensors = [Tensor(a, device=device) if k else a for a, k in zip(arrays, args_kind)]
    out = fn(*with_tensors)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(float((o.numpy().astype(np.float64) * w).sum()) for o, w in zip(outs, weights))


def numeric_directional_derivative(fn, arrays, directions, args_kind, device, weights, eps):
    """Central difference of ``sum(fn(arrays) * weights)`` along ``directions`` (one per array,
    None for constants): ``(L(a + eps d) - L(a - eps d)) / (2 eps)``, in float64."""
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
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol + rtol * NEAR_ZERO_SLACK), (
            f"gradient check failed: analytic directional derivative {analytic!r} vs "
            f"finite differences {numeric!r}"
        )


def _first_grads(fn, arrays, weights, device) -> list:
    """Gradients of ``sum(fn(*arrays) * weights)`` w.r.t. every array, as float64 NumPy arrays."""
    ts = [Tensor(a, device=device) for a in arrays]
    gm = GradManager().attach(ts)
    with gm:
        gm.backward(fn(*ts), Tensor(weights, device=device))
    return [
        np.zeros_like(a) if t.grad is None else t.grad.numpy()
        for a, t in zip(arrays, ts, strict=True)
    ]


def check_double_grad(fn, *inputs, device="cpu0", eps=1e-5, rtol=1e-4, atol=1e-6, seed=0) -> None:
    """MegEngine's nested-GradManager second-order gradient, checked against finite differences.

    Inside ``with gm1: with gm2:``, ``gm2.backward`` leaves ``x.grad = g(x)`` (the first derivative,
    itself recorded by gm1); ``gm1.backward(x.grad)`` then adds ``d/dx sum(g(x))``. The added part
    is compared, along a random direction, with central differences of ``sum(g)`` where ``g`` comes
    from plain first-order backward passes (float64 throughout).
    """
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(a, np.float64) for a in inputs]
    with no_grad():
        out_shape = fn(*[Tensor(a, device=device) for a in arrays]).shape
    weights = rng.standard_normal(out_shape)

    ts = [Tensor(a, device=device) for a in arrays]
    gm1 = GradManager().attach(ts)
    gm2 = GradManager().attach(ts)
    with gm1:
        with gm2:
            gm2.backward(fn(*ts), Tensor(weights, device=device))
        first = [t.grad for t in ts]
        first_np = [
            np.zeros_like(a) if g is None else g.numpy() for a, g in zip(arrays, first, strict=True)
        ]
        gm1.backward([g for g in first if g is not None])
    second = [
        np.zeros_like(a) if t.grad is None else t.grad.numpy() - g
        for a, t, g in zip(arrays, ts, first_np, strict=True)
    ]

    expected_first = _first_grads(fn, arrays, weights, device)
    for i, (got, want) in enumerate(zip(first_np, expected_first, strict=True)):
        np.testing.assert_allclose(
            got,
            want,
            rtol=FIRST_DERIVATIVE_RTOL,
            atol=FIRST_DERIVATIVE_ATOL,
            err_msg=f"first derivative of input {i} (nested managers)",
        )
    for _ in range(2):
        dirs = [rng.standard_normal(a.shape) for a in arrays]

        def total(sign, dirs=dirs):
            moved = [a + sign * eps * d for a, d in zip(arrays, dirs, strict=True)]
            return sum(float(g.sum()) for g in _first_grads(fn, moved, weights, device))

        numeric = (total(1) - total(-1)) / (2 * eps)
        analytic = sum(float((s * d).sum()) for s, d in zip(second, dirs, strict=True))
        assert np.isclose(analytic, numeric, rtol=rtol, atol=atol), (
            f"second-order gradient: analytic directional derivative {analytic!r} vs finite "
            f"differences {numeric!r}"
        )
