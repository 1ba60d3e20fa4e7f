"""The codec interface: what an encoded update is, the base class every codec derives from, and
the block-wise absmax quantisation that the low-bit codecs share."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from coop.threads import parallel_map
from coop.wire import WireError

Shapes = Mapping[str, tuple[int, ...]]
PIECE = 1 << 22  # elements of a piece of a large tensor, for the codecs that encode in pieces (Codec.piece_elements)


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
        arrays = {name: np.asarray(array, dtype=np.float32) for name, array in update.items()}
        piece = self.piece_elements()

        def spans(size: int) -> list[tuple[int | None, int]]:  # [(None, size)]: the whole tensor
            if not piece or size <= piece:
                return [(None, size)]
            return [(start, min(start + piece, size)) for start in range(0, size, piece)]

        # the work items: whole tensors, or block-aligned pieces of the large ones, so that one big
        # tensor (GPT-2's 38.6M-element embedding) is not one core's work while the others idle
        items = [(name, start, stop) for name, x in arrays.items() for start, stop in spans(x.size)]

        def one(item: tuple[str, int | None, int]) -> list[np.ndarray]:  # a tensor's own work (its residual, if any)
            name, start, stop = item
            x = arrays[name] if start is None else arrays[name].reshape(-1)[start:stop]
            if not np.isfinite(x).all():
                raise ValueError(f"tensor {name!r} has NaN/inf values; refusing to encode a diverged update")
            return self._encode_one(name, x)

        # on every core: a 124M-parameter update is ~1 s of numpy on one
        encoded = parallel_map(one, items, sum(x.size for x in arrays.values()))
        pieces: dict[str, list[list[np.ndarray]]] = {}
        for (name, _, _), parts in zip(items, encoded):
            pieces.setdefault(name, []).append(parts)
        tensors: dict[str, np.ndarray] = {}
        for name, parts_of_pieces in pieces.items():
            parts = parts_of_pieces[0] if len(parts_of_pieces) == 1 else \
                [np.concatenate(same) for same in zip(*parts_of_pieces)]  # each suffix's pieces, in order
            for suffix, part in zip(self.suffixes, parts):
                tensors[name + suffix] = part
        shapes = {name: list(x.shape) for name, x in arrays.items()}
        return Encoded(tensors, {"codec": self.name, "options": self.options(), "shapes": shapes})

    def piece_elements(self) -> int:
        """0, or the size of the pieces a large tensor may be encoded in, each on its own: for a
        codec whose arrays are flat and blockwise (a multiple of its block size), where the pieces'
        arrays put end to end are the whole tensor's encoding, bit for bit."""
        return 0

    def decode(
        self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any], expected_shapes: Shapes | None = None,
        *, copy: bool = True,
    ) -> dict[str, np.ndarray]:
        """Decode back to float32 arrays of the recorded shapes. Pass `expected_shapes` (the
        model's) for anything that came over the network: a mismatch raises WireError before
        any allocation, so a hostile metadata cannot make us allocate a huge array. `copy=False`
        lets a lossless codec return the given arrays themselves (fp32: no copy of the model for
        a receiver that only reads the update, as the coordinator does)."""
        shapes = recorded_shapes(metadata, expected_shapes)
        expected_keys = {name + suffix for name in shapes for suffix in self.suffixes}
        if set(tensors) != expected_keys:
            missing, extra = sorted(expected_keys - set(tensors)), sorted(set(tensors) - expected_keys)
            raise WireError(f"{self.name} update: arrays missing {missing[:8]}, unexpected {extra[:8]}")
        one = self._decode_one if copy else self._decode_one_view
        piece = self.piece_elements()
        # the work items: whole tensors, or (their encoding checked whole first) pieces of the large
        # ones, decoded on every core into the tensor's one output
        items: list[tuple[str, tuple[int, ...], int | None, np.ndarray | None]] = []
        outputs: dict[str, np.ndarray] = {}
        for name, shape in shapes.items():
            size = math.prod(shape)
            if not piece or size <= piece:
                items.append((name, shape, None, None))
                continue
            self._check_parts(name, shape, [tensors[name + s] for s in self.suffixes])
            outputs[name] = np.empty(size, dtype=np.float32)
            items += [(name, shape, start, outputs[name][start : start + piece]) for start in range(0, size, piece)]

        def decode_item(item) -> np.ndarray | None:
            name, shape, start, out = item
            parts = [tensors[name + s] for s in self.suffixes]
            if start is None:
                return one(name, shape, parts)
            self._decode_piece(parts, start, out)
            return None

        decoded = parallel_map(decode_item, items, sum(math.prod(shape) for shape in shapes.values()))
        whole = {item[0]: array for item, array in zip(items, decoded) if item[2] is None}
        return {name: whole[name] if name in whole else outputs[name].reshape(shape) for name, shape in shapes.items()}

    def payload_nbytes(self, shapes: Shapes) -> int:
        """Exact payload bytes `encode` produces for tensors of these shapes."""
        return sum(self._nbytes_one(math.prod(shape)) for shape in shapes.values())

    # -- per tensor -----------------------------------------------------------------------------
    def _encode_one(self, name: str, x: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _decode_one(self, name: str, shape: tuple[int, ...], parts: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def _decode_one_view(self, name: str, shape: tuple[int, ...], parts: list[np.ndarray]) -> np.ndarray:
        """`_decode_one`, allowed to return (a view of) its input: what `decode(copy=False)` calls."""
        return self._decode_one(name, shape, parts)

    def _nbytes_one(self, n: int) -> int:
        raise NotImplementedError

    def _check_parts(self, name: str, shape: tuple[int, ...], parts: list[np.ndarray]) -> None:
        """With `piece_elements`: refuse a tensor's encoded parts (WireError) before its pieces decode."""
        raise NotImplementedError

    def _decode_piece(self, parts: list[np.ndarray], start: int, out: np.ndarray) -> None:
        """With `piece_elements`: decode elements [start, start + out.size) of a checked tensor into `out`."""
        raise NotImplementedError


def recorded_shapes(metadata: Mapping[str, Any], expected: Shapes | None) -> dict[str, tuple[int, ...]]:
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
# Block-wise absmax quantisation (int8, int4, top-k's values).


def quantize_blocks(flat: np.ndarray, block_size: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """(n,) float32 -> (codes (n,) int8 in [-levels, levels], scales (ceil(n / block_size),) float32).

    The array is cut into blocks of `block_size` (the last may be shorter); each block's scale is
    absmax(block) / levels and its codes round(x / scale). |x - code * scale| <= scale / 2 per
    element; an all-zero block has scale 0 and codes 0."""
    n_full = flat.size // block_size
    # (n,) -> full blocks (n_full, B) and the shorter last block, if any: no padded copy.
    blocks = [flat[: n_full * block_size].reshape(n_full, block_size)]
    if flat.size % block_size:
        blocks.append(flat[n_full * block_size :].reshape(1, -1))
    codes, scales = [], []
    for block in blocks:
        scale = (np.abs(block).max(axis=1, initial=0.0) / np.float32(levels)).astype(np.float32)  # (nb,)
        inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
        codes.append(np.clip(np.rint(block * inverse[:, None]), -levels, levels).astype(np.int8).reshape(-1))
        scales.append(scale)
    return np.concatenate(codes), np.concatenate(scales)


def dequantize_blocks(codes: np.ndarray, scale: np.ndarray, block_size: int, out: np.ndarray | None = None) -> np.ndarray:
    """(n,) integer codes and their block scales -> (n,) float32 codes * scale (into `out` if given)."""
    n = codes.size
    n_full = n // block_size
    head = n_full * block_size
    out = np.empty(n, dtype=np.float32) if out is None else out
    # (n_full, B) * (n_full, 1), then the short last block times its scale.
    out[:head] = (codes[:head].reshape(n_full, block_size).astype(np.float32) * scale[:n_full, None]).reshape(-1)
    if head < n:
        out[head:] = codes[head:].astype(np.float32) * scale[n_full]
    return out


def check_scales(name: str, scale: np.ndarray, n: int, block_size: int) -> None:
    """Refuse block scales that do not fit n elements, or that are negative or not finite."""
    _expect(name + ".scale", scale, np.float32, (-(-n // block_size),))
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        raise WireError(f"tensor {name!r}: block scales must be finite and >= 0")


def check_block_size(codec: str, block_size: Any, largest: int = 1 << 24) -> int:
    if not (isinstance(block_size, int) and not isinstance(block_size, bool) and 1 <= block_size <= largest):
        raise ValueError(f"{codec} block_size must be an int in [1, {largest}], got {block_size!r}")
    return block_size


class ErrorFeedback:
    """What a lossy encoder did not send, kept per tensor on the sender and added to the next
    round's update before encoding: nothing is lost, only delayed (sum of decoded updates over
    rounds + residual == sum of updates, up to float32 rounding). One encoder per sender."""

    def __init__(self, enabled: bool = True):
        self.error_feedback = bool(enabled)
        self.residual: dict[str, np.ndarray] = {}  # tensor name -> float32 (n,) (sender side)

    def reset(self) -> None:
        """Forget the residual (e.g. when the sender restarts from fresh global weights)."""
        self.residual.clear()

    def corrected(self, name: str, x: np.ndarray) -> np.ndarray:
        """x (flattened copy) plus what earlier rounds did not send of this tensor."""
        corrected = x.reshape(-1).astype(np.float32, copy=True)
        if self.error_feedback and name in self.residual:
            if self.residual[name].shape != corrected.shape:
                before = self.residual[name].size
                raise ValueError(f"tensor {name!r} changed size from {before} to {corrected.size}; call reset()")
            corrected += self.residual[name]
        return corrected

    def keep(self, name: str, corrected: np.ndarray, sent: np.ndarray) -> None:
        """Remember corrected - sent (what the receiver will decode) for the next round."""
        if self.error_feedback:
            self.residual[name] = corrected - sent
