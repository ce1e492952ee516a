"""``MixedPrecisionPolicy``: the dtypes ``fully_shard`` computes and reduces in (FSDP2's name).

With sharded data parallelism the sharded parameters are the float32 *master weights*: the
optimizer updates them in float32 and keeps float32 state. A policy only changes what happens
around each wrapped forward and backward:

* ``param_dtype``: each rank's shard is cast to it before the all-gather, so the gathered full
  parameters (and the bytes on the wire) are in ``param_dtype`` and the module computes in it;
* ``reduce_dtype``: the full gradients (which come back in ``param_dtype``) are cast to it for
  the reduce-scatter; the shard's gradient is then cast to the shard's dtype (float32) for the
  optimizer. **Default: the shard's dtype** (float32): reducing in low precision is opt-in, as for
  ``make_allreduce_cb(reduce_dtype=...)``. PyTorch's default is ``param_dtype``; pass
  ``reduce_dtype=param_dtype`` to get it;
* ``output_dtype``: the module's floating outputs are cast to it (None: left as computed);
* ``cast_forward_inputs``: the module's floating positional inputs are cast to ``param_dtype``.

Gradients accumulated under ``dist.no_sync`` are kept in ``reduce_dtype``.

Example::

    policy = dist.MixedPrecisionPolicy(param_dtype="float16")
    for block in net.blocks:
        dist.fully_shard(block, mp_policy=policy)
    dist.fully_shard(net, mp_policy=policy)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from minigrad.backend.dtypes import as_float_dtype, is_floating
from minigrad.distributed.comm.arrays import DTYPES


@dataclasses.dataclass(frozen=True)
class MixedPrecisionPolicy:
    """What ``fully_shard(module, mp_policy=...)`` computes and reduces in (see the module
    docstring): ``param_dtype`` (None: the parameters' own), ``reduce_dtype`` (None: the
    parameters' own, float32 for float32 master weights), ``output_dtype`` (None: unchanged),
    ``cast_forward_inputs``. Dtypes may be names (``"float16"``, ``"bfloat16"``) or dtypes.

    Example::

        dist.fully_shard(net, mp_policy=dist.MixedPrecisionPolicy(param_dtype="bfloat16"))
    """

    param_dtype: Any = None
    reduce_dtype: Any = None
    output_dtype: Any = None
    cast_forward_inputs: bool = True

    def __post_init__(self):
        for field in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(
                    self, field, as_float_dtype(value, f"MixedPrecisionPolicy: {field}"))
        check_reducible(self.reduce_dtype, "MixedPrecisionPolicy: reduce_dtype")

    def compute_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype parameters of ``dtype`` are gathered and computed in."""
        if self.param_dtype is None or not is_floating(dtype):
            return dtype
        return self.param_dtype

    def gradient_reduce_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype the gradients of parameters of ``dtype`` are reduce-scattered in."""
        if self.reduce_dtype is None or not is_floating(dtype):
            return dtype
        return self.reduce_dtype

    def __repr__(self) -> str:
        def name(d):
            return None if d is None else d.name

        return (f"MixedPrecisionPolicy(param_dtype={name(self.param_dtype)}, reduce_dtype="
                f"{name(self.reduce_dtype)}, output_dtype={name(self.output_dtype)}, "
                f"cast_forward_inputs={self.cast_forward_inputs})")


def check_reducible(dtype, where: str) -> None:
    """Refuse a reduce dtype the collective backends cannot sum (bfloat16: they carry float16,
    float32 and float64), naming ``where``; None passes."""
    if dtype is not None and dtype.name not in DTYPES:
        raise ValueError(
            f"{where}: the collectives cannot reduce {dtype.name} (they reduce "
            f"{', '.join(d for d in DTYPES if d.startswith('float'))}); use float16, or None "
            "(float32)")


#: no policy: every dtype as the parameters have it
FULL_PRECISION = MixedPrecisionPolicy()
