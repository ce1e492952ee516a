"""Attention: ``scaled_dot_product_attention`` and the functional ``multi_head_attention``.

The attention core ``softmax(q k^T * scale + bias) v`` is one node with a closed-form backward
(it is most of a Transformer's non-matmul time); with dropout it is the composition of matmul,
softmax and dropout. Masks enter as constant additive biases (``0`` to keep, ``-inf`` to drop),
so they cost one broadcast add and no gradient work; ``attention_bias`` builds them, for these
functions and for ``M.MultiHeadAttention``, with one meaning: a boolean ``attn_mask`` is True
where a query may attend a key.
"""

from __future__ import annotations

import math

import numpy as np

from minigrad.autodiff.autocast import AUTOCAST
from minigrad.autodiff.function import Function, dispatches
from minigrad.autodiff.tensor import Tensor
from minigrad.backend import blas, kernels
from minigrad.functional._util import autocast_low, recording_backward
from minigrad.functional.elementwise import _f
from minigrad.functional.linalg import linear, matmul
from minigrad.functional.reduction import sum as _sum
from minigrad.functional.shape import reshape, stack, transpose
from minigrad.functional.softmax_family import softmax
from minigrad.functional.stochastic import dropout

__all__ = ["attention_bias", "multi_head_attention", "scaled_dot_product_attention"]


def attention_bias(query_len: int, key_len: int, attn_mask=None, is_causal: bool = False,
                   key_padding_mask=None, *, like: Tensor) -> Tensor | None:
    """The additive score bias (a constant Tensor of ``like``'s dtype and device, or None) that
    every attention in minigrad applies: ``softmax(q k^T * scale + bias)``.

    One meaning for boolean masks everywhere, PyTorch's ``scaled_dot_product_attention`` one:
    in ``attn_mask`` **True means "may attend"** (the score is kept, bias 0) and False "masked"
    (bias ``-inf``). A float ``attn_mask`` is added as it is. ``attn_mask`` broadcasts to
    ``(..., query_len, key_len)``. ``is_causal`` lets query ``i`` attend keys ``j <= i``
    (top-left aligned). ``key_padding_mask`` is ``(N, key_len)`` and marks what its name says,
    padding: True means the key is padding and is masked for every query; it broadcasts as
    ``(N, 1, 1, key_len)`` over heads and queries.

    Example::

        bias = F.nn.attention_bias(4, 4, attn_mask=keep, like=scores)   # keep: bool (4, 4)
    """
    with like._device.context():  # the masks are built on like's GPU
        return _attention_bias(query_len, key_len, attn_mask, is_causal, key_padding_mask, like)


def _attention_bias(query_len, key_len, attn_mask, is_causal, key_padding_mask, like):
    op = "attention_bias"
    xp, dtype = like.xp, like.dtype
    bias = None

    def add(term):
        nonlocal bias
        bias = term if bias is None else bias + term

    if is_causal:
        add(xp.triu(xp.full((query_len, key_len), -xp.inf, dtype=dtype), k=1))
    if attn_mask is not None:
        m = attn_mask.data if isinstance(attn_mask, Tensor) else xp.asarray(attn_mask)
        if m.ndim >= 2 and (m.shape[-2] not in (1, query_len) or m.shape[-1] not in (1, key_len)):
            raise ValueError(
                f"{op}: attn_mask shape {m.shape} does not broadcast to ({query_len}, {key_len})"
            )
        add(xp.where(m, 0.0, -xp.inf).astype(dtype) if m.dtype == bool
            else m.astype(dtype, copy=False))
    if key_padding_mask is not None:
        m = (key_padding_mask.data if isinstance(key_padding_mask, Tensor)
             else xp.asarray(key_padding_mask))
        if m.ndim != 2 or m.shape[1] != key_len:
            raise ValueError(
                f"{op}: key_padding_mask must be (N, {key_len}) (True = padding), got {m.shape}"
            )
        add(xp.where(m.astype(bool), -xp.inf, 0.0).astype(dtype)[:, None, None, :])
    return None if bias is None else Tensor._wrap(bias, like.device)


def _weights(q, k, bias, scale):
    """softmax(q k^T * scale + bias) over the last axis, as recorded Tensor ops."""
    scores = matmul(q * scale, k, transpose_b=True)
    return softmax(scores if bias is None else scores + bias, -1)


def _transposed(xp, a):
    """``a`` with its last two axes swapped, as a contiguous copy: NumPy multiplies stacks of
    matrices about 2x faster when the right operand is not a transposed view (measured on the
    attention shapes: 0.17 vs 0.33 ms, the copy 0.07 ms)."""
    return xp.ascontiguousarray(xp.swapaxes(a, -1, -2))


