"""The tokenizer interface and the character tokenizer (`load_tokenizer` is in loading.py).

Every tokenizer has the same small interface (`Tokenizer`): `encode(text) -> list[int]`,
`decode(ids) -> str`, `vocab_size`, `save(path)` / `load(path)` as one JSON file, and `info()`
(kind, vocabulary size and a fingerprint of the saved JSON) that token datasets record so that a
corpus is never read back with another tokenizer by mistake.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

CHAR_KIND = "char"
BPE_KIND = "bpe"


@runtime_checkable
class Tokenizer(Protocol):
    """What `TokenDataset`, `encode_corpus` and the training loop need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def eot_id(self) -> int | None:
        """Id of the end-of-text token put between documents, or None if there is none."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def to_json(self) -> str: ...

    def save(self, path: str | os.PathLike[str]) -> None: ...

    def info(self) -> dict[str, Any]: ...


def fingerprint(serialized: str) -> str:
    """A short content hash of a tokenizer's JSON: equal fingerprints, equal token ids."""
    return hashlib.sha256(serialized.encode("utf-8")).hexdigest()[:16]


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write `text` to `path` via a temporary file + fsync + rename: never a half-written file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CharTokenizer:
    """One token per character (Unicode code point); the vocabulary is the sorted set of characters.

    >>> tok = CharTokenizer.from_text("hello")
    >>> tok.decode(tok.encode("hole")) == "hole"
    True
    """

    kind = CHAR_KIND

    def __init__(self, chars: Iterable[str]) -> None:
        chars = sorted(set(chars))
        for ch in chars:
            if len(ch) != 1:
                raise ValueError(f"CharTokenizer expects single characters, got {ch!r}")
        if not chars:
            raise ValueError("CharTokenizer needs at least one character; got an empty vocabulary")
        self.chars: list[str] = chars
        # Sorted code points make encoding a vectorised searchsorted instead of a Python loop.
        self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)
        self._chars_array = np.array(chars)

    @classmethod
    def from_text(cls, text: str | Iterable[str]) -> CharTokenizer:
        """Build the vocabulary from a text (or an iterable of texts)."""
        chars: set[str] = set()
        for piece in [text] if isinstance(text, str) else text:
            chars.update(piece)
        return cls(chars)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    @property
    def eot_id(self) -> int | None:
        return None

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        # utf-32 without BOM gives one uint32 per code point (lone surrogates included).
        codepoints = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ids = np.searchsorted(self._codepoints, codepoints)
        ids_clipped = np.minimum(ids, len(self._codepoints) - 1)
        unknown = self._codepoints[ids_clipped] != codepoints
        if unknown.any():
            missing = sorted({chr(c) for c in codepoints[unknown].tolist()})
            shown = ", ".join(repr(c) for c in missing[:10])
            raise ValueError(
                f"CharTokenizer: {len(missing)} character(s) not in the vocabulary of "
                f"{self.vocab_size}: {shown}{' ...' if len(missing) > 10 else ''}; "
                "build the tokenizer from a text that contains them (CharTokenizer.from_text)"
            )
        return ids.tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        ids_array = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        if ids_array.size == 0:
            return ""
        bad = (ids_array < 0) | (ids_array >= self.vocab_size)
        if bad.any():
            raise ValueError(
                f"CharTokenizer.decode: id {int(ids_array[bad][0])} is out of range; "
                f"expected ids in [0, {self.vocab_size})"
            )
        return "".join(self._chars_array[ids_array].tolist())

    def to_json(self) -> str:
        return json.dumps({"kind": CHAR_KIND, "version": 1, "chars": self.chars})

    def save(self, path: str | os.PathLike[str]) -> None:
        write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, serialized: str) -> CharTokenizer:
        obj = json.loads(serialized)
        if not isinstance(obj, dict) or obj.get("kind") != CHAR_KIND or "chars" not in obj:
            raise ValueError("not a CharTokenizer JSON: expected an object with kind 'char' and 'chars'")
        return cls(obj["chars"])

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CharTokenizer:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "fingerprint": fingerprint(self.to_json())}

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
