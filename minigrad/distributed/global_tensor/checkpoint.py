"""The distributed side of ``mg.save(global_dst_rank=)`` and ``mg.load(global_src_rank=)``.

``minigrad.serialization`` (a lower layer) asks for three things through the object installed
here (``minigrad.seams.GLOBAL_IO``): this process's rank, a global tensor's logical value
gathered to one rank (boxing to a one-rank placement with ``broadcast``), and one rank's bytes on
every rank (a broadcast over all ranks).
"""

from __future__ import annotations

import numpy as np

from minigrad.autodiff import no_grad
from minigrad.backend.xp import to_numpy
from minigrad.distributed.comm import arrays as comm
from minigrad.distributed.comm.group import WORLD, get_rank, get_world_size
from minigrad.distributed.global_tensor.placement import Placement
from minigrad.distributed.global_tensor.sbp import broadcast

__all__ = ["GlobalIO"]


class GlobalIO:
    """What ``save``/``load`` need from the distributed runtime (see the module docstring)."""

    def rank(self) -> int:
        """This process's global rank."""
        return get_rank()

    def gather(self, tensor, dst: int):
        """``tensor``'s logical value as a NumPy array on rank ``dst`` (None elsewhere); every
        rank calls it."""
        one = Placement(tensor.placement.type, [int(dst)])
        with no_grad():
            whole = tensor.detach().to_global(one, broadcast)
        return whole.numpy() if get_rank() == dst else None

    def share(self, payload: bytes | None, src: int) -> bytes:
        """Rank ``src``'s ``payload`` on every rank."""
        if get_world_size() == 1:
            return payload
        data = np.frombuffer(payload, dtype=np.uint8).copy() if get_rank() == src else None
        out = comm.broadcast(data, src, WORLD)
        return np.asarray(to_numpy(out), dtype=np.uint8).tobytes()
