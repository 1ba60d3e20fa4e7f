"""Token datasets: a corpus encoded once to a flat uint16/uint32 file, memory-mapped.

On disk: `tokens.bin` (the ids back to back, native little-endian) and `tokens.bin.json`, a small
sidecar with the dtype, the token count and the tokenizer's info. The sidecar is written last, so
a file without one (an interrupted encode) is never read.

In memory: a `TokenDataset` is a 1-D view of token ids; `split` and `shard` return views of the
same memory map (the iid shard is the one exception: it gathers blocks into a new array).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.data.tokenizer import Tokenizer, write_text_atomic

FORMAT = "coop-tokens"
FORMAT_VERSION = 1
DEFAULT_CHUNK_CHARS = 1 << 20
DEFAULT_SHARD_BLOCK_TOKENS = 1 << 16


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab_size <= 65536), else uint32."""
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise ValueError(f"vocab_size {vocab_size} does not fit in uint32 token ids")


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".json")


class TokenDataset:
    """A 1-D sequence of token ids with train/val split, worker shards and random windows."""

    def __init__(self, tokens: np.ndarray, tokenizer_info: dict[str, Any] | None = None) -> None:
        tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise ValueError(
                f"TokenDataset expects a 1-D integer array of token ids, got shape {tokens.shape} dtype {tokens.dtype}"
            )
        self.tokens = tokens
        self.tokenizer_info: dict[str, Any] = dict(tokenizer_info or {})

    @classmethod
    def open(cls, path: str | os.PathLike[str], tokenizer: Tokenizer | None = None) -> TokenDataset:
        """Memory-map a file written by `encode_corpus`; with `tokenizer`, check it is the same one."""
        path = Path(path)
        meta_path = sidecar_path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no token file at {path}; create it with encode_corpus(...)")
        if not meta_path.is_file():
            raise FileNotFoundError(
                f"{path} has no sidecar {meta_path.name}: it was not written by encode_corpus or the "
                "write was interrupted; run encode_corpus again"
            )
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            if meta.get("format") != FORMAT:
                raise ValueError(f"format is {meta.get('format')!r}, expected {FORMAT!r}")
            dtype = np.dtype(meta["dtype"])
            count = int(meta["count"])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{meta_path} is not a valid token-file sidecar ({e}); run encode_corpus again") from e
        if dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):
            raise ValueError(f"{meta_path}: dtype {dtype} is not uint16 or uint32; run encode_corpus again")
        size = path.stat().st_size
        if size != count * dtype.itemsize:
            raise ValueError(
                f"{path} holds {size} bytes but its sidecar says {count} {dtype} tokens "
                f"({count * dtype.itemsize} bytes): the file is truncated or stale; run encode_corpus again"
            )
        info = dict(meta.get("tokenizer") or {})
        if tokenizer is not None and info.get("fingerprint") not in (None, tokenizer.info()["fingerprint"]):
            raise ValueError(
                f"{path} was encoded with another tokenizer ({info}) than the one given "
                f"({tokenizer.info()}); encode the corpus again with this tokenizer or load the original"
            )
        tokens = np.memmap(path, dtype=dtype, mode="r", shape=(count,)) if count else np.zeros(0, dtype)
        return cls(tokens, info)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def vocab_size(self) -> int | None:
        return self.tokenizer_info.get("vocab_size")

    def __repr__(self) -> str:
        return f"TokenDataset({len(self)} tokens, dtype={self.tokens.dtype}, tokenizer={self.tokenizer_info})"

    def _view(self, tokens: np.ndarray) -> TokenDataset:
        return TokenDataset(tokens, self.tokenizer_info)

    def split(self, val_fraction: float) -> tuple[TokenDataset, TokenDataset]:
        """(train, val): the first 1 - val_fraction of the tokens and the last val_fraction, as views."""
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        n = len(self)
        n_val = round(n * val_fraction)
        if n_val == 0 or n_val == n:
            raise ValueError(
                f"split({val_fraction}) of {n} tokens leaves an empty {'val' if n_val == 0 else 'train'} "
                "set; use more data or another val_fraction"
            )
        return self._view(self.tokens[: n - n_val]), self._view(self.tokens[n - n_val :])

    def shard(
        self, index: int, count: int, iid: bool = False, block_tokens: int = DEFAULT_SHARD_BLOCK_TOKENS
    ) -> TokenDataset:
        """Worker `index` of `count` gets its own part; the parts are disjoint and cover every token.

        Contiguous (default): one slice of about len/count tokens, a view. `iid=True`: blocks of
        `block_tokens` are dealt round-robin (block k goes to worker k % count), so every worker sees
        text from all over the corpus; this gathers a copy, and a window may straddle two blocks.
        """
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard(index, count) needs count >= 1 and 0 <= index < count, got ({index}, {count})")
        n = len(self)
        if not iid:
            return self._view(self.tokens[index * n // count : (index + 1) * n // count])
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be positive, got {block_tokens}")
        starts = range(index * block_tokens, n, count * block_tokens)
        pieces = [self.tokens[s : s + block_tokens] for s in starts]
        gathered = np.concatenate(pieces) if pieces else np.zeros(0, self.tokens.dtype)
        return self._view(np.asarray(gathered))

    def get_batch(self, batch_size: int, block_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Random windows x (B, T) and targets y (B, T), int64: y is x shifted by one token.

        Windows start uniformly in [0, len - block_size); the same `rng` state gives the same batch.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(
                f"get_batch needs an np.random.Generator, got {type(rng).__name__}; "
                "pass np.random.default_rng(seed) and keep it between calls"
            )
        if batch_size < 1 or block_size < 1:
            raise ValueError(f"batch_size and block_size must be >= 1, got {batch_size}, {block_size}")
        n = len(self)
        if n < block_size + 1:
            raise ValueError(
                f"dataset has {n} tokens, a window of block_size={block_size} needs {block_size + 1}; "
                "use a smaller block_size or more data"
            )
        starts = rng.integers(0, n - block_size, size=batch_size)
        windows = np.asarray(self.tokens[starts[:, None] + np.arange(block_size + 1)], dtype=np.int64)  # (B, T+1)
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])


def _documents(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Iterator[str]:
    """A `str` is a text; an `os.PathLike` (pathlib.Path) is a UTF-8 file; an iterable mixes both."""
    items: Iterable[Any] = [source] if isinstance(source, (str, os.PathLike)) else source
    for item in items:
        if isinstance(item, os.PathLike):
            path = Path(item)
            if not path.is_file():
                raise FileNotFoundError(f"encode_corpus: no such text file: {path}")
            yield path.read_text(encoding="utf-8", errors="replace")
        elif isinstance(item, str):
            if "\n" not in item and len(item) < 4096 and os.path.isfile(item):
                raise ValueError(
                    f"encode_corpus got the str {item!r}, which names a file; a str is encoded as text. "
                    "Pass pathlib.Path(...) to encode the file's contents"
                )
            yield item
        else:
            raise TypeError(f"encode_corpus expects str texts or pathlib.Path files, got {type(item).__name__}")


def _chunks(text: str, chunk_chars: int) -> list[str]:
    """Cut `text` into pieces of about `chunk_chars`, only after a newline between two non-spaces.

    The byte-level pre-tokenizer always splits there, so encoding the pieces gives exactly the ids
    of encoding the whole text, with bounded memory and in parallel.
    """
    pieces: list[str] = []
    start = 0
    while len(text) - start > chunk_chars:
        cut = text.find("\n", start + chunk_chars)
        while cut != -1 and (cut + 1 >= len(text) or text[cut + 1].isspace() or text[cut - 1].isspace()):
            cut = text.find("\n", cut + 1)
        if cut == -1:
            break
        pieces.append(text[start : cut + 1])
        start = cut + 1
    pieces.append(text[start:])
    return pieces


def encode_corpus(
    source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    tokenizer: Tokenizer,
    path: str | os.PathLike[str],
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
) -> TokenDataset:
    """Encode texts / files once into `path` (+ `path`.json sidecar) and return it memory-mapped.

    Documents are separated by the tokenizer's end-of-text token when it has one. The token file
    is written to a temporary name, fsynced and renamed; the sidecar is written after it.
    """
    path = Path(path)
    dtype = token_dtype(tokenizer.vocab_size)
    eot = tokenizer.eot_id
    tmp = path.with_name(path.name + ".tmp")
    meta_path = sidecar_path(path)
    meta_path.unlink(missing_ok=True)  # a stale sidecar must never describe the new file
    count = 0
    documents = 0
    with open(tmp, "wb") as f:
        for doc_index, text in enumerate(_documents(source)):
            if doc_index > 0 and eot is not None:
                f.write(np.array([eot], dtype=dtype).tobytes())
                count += 1
            chunks = _chunks(text, chunk_chars)
            for first in range(0, len(chunks), 16):
                for ids in tokenizer.encode_batch(chunks[first : first + 16]):
                    arr = np.asarray(ids, dtype=np.int64)
                    if arr.size and (arr.min() < 0 or arr.max() >= tokenizer.vocab_size):
                        raise ValueError(f"tokenizer produced id {int(arr.max())} outside [0, {tokenizer.vocab_size})")
                    f.write(arr.astype(dtype).tobytes())
                    count += arr.size
            documents += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    meta = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": dtype.name,
        "count": count,
        "documents": documents,
        "tokenizer": tokenizer.info(),
    }
    write_text_atomic(meta_path, json.dumps(meta, indent=1))
    return TokenDataset.open(path)


def encode_corpus_in_memory(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], tokenizer: Tokenizer
) -> TokenDataset:
    """Like `encode_corpus` without a file: for small corpora and tests."""
    ids: list[int] = []
    for doc_index, text in enumerate(_documents(source)):
        if doc_index > 0 and tokenizer.eot_id is not None:
            ids.append(tokenizer.eot_id)
        ids.extend(tokenizer.encode(text))
    return TokenDataset(np.asarray(ids, dtype=token_dtype(tokenizer.vocab_size)), tokenizer.info())
