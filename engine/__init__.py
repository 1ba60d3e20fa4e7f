"""engine: a PyTorch-style tensor library with reverse-mode autograd, a numpy CPU backend and a
CUDA backend of its own kernels (engine._C).

Layers, each importing only from those before it: dtypes, device, random, autocast -> _native
(loads engine._C) -> backends (cpu/, cuda/) -> tensor (the data type) -> autograd -> ops (one
Function per op) -> methods (Tensor's op methods), factories -> distributed -> nn, graphs -> optim, cuda -> this
package; data and checkpoint stand apart."""
from __future__ import annotations

from .dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64, uint8
from .device import Device, get_default_device, set_default_device
from .autograd import enable_grad, is_grad_enabled, no_grad
from .autocast import autocast, get_autocast_dtype, is_autocast_enabled
from .random import get_rng_state, manual_seed, set_rng_state
from .tensor import Tensor, tensor
from . import methods  # noqa: F401  (installs Tensor's op methods: operators, reductions, shape, .to)
from .methods.arithmetic import matmul, where
from .methods.shape import cat, concat, split, stack
from .factories import (arange, empty, from_dlpack, from_numpy, full, full_like, ones, ones_like, rand, randint,
                        randn, zeros, zeros_like)
from . import cuda  # noqa: E402  (engine.cuda.is_available() etc.; never fails without a GPU)
from . import nn, optim  # noqa: E402
from . import distributed  # noqa: E402  (engine.distributed: process groups, collectives; never needs a GPU)

bool = bool_  # engine.bool, as torch.bool
device = Device
__version__ = "0.1.0"
