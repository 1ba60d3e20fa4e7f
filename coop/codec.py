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
| topk  | `w.idx` uint32 (k), `w.val` float32 (k)           | 8k, k = ceil(ratio n)    | see TopKCodec     |

The error bounds are for finite inputs in range (fp16 refuses values beyond 65504, bf16 those
that round past float32's range); the tests assert each one.

Receiving from the network: `tensors, meta = wire.unpack(body, max_bytes)`, then
`decode(tensors, meta, expected_shapes=model_shapes)` (checks every array against the shapes
the receiver expects before allocating anything), then `wire.check_tensors(update, spec)`
(names, float32, finite values). Malformed encodings raise `WireError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from coop.wire import WireError

Shapes = Mapping[str, tuple[int, ...]]


@dataclass
class Encoded:
    """An encoded update: the arrays to ship and the metadata that says how to decode them.

    metadata = {"codec": name, "options": {...}, "shapes": {tensor name: [dims]}}
    """

    tensors: dict[str, np.ndarray]
    metadata: dict[str, Any]

    @property
    def nbytes(self) -> int:
        """Payload bytes: the sum of the arrays' sizes (the safetensors header adds ~100 B per tensor)."""
        return sum(int(array.nbytes) for array in self.tensors.values())


class Codec:
    """Base class: a codec encodes a float32 update and decodes what it encoded.

    Subclasses set `name`, implement `_encode_one` / `_decode_one` / `_nbytes_one`, and list the
    array suffixes they produce in `suffixes` (`""` means the tensor's own name).
    """

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]

    def options(self) -> dict[str, Any]:
        """JSON-able options that decode needs (recorded in the metadata)."""
        return {}

    def encode(self, update: Mapping[str, np.ndarray]) -> Encoded:
        """Encode a dict of float arrays; refuses non-finite values (a diverged replica)."""
        tensors: dict[str, np.ndarray] = {}
        shapes: dict[str, list[int]] = {}
        for name, array in update.items():
            x = np.asarray(array, dtype=np.float32)
            if not np.isfinite(x).all():
                raise ValueError(f"tensor {name!r} has NaN/inf values; refusing to encode a diverged update")
            for suffix, part in zip(self.suffixes, self._encode_one(name, x)):
                tensors[name + suffix] = part
            shapes[name] = list(x.shape)
        return Encoded(tensors, {"codec": self.name, "options": self.options(), "shapes": shapes})

    def decode(
        self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any], expected_shapes: Shapes | None = None
    ) -> dict[str, np.ndarray]:
        """Decode back to float32 arrays of the recorded shapes. Pass `expected_shapes` (the
        model's) for anything that came over the network: a mismatch raises WireError before
        any allocation, so a hostile metadata cannot make us allocate a huge array."""
        shapes = _recorded_shapes(metadata, expected_shapes)
        expected_keys = {name + suffix for name in shapes for suffix in self.suffixes}
        if set(tensors) != expected_keys:
            missing, extra = sorted(expected_keys - set(tensors)), sorted(set(tensors) - expected_keys)
            raise WireError(f"{self.name} update: arrays missing {missing[:8]}, unexpected {extra[:8]}")
        out: dict[str, np.ndarray] = {}
        for name, shape in shapes.items():
            parts = [tensors[name + suffix] for suffix in self.suffixes]
            out[name] = self._decode_one(name, shape, parts)
        return out

    def payload_nbytes(self, shapes: Shapes) -> int:
        """Exact payload bytes `encode` produces for tensors of these shapes."""
        return sum(self._nbytes_one(math.prod(shape)) for shape in shapes.values())

    # -- per tensor -----------------------------------------------------------------------------
    def _encode_one(self, name: str, x: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _decode_one(self, name: str, shape: tuple[int, ...], parts: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def _nbytes_one(self, n: int) -> int:
        raise NotImplementedError


def _recorded_shapes(metadata: Mapping[str, Any], expected: Shapes | None) -> dict[str, tuple[int, ...]]:
    raw = metadata.get("shapes")
    def is_dims(dims: Any) -> bool:
        return isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims)

    if not isinstance(raw, dict) or not all(is_dims(dims) for dims in raw.values()):
        raise WireError("metadata 'shapes' must map tensor names to lists of non-negative ints")
    shapes = {name: tuple(dims) for name, dims in raw.items()}
    if expected is not None:
        want = {name: tuple(shape) for name, shape in expected.items()}
        if shapes != want:
            diff = sorted(n for n in set(shapes) | set(want) if shapes.get(n) != want.get(n))
            details = ", ".join(f"{n}: got {shapes.get(n)} expected {want.get(n)}" for n in diff[:5])
            raise WireError(f"update shapes do not match the model ({details}); is the sender on the same model config?")
    return shapes


def _expect(name: str, part: np.ndarray, dtype: Any, shape: tuple[int, ...]) -> None:
    if part.dtype != np.dtype(dtype) or part.shape != shape:
        raise WireError(f"tensor {name!r}: expected {np.dtype(dtype)} array of shape {shape}, got {part.dtype} {part.shape}")


# ----------------------------------------------------------------------------------------------
# Dense codecs.


class FP32Codec(Codec):
    """Lossless: the float32 values as they are (the encoded array may share memory with the input)."""

    name = "fp32"
    suffixes = ("",)

    def _encode_one(self, name, x):
        return [x]

    def _decode_one(self, name, shape, parts):
        _expect(name, parts[0], np.float32, shape)
        return parts[0].astype(np.float32, copy=True)

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


# ----------------------------------------------------------------------------------------------
# int8 with block-wise absmax scales.


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
        if not (isinstance(block_size, int) and not isinstance(block_size, bool) and 1 <= block_size <= self.max_block_size):
            raise ValueError(f"int8 block_size must be an int in [1, {self.max_block_size}], got {block_size!r}")
        self.block_size = block_size

    def options(self):
        return {"block_size": self.block_size}

    def _encode_one(self, name, x):
        flat = x.reshape(-1)
        n_full = flat.size // self.block_size
        # (n,) -> full blocks (n_full, B) and the shorter last block, if any: no padded copy.
        blocks = [flat[: n_full * self.block_size].reshape(n_full, self.block_size)]
        if flat.size % self.block_size:
            blocks.append(flat[n_full * self.block_size :].reshape(1, -1))
        codes, scales = [], []
        for block in blocks:
            scale = (np.abs(block).max(axis=1, initial=0.0) / np.float32(127)).astype(np.float32)  # (nb,)
            inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
            codes.append(np.clip(np.rint(block * inverse[:, None]), -127, 127).astype(np.int8).reshape(-1))
            scales.append(scale)
        return [np.concatenate(codes), np.concatenate(scales)]

    def _decode_one(self, name, shape, parts):
        codes, scale = parts
        n = math.prod(shape)
        n_full = n // self.block_size
        _expect(name + ".q", codes, np.int8, (n,))
        _expect(name + ".scale", scale, np.float32, (-(-n // self.block_size),))
        if not (np.isfinite(scale).all() and (scale >= 0).all()):
            raise WireError(f"tensor {name!r}: int8 scales must be finite and >= 0")
        out = np.empty(n, dtype=np.float32)
        head = n_full * self.block_size
        # (n_full, B) * (n_full, 1), then the short last block times its scale.
        out[:head] = (codes[:head].reshape(n_full, self.block_size).astype(np.float32) * scale[:n_full, None]).reshape(-1)
        if head < n:
            out[head:] = codes[head:].astype(np.float32) * scale[n_full]
        return out.reshape(shape)

    def _nbytes_one(self, n):
        return n + 4 * (-(-n // self.block_size))


# ----------------------------------------------------------------------------------------------
# top-k with error feedback.


class TopKCodec(Codec):
    """Per tensor, send only the k = ceil(ratio * n) entries of largest magnitude (flat uint32
    indices, ascending, and their float32 values); the rest decodes as zero.

    Error feedback (on by default): the encoder keeps what it did not send, per tensor, and adds
    it to the next round's update before choosing, so nothing is lost, only delayed:
    sum of decoded updates over rounds + residual == sum of updates (up to float32 rounding).
    Keep one encoder per sender; the residual lives on the sender only.

    Error of one round: with c = update + residual, ||c - decoded||_2 <= sqrt(1 - k/n) ||c||_2
    (the dropped entries are the n-k smallest of c). Bytes: 8k per tensor.
    """

    name = "topk"
    suffixes = (".idx", ".val")

    def __init__(self, ratio: float = 0.01, error_feedback: bool = True):
        if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0.0 < ratio <= 1.0):
            raise ValueError(f"topk ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self.error_feedback = bool(error_feedback)
        self.residual: dict[str, np.ndarray] = {}  # tensor name -> float32 array (sender side)

    def options(self):
        return {"ratio": self.ratio}

    def k_of(self, n: int) -> int:
        """How many entries a tensor of n elements sends."""
        return min(n, math.ceil(self.ratio * n))

    def reset(self) -> None:
        """Forget the residual (e.g. when the sender restarts from fresh global weights)."""
        self.residual.clear()

    def _encode_one(self, name, x):
        corrected = x.reshape(-1).copy()
        if self.error_feedback and name in self.residual:
            if self.residual[name].shape != corrected.shape:
                before = self.residual[name].size
                raise ValueError(f"tensor {name!r} changed size from {before} to {corrected.size}; call reset()")
            corrected += self.residual[name]
        k = self.k_of(corrected.size)
        if k == corrected.size:
            index = np.arange(k, dtype=np.int64)
        else:  # the k largest magnitudes, in ascending index order (deterministic, compresses well)
            index = np.sort(np.argpartition(np.abs(corrected), corrected.size - k)[corrected.size - k :])
        values = corrected[index].astype(np.float32)
        if self.error_feedback:
            corrected[index] = 0.0
            self.residual[name] = corrected  # what was not sent this round
        return [index.astype(np.uint32), values]

    def _decode_one(self, name, shape, parts):
        index, values = parts
        n = math.prod(shape)
        if n >= 1 << 32:
            raise WireError(f"tensor {name!r} has {n} elements, beyond uint32 indices")
        k = index.shape[0] if index.ndim == 1 else -1
        _expect(name + ".idx", index, np.uint32, (k,))
        _expect(name + ".val", values, np.float32, (k,))
        if k > n or (k and int(index.max()) >= n):
            raise WireError(f"tensor {name!r}: top-k indices must be < {n} and at most {n} of them")
        if k > 1 and not (np.diff(index.astype(np.int64)) > 0).all():
            raise WireError(f"tensor {name!r}: top-k indices must be strictly increasing (sorted, no repeats)")
        out = np.zeros(n, dtype=np.float32)
        out[index] = values
        return out.reshape(shape)

    def _nbytes_one(self, n):
        return 8 * self.k_of(n)


# ----------------------------------------------------------------------------------------------

CODECS: dict[str, type[Codec]] = {c.name: c for c in (FP32Codec, FP16Codec, BF16Codec, Int8Codec, TopKCodec)}


def get_codec(name: str, **options: Any) -> Codec:
    """A codec by name ("fp32", "fp16", "bf16", "int8", "topk") with its options, e.g.
    get_codec("int8", block_size=128), get_codec("topk", ratio=0.01)."""
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of {sorted(CODECS)}")
    try:
        return CODECS[name](**options)
    except TypeError as error:
        raise ValueError(f"bad options for codec {name!r}: {options} ({error})") from error


def decode(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any], expected_shapes: Shapes | None = None
) -> dict[str, np.ndarray]:
    """Decode whatever `Codec.encode` produced, using only the metadata that came with it.
    Malformed metadata or arrays raise WireError."""
    name, options = metadata.get("codec"), metadata.get("options", {})
    if not isinstance(name, str) or name not in CODECS:
        raise WireError(f"metadata 'codec' must be one of {sorted(CODECS)}, got {name!r:.50}")
    if not isinstance(options, dict):
        raise WireError(f"metadata 'options' must be an object, got {type(options).__name__}")
    try:
        codec = get_codec(name, **options)
    except ValueError as error:  # bad options from the network are a bad request
        raise WireError(str(error)) from error
    return codec.decode(tensors, metadata, expected_shapes)
