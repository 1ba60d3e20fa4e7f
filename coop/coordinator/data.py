"""The run's data, prepared once by the coordinator: the corpus is tokenized into the state
directory (data/tokens.bin, memory-mapped), split into train and val, and the train part is cut
into `data.shards` shards that workers download, so that a worker needs nothing but the URL."""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from coop.runconfig import DataSection
from coop.wire import pack
from engine.data import TokenDataset, encode_corpus, load_tokenizer
from engine.data.tokenizer import write_text_atomic

log = logging.getLogger("coop.coordinator")


class RunData:
    def __init__(self, tokenizer: Any, tokens: TokenDataset, section: DataSection):
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.section = section
        self.train, self.val = tokens.split(section.val_fraction)
        self._shard_bytes: dict[int, bytes] = {}
        # names this exact data (corpus section + tokenizer): workers key their shard cache on it
        self.data_id = hashlib.sha256(json.dumps([section.model_dump(), tokenizer.info(), len(tokens)],
                                                 sort_keys=True).encode()).hexdigest()[:16]
        # iid shards deal blocks round-robin; small enough blocks that each shard gets at least 8
        self.block_tokens = max(1, min(1 << 16, len(self.train) // (8 * section.shards)))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def shard(self, index: int) -> TokenDataset:
        return self.train.shard(index, self.section.shards, iid=self.section.iid_shards, block_tokens=self.block_tokens)

    def shard_body(self, index: int) -> bytes:
        """Shard `index` as safetensors bytes: {"tokens": uint16/uint32 (n,)} + metadata (cached)."""
        if index not in self._shard_bytes:
            part = self.shard(index)
            metadata = {"index": index, "count": self.section.shards, "tokens": len(part), "data_id": self.data_id,
                        "tokenizer": self.tokenizer.info()}
            self._shard_bytes[index] = pack({"tokens": np.ascontiguousarray(part.tokens)}, metadata)
        return self._shard_bytes[index]

    def describe(self) -> dict[str, Any]:
        return {"path": self.section.path, "tokenizer": self.tokenizer.info(), "vocab_size": self.vocab_size,
                "train_tokens": len(self.train), "val_tokens": len(self.val), "shards": self.section.shards}


def prepare_data(section: DataSection, data_dir: Path, block_size: int, tokenizer: Any = None) -> RunData:
    """Tokenize the corpus into `data_dir` the first time; later starts reuse the files, as long
    as they were made from the same data section (recorded in data_dir/section.json). `tokenizer`:
    tokenize with this one instead of the section's (a model's own, [model] init_from), and reuse
    files only if they were made with it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tokens_path, tokenizer_path, section_path = data_dir / "tokens.bin", data_dir / "tokenizer.json", data_dir / "section.json"
    wanted = section.model_dump()
    if section_path.is_file() and tokenizer_path.is_file() and json.loads(section_path.read_text()) == wanted:
        try:
            saved = load_tokenizer(tokenizer_path)
            if tokenizer is not None and saved.to_json() != tokenizer.to_json():
                raise ValueError("it was tokenized with another tokenizer than the model's")
            data = RunData(saved, TokenDataset.open(tokens_path, saved), section)
            log.info("data: reusing %s (%d tokens)", tokens_path, len(data.tokens))
            return _checked(data, block_size)
        except (OSError, ValueError) as error:
            log.warning("data: cannot reuse %s (%s); tokenizing again", tokens_path, error)
    section_path.unlink(missing_ok=True)  # written last: its presence means the files below are complete
    text = section.corpus_text()
    tokenizer = tokenizer if tokenizer is not None else section.new_tokenizer(text)
    log.info("data: tokenizing %d characters with %r", len(text), tokenizer)
    write_text_atomic(tokenizer_path, tokenizer.to_json())
    tokens = encode_corpus(text, tokenizer, tokens_path)
    write_text_atomic(section_path, json.dumps(wanted))
    return _checked(RunData(tokenizer, tokens, section), block_size)


def _checked(data: RunData, block_size: int) -> RunData:
    smallest = min(len(data.shard(i)) for i in range(data.section.shards))
    if smallest < block_size + 1 or len(data.val) < block_size + 1:
        raise ValueError(f"the corpus is too small: the smallest shard has {smallest} tokens and val {len(data.val)}, "
                         f"a window of block_size {block_size} needs {block_size + 1}; use more text, fewer shards "
                         "or a smaller block_size")
    return data
