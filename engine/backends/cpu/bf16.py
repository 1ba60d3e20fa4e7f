"""bfloat16 on the CPU backend: how every primitive treats bf16 arrays.

A bf16 array here is a numpy array of ml_dtypes' bfloat16 dtype (2 bytes, the upper half of a
float32). numpy itself has no bf16 arithmetic worth using (ml_dtypes' loops round after every
operation, and its matmul returns float32), so the primitives follow the CUDA backend's bf16 kernels
instead: read bf16, compute in float32, round the result once to bf16 (to nearest, ties to even).
A primitive `widen`s its bf16 operands, runs its float32 code and `narrow`s what the CUDA kernel
writes in bf16; what the CUDA kernel writes in float32 (layer norm's statistics, the losses and
log-sum-exps of cross-entropy and attention, embedding and weight gradients for float32 master
weights) stays float32 here too.
"""
from __future__ import annotations

import numpy as np

from ...dtypes import bfloat16

BF16 = bfloat16.numpy  # np.dtype(ml_dtypes.bfloat16)


def is_bf16(x) -> bool:
    """Whether x is a bf16 array or numpy scalar (Python scalars and None never are). numpy keeps one
    dtype instance per registered dtype, so identity is the test: every float32 op asks this, cheaply."""
    return getattr(x, "dtype", None) is BF16


def any_bf16(*xs) -> bool:
    for x in xs:
        if getattr(x, "dtype", None) is BF16:
            return True
    return False


def widen(x):
    """bf16 -> float32 (exact); anything else (float32 arrays, scalars, None) as it is."""
    return x.astype(np.float32) if is_bf16(x) else x


def narrow(x: np.ndarray, dtype=BF16) -> np.ndarray:
    """A float32 result -> `dtype` (bf16 by default: round to nearest even), 0-d kept as an array."""
    return np.asarray(x).astype(dtype, copy=False)
