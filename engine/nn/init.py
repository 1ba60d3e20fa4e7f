"""Weight initialisation in place, from the engine's seeded generator (engine.manual_seed)."""
from __future__ import annotations

import math

import numpy as np

from ..autograd import no_grad
from ..random import default_generator
from ..tensor import Tensor, tensor


_DRAW = 1 << 20  # values drawn in float64 at a time: the generator's stream is the same drawn in pieces


def _fill(t: Tensor, draw) -> Tensor:
    """t = draw(n) for n = t.numel(), drawn in pieces into one array of t's dtype: a 124M-parameter
    model's embedding would otherwise pass through a float64 copy (2x its size) and a cast."""
    values = np.empty(t.shape, dtype=t.dtype.numpy).reshape(-1)
    for start in range(0, values.size, _DRAW):
        values[start : start + _DRAW] = draw(min(_DRAW, values.size - start))
    with no_grad():
        t.copy_(tensor(values.reshape(t.shape), device=t.device))
    return t


def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    return _fill(t, lambda n: default_generator().normal(mean, std, size=n))


def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    return _fill(t, lambda n: default_generator().uniform(a, b, size=n))


def zeros_(t: Tensor) -> Tensor:
    return t.fill_(0.0)


def ones_(t: Tensor) -> Tensor:
    return t.fill_(1.0)


def kaiming_uniform_linear_(weight: Tensor) -> Tensor:
    """PyTorch's default for nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(weight.shape[-1]) if weight.shape[-1] else 0.0
    return uniform_(weight, -bound, bound)
