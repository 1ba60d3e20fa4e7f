"""Weight initialisation in place, from the engine's seeded generator (engine.manual_seed)."""
from __future__ import annotations

import math

import numpy as np

from ..autograd import no_grad
from ..random import default_generator
from ..tensor import Tensor, tensor


def _fill(t: Tensor, values: np.ndarray) -> Tensor:
    with no_grad():
        t.copy_(tensor(values.astype(t.dtype.numpy), device=t.device))
    return t


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    return _fill(t, default_generator().normal(mean, std, size=t.shape))


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    return _fill(t, default_generator().uniform(a, b, size=t.shape))


def zeros_(t: Tensor) -> Tensor:
    return t.fill_(0.0)


def ones_(t: Tensor) -> Tensor:
    return t.fill_(1.0)


def kaiming_uniform_linear_(weight: Tensor) -> Tensor:
    """PyTorch's default for nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(weight.shape[-1]) if weight.shape[-1] else 0.0
    return uniform_(weight, -bound, bound)
