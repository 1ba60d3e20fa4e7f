"""What a pseudo-gradient becomes on the wire: encode/decode pairs with exact byte counts.

An update is a dict of float32 arrays (one per model tensor). `codec.encode(update)` gives an
`Encoded`: named numpy arrays (what `coop.wire.pack` ships) plus JSON-able metadata that says
how to decode them, so the receiver needs no configuration: `decode(tensors, metadata)`.

| codec | arrays per tensor `w` (n elements)                | payload bytes            | error per element |
| ----- | ------------------------------------------------- | ------------------------ | ----------------- |
| fp32  | `w` float32                                       | 4n                       | 0                 |
| fp16  | `w` float16                                       | 2n                       | <= max(2^-11 abs(x), 2^-25) |
| bf16  | `w` uint16 (bfloat16 bits)                        | 2n                       | <= max(2^-8 abs(x), 2^-134) |
| int8  | `w.q` int8 (n), `w.scale` float32 (ceil(n/B))     | n + 4 ceil(n/B)          | <= absmax(block) / 254 |
| int4  | `w.q4` uint8 (ceil(n/2)), `w.scale` float32 (ceil(n/B)) | ceil(n/2) + 4 ceil(n/B) | <= absmax(block) / 14, carried over |
| topk  | `w.idx` uint32 (k), `w.val` float32 (k)           | 8k, k = ceil(ratio n)    | see TopKCodec     |
| topk8 | `w.idx` uint32 (k), `w.q` int8 (k), `w.scale` float32 (ceil(k/B)) | 5k + 4 ceil(k/B) | see TopKInt8Codec |

int4, topk and topk8 keep an error-feedback residual on the sender (what they did not send is
added to the next round's update): keep one encoder per sender for the whole run, as the round
loop (coop.round) does.

The error bounds are for finite inputs in range (fp16 refuses values beyond 65504, bf16 those
that round past float32's range); the tests assert each one.

Receiving from the network: `tensors, meta = wire.unpack(body, max_bytes)`, then
`decode(tensors, meta, expected_shapes=model_shapes)` (checks every array against the shapes
the receiver expects before allocating anything), then `wire.check_tensors(update, spec)`
(names, float32, finite values). Malformed encodings raise `WireError`.

    base.py    Encoded, Codec, block quantisation, error feedback
    dense.py   fp32, fp16, bf16, int8
    int4.py    int4
    topk.py    topk, topk8
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from coop.wire import WireError

from .base import Codec, Encoded, ErrorFeedback, Shapes
from .dense import BF16Codec, FP16Codec, FP32Codec, Int8Codec, bf16_bits_to_float32, float32_to_bf16_bits
from .int4 import Int4Codec
from .topk import TopKCodec, TopKInt8Codec

CODECS: dict[str, type[Codec]] = {c.name: c for c in (FP32Codec, FP16Codec, BF16Codec, Int8Codec, Int4Codec, TopKCodec,
                                                      TopKInt8Codec)}


def get_codec(name: str, **options: Any) -> Codec:
    """A codec by name ("fp32", "fp16", "bf16", "int8", "int4", "topk", "topk8") with its options,
    e.g. get_codec("int8", block_size=128), get_codec("topk", ratio=0.01)."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {sorted(CODECS)}")
    try:
        return CODECS[name](**options)
    except TypeError as error:
        raise ValueError(f"bad options for codec {name!r}: {options} ({error})") from error


def decode(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any], expected_shapes: Shapes | None = None,
    *, copy: bool = True,
) -> dict[str, np.ndarray]:
    """Decode whatever `Codec.encode` produced, using only the metadata that came with it.
    Malformed metadata or arrays raise WireError. `copy`: see `Codec.decode`."""
    return codec_of(metadata).decode(tensors, metadata, expected_shapes, copy=copy)


def codec_of(metadata: Mapping[str, Any]) -> Codec:
    """The codec an encoded update's metadata names, with its options. WireError if malformed."""
    name, options = metadata.get("codec"), metadata.get("options", {})
    if not isinstance(name, str) or name not in CODECS:
        raise WireError(f"metadata 'codec' must be one of {sorted(CODECS)}, got {name!r:.50}")
    if not isinstance(options, dict):
        raise WireError(f"metadata 'options' must be an object, got {type(options).__name__}")
    try:
        return get_codec(name, **options)
    except ValueError as error:  # bad options from the network are a bad request
        raise WireError(str(error)) from error


__all__ = ["Codec", "Encoded", "ErrorFeedback", "Shapes", "CODECS", "get_codec", "decode", "codec_of", "FP32Codec", "FP16Codec",
           "BF16Codec", "Int8Codec", "Int4Codec", "TopKCodec", "TopKInt8Codec", "float32_to_bf16_bits",
           "bf16_bits_to_float32"]
