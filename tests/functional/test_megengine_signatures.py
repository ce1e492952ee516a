"""Every op MegEngine also has takes MegEngine's parameter names, in MegEngine's order, so that
MegEngine code calling them by keyword (``F.sum(inp=x, axis=1)``) runs unchanged.

The table is MegEngine's public functional API (megengine.functional and .nn, version 1.13) for the
ops minigrad implements; minigrad may add parameters after these. ``multi_head_attention`` is
left out on purpose: minigrad's is PyTorch's functional form (a different argument list).
"""

import inspect

import numpy as np
import pytest

import minigrad as mg
import minigrad.functional as F

MEGENGINE = {
    "abs": ("x",), "add": ("x", "y"), "sub": ("x", "y"), "mul": ("x", "y"), "div": ("x", "y"),
    "floor_div": ("x", "y"), "mod": ("x", "y"), "pow": ("x", "y"), "neg": ("x",),
    "maximum": ("x", "y"), "minimum": ("x", "y"), "clip": ("x", "lower", "upper"),
    "where": ("mask", "x", "y"), "exp": ("x",), "expm1": ("x",), "log": ("x",),
    "log1p": ("x",), "sqrt": ("x",), "square": ("x",), "erf": ("x",), "sin": ("x",),
    "cos": ("x",), "tan": ("x",), "tanh": ("x",), "round": ("x",), "ceil": ("x",),
    "floor": ("x",), "sign": ("x",), "isnan": ("inp",), "isinf": ("inp",),
    "equal": ("x", "y"), "not_equal": ("x", "y"), "less": ("x", "y"),
    "less_equal": ("x", "y"), "greater": ("x", "y"), "greater_equal": ("x", "y"),
    "logical_and": ("x", "y"), "logical_or": ("x", "y"), "logical_xor": ("x", "y"),
    "logical_not": ("x",),
    "sum": ("inp", "axis", "keepdims"), "prod": ("inp", "axis", "keepdims"),
    "mean": ("inp", "axis", "keepdims"), "var": ("inp", "axis", "keepdims"),
    "std": ("inp", "axis", "keepdims"), "max": ("inp", "axis", "keepdims"),
    "min": ("inp", "axis", "keepdims"), "argmax": ("inp", "axis", "keepdims"),
    "argmin": ("inp", "axis", "keepdims"), "norm": ("inp", "ord", "axis", "keepdims"),
    "logsumexp": ("inp", "axis", "keepdims"), "argsort": ("inp", "descending"),
    "sort": ("inp", "descending", "dim"),
    "topk": ("inp", "k", "descending", "kth_only", "no_sort"), "cumsum": ("inp", "axis"),
    "matmul": ("inp1", "inp2", "transpose_a", "transpose_b", "compute_mode"),
    "dot": ("inp1", "inp2"), "einsum": ("equation", "*args"),
    "arange": ("start", "stop", "step", "dtype", "device"),
    "linspace": ("start", "stop", "num", "dtype", "device"), "eye": ("N", "M", "dtype", "device"),
    "full": ("shape", "value", "dtype", "device"), "ones": ("shape", "dtype", "device"),
    "zeros": ("shape", "dtype", "device"), "zeros_like": ("inp",), "ones_like": ("inp",),
    "full_like": ("inp", "value"), "broadcast_to": ("inp", "shape"),
    "concat": ("inps", "axis", "device"), "stack": ("inps", "axis", "device"),
    "split": ("inp", "nsplits_or_sections", "axis"), "gather": ("inp", "axis", "index"),
    "scatter": ("inp", "axis", "index", "source"), "transpose": ("inp", "pattern"),
    "swapaxes": ("inp", "axis1", "axis2"), "reshape": ("inp", "target_shape"),
    "flatten": ("inp", "start_axis", "end_axis"), "expand_dims": ("inp", "axis"),
    "squeeze": ("inp", "axis"), "repeat": ("inp", "repeats", "axis"), "tile": ("inp", "reps"),
    "copy": ("inp", "device"), "pad": ("src", "pad_width", "mode", "constant_value"),
    "indexing_one_hot": ("src", "index", "axis", "keepdims"),
    "linear": ("inp", "weight", "bias", "compute_mode"),
    "conv1d": ("inp", "weight", "bias", "stride", "padding", "dilation", "groups", "conv_mode",
               "compute_mode"),
    "conv2d": ("inp", "weight", "bias", "stride", "padding", "dilation", "groups", "conv_mode",
               "compute_mode"),
    "conv_transpose2d": ("inp", "weight", "bias", "stride", "padding", "output_padding",
                         "dilation", "groups", "conv_mode", "compute_mode"),
    "max_pool2d": ("inp", "kernel_size", "stride", "padding"),
    "avg_pool2d": ("inp", "kernel_size", "stride", "padding", "mode"),
    "adaptive_avg_pool2d": ("inp", "oshp"), "relu": ("x",), "relu6": ("x",),
    "sigmoid": ("x",), "hsigmoid": ("x",), "hswish": ("x",), "silu": ("x",), "gelu": ("x",),
    "leaky_relu": ("inp", "negative_slope"), "softplus": ("inp",), "softmax": ("inp", "axis"),
    "logsoftmax": ("inp", "axis"), "dropout": ("inp", "drop_prob", "training"),
    "one_hot": ("inp", "num_classes"),
    "embedding": ("inp", "weight", "padding_idx", "max_norm", "norm_type"),
    "batch_norm": ("inp", "running_mean", "running_var", "weight", "bias", "training",
                   "momentum", "eps", "inplace"),
    "layer_norm": ("inp", "normalized_shape", "affine", "weight", "bias", "eps"),
    "group_norm": ("inp", "num_groups", "affine", "weight", "bias", "eps"),
    "cross_entropy": ("pred", "label", "axis", "with_logits", "label_smooth", "reduction"),
    "binary_cross_entropy": ("pred", "label", "with_logits", "reduction"),
    "l1_loss": ("pred", "label", "reduction"), "square_loss": ("pred", "label", "reduction"),
    "topk_accuracy": ("logits", "target", "topk"),
}


