"""Dense codecs: every element is sent, in float32, float16, bfloat16 or int8 with block scales."""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from .base import PIECE, Codec, _expect, check_block_size, check_scales, dequantize_blocks, quantize_blocks


class FP32Codec(Codec):
    """Lossless: the float32 values as they are (the encoded array may share memory with the input)."""

    name = "fp32"
    suffixes = ("",)

    def _encode_one(self, name, x):
        return [x]

    def _decode_one(self, name, shape, parts):
        _expect(name, parts[0], np.float32, shape)
        return parts[0].astype(np.float32, copy=True)

    def _decode_one_view(self, name, shape, parts):
        _expect(name, parts[0], np.float32, shape)
        return np.asarray(parts[0], dtype=np.float32)  # the received array itself (native byte order)

    def _nbytes_one(self, n):
        return 4 * n


class FP16Codec(Codec):
    """IEEE half precision, round to nearest even (numpy's cast).

    Error: |x - decode(encode(x))| <= 2^-11 |x| for |x| >= 2^-14 (normal range) and <= 2^-25
    below it (subnormals). Values with |x| > 65504 would become inf, so encode refuses them:
    use bf16 or fp32 for such updates.
    """

    name = "fp16"
    suffixes = ("",)
    max_value: ClassVar[float] = 65504.0

    def _encode_one(self, name, x):
        peak = float(np.abs(x).max(initial=0.0))
        if peak > self.max_value:
            raise ValueError(f"tensor {name!r} has |x| up to {peak:.3g}, beyond fp16's {self.max_value}; use bf16 or fp32")
        return [x.astype(np.float16)]

    def _decode_one(self, name, shape, parts):
        _expect(name, parts[0], np.float16, shape)
        return parts[0].astype(np.float32)

    def _nbytes_one(self, n):
        return 2 * n


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest, ties to even.

    bf16 is the top 16 bits of a float32. Adding 0x7FFF plus the lowest kept bit before dropping
    the low 16 bits rounds to nearest with ties going to the even pattern. Finite inputs only
    (NaN payloads are not preserved; callers refuse non-finite values first).
    """
    bits = np.asarray(x, dtype=np.float32, order="C").view(np.uint32).astype(np.uint64)  # u64: no wrap-around
    rounding = 0x7FFF + ((bits >> 16) & 1)
    return np.asarray((bits + rounding) >> 16).astype(np.uint16)  # asarray: 0-d ufunc results are scalars


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32, exactly (shift into the top half)."""
    return np.asarray(np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class BF16Codec(Codec):
    """bfloat16 (float32's exponent range, 8 mantissa bits), round to nearest even.

    Error: |x - decode(encode(x))| <= 2^-8 |x| for |x| >= 2^-126 (normal range) and <= 2^-134
    below it. Values within half a bf16 step of float32's maximum would round to inf; encode refuses them.
    """

    name = "bf16"
    suffixes = ("",)

    def _encode_one(self, name, x):
        bits = float32_to_bf16_bits(x)
        if ((bits & 0x7F80) == 0x7F80).any():  # exponent all ones: rounded up to inf
            raise ValueError(f"tensor {name!r} has values that overflow bf16 (|x| near 3.4e38); use fp32")
        return [bits]

    def _decode_one(self, name, shape, parts):
        _expect(name, parts[0], np.uint16, shape)
        return bf16_bits_to_float32(parts[0])

    def _nbytes_one(self, n):
        return 2 * n


class Int8Codec(Codec):
    """Each tensor is flattened and cut into blocks of `block_size` elements (the last may be
    shorter); each block keeps one float32 scale = absmax(block) / 127 and int8 codes
    q = round(x / scale) in [-127, 127].

    Error: |x - q * scale| <= scale / 2 = absmax(block) / 254 per element (plus float32 rounding,
    ~1e-7 relative). An all-zero block has scale 0 and decodes to exact zeros.
    Bytes: n + 4 * ceil(n / block_size).
    """

    name = "int8"
    suffixes = (".q", ".scale")
    max_block_size: ClassVar[int] = 1 << 24

    def __init__(self, block_size: int = 256):
        self.block_size = check_block_size("int8", block_size, self.max_block_size)

    def options(self):
        return {"block_size": self.block_size}

    def _encode_one(self, name, x):
        return list(quantize_blocks(x.reshape(-1), self.block_size, 127))

    def piece_elements(self):
        return max(1, PIECE // self.block_size) * self.block_size  # whole blocks: codes and scales concatenate

    def _decode_one(self, name, shape, parts):
        self._check_parts(name, shape, parts)
        return dequantize_blocks(*parts, self.block_size).reshape(shape)

    def _check_parts(self, name, shape, parts):
        codes, scale = parts
        n = math.prod(shape)
        _expect(name + ".q", codes, np.int8, (n,))
        check_scales(name, scale, n, self.block_size)

    def _decode_piece(self, parts, start, out):
        codes, scale = parts
        first = start // self.block_size  # pieces start on a block
        dequantize_blocks(codes[start : start + out.size], scale[first : first - (-out.size // self.block_size)],
                          self.block_size, out=out)

    def _nbytes_one(self, n):
        return n + 4 * (-(-n // self.block_size))