class _Attention(Function):
    """``w = softmax(q k^T * scale + bias); out = w v``, keeping only ``w`` for backward::

        dv = w^T dout,  ds = scale * w * (dw - rowsum(dw * w)) with dw = dout v^T,
        dq = ds k,  dk = ds^T q

    The products are batched matrix products; the scaling, the mask, causality and the softmax
    are one fused kernel (``kernels.attention_softmax``), and so is ``ds``. ``causal`` masks keys
    after the query without a mask array (and skips their exponentials)."""

    def forward(self, q, k, v, bias, scale, causal):
        out, self.w = _attention_arrays(q.xp, q._data, k._data, v._data,
                                        None if bias is None else bias._data, scale, causal)
        self.q, self.k, self.v, self.bias, self.scale, self.causal = q, k, v, bias, scale, causal
        return out

    def backward(self, dy):
        q, k, v, scale = self.q, self.k, self.v, self.scale
        need = [self.needs_input_grad(i) for i in range(3)]
        if recording_backward():  # Tensor ops, so that a second-order gradient flows through
            return (*_recorded_attention_grads(q, k, v, self.bias, scale, self.causal, dy, need),
                    None, None, None)
        outs = [None] * 3
        _attention_grad_arrays(q.xp, q._data, k._data, v._data, self.w, dy._data, scale, need,
                               outs)
        return (*outs, None, None, None)


def _attention_arrays(xp, q, k, v, bias, scale, causal):
    """``(softmax(q k^T * scale + bias) v, the weights)`` on arrays (bias: an array or None)."""
    w = blas.matmul(q, _transposed(xp, k))
    if bias is not None:
        shape = np.broadcast_shapes(w.shape, bias.shape)
        if shape != w.shape:
            w = xp.ascontiguousarray(xp.broadcast_to(w, shape))
    w = kernels.attention_softmax(w, scale, bias, causal)
    return blas.matmul(w, v), w


def _attention_grad_arrays(xp, q, k, v, w, g, scale, need, outs) -> None:
    """The gradients of q, k, v (those ``need`` lists) given the output's ``g``, on arrays:
    ``outs[i]`` is None (a new array is put there) or an array the product is written into."""
    def product(i, a, b):
        if outs[i] is None:
            outs[i] = blas.matmul(a, b)
        else:
            blas.matmul(a, b, out=outs[i])

    if need[2]:
        product(2, xp.swapaxes(w, -1, -2), g)
    ds = kernels.attention_softmax_grad(w, blas.matmul(g, _transposed(xp, v)), scale)
    if need[0]:
        product(0, ds, k)
    if need[1]:
        product(1, xp.swapaxes(ds, -1, -2), q)


def _recorded_attention_grads(q, k, v, bias, scale, causal, dy, need) -> list:
    """The gradients of q, k, v (Tensors) as recorded Tensor ops (second-order gradients)."""
    if causal:  # the forward's kernel applied it without an array: add it here
        bias = attention_bias(q.shape[-2], k.shape[-2], bias, True, like=q)
    w = _weights(q, k, bias, scale)
    dw = matmul(dy, v, transpose_b=True)
    ds = w * (dw - _sum(dw * w, -1, keepdims=True))
    return [matmul(ds, k) * scale if need[0] else None,
            matmul(ds, q, transpose_a=True) * scale if need[1] else None,
            matmul(w, dy, transpose_a=True) if need[2] else None]


class _SplitHeads(Function):
    """Projections (N, T, P*E) -> P contiguous (N, H, T, E/H) head tensors, in one copy; backward
    writes their gradients back into one (N, T, P*E) array (one copy). The reshape/transpose/split
    composition cost five ops and as many copies each way, and left the attention products with
    strided operands. Backward uses Tensor ops when it is being recorded."""

    def forward(self, x, heads, parts):
        n, length, width = self.shape = x._data.shape
        self.heads, self.parts = heads, parts
        d = width // (parts * heads)
        packed = x._data.reshape(n, length, parts, heads, d).transpose(2, 0, 3, 1, 4)
        packed = x.xp.ascontiguousarray(packed)
        return tuple(packed[i] for i in range(parts))

    def backward(self, *grads):
        n, length, width = self.shape
        heads, parts = self.heads, self.parts
        if recording_backward():
            return _recorded_merge_parts(list(grads), self.shape), None, None
        d = width // (parts * heads)
        out = grads[0].xp.empty((n, length, parts, heads, d), grads[0].dtype)
        for i, g in enumerate(grads):
            out[:, :, i] = g._data.transpose(0, 2, 1, 3)
        return out.reshape(self.shape), None, None


def _recorded_merge_parts(grads: list, shape: tuple) -> Tensor:
    """P head gradients (N, H, T, E/H) back into one (N, T, P*E) gradient, as recorded Tensor
    ops (the adjoint of ``_SplitHeads``)."""
    return reshape(transpose(stack(grads, 0), (1, 3, 0, 2, 4)), shape)


