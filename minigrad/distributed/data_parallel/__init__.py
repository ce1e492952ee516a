"""Data parallelism: every rank computes on a slice of the batch.

:mod:`.helper` (MegEngine's ``dist.helper``: ``bcast_list_``, the bucketed, overlapped gradient
all-reduce callback), :mod:`.ddp` (PyTorch's ``DistributedDataParallel`` on top of it),
:mod:`.sync_batch_norm` (batch statistics over the data-parallel group), and the sharded forms,
where a rank holds only its share of the model state: :mod:`.zero` (``ZeroRedundancyOptimizer``,
ZeRO-1), :mod:`.fully_shard` (``fully_shard``, ZeRO-2/3; its
:mod:`.mixed_precision` policy) and :mod:`.zero_memory`
(``estimate_zero_memory``).
"""
