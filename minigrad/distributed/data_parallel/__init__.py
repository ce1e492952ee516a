"""Data parallelism: every rank holds the whole model and a slice of the batch.

:mod:`.helper` (MegEngine's ``dist.helper``: ``bcast_list_``, the bucketed, overlapped gradient
all-reduce callback), :mod:`.ddp` (PyTorch's ``DistributedDataParallel`` on top of it) and
:mod:`.sync_batch_norm` (batch statistics over the data-parallel group).
"""
