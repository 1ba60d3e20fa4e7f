"""Reading a saved tokenizer back whichever kind it is: `tokenizer_from_json`, `load_tokenizer`."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.data.bpe import BPETokenizer
from engine.data.tokenizer import CHAR_KIND, CharTokenizer, Tokenizer


def tokenizer_from_json(serialized: str) -> Tokenizer:
    """Rebuild a tokenizer from what its `to_json()` returned, whichever kind it is."""
    try:
        obj = json.loads(serialized)
    except json.JSONDecodeError as e:
        raise ValueError(f"tokenizer JSON is not valid JSON ({e})") from e
    if isinstance(obj, dict) and obj.get("kind") == CHAR_KIND:
        return CharTokenizer.from_json(serialized)
    # A byte-level BPE file is the `tokenizers` package's own format (so other tools can read it).
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        return BPETokenizer.from_json(serialized)
    raise ValueError(
        "unknown tokenizer JSON: expected a CharTokenizer file (kind 'char') or a `tokenizers` "
        "BPE file (with a 'model' object)"
    )


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Load a tokenizer saved by `CharTokenizer.save` or `BPETokenizer.save`, detecting the kind."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}; save one with tokenizer.save(path) first")
    try:
        return tokenizer_from_json(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e
