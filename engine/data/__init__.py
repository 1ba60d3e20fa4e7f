"""Tokenizers, token datasets and batch sampling.

    tok = CharTokenizer.from_text(text)            # or BPETokenizer.train(files=[...], vocab_size=4096)
    data = encode_corpus(text, tok, "tokens.bin")  # once; later TokenDataset.open("tokens.bin")
    train, val = data.split(0.1)
    mine = train.shard(worker_index, worker_count)
    x, y = mine.get_batch(16, 128, np.random.default_rng(0))   # int64 (B, T) numpy arrays
"""

from engine.data.bpe import BPETokenizer
from engine.data.corpus import default_corpus, stdlib_source_files
from engine.data.dataset import TokenDataset, encode_corpus, encode_corpus_in_memory, token_dtype
from engine.data.loading import load_tokenizer, tokenizer_from_json
from engine.data.tokenizer import CharTokenizer, Tokenizer

__all__ = [
    "BPETokenizer",
    "CharTokenizer",
    "TokenDataset",
    "Tokenizer",
    "default_corpus",
    "encode_corpus",
    "encode_corpus_in_memory",
    "load_tokenizer",
    "stdlib_source_files",
    "token_dtype",
    "tokenizer_from_json",
]
