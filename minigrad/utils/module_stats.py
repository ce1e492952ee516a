"""``module_stats``: how big a model is and where its work goes, layer by layer (MegEngine's
``megengine.utils.module_stats``, same name, arguments and return values).

One forward pass on the given inputs (or zeros of ``input_shapes``) runs with a forward hook on
every leaf layer and every layer that has a FLOP rule. Each hook records the layer's input and
output shapes, its FLOPs and its output's size; parameters are counted once each, under the name
of the layer that owns them. The model is put in eval mode for the pass and back afterwards, and
nothing is recorded for autodiff.

FLOPs are multiply-adds, counted as MegEngine counts them, so numbers compare across the two:

================================== =====================================================
layer                              FLOPs
================================== =====================================================
``Linear``                         ``prod(out.shape) * in_features`` (+ ``out_features``
                                   with a bias: MegEngine counts the bias once, not per row)
``Conv1d/2d/3d``                   ``prod(out.shape) * (in_channels / groups * prod(kernel)
                                   + bias)``
``ConvTranspose2d``                ``prod(in.shape) * out_channels / groups * prod(kernel)
                                   + prod(out.shape) * bias``
BatchNorm, SyncBatchNorm,          ``7 * prod(in.shape)``
LayerNorm, GroupNorm, InstanceNorm
``MaxPool2d``, ``AvgPool2d``       ``prod(out.shape) * kh * kw``
``AdaptiveAvgPool2d``              ``prod(out.shape) * ceil(H / oh) * ceil(W / ow)`` (MegEngine's
                                   formula reduces to ``prod(out.shape)``: a window of 1)
``DotProductAttention``            ``2 * N * heads * L * S * head_dim`` (scores, then weights x V)
``MultiHeadAttention``             its q/k/v projections as Linear layers, plus the core above
                                   (the output projection is its ``out_proj`` Linear, counted
                                   there)
everything else (activations,      0 (as in MegEngine: elementwise work is not counted)
dropout, embedding lookup, ...)
================================== =====================================================

Example::

    from minigrad.utils.module_stats import module_stats
    total, details = module_stats(net, inputs=(x,))
    total.param_dims, total.flops          # 61706, 429342 for LeNet-5 on one 1x28x28 image
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Callable

import numpy as np

import minigrad.module as M
from minigrad.autodiff import no_grad
from minigrad.autodiff.tensor import Tensor

total_stats = namedtuple("total_stats", ["param_size", "param_dims", "flops", "act_size",
                                         "act_dims"])
stats_details = namedtuple("module_stats", ["params", "flops", "activations"])


def _linear(module: M.Linear, inputs, output) -> float:
    return math.prod(output.shape) * module.in_features + (
        module.out_features if module.bias is not None else 0)


def _conv(module, inputs, output) -> float:
    bias = 1 if module.bias is not None else 0
    if isinstance(module, M.ConvTranspose2d):
        return (math.prod(inputs[0].shape) * module.out_channels // module.groups
                * math.prod(module.kernel_size) + math.prod(output.shape) * bias)
    per_output = module.in_channels // module.groups * math.prod(module.kernel_size) + bias
    return math.prod(output.shape) * per_output


def _norm(module, inputs, output) -> float:
    return 7 * math.prod(inputs[0].shape)


def _pool(module, inputs, output) -> float:
    k = module.kernel_size
    kh, kw = (k, k) if isinstance(k, int) else k
    return math.prod(output.shape) * kh * kw


def _adaptive_pool(module, inputs, output) -> float:
    (h, w), (oh, ow) = inputs[0].shape[-2:], output.shape[-2:]
    return math.prod(output.shape) * math.ceil(h / oh) * math.ceil(w / ow)


def _attention_core(q_shape, k_shape) -> float:
    """Scores (``q k^T``) and their weighted sum of values: two batched matmuls."""
    *lead, length, head_dim = q_shape
    return 2 * math.prod(lead) * length * k_shape[-2] * head_dim


def _dot_product_attention(module, inputs, output) -> float:
    return _attention_core(inputs[0].shape, inputs[1].shape)


def _multi_head_attention(module: M.MultiHeadAttention, inputs, output) -> float:
    query = inputs[0]
    key = inputs[1] if len(inputs) > 1 and inputs[1] is not None else query
    value = inputs[2] if len(inputs) > 2 and inputs[2] is not None else key
    e, h = module.embed_dim, module.num_heads
    bias = e if module.in_proj_bias is not None else 0
    projections = sum(math.prod(t.shape) * e + bias for t in (query, key, value))
    seq = 1 if module.batch_first else 0
    batch = query.shape[1 - seq]
    q_shape = (batch, h, query.shape[seq], e // h)
    k_shape = (batch, h, key.shape[seq], e // h)
    return projections + _attention_core(q_shape, k_shape)


FLOP_RULES: dict[type, Callable] = {
    M.Linear: _linear,
    M.Conv1d: _conv, M.Conv2d: _conv, M.Conv3d: _conv, M.ConvTranspose2d: _conv,
    M.BatchNormBase: _norm, M.LayerNorm: _norm, M.GroupNorm: _norm,
    M.MaxPool2d: _pool, M.AvgPool2d: _pool, M.AdaptiveAvgPool2d: _adaptive_pool,
    M.DotProductAttention: _dot_product_attention,
    M.MultiHeadAttention: _multi_head_attention,
}


def register_flops(*module_types: type):
    """Decorator: ``fn(module, inputs, output) -> FLOPs`` counts the layers of these types (your
    own layers, or a different count for minigrad's)."""
    def register(fn):
        for t in module_types:
            FLOP_RULES[t] = fn
        return fn
    return register


def _flop_rule(module) -> Callable | None:
    for cls in type(module).__mro__:
        if cls in FLOP_RULES:
            return FLOP_RULES[cls]
    return None


def _dtype_bits(dtype) -> int:
    return np.dtype(dtype).itemsize * 8


def sizeof_fmt(num: float, suffix: str = "B") -> str:
    """``1536 -> '1.500 KiB'`` (bytes, powers of 1024) or, with another suffix, powers of 1000."""
    scale, units = (1024.0, ["", "Ki", "Mi", "Gi", "Ti"]) if suffix == "B" else (
        1000.0, ["", "K", "M", "G", "T"])
    for unit in units:
        if abs(num) < scale or unit == units[-1]:
            return f"{num:.3f} {unit}{suffix}"
        num /= scale
    return f"{num:.3f} {suffix}"


def _table(title: str, rows: list[dict], columns: list[str]) -> str:
    cells = [columns] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    line = "  ".join("-" * w for w in widths)
    body = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join([title, line, body[0], line, *body[1:], line])


def _as_tensor(x):
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_as_tensor(v) for v in x)
    if isinstance(x, dict):
        return {k: _as_tensor(v) for k, v in x.items()}
    return Tensor(np.asarray(x, dtype=np.float32 if np.asarray(x).dtype == np.float64 else None))


