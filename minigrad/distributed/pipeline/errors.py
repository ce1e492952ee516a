"""``PipelineError``: the error of every misuse or failed step of a pipeline."""

from __future__ import annotations

__all__ = ["PipelineError"]


class PipelineError(RuntimeError):
    """A pipeline is used the wrong way (a stage run outside its engine's steps, ``train_batch``
    under ``no_grad``), or a pipelined step failed on some rank (the message names it)."""
