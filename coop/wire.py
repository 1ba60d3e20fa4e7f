"""Named numpy arrays + JSON metadata <-> bytes, as one safetensors blob.

Layout (the safetensors format, https://github.com/huggingface/safetensors):

    8 bytes   little-endian u64 N, the header length
    N bytes   JSON header: {"__metadata__": {"json": "<our metadata as a JSON string>"},
                            "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
    rest      the tensors' bytes, back to back, offsets relative to the end of the header

Everything that arrives from the network is untrusted, so `unpack` checks the header itself
(sizes, dtypes, shapes, offsets that tile the data exactly) before any array is built, and
`check_tensors` / `check_metadata` let the caller compare what came with what the model expects.
Every refusal is a `WireError` (a `ValueError`): the HTTP layers turn it into a 4xx.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import safetensors.numpy  # writes; reading is ours (checked header, then numpy views)

from .threads import copy_all

# Metadata lives under this key of the safetensors "__metadata__" map (which only holds strings).
METADATA_KEY = "json"
# A default ceiling on one message: a 124M-parameter fp32 model is ~0.5 GB, so 4 GiB leaves room
# for larger models while still refusing absurd bodies. Callers pass their own, tighter bound.
DEFAULT_MAX_BYTES = 4 << 30
# The safetensors library itself refuses headers over 100 MB; ours are a few KB per 100 tensors.
MAX_HEADER_BYTES = 100_000_000
# Our headers nest 3 deep (header -> entry -> shape) and our metadata a few levels more; 64 leaves
# room while refusing the 100,000 nested "[" that would exhaust Python's recursion limit in json.
MAX_JSON_DEPTH = 64

# safetensors dtype tag <-> numpy dtype, for the dtypes coop puts on the wire. bf16 travels as
# U16 (numpy has no bfloat16); see coop.codec.
_DTYPE_OF_TAG: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
_SUPPORTED = ", ".join(str(d) for d in _DTYPE_OF_TAG.values())


class WireError(ValueError):
    """Bytes or tensors from the network that coop refuses (malformed, truncated, oversized,
    or not what the model expects). The message says what was expected and what came."""


UPLOAD_CHUNK = 8 << 20  # memoryview slices of 8 MB: httpx uploads them ~6x faster than one bytes object


def upload_chunks(body: bytes | bytearray | memoryview, chunk: int = UPLOAD_CHUNK) -> Iterator[memoryview]:
    """A packed body as the slices an httpx upload should be given (`content=upload_chunks(body)`),
    without copying it: what the worker's and the peers' uploads both send."""
    view = memoryview(body).cast("B")
    for start in range(0, view.nbytes, chunk):
        yield view[start : start + chunk]


def pack(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any] | None = None) -> bytes:
    """Serialize named arrays and JSON-able metadata into safetensors bytes.

    Arrays are written little-endian and C-contiguous; the metadata must be JSON without NaN or
    infinity (it goes into the header as one JSON string).
    """
    return safetensors.numpy.save(_wire_arrays(tensors), metadata={METADATA_KEY: _metadata_json(metadata)})


def pack_view(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any] | None = None) -> memoryview:
    """`pack`, as a memoryview of a buffer of its own laid out first (`lay_out`), the arrays copied
    in on every core: for a large body that is only sent (a worker's upload, through
    `upload_chunks`). GPT-2's int8 update: 0.25 s in `pack`, 0.06 s here, on 2 cores."""
    arrays = _wire_arrays(tensors)
    laid = lay_out(spec_of(arrays), metadata)
    copy_all((laid.tensors[name] for name in arrays), arrays.values())
    return laid.body