def _names(fn) -> list[str]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append("*" + p.name if p.kind is p.VAR_POSITIONAL else p.name)
    return out


@pytest.mark.parametrize("name", sorted(MEGENGINE))
def test_parameter_names_and_order_are_megengine_s(name):
    expected = list(MEGENGINE[name])
    for fn in {getattr(F, name), getattr(F.nn, name, getattr(F, name))}:
        assert _names(fn)[: len(expected)] == expected, f"F.{name}{inspect.signature(fn)}"


def test_megengine_keyword_calls_run():
    x = mg.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert F.reshape(inp=x, target_shape=(3, 2)).shape == (3, 2)
    assert F.transpose(inp=x, pattern=(1, 0)).shape == (3, 2)
    assert F.sum(inp=x, axis=1, keepdims=True).numpy().tolist() == [[3.0], [12.0]]
    assert F.concat(inps=[x, x], axis=0).shape == (4, 3)
    assert F.pad(src=x, pad_width=((0, 0), (1, 1))).shape == (2, 5)
    assert F.matmul(inp1=x, inp2=x, transpose_b=True).shape == (2, 2)
    assert F.eye(N=2, M=3).shape == (2, 3)
    assert F.einsum("ij->ji", x).shape == (3, 2)
    assert F.isnan(inp=x).dtype == np.bool_
    values, idx = F.sort(inp=mg.tensor([[3.0, 1.0], [0.0, 2.0]]), dim=0)
    assert values.numpy().tolist() == [[0.0, 1.0], [3.0, 2.0]]
    assert idx.numpy().tolist() == [[1, 0], [0, 1]]
    assert F.concat([x], device="cpu0").device == "cpu0"


def test_sort_along_dim_matches_numpy_and_is_differentiable(rng, default_device):
    from minigrad.testing import check_grad

    a = rng.standard_normal((4, 3, 2))
    values, idx = F.sort(mg.tensor(a), descending=True, dim=1)
    np.testing.assert_array_equal(values.numpy(), -np.sort(-a, axis=1))
    np.testing.assert_array_equal(idx.numpy(), np.argsort(-a, axis=1, kind="stable"))
    check_grad(lambda t: F.sort(t, dim=0)[0], a)
