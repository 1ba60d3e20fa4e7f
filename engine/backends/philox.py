"""Philox4x32-10 (Salmon et al., 2011) in numpy, bit for bit the device function of
csrc/cuda/philox.cuh, and the attention-dropout keep rule built on it.

The fused attention kernels (csrc/cuda/attention/) and the CPU reference (cpu/attention.py) both draw the
dropout mask of element (bh, query, key) from here, so the two backends agree element for element
given the same key:
  - one Philox call, counter (key // 8, query, bh, ATTENTION_STREAM) and the 64-bit draw key,
    gives 4 x 32 bits = 8 x 16-bit lanes; key j uses lane j % 8 (lane 2w is the low half of
    word w, lane 2w + 1 its high half);
  - the key is kept iff its 16-bit value >= threshold = round(p * 65536), at most 65535;
  - a kept element is scaled by 1 / (1 - p), computed in float32.
"""
from __future__ import annotations

import math

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # round multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments
_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)

# counter word 3 of attention dropout: its own stream, apart from dropout_mask's (random.cu)
ATTENTION_STREAM = 0xA77E


def philox4x32_10(counter: tuple, key: int) -> tuple:
    """counter: 4 uint32 arrays (broadcast together), key: a 64-bit int (low word first) ->
    4 uint32 arrays of random bits, each of the counters' broadcast shape."""
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(c, dtype=np.uint32) for c in counter))
    k0, k1 = int(key) & 0xFFFFFFFF, (int(key) >> 32) & 0xFFFFFFFF
    for _ in range(10):
        prod0 = _M0 * c0.astype(np.uint64)  # exact 64-bit products: mulhi = the high word
        prod1 = _M1 * c2.astype(np.uint64)
        hi0, lo0 = (prod0 >> _SHIFT32).astype(np.uint32), (prod0 & _LOW32).astype(np.uint32)
        hi1, lo1 = (prod1 >> _SHIFT32).astype(np.uint32), (prod1 & _LOW32).astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint32(k0), lo1, hi0 ^ c3 ^ np.uint32(k1), lo0
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def dropout_threshold(p: float) -> int:
    """The 16-bit threshold of drop probability p (p as float32, as the kernels receive it)."""
    return min(int(math.floor(float(np.float32(p)) * 65536.0 + 0.5)), 65535)


def keep_scale(p: float) -> np.float32:
    """1 / (1 - p) in float32, as the kernels compute it."""
    return np.float32(1.0) / (np.float32(1.0) - np.float32(p))


def attention_keep(key: int, BH: int, T: int, S: int, p: float) -> np.ndarray:
    """Keep flags (BH, T, S) bool of attention dropout with drop probability p under `key`."""
    S8 = (S + 7) // 8
    bh = np.arange(BH, dtype=np.uint32)[:, None, None]
    qi = np.arange(T, dtype=np.uint32)[None, :, None]
    k8 = np.arange(S8, dtype=np.uint32)[None, None, :]
    words = np.stack(philox4x32_10((k8, qi, bh, ATTENTION_STREAM), key), axis=-1)  # (BH, T, S8, 4)
    lanes = np.stack([words & np.uint32(0xFFFF), words >> np.uint32(16)], axis=-1)  # (BH, T, S8, 4, 2)
    return lanes.reshape(BH, T, S8 * 8)[..., :S] >= dropout_threshold(p)


def attention_dropout_mask(key: int, BH: int, T: int, S: int, p: float) -> np.ndarray:
    """Z (BH, T, S) float32: 0 where dropped, 1 / (1 - p) where kept."""
    return np.where(attention_keep(key, BH, T, S, p), keep_scale(p), np.float32(0.0))
