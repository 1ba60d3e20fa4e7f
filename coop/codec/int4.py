"""4-bit outer gradients: block-scaled int4 with error feedback (Streaming DiLoCo sends its outer
gradients in 4 bits; with the residual carried over, what rounding drops is sent later)."""
from __future__ import annotations

import math

import numpy as np

from coop.wire import WireError

from .base import Codec, ErrorFeedback, _expect, check_block_size, check_scales, dequantize_blocks, quantize_blocks


class Int4Codec(ErrorFeedback, Codec):
    """Each tensor is flattened (after adding the residual, see ErrorFeedback) and cut into blocks
    of `block_size` elements; each block keeps one float32 scale = absmax(block) / 7 and codes
    q = round(c / scale) in [-7, 7], stored as q + 8 in 4-bit nibbles, two per byte (element 2i
    in the low nibble of byte i, 2i + 1 in the high one; an odd count pads the last high nibble
    with 8, a zero).

    Error of one round: |c - q * scale| <= scale / 2 = absmax(block of c) / 14 per element, with
    c = update + residual; the residual carries that error into the next round.
    Bytes: ceil(n / 2) + 4 ceil(n / B): about 7x fewer than fp32 at B = 64.
    """

    name = "int4"
    suffixes = (".q4", ".scale")

    def __init__(self, block_size: int = 64, error_feedback: bool = True):
        ErrorFeedback.__init__(self, error_feedback)
        self.block_size = check_block_size("int4", block_size)

    def options(self):
        return {"block_size": self.block_size}

    def _encode_one(self, name, x):
        corrected = self.corrected(name, x)  # (n,)
        codes, scale = quantize_blocks(corrected, self.block_size, 7)
        self.keep(name, corrected, dequantize_blocks(codes, scale, self.block_size))
        nibbles = (codes.astype(np.int16) + 8).astype(np.uint8)  # (n,) in [1, 15]
        if nibbles.size % 2:
            nibbles = np.append(nibbles, np.uint8(8))
        return [nibbles[0::2] | (nibbles[1::2] << 4), scale]  # (ceil(n / 2),) uint8

    def _decode_one(self, name, shape, parts):
        packed, scale = parts
        n = math.prod(shape)
        _expect(name + ".q4", packed, np.uint8, (-(-n // 2),))
        check_scales(name, scale, n, self.block_size)
        nibbles = np.empty(2 * packed.size, dtype=np.uint8)
        nibbles[0::2], nibbles[1::2] = packed & 0x0F, packed >> 4
        if (nibbles[:n] == 0).any() or (n % 2 and nibbles[n] != 8):
            raise WireError(f"tensor {name!r}: int4 codes must be in [-7, 7] (nibbles 1..15, padding 8)")
        codes = nibbles[:n].astype(np.int8) - np.int8(8)
        return dequantize_blocks(codes, scale, self.block_size).reshape(shape)

    def _nbytes_one(self, n):
        return -(-n // 2) + 4 * (-(-n // self.block_size))