class _SelfAttention(Function):
    """Causal or masked self-attention without dropout from the fused projection ``qkv``
    (N, T, 3E) to the merged heads (N, T, E): ``_SplitHeads``, ``_Attention`` and
    ``_MergeHeads`` as one node, with the same products. Being one node, its backward writes
    dq, dk and dv straight into one array laid out as ``qkv`` (no copy per part), and it pays the
    graph's bookkeeping once instead of three times (on a GPU a Transformer step is bound by such
    host-side costs). Backward uses Tensor ops when it is being recorded.

    On the CPU the heads are strided views of ``qkv`` and the gradient products write into
    strided views of their result: NumPy's batched products take such stacks (unit stride within
    a row) at nearly the speed of contiguous ones, which saves copying ``qkv`` forward and the
    three gradients backward (0.06 ms each way on the benchmark's Transformer block). A GPU keeps
    the contiguous copies (not measured there: CuPy may copy strided stacks inside each product,
    one launch each)."""

    def forward(self, qkv, heads, bias, scale, causal):
        xp, d = qkv.xp, qkv._data
        n, length, width = d.shape
        e = width // (3 * heads)
        parts = d.reshape(n, length, 3, heads, e).transpose(2, 0, 3, 1, 4)
        if xp is not np:
            parts = xp.ascontiguousarray(parts)
        out, self.w = _attention_arrays(xp, parts[0], parts[1], parts[2],
                                        None if bias is None else bias._data, scale, causal)
        self.qkv, self.parts, self.heads = qkv, parts, heads
        self.bias, self.scale, self.causal = bias, scale, causal
        return xp.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(n, length, heads * e)

    def backward(self, dy):
        qkv, heads, scale = self.qkv, self.heads, self.scale
        n, length, width = qkv.shape
        e = width // (3 * heads)
        if recording_backward():  # the three nodes' recorded backwards, composed
            q, k, v = _SplitHeads()(qkv, heads, 3)
            g = transpose(reshape(dy, (n, length, heads, e)), (0, 2, 1, 3))
            grads = _recorded_attention_grads(q, k, v, self.bias, scale, self.causal, g,
                                              [True] * 3)
            return _recorded_merge_parts(grads, qkv.shape), None, None, None, None
        xp, parts, w = qkv.xp, self.parts, self.w
        g = xp.ascontiguousarray(dy._data.reshape(n, length, heads, e).transpose(0, 2, 1, 3))
        dtype = np.result_type(w.dtype, g.dtype)
        if xp is np:  # the products write into their places in the (N, T, 3, H, E/H) result
            merged = np.empty((n, length, 3, heads, e), dtype)
            outs = [merged[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
        else:
            grads = xp.empty((3, n, heads, length, e), dtype)
            outs = [grads[0], grads[1], grads[2]]
        _attention_grad_arrays(xp, parts[0], parts[1], parts[2], w, g, scale, [True] * 3, outs)
        if xp is not np:
            merged = xp.ascontiguousarray(grads.transpose(1, 3, 0, 2, 4))
        return merged.reshape(n, length, width), None, None, None, None


class _MergeHeads(Function):
    """Head outputs (N, H, T, D) -> contiguous (N, T, H*D) in one copy, and back for the gradient.
    Backward uses Tensor ops when it is being recorded."""

    def forward(self, x):
        n, h, length, d = self.shape = x._data.shape
        return x.xp.ascontiguousarray(x._data.transpose(0, 2, 1, 3)).reshape(n, length, h * d)

    def backward(self, dy):
        n, h, length, d = self.shape
        if recording_backward():
            return transpose(reshape(dy, (n, length, h, d)), (0, 2, 1, 3))
        return dy.xp.ascontiguousarray(dy._data.reshape(n, length, h, d).transpose(0, 2, 1, 3))


def _self_attention(qkv: Tensor, heads: int, attn_mask, is_causal) -> Tensor:
    """``_SplitHeads``, ``scaled_dot_product_attention`` (no dropout) and ``_MergeHeads`` of
    ``multi_head_attention`` as one node (``_SelfAttention``), with the same checks."""
    n, length, width = qkv.shape
    e = width // (3 * heads)
    scale = 1.0 / math.sqrt(e)
    bias = None if attn_mask is None else attention_bias(length, length, attn_mask, False,
                                                         like=qkv)
    return _SelfAttention()(qkv, heads, bias, scale, bool(is_causal))


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal: bool = False,
                                 dropout_p: float = 0.0, scale: float | None = None) -> Tensor:
    """``softmax(q @ k^T * scale + mask) @ v`` over the last two axes.

    ``q`` is (..., L, E), ``k`` (..., S, E), ``v`` (..., S, Ev); leading axes broadcast. ``scale``
    defaults to ``1/sqrt(E)``. ``attn_mask`` is boolean (True = may attend, see
    :func:`attention_bias`) or float (added to the scores) and broadcasts to (..., L, S);
    ``is_causal`` lets query i attend keys ``j <= i``.
    ``dropout_p`` drops attention weights (inverted dropout) whenever it is positive.

    Example::

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, D)
    """
    op = "scaled_dot_product_attention"
    q, k, v = _f(q), _f(k), _f(v)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(
            f"{op}: q, k, v must be at least 2-D, got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{op}: incompatible shapes q {q.shape}, k {k.shape}, v {v.shape} (need "
            f"q[-1] == k[-1] and k[-2] == v[-2])"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    result_dtype = None
    if AUTOCAST.enabled:  # low-precision inputs (see minigrad.autodiff.autocast)
        (q, k, v), result_dtype = autocast_low(op, q, k, v)
        mask = attn_mask
        if isinstance(mask, Tensor) and mask.dtype.kind != "b" and mask.dtype != q.dtype:
            attn_mask = mask.astype(q.dtype)  # a float mask adds in the product's dtype
    if dropout_p > 0.0:
        bias = attention_bias(q.shape[-2], k.shape[-2], attn_mask, is_causal, like=q)
        out = matmul(dropout(_weights(q, k, bias, scale), dropout_p, training=True), v)
    else:  # without dropout the fused kernel applies causality itself: no (L, S) mask array
        bias = attention_bias(q.shape[-2], k.shape[-2], attn_mask, False, like=q)
        out = _Attention()(q, k, v, bias, scale, bool(is_causal))
    return out if result_dtype is None else out.astype(result_dtype)


def multi_head_attention(query, key, value, num_heads: int, in_proj_weight, in_proj_bias=None,
                         out_proj_weight=None, out_proj_bias=None, attn_mask=None,
                         is_causal: bool = False, dropout_p: float = 0.0,
                         training: bool = True) -> Tensor:
    """Multi-head attention on batch-first inputs (the functional core of a MultiHeadAttention).

    ``query`` is (N, L, E), ``key``/``value`` (N, S, E). ``in_proj_weight`` (3E, E) stacks the
    query, key and value projections (``linear`` layout: out x in) and ``in_proj_bias`` is (3E,);
    ``out_proj_weight`` (E, E) and ``out_proj_bias`` (E,) project the concatenated heads back (no
    output projection when ``out_proj_weight`` is None). Each of the ``num_heads`` heads attends
    with ``scaled_dot_product_attention`` on ``E // num_heads`` features; ``attn_mask`` and
    ``is_causal`` are passed through, and ``dropout_p`` applies only when ``training``.
    Returns (N, L, E).

    Example::

        y = F.multi_head_attention(x, x, x, 4, w_in, b_in, w_out, b_out, is_causal=True)
    """
    op = "multi_head_attention"
    query, in_proj_weight = _f(query), _f(in_proj_weight)
    if query.ndim != 3:
        raise ValueError(f"{op}: query must be (N, L, E), got shape {query.shape}")
    n, length, e = query.shape
    if num_heads < 1 or e % num_heads:
        raise ValueError(f"{op}: num_heads={num_heads} must divide the embedding size {e}")
    if tuple(in_proj_weight.shape) != (3 * e, e):
        raise ValueError(
            f"{op}: in_proj_weight has shape {in_proj_weight.shape}, expected {(3 * e, e)}"
        )
    if query is key and key is value:  # self-attention: one fused projection
        qkv = linear(query, in_proj_weight, in_proj_bias)
        if not (dropout_p and training) and not AUTOCAST.enabled and not dispatches((qkv,)):
            out = _self_attention(qkv, num_heads, attn_mask, is_causal)
            return out if out_proj_weight is None else linear(out, out_proj_weight,
                                                              out_proj_bias)
        q, k, v = _SplitHeads()(qkv, num_heads, 3)
    else:
        key, value = _f(key), _f(value)
        if key.ndim != 3 or key.shape[0] != n or key.shape[2] != e or value.shape != key.shape:
            raise ValueError(
                f"{op}: key {key.shape} and value {value.shape} must both be (N={n}, S, E={e})"
            )
        b = [None] * 3 if in_proj_bias is None else [in_proj_bias[i * e : (i + 1) * e]
                                                     for i in range(3)]
        w = [in_proj_weight[i * e : (i + 1) * e] for i in range(3)]
        q, k, v = (_SplitHeads()(linear(x, w[i], b[i]), num_heads, 1)[0]
                   for i, x in enumerate((query, key, value)))
    out = scaled_dot_product_attention(q, k, v, attn_mask, is_causal,
                                       dropout_p if training else 0.0)
    out = _MergeHeads()(out)
    if out_proj_weight is not None:
        out = linear(out, out_proj_weight, out_proj_bias)
    return out