def _wire_arrays(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The named arrays checked for the wire, little-endian and C-contiguous (views where they are)."""
    arrays: dict[str, np.ndarray] = {}
    for name, array in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensor names must be non-empty strings other than '__metadata__', got {name!r}")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"tensor {name!r}: expected a numpy array, got {type(array).__name__}")
        if array.dtype.newbyteorder("<") not in _DTYPE_OF_TAG.values():
            raise TypeError(f"tensor {name!r}: dtype {array.dtype} cannot go on the wire; use one of {_SUPPORTED}")
        # np.asarray(order="C"), not ascontiguousarray, which turns 0-d arrays into shape (1,).
        arrays[name] = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
    return arrays


@dataclass(frozen=True)
class Laid:
    """A message laid out in one buffer before its values exist: `tensors` are writable views of
    the buffer's data, so whatever is computed into them is already the `body` (no packing copy,
    no second copy of the arrays in memory). Once the body is served, the views must not change."""

    body: memoryview
    tensors: dict[str, np.ndarray]

    def flat(self, names: list[str]) -> np.ndarray | None:
        """The tensors `names` as one flat array (a view), if they lie back to back in this order
        and share a dtype; else None."""
        return flat_view([self.tensors[name] for name in names])


def flat_view(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """The arrays as one flat array, a view of the buffer they are views of (a message's body), if
    they lie in it back to back in this order and share a dtype; else None (arrays of their own)."""
    if not arrays or any(a.dtype != arrays[0].dtype or not a.flags.c_contiguous for a in arrays):
        return None
    owner = _owner(arrays[0])
    if any(_owner(a) is not owner for a in arrays):
        return None
    start = position = arrays[0].ctypes.data
    for array in arrays:
        if array.ctypes.data != position:
            return None
        position += array.nbytes
    data = np.frombuffer(owner, dtype=np.uint8)
    offset = start - data.ctypes.data
    return data[offset : offset + position - start].view(arrays[0].dtype)


def _owner(array: np.ndarray) -> Any:
    """What holds an array's memory, through views and memoryviews: a buffer (bytes, bytearray) or an array of its own."""
    while True:
        if isinstance(array, np.ndarray) and array.base is not None:
            array = array.base
        elif isinstance(array, memoryview):
            array = array.obj
        else:
            return array


def lay_out(specs: Mapping[str, TensorSpec], metadata: Mapping[str, Any] | None = None) -> Laid:
    """The safetensors layout of `pack(tensors, metadata)` for tensors of these specs, in one
    buffer, the header written and the data uninitialised. Tensors are placed by decreasing
    itemsize, so every view is aligned, and in the given order among equal itemsizes (a model's
    float32 tensors are one flat vector in its order: `Laid.flat`); the header is padded to 8
    bytes as safetensors pads it. `unpack` and the safetensors library both read the body."""
    tags = {dtype: tag for tag, dtype in _DTYPE_OF_TAG.items()}
    header: dict[str, Any] = {"__metadata__": {METADATA_KEY: _metadata_json(metadata)}}
    order = sorted(specs, key=lambda name: -np.dtype(specs[name].dtype).itemsize)  # stable: the given order
    offset = 0
    for name in order:
        spec = specs[name]
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        if dtype not in tags:
            raise TypeError(f"tensor {name!r}: dtype {spec.dtype} cannot go on the wire; use one of {_SUPPORTED}")
        size = math.prod(spec.shape) * dtype.itemsize
        header[name] = {"dtype": tags[dtype], "shape": list(spec.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    buffer = np.empty(8 + len(raw) + offset, dtype=np.uint8)
    buffer[:8] = np.frombuffer(struct.pack("<Q", len(raw)), dtype=np.uint8)
    buffer[8 : 8 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    base, tensors = 8 + len(raw), {}
    for name in order:
        entry = header[name]
        begin, end = entry["data_offsets"]
        dtype = _DTYPE_OF_TAG[entry["dtype"]]
        tensors[name] = buffer[base + begin : base + end].view(dtype).reshape(specs[name].shape)
    return Laid(memoryview(buffer), {name: tensors[name] for name in specs})


def _metadata_json(metadata: Mapping[str, Any] | None) -> str:
    try:
        return json.dumps(dict(metadata or {}), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"metadata must be JSON-able without NaN/inf (plain dicts, lists, str, numbers): {error}") from error


def unpack(
    data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES, *, copy: bool = True
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse bytes made by `pack` back into (tensors, metadata), refusing anything malformed.

    Raises WireError if the input is larger than `max_bytes`, truncated, has a header that is not
    the safetensors layout, an unsupported dtype, sizes that do not match the shapes, overlapping
    or gapped data offsets, or trailing bytes.

    copy=True (the default): writable arrays of their own. copy=False: read-only views into
    `data`, nothing copied (they keep `data` alive; a caller that later changes a writable buffer
    changes the arrays too). For a 0.5 GB fp32 update the views save about a second of a 2-core
    machine and the memory of the copies; a receiver that only reads, decodes or accumulates
    (the coordinator) wants them.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B")
    header, metadata, base = parse_header(view, view.nbytes, max_bytes)
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        dtype = _DTYPE_OF_TAG[entry["dtype"]]
        begin, end = entry["data_offsets"]
        # (B,) bytes of the tensor -> its dtype and shape; a slice of a memoryview copies nothing
        array = np.frombuffer(view[base + begin : base + end], dtype=dtype).reshape(entry["shape"])
        if copy:
            array = array.astype(dtype.newbyteorder("="), copy=True)  # writable, native byte order
        else:
            array.flags.writeable = False
        tensors[name] = array
    return tensors, metadata


def _parse_metadata(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise WireError("safetensors '__metadata__' must map strings to strings")
    if METADATA_KEY not in raw:
        return {}
    metadata = parse_json(raw[METADATA_KEY], MAX_HEADER_BYTES, what="metadata")
    if not isinstance(metadata, dict):
        raise WireError(f"metadata must be a JSON object, got {type(metadata).__name__}")
    return metadata


def json_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), found without
    recursion and without a Python loop: brackets count +1 ("[", "{") or -1 ("]", "}") unless
    they sit inside a string, i.e. after an odd number of unescaped quotes. (~0.1 s per 100 MB.)"""
    text = np.frombuffer(raw, np.uint8)
    if text.size == 0:
        return 0
    position = np.arange(text.size)
    backslash = text == ord("\\")
    # for each byte, the index of the last byte at or before it that is not a backslash
    last_plain = np.maximum.accumulate(np.where(backslash, -1, position))
    run_before = np.zeros(text.size, np.int64)  # backslashes right before each byte
    run_before[1:] = position[:-1] - last_plain[:-1]
    quote = (text == ord('"')) & (run_before % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0  # a closing quote itself counts as outside: it is not a bracket
    opens = outside & ((text == ord("[")) | (text == ord("{")))
    closes = outside & ((text == ord("]")) | (text == ord("}")))
    return int(np.cumsum(opens.astype(np.int32) - closes.astype(np.int32)).max(initial=0))


def parse_json(raw: bytes | str, max_bytes: int, max_depth: int = MAX_JSON_DEPTH, *, what: str = "JSON") -> Any:
    """json.loads with a size and a nesting-depth limit: untrusted text that would exhaust memory
    or the recursion limit (a RecursionError, a 500 to an HTTP client) is a WireError instead."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if len(data) > max_bytes:
        raise WireError(f"{what} is {len(data)} bytes, the limit is {max_bytes}")
    depth = json_depth(data)
    if depth > max_depth:
        raise WireError(f"{what} nests {depth} levels deep, the limit is {max_depth}; coop never sends more than a few")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise WireError(f"{what} is not UTF-8 JSON: {error}") from error


def dtype_of_tag(tag: str) -> np.dtype:
    """The numpy dtype of a safetensors dtype tag coop accepts ("F32" -> float32)."""
    return np.dtype(_DTYPE_OF_TAG[tag].newbyteorder("="))


def header_length(prefix: bytes | memoryview, size: int, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """The header length a message of `size` bytes declares in its first 8 bytes (`prefix`), checked
    against the size and the limits."""
    if size > max_bytes:
        raise WireError(f"message is {size} bytes, the limit is {max_bytes}; send a smaller update or raise the limit")
    if size < 8:
        raise WireError(f"message is {size} bytes, too short for the 8-byte safetensors length prefix (truncated?)")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > MAX_HEADER_BYTES:
        raise WireError(f"safetensors header claims {length} bytes, the limit is {MAX_HEADER_BYTES}")
    if 8 + length > size:
        raise WireError(f"safetensors header claims {length} bytes but only {size - 8} follow the prefix (truncated?)")
    return length


def parse_header(head: bytes | memoryview, size: int,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The checked header of a message of `size` bytes whose first bytes are `head` (at least the
    length prefix and the header): (tensor entries, our metadata, where the data starts). Every
    entry is known to fit the message exactly, so a reader of the data can trust its offsets (as
    `unpack` does, and a coordinator checking an upload from its spool file)."""
    length = header_length(head, size, max_bytes)
    if len(head) < 8 + length:
        raise ValueError(f"parse_header needs the first {8 + length} bytes, got {len(head)}")
    header = parse_json(bytes(head[8 : 8 + length]), MAX_HEADER_BYTES, what="safetensors header")
    if not isinstance(header, dict):
        raise WireError(f"safetensors header must be a JSON object, got {type(header).__name__}")
    metadata = _parse_metadata(header.pop("__metadata__", None))
    _check_layout(header, size - 8 - length)  # after this, every entry is known to fit exactly
    return header, metadata, 8 + length


def _check_layout(header: dict[str, Any], data_len: int) -> None:
    """Each entry has a known dtype, a shape of non-negative ints, and offsets whose length is
    prod(shape) * itemsize; together the offsets tile [0, data_len) with no gap or overlap."""
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise WireError(f"tensor {name!r}: header entry must have exactly dtype, shape, data_offsets; got {entry!r:.200}")
        tag, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if tag not in _DTYPE_OF_TAG:
            raise WireError(f"tensor {name!r}: dtype {tag!r} is not accepted; expected one of {sorted(_DTYPE_OF_TAG)}")
        if not isinstance(shape, list) or not all(_is_nonneg_int(d) for d in shape):
            raise WireError(f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r:.200}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_nonneg_int(o) for o in offsets)):
            raise WireError(f"tensor {name!r}: data_offsets must be [begin, end], got {offsets!r:.200}")
        begin, end = offsets
        expected = math.prod(shape) * _DTYPE_OF_TAG[tag].itemsize
        if end - begin != expected:
            raise WireError(f"tensor {name!r}: shape {shape} of {tag} needs {expected} bytes, offsets give {end - begin}")
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise WireError(f"tensor {name!r}: data starts at {begin}, expected {position} (gap or overlap)")
        position = end
    if position != data_len:
        if position > data_len:
            raise WireError(f"tensors need {position} data bytes but only {data_len} came (truncated?)")
        raise WireError(f"{data_len - position} trailing bytes after the last tensor")


def _is_nonneg_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ----------------------------------------------------------------------------------------------
# Checking an unpacked update against what the receiver expects.


@dataclass(frozen=True)
class TensorSpec:
    """What one named tensor must look like."""

    shape: tuple[int, ...]
    dtype: np.dtype


def spec_of(tensors: Mapping[str, np.ndarray]) -> dict[str, TensorSpec]:
    """The spec that arrays like these have (e.g. the global weights: what every update must match)."""
    return {name: TensorSpec(tuple(array.shape), np.dtype(array.dtype)) for name, array in tensors.items()}


def check_tensors(
    tensors: Mapping[str, np.ndarray],
    expected: Mapping[str, TensorSpec],
    *,
    require_finite: bool = True,
    what: str = "update",
) -> None:
    """Raise WireError unless `tensors` has exactly the expected names, shapes and dtypes and
    (with `require_finite`) only finite values. Changes nothing, so a refused update leaves no trace."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise WireError(
            f"{what} has the wrong tensor names: missing {_few(missing)}, unexpected {_few(unexpected)}; "
            "is the sender running the same model config?"
        )
    for name, spec in expected.items():
        array = tensors[name]
        if not isinstance(array, np.ndarray):
            raise WireError(f"{what}: tensor {name!r} should be a numpy array, got {type(array).__name__}")
        if tuple(array.shape) != tuple(spec.shape):
            raise WireError(f"{what}: tensor {name!r} has shape {tuple(array.shape)}, expected {tuple(spec.shape)}")
        if np.dtype(array.dtype) != np.dtype(spec.dtype):
            raise WireError(f"{what}: tensor {name!r} has dtype {array.dtype}, expected {np.dtype(spec.dtype)}")
        if require_finite and array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(array.size - np.count_nonzero(np.isfinite(array)))
            raise WireError(f"{what}: tensor {name!r} has {bad} non-finite values (NaN/inf); the sender's training diverged")


def check_metadata(
    metadata: Mapping[str, Any], required: Mapping[str, type | tuple[type, ...]], *, what: str = "metadata"
) -> None:
    """Raise WireError unless every key in `required` is present with a value of the given type(s).
    bool is not accepted where int is asked for (JSON true is not a round number)."""
    for key, kind in required.items():
        if key not in metadata:
            raise WireError(f"{what} lacks {key!r}; it has {_few(sorted(metadata))}")
        value = metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise WireError(f"{what}: {key!r} should be {names}, got {type(value).__name__} {value!r:.100}")


def _few(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"[{shown}{more}]"
