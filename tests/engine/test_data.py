"""Tokenizers, token files, split / shard / batch sampling, and the embedded default corpus."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.data import (
    BPETokenizer,
    CharTokenizer,
    TokenDataset,
    Tokenizer,
    default_corpus,
    encode_corpus,
    encode_corpus_in_memory,
    load_tokenizer,
    stdlib_source_files,
    token_dtype,
    tokenizer_from_json,
)
from engine.data.dataset import _chunks, sidecar_path

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "class Greeter:\n    'Say héllo — 日本語 too.'\n    def greet(self, name):\n        return f'hi {name}'\n"
) * 20


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(texts=[TEXT], vocab_size=300)


# ---- tokenizers -------------------------------------------------------------------------------


def test_char_tokenizer_round_trip_and_save(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text(TEXT)
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == len(set(TEXT))
    ids = tok.encode(TEXT)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids[:5])
    assert len(ids) == len(TEXT) and tok.decode(ids) == TEXT
    assert tok.encode("") == [] and tok.decode([]) == ""
    tok.save(tmp_path / "char.json")
    again = load_tokenizer(tmp_path / "char.json")
    assert isinstance(again, CharTokenizer) and again.encode(TEXT) == ids
    assert again.info() == tok.info()


def test_char_tokenizer_errors_name_the_problem() -> None:
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"'z'.*from_text"):
        tok.encode("abz")
    with pytest.raises(ValueError, match=r"out of range.*\[0, 3\)"):
        tok.decode([0, 3])


def test_bpe_round_trip_save_load(bpe: BPETokenizer, tmp_path: Path) -> None:
    assert 256 < bpe.vocab_size <= 300
    text = "def greet(self):\n\treturn 'héllo 日本語 🙂 unseen ZZZ'  <|endoftext|>\n"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text  # byte level: any string round-trips
    assert bpe.eot_id is not None and bpe.eot_id in ids
    assert len(bpe.encode(TEXT)) < len(TEXT.encode("utf-8")) / 2  # merges were learned
    assert bpe.encode_batch([text, "ab"]) == [ids, bpe.encode("ab")]
    bpe.save(tmp_path / "bpe.json")
    again = load_tokenizer(tmp_path / "bpe.json")
    assert isinstance(again, BPETokenizer)
    assert again.encode(text) == ids and again.eot_id == bpe.eot_id
    assert again.info() == bpe.info()


def test_bpe_train_from_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(TEXT, encoding="utf-8")
    tok = BPETokenizer.train(files=[tmp_path / "a.txt"], vocab_size=280, special_tokens=())
    assert tok.eot_id is None and tok.decode(tok.encode(TEXT)) == TEXT
    with pytest.raises(ValueError, match="at least 257"):
        BPETokenizer.train(texts=["x"], vocab_size=100)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        BPETokenizer.train(files=[tmp_path / "missing.txt"], vocab_size=300)


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        load_tokenizer(tmp_path / "nope.json")
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="unknown tokenizer JSON"):
        load_tokenizer(tmp_path / "other.json")
    with pytest.raises(ValueError, match="not valid JSON"):
        tokenizer_from_json("{")


# ---- token files ------------------------------------------------------------------------------


class BigVocabTokenizer:
    """A stand-in tokenizer whose ids do not fit in uint16."""

    kind = "test-big"
    vocab_size = 70_000
    eot_id = None

    def encode(self, text: str) -> list[int]:
        return [66_000 + ord(c) % 1000 for c in text]

    def encode_batch(self, texts: Any) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Any) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        return "{}"

    def save(self, path: Any) -> None:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "vocab_size": self.vocab_size, "fingerprint": "big"}


def test_token_dtype_choice() -> None:
    assert token_dtype(256) == np.uint16
    assert token_dtype(65_536) == np.uint16  # ids 0..65535 fit
    assert token_dtype(65_537) == np.uint32
    with pytest.raises(ValueError):
        token_dtype(0)


def test_encode_corpus_memmap_uint16(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text(TEXT)
    data = encode_corpus(TEXT, tok, tmp_path / "tokens.bin")
    assert isinstance(data.tokens, np.memmap) and data.tokens.dtype == np.uint16
    assert (tmp_path / "tokens.bin").stat().st_size == 2 * len(TEXT)
    meta = json.loads(sidecar_path(tmp_path / "tokens.bin").read_text())
    assert meta["dtype"] == "uint16" and meta["count"] == len(TEXT)
    assert meta["tokenizer"] == tok.info()
    opened = TokenDataset.open(tmp_path / "tokens.bin", tokenizer=tok)
    assert tok.decode(opened.tokens) == TEXT and opened.vocab_size == tok.vocab_size
    assert not (tmp_path / "tokens.bin.tmp").exists()


def test_encode_corpus_uint32_for_big_vocab(tmp_path: Path) -> None:
    tok = BigVocabTokenizer()
    data = encode_corpus("hello", tok, tmp_path / "big.bin")
    assert data.tokens.dtype == np.uint32
    assert data.tokens.tolist() == tok.encode("hello")


def test_encode_corpus_files_with_eot_and_chunks(bpe: BPETokenizer, tmp_path: Path) -> None:
    docs = [TEXT, "print('second document')\n"]
    paths = []
    for i, doc in enumerate(docs):
        paths.append(tmp_path / f"doc{i}.py")
        paths[-1].write_text(doc, encoding="utf-8")
    # Tiny chunks: chunked encoding must give exactly the ids of encoding each document whole.
    data = encode_corpus(paths, bpe, tmp_path / "t.bin", chunk_chars=50)
    assert len(_chunks(TEXT, 50)) > 5
    expected = bpe.encode(docs[0]) + [bpe.eot_id] + bpe.encode(docs[1])
    assert data.tokens.tolist() == expected
    assert bpe.decode(data.tokens) == docs[0] + "<|endoftext|>" + docs[1]
    assert encode_corpus_in_memory(paths, bpe).tokens.tolist() == expected


def test_encode_corpus_refuses_a_str_that_names_a_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("abc")
    with pytest.raises(ValueError, match="pathlib.Path"):
        encode_corpus(str(tmp_path / "a.txt"), CharTokenizer.from_text("abc"), tmp_path / "t.bin")


def test_open_rejects_missing_stale_or_mismatched_files(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text(TEXT)
    path = tmp_path / "t.bin"
    with pytest.raises(FileNotFoundError, match="encode_corpus"):
        TokenDataset.open(path)
    encode_corpus(TEXT, tok, path)
    with pytest.raises(ValueError, match="another tokenizer"):
        TokenDataset.open(path, tokenizer=CharTokenizer.from_text("xyz"))
    with open(path, "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match="truncated or stale"):
        TokenDataset.open(path)
    sidecar_path(path).unlink()
    with pytest.raises(FileNotFoundError, match="no sidecar"):
        TokenDataset.open(path)


# ---- split, shard, batches --------------------------------------------------------------------


def positions(n: int) -> TokenDataset:
    """A dataset whose token at position p is p, so coverage is easy to check."""
    return TokenDataset(np.arange(n, dtype=np.uint32))


def test_split_is_two_views_covering_everything() -> None:
    data = positions(1000)
    train, val = data.split(0.1)
    assert len(train) == 900 and len(val) == 100
    assert np.array_equal(np.concatenate([train.tokens, val.tokens]), data.tokens)
    assert np.shares_memory(train.tokens, data.tokens) and np.shares_memory(val.tokens, data.tokens)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="val_fraction"):
            data.split(bad)
    with pytest.raises(ValueError, match="empty val"):
        positions(3).split(0.01)


@pytest.mark.parametrize("iid", [False, True])
@pytest.mark.parametrize("n_tokens, workers", [(1000, 3), (1001, 4), (10, 1), (5, 7)])
def test_shards_are_disjoint_and_cover(iid: bool, n_tokens: int, workers: int) -> None:
    data = positions(n_tokens)
    shards = [data.shard(i, workers, iid=iid, block_tokens=16) for i in range(workers)]
    everything = np.concatenate([s.tokens for s in shards])
    assert len(everything) == n_tokens  # disjoint (no position twice) ...
    assert np.array_equal(np.sort(everything), data.tokens)  # ... and covering
    if not iid:
        assert np.array_equal(everything, data.tokens)  # contiguous, in order
        assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_iid_shard_interleaves_blocks() -> None:
    shard = positions(100).shard(1, 3, iid=True, block_tokens=10)
    assert shard.tokens.tolist() == list(range(10, 20)) + list(range(40, 50)) + list(range(70, 80))
    with pytest.raises(ValueError, match="0 <= index < count"):
        positions(10).shard(3, 3)


def test_get_batch_shapes_shift_and_reproducibility(tmp_path: Path) -> None:
    data = positions(500)
    x, y = data.get_batch(8, 16, np.random.default_rng(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == np.int64
    assert np.array_equal(y, x + 1)  # y is x shifted by one token
    assert np.array_equal(x[:, 1:], y[:, :-1])
    assert x.min() >= 0 and y.max() <= 499
    x2, y2 = data.get_batch(8, 16, np.random.default_rng(0))
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    x3, _ = data.get_batch(8, 16, np.random.default_rng(1))
    assert not np.array_equal(x, x3)
    rng = np.random.default_rng(0)
    first, _ = data.get_batch(8, 16, rng)
    second, _ = data.get_batch(8, 16, rng)
    assert not np.array_equal(first, second)  # the generator advances between calls


def test_get_batch_reaches_the_last_token_and_checks_inputs() -> None:
    data = positions(10)
    x, y = data.get_batch(200, 9, np.random.default_rng(0))  # only one window fits
    assert np.array_equal(x[0], np.arange(9)) and y.max() == 9
    with pytest.raises(ValueError, match="needs 11"):
        data.get_batch(1, 10, np.random.default_rng(0))
    with pytest.raises(TypeError, match="default_rng"):
        data.get_batch(1, 4, 0)  # type: ignore[arg-type]


def test_get_batch_on_memmap_shard(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text(TEXT)
    train, _ = encode_corpus(TEXT, tok, tmp_path / "t.bin").split(0.2)
    x, y = train.shard(1, 2).get_batch(4, 8, np.random.default_rng(3))
    assert type(x) is np.ndarray and x.shape == (4, 8)
    for row_x, row_y in zip(x, y):
        assert tok.decode(row_x)[1:] == tok.decode(row_y)[:-1]
        assert tok.decode(row_x) in TEXT


# ---- default corpus ---------------------------------------------------------------------------


def test_default_corpus_is_capped_deterministic_python_source() -> None:
    text = default_corpus(200_000)
    assert 150_000 < len(text) <= 200_000 and text.endswith("\n")
    assert "def " in text and "import " in text
    assert default_corpus(200_000) == text
    assert default_corpus(50_000) == text[: len(default_corpus(50_000))]  # the cap cuts the same stream
    files = stdlib_source_files()
    assert len(files) > 100
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "test", "tests"}
    assert not any(skipped & set(f.relative_to(root).parts[:-1]) for f in files)
    with pytest.raises(ValueError):
        default_corpus(0)
