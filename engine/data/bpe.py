"""Byte-level BPE (GPT-2 style) on the `tokenizers` package.

Byte level: the 256 byte values are in the vocabulary before any merge, so every string encodes
(no unknown token) and decode(encode(text)) == text exactly. The saved file is the `tokenizers`
package's own JSON, so other tools can read it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.data.tokenizer import BPE_KIND, fingerprint, write_text_atomic

DEFAULT_SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>",)
BYTE_ALPHABET_SIZE = 256


def _hf() -> Any:
    try:
        import tokenizers  # optional at import time: loaded when a BPE tokenizer is first used
    except ImportError as e:  # the rest of engine works without it
        raise ImportError("BPETokenizer needs the `tokenizers` package: pip install tokenizers") from e
    return tokenizers


class BPETokenizer:
    """A byte-level BPE tokenizer: `BPETokenizer.train(...)`, then encode / decode / save / load."""

    kind = BPE_KIND

    def __init__(self, hf_tokenizer: Any, special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS) -> None:
        self._tok = hf_tokenizer
        self.special_tokens = [t for t in special_tokens if self._tok.token_to_id(t) is not None]

    @classmethod
    def train(
        cls,
        files: Sequence[str | os.PathLike[str]] = (),
        texts: Iterable[str] = (),
        vocab_size: int = 4096,
        special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn merges from text files and/or in-memory texts until `vocab_size` tokens.

        `vocab_size` counts the 256 byte tokens and the special tokens too; the first special
        token (by default "<|endoftext|>") is the one `encode_corpus` puts between documents.
        """
        hf = _hf()
        minimum = BYTE_ALPHABET_SIZE + len(special_tokens)
        if vocab_size < minimum:
            raise ValueError(
                f"BPETokenizer.train: vocab_size={vocab_size} is too small; a byte-level BPE needs at "
                f"least {minimum} (256 bytes + {len(special_tokens)} special tokens)"
            )
        paths = [Path(f) for f in files]
        for p in paths:
            if not p.is_file():
                raise FileNotFoundError(f"BPETokenizer.train: no such text file: {p}")
        texts = [texts] if isinstance(texts, str) else texts

        tok = hf.Tokenizer(hf.models.BPE())
        tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = hf.decoders.ByteLevel()
        trainer = hf.trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(special_tokens),
            initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )

        def all_texts() -> Iterable[str]:
            for p in paths:
                yield p.read_text(encoding="utf-8", errors="replace")
            yield from texts

        tok.train_from_iterator(all_texts(), trainer=trainer)
        return cls(tok, special_tokens)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eot_id(self) -> int | None:
        return self._tok.token_to_id(self.special_tokens[0]) if self.special_tokens else None

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # The Rust side encodes the batch on all cores.
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(
                f"BPETokenizer.decode: id {bad[0]} is out of range; expected ids in [0, {self.vocab_size})"
            )
        return self._tok.decode(ids, skip_special_tokens=False)

    def to_json(self) -> str:
        return self._tok.to_str()

    def save(self, path: str | os.PathLike[str]) -> None:
        write_text_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, serialized: str) -> BPETokenizer:
        tok = _hf().Tokenizer.from_str(serialized)
        special = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
        return cls(tok, special)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BPETokenizer:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no BPE tokenizer file at {path}; train one and save it first")
        return cls.from_json(path.read_text(encoding="utf-8"))

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "fingerprint": fingerprint(self.to_json())}

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"
