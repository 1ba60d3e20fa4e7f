"""Checkpoints: array leaves in a safetensors file, everything else in JSON. No pickle.

    save_checkpoint("runs/x/ckpt", model=model.state_dict(), optimizer=opt.state_dict(),
                    step=step, rng=rng.bit_generator.state)
    state = load_checkpoint("runs/x/ckpt")     # arrays come back as numpy arrays

A checkpoint is a directory `path/` holding `tensors.safetensors` (keys are dotted paths such as
"model.h.0.attn.weight") and `state.json` (the structure, with {"__tensor__": key} placeholders and
the sha256 of the tensor file). State may nest dicts (any JSON-able keys: str, int, ...), lists,
tuples, str / int / float / bool / None, numpy scalars, numpy arrays, and tensors (any object with
`.numpy()` and `.shape`). Python ints of any size survive, so numpy's RNG state round-trips.

Atomic replace: the new checkpoint is written complete to `path.tmp/` (fsynced), then
`path/` -> `path.prev/`, `path.tmp/` -> `path/`, and `path.prev/` is removed. Each rename is atomic,
so at every instant `path/` or `path.prev/` is a complete checkpoint; `load_checkpoint` falls back to
`path.prev/` when `path/` is missing, and the next save puts it back first.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from safetensors import SafetensorError

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
FORMAT = "coop-checkpoint"
FORMAT_VERSION = 1

# Reserved keys of the JSON encoding; a dict with one of them as a key is stored as __items__.
TENSOR_KEY = "__tensor__"
TUPLE_KEY = "__tuple__"
ITEMS_KEY = "__items__"
_RESERVED = frozenset({TENSOR_KEY, TUPLE_KEY, ITEMS_KEY})


class CheckpointError(Exception):
    """A checkpoint that cannot be written or read (corrupt, incomplete, or not a checkpoint)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint at the given path."""


def _is_tensor_leaf(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (callable(getattr(value, "numpy", None)) and hasattr(value, "shape"))


def _to_numpy(value: Any, where: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        if callable(getattr(value, "detach", None)):
            value = value.detach()
        value = value.numpy()
    array = np.asarray(value, order="C")  # (ascontiguousarray would turn 0-d into 1-d)
    if array.dtype == object or array.dtype.kind in "USV":
        raise CheckpointError(
            f"checkpoint state at '{where}' is an array of dtype {array.dtype}; only numeric arrays can be saved"
        )
    return array


class _Encoder:
    """Splits a state tree into a JSON-able tree and a flat {dotted key: array} dict."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}

    def encode(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.void)):
            return value.item()
        if _is_tensor_leaf(value):
            return {TENSOR_KEY: self._add_tensor(_to_numpy(value, where), where)}
        if isinstance(value, dict):
            plain = all(isinstance(k, str) and k not in _RESERVED for k in value)
            if plain:
                return {k: self.encode(v, _join(where, k)) for k, v in value.items()}
            return {
                ITEMS_KEY: [[self.encode(k, where), self.encode(v, _join(where, str(k)))] for k, v in value.items()]
            }
        if isinstance(value, list):
            return [self.encode(v, _join(where, str(i))) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {TUPLE_KEY: [self.encode(v, _join(where, str(i))) for i, v in enumerate(value)]}
        raise CheckpointError(
            f"checkpoint state at '{where}' is a {type(value).__name__}; expected dict, list, tuple, str, "
            "int, float, bool, None, a numpy array or a tensor (convert it, e.g. to a dict, before saving)"
        )

    def _add_tensor(self, array: np.ndarray, where: str) -> str:
        # Keys only need to be unique (the JSON placeholder names the key); a dotted path can
        # collide ({"a.b": x} vs {"a": {"b": y}}), so add a suffix then.
        key, n = where, 1
        while key in self.tensors:
            n += 1
            key = f"{where}#{n}"
        self.tensors[key] = array
        return key


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _decode(value: Any, tensors: dict[str, np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if TENSOR_KEY in value:
        key = value[TENSOR_KEY]
        if key not in tensors:
            raise CheckpointError(f"{STATE_FILE} refers to tensor '{key}', which is missing from {TENSORS_FILE}")
        return tensors[key]
    if TUPLE_KEY in value:
        return tuple(_decode(v, tensors) for v in value[TUPLE_KEY])
    if ITEMS_KEY in value:
        return {_hashable(_decode(k, tensors)): _decode(v, tensors) for k, v in value[ITEMS_KEY]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory; the renames are still atomic there
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _siblings(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".tmp"), path.with_name(path.name + ".prev")


def _recover(path: Path) -> None:
    """Finish or undo a save that was interrupted, so that `path/` is the latest complete checkpoint."""
    tmp, prev = _siblings(path)
    if prev.exists():
        if path.exists():
            shutil.rmtree(prev)  # crashed after the swap: prev is the old checkpoint, no longer needed
        else:
            os.replace(prev, path)  # crashed between the two renames: put the old checkpoint back
            _fsync_dir(path.parent)
    if tmp.exists():
        shutil.rmtree(tmp)  # crashed while writing: the new checkpoint is incomplete


def _check_replaceable(path: Path) -> None:
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"{path} exists and is a file; a checkpoint is a directory. Choose another path")
    unexpected = sorted(set(os.listdir(path)) - {TENSORS_FILE, STATE_FILE})
    if unexpected:
        raise CheckpointError(
            f"{path} exists and holds files that are not part of a checkpoint ({', '.join(unexpected[:5])}); "
            "refusing to replace it. Choose another path or remove it"
        )


def save_checkpoint(path: str | os.PathLike[str], **state: Any) -> None:
    """Write `state` as the checkpoint directory `path/`, atomically replacing any previous one."""
    write_checkpoint(path, state)


def write_checkpoint(path: str | os.PathLike[str], state: dict[str, Any],
                     tensors_written: Callable[[], None] | None = None) -> None:
    """save_checkpoint, with `tensors_written` called once the arrays of `state` have been read
    (written to the file, not yet on the disk): from then on the caller may change them, or drop
    them (nothing here holds them any more), while the fsync, the hash and the renames go on."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _recover(path)
    _check_replaceable(path)

    encoder = _Encoder()
    tree = encoder.encode(state, "")

    tmp, prev = _siblings(path)
    tmp.mkdir()
    tensors_path = tmp / TENSORS_FILE
    safetensors.numpy.save_file(encoder.tensors, str(tensors_path))
    tensor_count = len(encoder.tensors)
    encoder.tensors.clear()
    if tensors_written is not None:
        tensors_written()
    _fsync_file(tensors_path)
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "tensors_sha256": _sha256(tensors_path),
        "tensor_count": tensor_count,
        "state": tree,
    }
    with open(tmp / STATE_FILE, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)

    if path.exists():
        os.replace(path, prev)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    if prev.exists():
        shutil.rmtree(prev)


def load_checkpoint(path: str | os.PathLike[str], verify: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint`; arrays come back as numpy arrays.

    With `verify`, the tensor file's sha256 is checked against the one recorded at save time.
    """
    path = Path(path)
    if not path.exists():
        _, prev = _siblings(path)
        if not prev.is_dir():
            raise CheckpointNotFoundError(
                f"no checkpoint at {path}; save one with save_checkpoint(path, ...) or check the path"
            )
        path = prev  # a save was interrupted between its two renames: prev is the last complete one
    state_path, tensors_path = path / STATE_FILE, path / TENSORS_FILE
    if not path.is_dir() or not state_path.is_file():
        raise CheckpointError(f"{path} is not a checkpoint: expected a directory with {STATE_FILE} and {TENSORS_FILE}")
    try:
        manifest = json.loads(state_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{state_path} is corrupt (not valid JSON: {e}); load an earlier checkpoint") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "state" not in manifest:
        raise CheckpointError(f"{state_path} is not a {FORMAT} state file; was it written by save_checkpoint?")
    if manifest.get("version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {manifest['version']}, newer than this code reads ({FORMAT_VERSION}); upgrade coop"
        )
    if not tensors_path.is_file():
        raise CheckpointError(f"{path} is incomplete: {TENSORS_FILE} is missing; load an earlier checkpoint")
    if verify and _sha256(tensors_path) != manifest.get("tensors_sha256"):
        raise CheckpointError(
            f"{tensors_path} is corrupt: its sha256 differs from the one recorded in {STATE_FILE}; "
            "load an earlier checkpoint"
        )

    try:
        tensors = safetensors.numpy.load_file(str(tensors_path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{tensors_path} is corrupt ({e}); load an earlier checkpoint") from e
    state = _decode(manifest["state"], tensors)
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_path}: expected the saved state to be an object, got {type(state).__name__}")
    return state
