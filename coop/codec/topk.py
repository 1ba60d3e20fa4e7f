"""Sparse codecs: per tensor, only the k entries of largest magnitude, with error feedback."""
from __future__ import annotations

import math

import numpy as np

from coop.wire import WireError

from .base import (Codec, ErrorFeedback, _expect, check_block_size, check_scales, dequantize_blocks,
                   quantize_blocks)


def largest(corrected: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest magnitudes of a flat array, ascending (deterministic, compresses well)."""
    if k == corrected.size:
        return np.arange(k, dtype=np.int64)
    return np.sort(np.argpartition(np.abs(corrected), corrected.size - k)[corrected.size - k :])


def check_indices(name: str, index: np.ndarray, n: int) -> int:
    """Refuse top-k indices that are not a strictly increasing uint32 list below n; returns k."""
    if n >= 1 << 32:
        raise WireError(f"tensor {name!r} has {n} elements, beyond uint32 indices")
    k = index.shape[0] if index.ndim == 1 else -1
    _expect(name + ".idx", index, np.uint32, (k,))
    if k > n or (k and int(index.max()) >= n):
        raise WireError(f"tensor {name!r}: top-k indices must be < {n} and at most {n} of them")
    if k > 1 and not (np.diff(index.astype(np.int64)) > 0).all():
        raise WireError(f"tensor {name!r}: top-k indices must be strictly increasing (sorted, no repeats)")
    return k


def check_ratio(codec: str, ratio) -> float:
    if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0.0 < ratio <= 1.0):
        raise ValueError(f"{codec} ratio must be in (0, 1], got {ratio!r}")
    return float(ratio)


class TopKCodec(ErrorFeedback, Codec):
    """Per tensor, send only the k = ceil(ratio * n) entries of largest magnitude (flat uint32
    indices, ascending, and their float32 values); the rest decodes as zero.

    Error feedback (on by default, see ErrorFeedback): the encoder keeps what it did not send,
    per tensor, and adds it to the next round's update before choosing, so nothing is lost, only
    delayed. Keep one encoder per sender; the residual lives on the sender only.

    Error of one round: with c = update + residual, ||c - decoded||_2 <= sqrt(1 - k/n) ||c||_2
    (the dropped entries are the n-k smallest of c). Bytes: 8k per tensor.
    """

    name = "topk"
    suffixes = (".idx", ".val")

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True):
        ErrorFeedback.__init__(self, error_feedback)
        self.ratio = check_ratio("topk", ratio)

    def options(self):
        return {"ratio": self.ratio}

    def k_of(self, n: int) -> int:
        """How many entries a tensor of n elements sends."""
        return min(n, math.ceil(self.ratio * n))

    def _encode_one(self, name, x):
        corrected = self.corrected(name, x)  # (n,)
        index = largest(corrected, self.k_of(corrected.size))
        values = corrected[index]
        sent = np.zeros_like(corrected)
        sent[index] = values
        self.keep(name, corrected, sent)  # exactly corrected with the sent entries zeroed
        return [index.astype(np.uint32), values]

    def _decode_one(self, name, shape, parts):
        index, values = parts
        n = math.prod(shape)
        k = check_indices(name, index, n)
        _expect(name + ".val", values, np.float32, (k,))
        out = np.zeros(n, dtype=np.float32)
        out[index] = values
        return out.reshape(shape)

    def _nbytes_one(self, n):
        return 8 * self.k_of(n)


class TopKInt8Codec(ErrorFeedback, Codec):
    """Top-k with the k values in int8 (block-wise absmax scales over the k selected values, in
    index order): the sparse and the low-bit savings together (SparseLoCo's recipe). Error
    feedback covers both losses: the residual keeps the unsent entries and the rounding of the
    sent ones.

    Error of one round: with c = update + residual, the dropped entries are the n - k smallest
    of c and each sent value is off by at most absmax(its block of values) / 254.
    Bytes: 5k + 4 ceil(k / B), k = ceil(ratio n).
    """

    name = "topk8"
    suffixes = (".idx", ".q", ".scale")

    def __init__(self, ratio: float = 0.01, block_size: int = 256, error_feedback: bool = True):
        ErrorFeedback.__init__(self, error_feedback)
        self.ratio = check_ratio("topk8", ratio)
        self.block_size = check_block_size("topk8", block_size)

    def options(self):
        return {"ratio": self.ratio, "block_size": self.block_size}

    def k_of(self, n: int) -> int:
        return min(n, math.ceil(self.ratio * n))

    def _encode_one(self, name, x):
        corrected = self.corrected(name, x)  # (n,)
        index = largest(corrected, self.k_of(corrected.size))
        codes, scale = quantize_blocks(corrected[index], self.block_size, 127)
        sent = np.zeros_like(corrected)
        sent[index] = dequantize_blocks(codes, scale, self.block_size)
        self.keep(name, corrected, sent)
        return [index.astype(np.uint32), codes, scale]

    def _decode_one(self, name, shape, parts):
        index, codes, scale = parts
        n = math.prod(shape)
        k = check_indices(name, index, n)
        _expect(name + ".q", codes, np.int8, (k,))
        check_scales(name, scale, k, self.block_size)
        out = np.zeros(n, dtype=np.float32)
        out[index] = dequantize_blocks(codes, scale, self.block_size)
        return out.reshape(shape)

    def _nbytes_one(self, n):
        k = self.k_of(n)
        return 5 * k + 4 * (-(-k // self.block_size))
