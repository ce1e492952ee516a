"""The communication core: process groups, the collectives on them, and what moves the bytes.

Bottom up: :mod:`.providers` (the collective backends, one interface: ``cpu`` over shared memory or
TCP, ``mpi``, ``nccl``), :mod:`.group` (process groups and the rule that routes an array to a
provider), :mod:`.flat_buffer` (many arrays in one buffer for one collective), :mod:`.recorder`
(the flight recorder and the comm log), :mod:`.arrays` (array-level collectives and messages: the
one implementation every API calls), then the two user-facing spellings on tensors:
:mod:`.collectives` (PyTorch's and OneFlow's, in place) and :mod:`.functional` (MegEngine's,
differentiable).

``minigrad.distributed.comm`` is also the array-level API itself (the names of :mod:`.arrays`),
as it was before these folders existed::

    from minigrad.distributed import comm
    comm.all_reduce(np.ones(3))
"""

from minigrad.distributed.comm import arrays
from minigrad.distributed.comm.arrays import *  # noqa: F403  (the array-level API)

__all__ = list(arrays.__all__)
