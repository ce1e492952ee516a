"""``deepspeed.runtime``: DeepSpeed's module path of its learning-rate schedulers, so that
``from deepspeed.runtime.lr_schedules import WarmupLR`` works with only the import changed.

Example::

    from minigrad.distributed.deepspeed.runtime.lr_schedules import WarmupLR
    sched = WarmupLR(opt, warmup_max_lr=1e-3, warmup_num_steps=100)
"""

from minigrad.distributed.deepspeed.runtime import lr_schedules

__all__ = ["lr_schedules"]
