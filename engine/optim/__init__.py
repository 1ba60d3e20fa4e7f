"""Optimizers, gradient clipping and learning-rate schedules (names as in `torch.optim`)."""
from . import lr_scheduler
from .adamw import Adam, AdamW
from .clip import clip_grad_norm_, clip_grad_value_
from .lr_scheduler import LambdaLR, LRScheduler, StepLR, WarmupCosine, warmup_cosine_lr
from .optimizer import Optimizer
from .sgd import SGD

__all__ = [
    "Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm_", "clip_grad_value_",
    "lr_scheduler", "LRScheduler", "StepLR", "LambdaLR", "WarmupCosine", "warmup_cosine_lr",
]
