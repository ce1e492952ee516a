"""``minigrad.optimizer``: optimizers, gradient clipping and learning-rate schedulers."""

from minigrad.optimizer import lr_scheduler
from minigrad.optimizer.adadelta import Adadelta
from minigrad.optimizer.adagrad import Adagrad
from minigrad.optimizer.adam import Adam, AdamW
from minigrad.optimizer.clip_grad import clip_grad_norm, clip_grad_value
from minigrad.optimizer.lamb import LAMB
from minigrad.optimizer.lr_scheduler import (
    CosineAnnealingLR,
    LinearWarmup,
    LRScheduler,
    MultiStepLR,
    StepLR,
)
from minigrad.optimizer.optimizer import Optimizer
from minigrad.optimizer.sgd import SGD

__all__ = [
    "LAMB",
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "CosineAnnealingLR",
    "LRScheduler",
    "LinearWarmup",
    "MultiStepLR",
    "Optimizer",
    "StepLR",
    "clip_grad_norm",
    "clip_grad_value",
    "lr_scheduler",
]
