"""Small real models for the Hugging Face tests: a tiny random GPT-2 made by transformers itself,
logits of both sides, and the transformers/torch imports that skip a test where they are absent."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokenizers

import engine
from engine.data import BPETokenizer, default_corpus


def hf():
    """(transformers, torch), or the test is skipped."""
    return pytest.importorskip("transformers"), pytest.importorskip("torch")


def small_bpe(vocab_size: int = 300) -> BPETokenizer:
    return BPETokenizer.train(texts=[default_corpus(30_000)], vocab_size=vocab_size)


def tiny_gpt2_dir(path: Path, tokenizer: BPETokenizer, seed: int = 0, n_positions: int = 64, pad_vocab: int = 0,
                  dtype=None) -> Path:
    """A random GPT2LMHeadModel (2 layers, 2 heads, 32 wide) saved by save_pretrained, every
    parameter drawn from N(0, 0.3) (biases and layer norms too, so that none of them is trivial),
    with `tokenizer` saved beside it by transformers."""
    transformers, torch = hf()
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=n_positions,
                                     vocab_size=tokenizer.vocab_size + pad_vocab, bos_token_id=tokenizer.eot_id,
                                     eos_token_id=tokenizer.eot_id)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    if dtype is not None:
        model = model.to(dtype)
    model.save_pretrained(path)
    wrapped = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(tokenizer.to_json()),
                                                   bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    wrapped.save_pretrained(path)
    return path


def hf_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    """(B, T) ids -> (B, T, V) float32 logits of GPT2LMHeadModel.from_pretrained(path), in eval mode."""
    transformers, torch = hf()
    model = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def engine_logits(model, ids: np.ndarray) -> np.ndarray:
    model.eval()
    with engine.no_grad():
        return model(engine.tensor(ids))[0].numpy()
