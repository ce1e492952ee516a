"""``M.Elemwise``: an elementwise op as a layer, named by MegEngine's mode string.

MegEngine models (and its quantisation-ready code) write
``self.add_relu = M.Elemwise("FUSE_ADD_RELU")`` and call ``self.add_relu(a, b)``; the mode names
are MegEngine's ``Elemwise.Mode`` names (any case).
Fused modes are plain compositions here (``FUSE_ADD_RELU`` is ``relu(a + b)``).
"""

from __future__ import annotations

import minigrad.functional as F
from minigrad.module.module import Module

_MODES = {
    # unary
    "RELU": F.relu, "ABS": F.abs, "ACOS": F.acos, "ASIN": F.asin, "CEIL": F.ceil, "COS": F.cos,
    "EXP": F.exp, "EXPM1": F.expm1, "FLOOR": F.floor, "LOG": F.log, "LOG1P": F.log1p,
    "NEGATE": F.neg, "SIGMOID": F.sigmoid, "SIN": F.sin, "TANH": F.tanh, "FAST_TANH": F.tanh,
    "ROUND": F.round, "ERF": F.erf, "H_SWISH": F.hswish, "NOT": F.logical_not, "SILU": F.silu,
    "GELU": F.gelu, "ISNAN": F.isnan, "ISINF": F.isinf, "SINH": F.sinh, "COSH": F.cosh,
    "ASINH": F.asinh, "ACOSH": F.acosh, "ATANH": F.atanh, "TAN": F.tan, "SOFTPLUS": F.softplus,
    "RELU6": F.relu6, "HSIGMOID": F.hsigmoid, "LOGSIGMOID": F.logsigmoid, "SQRT": F.sqrt,
    "SQUARE": F.square, "SIGN": F.sign,
    # binary
    "ADD": F.add, "SUB": F.sub, "MUL": F.mul, "TRUE_DIV": F.div, "FLOOR_DIV": F.floor_div,
    "MOD": F.mod, "POW": F.pow, "MAX": F.maximum, "MIN": F.minimum, "LT": F.less,
    "LEQ": F.less_equal, "EQ": F.equal, "NEQ": F.not_equal, "AND": F.logical_and,
    "OR": F.logical_or, "XOR": F.logical_xor, "SHL": F.left_shift, "SHR": F.right_shift,
    "ATAN2": F.atan2, "LOG_SUM_EXP": F.logaddexp,
    "PRELU": lambda x, w: F.where(x > 0, x, x * w),
    "FUSE_ADD_RELU": lambda x, y: F.relu(x + y),
    "FUSE_ADD_SIGMOID": lambda x, y: F.sigmoid(x + y),
    "FUSE_ADD_TANH": lambda x, y: F.tanh(x + y),
    "FUSE_ADD_H_SWISH": lambda x, y: F.hswish(x + y),
    # ternary and more
    "CLIP": F.clip,
    "FUSE_MUL_ADD3": lambda x, y, z: x * y + z,
    "FUSE_MUL_ADD4": lambda a, b, c, d: a * b + c * d,
    "COND_LEQ_MOV": lambda x, y, z: F.where(x <= y, z, 0),
    "COND_LT_MOV": lambda x, y, z: F.where(x < y, z, 0),
}


class Elemwise(Module):
    """Apply the elementwise op ``method`` (a MegEngine ``Elemwise.Mode`` name such as ``"ADD"``,
    ``"FUSE_ADD_RELU"`` or ``"fuse_mul_add3"``) to the call's arguments.

    Example::

        add_relu = M.Elemwise("FUSE_ADD_RELU")
        add_relu(a, b)  # == F.relu(a + b)
    """

    def __init__(self, method: str, **kwargs):
        super().__init__(**kwargs)
        key = str(method).upper()
        if key not in _MODES:
            raise ValueError(
                f"Elemwise: unknown method {method!r}; supported: {', '.join(sorted(_MODES))}"
            )
        self.method = method
        self._op = _MODES[key]

    def forward(self, *inps):
        return self._op(*inps)

    def extra_repr(self) -> str:
        return f"method={self.method!r}"
