"""The matrix products one training step of each benchmark model issues.

Each product is ``(a shape, b shape, transpose b)``: ``a @ b`` (``a @ b.T`` when the flag is set;
3-D shapes are batched products), in the layouts minigrad uses, with one simplification: minigrad
sums a long convolution weight gradient (LeNet's first) over slabs of its reduction axis, which
is listed here as the one product it replaces, so LeNet's floor is on the slow side.
``bench_training.py`` times these alone as the *GEMM floor* (NumPy against PyTorch) and
``bench_blas.py`` times them under several BLAS libraries; both take them from here so the lists
cannot drift apart. The models are those of ``bench_training.py``.
"""

from __future__ import annotations

import numpy as np

MODELS = ("mlp", "lenet", "transformer")


def linear_products(batch: int, sizes: list, first_needs_dx: bool = False) -> list:
    """Forward ``x @ w.T``, backward ``g @ w`` (input gradient) and ``g.T @ x`` (weight gradient)
    of a stack of linear layers, as Linear issues them."""
    out = []
    for i, (fin, fout) in enumerate(zip(sizes[:-1], sizes[1:])):
        out.append(((batch, fin), (fout, fin), True))
        out.append(((fout, batch), (batch, fin), False))
        if i > 0 or first_needs_dx:
            out.append(((batch, fout), (fout, fin), False))
    return out


def mlp() -> list:
    """MLP 784-512-512-10, batch 128."""
    return linear_products(128, [784, 512, 512, 10])


def lenet() -> list:
    """LeNet-style CNN, batch 64 on 28x28: the convolutions' im2col products, then the linears."""
    convs = [  # W (O, K) @ cols (K, P); dW = dY (O, P) @ cols.T; dcols = W.T @ dY
        ((6, 25), (25, 36864), False), ((6, 36864), (25, 36864), True),
        ((16, 150), (150, 4096), False), ((16, 4096), (150, 4096), True),
        ((150, 16), (16, 4096), False),
    ]
    return convs + linear_products(64, [256, 120, 84, 10], first_needs_dx=True)


def transformer(d: int = 128, heads: int = 4, seq: int = 64, batch: int = 16,
                hidden: int = 512) -> list:
    """One pre-norm Transformer block: the four linears, then the attention core batched over
    (batch, heads)."""
    tokens, g, hd = batch * seq, batch * heads, d // heads
    out = []
    for fin, fout in ((d, 3 * d), (d, d), (d, hidden), (hidden, d)):
        out += linear_products(tokens, [fin, fout], first_needs_dx=True)
    out += [
        ((g, seq, hd), (g, seq, hd), True), ((g, seq, seq), (g, seq, hd), False),
        ((g, seq, seq), (g, seq, hd), False), ((g, seq, hd), (g, seq, hd), True),
        ((g, seq, seq), (g, seq, hd), False), ((g, seq, seq), (g, seq, hd), False),
    ]
    return out


PRODUCTS = {"mlp": mlp, "lenet": lenet, "transformer": transformer}


def operands(products: list, seed: int = 0) -> list:
    """``(a, b, transpose b)`` with random float32 ``a`` and ``b`` of each product's shapes."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(a_shape).astype(np.float32),
             rng.standard_normal(b_shape).astype(np.float32), trans_b)
            for a_shape, b_shape, trans_b in products]
