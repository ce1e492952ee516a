"""``deepspeed.utils``: ``RepeatingLoader`` (minigrad's, from :mod:`minigrad.distributed.pipeline`)
and ``logger``, the rank-aware logger DeepSpeed programs log through.

Example::

    from minigrad.distributed.deepspeed.utils import RepeatingLoader
    data = iter(RepeatingLoader(loader))
"""

from minigrad.distributed.pipeline.loader import RepeatingLoader
from minigrad.distributed.runtime.log import get_logger

#: DeepSpeed's ``deepspeed.utils.logger``
logger = get_logger("deepspeed")

__all__ = ["RepeatingLoader", "logger"]