def module_stats(model: M.Module, inputs=None, input_shapes=None, cal_params: bool = True,
                 cal_flops: bool = True, cal_activations: bool = True,
                 logging_to_stdout: bool = True, bar_length_max: int = 20):
    """Parameters, FLOPs and activation sizes of ``model``, per layer and in total.

    ``inputs``: the model's positional inputs (a tensor/array or a tuple of them), or
    ``input_shapes``: shapes of float32 zero inputs. Returns ``(total_stats(param_size,
    param_dims, flops, act_size, act_dims), module_stats(params, flops, activations))``: sizes in
    bytes, dims in elements, FLOPs in multiply-adds; the details are lists of one dict per
    parameter / counted layer / layer output (numbers, not formatted strings). With
    ``logging_to_stdout`` the three tables and a summary are printed.
    """
    if inputs is None:
        if not input_shapes:
            raise ValueError("module_stats: give inputs= (the model's inputs) or input_shapes=")
        shapes = [input_shapes] if isinstance(input_shapes[0], int) else input_shapes
        inputs = tuple(Tensor(np.zeros(s, np.float32)) for s in shapes)
    elif not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    inputs = tuple(_as_tensor(x) for x in inputs)

    flops, activations, hooks = [], [], []

    def record(name: str):
        def hook(module, args, output):
            out = output[0] if isinstance(output, (tuple, list)) else output
            class_name = type(module).__name__
            rule = _flop_rule(module)
            if cal_flops and rule is not None:
                flops.append(dict(
                    name=name, class_name=class_name,
                    input_shapes=[tuple(a.shape) for a in args if isinstance(a, Tensor)],
                    output_shapes=[tuple(out.shape)], flops_num=int(rule(module, args, out))))
            if cal_activations and isinstance(out, Tensor) and not any(module.children()):
                dims = math.prod(out.shape)
                bits = _dtype_bits(out.dtype)
                activations.append(dict(name=name, class_name=class_name, dtype=out.dtype,
                                        shape=tuple(out.shape), act_dim=dims, nbits=bits,
                                        size=dims * bits // 8))
        return hook

    for name, module in model.named_modules():
        if _flop_rule(module) is not None or not any(module.children()):
            hooks.append(module.register_forward_hook(record(name or type(module).__name__)))
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            model(*inputs)
    finally:
        model.train(was_training)
        for handle in hooks:
            handle.remove()

    params = []
    if cal_params:
        for name, p in model.named_parameters():
            dims, bits = p.size, _dtype_bits(p.dtype)
            params.append(dict(name=name, dtype=p.dtype, shape=tuple(p.shape), param_dim=dims,
                               nbits=bits, size=dims * bits // 8))
    total = total_stats(
        param_size=sum(d["size"] for d in params), param_dims=sum(d["param_dim"] for d in params),
        flops=sum(d["flops_num"] for d in flops),
        act_size=sum(d["size"] for d in activations),
        act_dims=sum(d["act_dim"] for d in activations))
    if logging_to_stdout:
        print(_report(total, params, flops, activations, bar_length_max))
    return total, stats_details(params=params, flops=flops, activations=activations)


def _with_shares(rows: list[dict], key: str, total: float, bar_length_max: int) -> list[dict]:
    peak = max((r[key] for r in rows), default=0) or 1
    return [dict(r, percentage=f"{100 * r[key] / (total or 1):.2f}%",
                 bar="#" * int(r[key] / peak * bar_length_max)) for r in rows]


def _report(total, params, flops, activations, bar_length_max: int) -> str:
    parts = []
    if params:
        rows = [dict(r, size=sizeof_fmt(r["size"])) for r in
                _with_shares(params, "size", total.param_size, bar_length_max)]
        parts.append(_table("param stats:", rows, ["name", "dtype", "shape", "param_dim",
                                                   "nbits", "size", "percentage", "bar"]))
    if flops:
        rows = [dict(r, flops=sizeof_fmt(r["flops_num"], "OPs")) for r in
                _with_shares(flops, "flops_num", total.flops, bar_length_max)]
        parts.append(_table("flops stats:", rows, ["name", "class_name", "input_shapes",
                                                   "output_shapes", "flops", "percentage",
                                                   "bar"]))
    if activations:
        rows = [dict(r, size=sizeof_fmt(r["size"])) for r in
                _with_shares(activations, "size", total.act_size, bar_length_max)]
        parts.append(_table("activations stats:", rows, ["name", "class_name", "dtype", "shape",
                                                         "act_dim", "size", "percentage",
                                                         "bar"]))
    summary = [dict(item="#params", value=len(params)),
               dict(item="total_param_dims", value=sizeof_fmt(total.param_dims, "")),
               dict(item="total_param_size", value=sizeof_fmt(total.param_size)),
               dict(item="total_flops", value=sizeof_fmt(total.flops, "OPs")),
               dict(item="total_act_dims", value=sizeof_fmt(total.act_dims, "")),
               dict(item="total_act_size", value=sizeof_fmt(total.act_size))]
    if total.param_size:
        summary.append(dict(item="flops/param_size",
                            value=f"{total.flops / total.param_size:.3f}"))
    parts.append(_table("summary:", summary, ["item", "value"]))
    return "\n\n".join(parts)
