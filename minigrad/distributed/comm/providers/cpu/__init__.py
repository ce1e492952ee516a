"""The ``"cpu"`` backend: collectives and messages on NumPy arrays, over shared memory or TCP.

One job per module: :mod:`.transport` (the exchange primitive and the rule that picks a transport),
:mod:`.shm` (shared-memory transport and ring), :mod:`.tcp` (TCP mesh), :mod:`.p2p` (per-pair
message channels), :mod:`.algorithms` (the collectives, written once on the exchange).
"""

from minigrad.distributed.comm.providers.cpu.algorithms import CpuBackend
from minigrad.distributed.comm.providers.cpu.shm import remove_job_segments
from minigrad.distributed.comm.providers.cpu.transport import choose_transport

__all__ = ["CpuBackend", "choose_transport", "remove_job_segments"]
