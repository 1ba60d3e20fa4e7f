"""`coop export CHECKPOINT OUT_DIR --format hf` against transformers: real `coop train` checkpoints
(char, BPE, no biases) load with GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained
and give the engine's logits and token ids; what cannot map exits 2 with one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from coop.cli import main as coop_main
from coop.hf import read_hf_dir
from coop.model_source import load_trained
from coop.train import TrainConfig, train
from engine.checkpoint import save_checkpoint
from engine.data import CharTokenizer, default_corpus
from engine.nn import GPT, GPTConfig

from hf_models import engine_logits, hf, hf_logits

TEXT = "def f(x, y):\n\treturn x , y  # é\n\nclass A :\n    pass\n"


def trained_checkpoint(out, **options) -> str:
    """A real `coop train` run on Python's source with TEXT's tabs, carriage returns and accents in it."""
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.txt"
    corpus.write_text(default_corpus(40_000) + TEXT * 20, encoding="utf-8", newline="")
    train(TrainConfig(data=[str(corpus)], out=str(out), max_steps=6, n_layer=2, n_head=2, n_embd=16, block_size=32,
                      batch_size=4, eval_batches=1, sample_tokens=0, quiet=True, **options), log=lambda *_: None)
    return str(out / "checkpoint")


@pytest.fixture(scope="module")
def char_checkpoint(tmp_path_factory):
    return trained_checkpoint(tmp_path_factory.mktemp("char"))


def export(checkpoint, out) -> None:
    assert coop_main(["export", checkpoint, str(out), "--format", "hf"]) == 0


def some_ids(trained, rows: int = 2) -> np.ndarray:
    ids = trained.tokenizer.encode(TEXT * 3)
    T = trained.config.block_size
    return np.array([ids[i:i + T] for i in range(rows)], dtype=np.int64)


def test_a_char_model_loads_in_transformers_with_the_same_logits(char_checkpoint, tmp_path):
    hf()
    export(char_checkpoint, tmp_path / "gpt2")
    config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    assert config["layer_norm_epsilon"] == 1e-5 and config["tie_word_embeddings"] is True
    assert config["bos_token_id"] is None and config["eos_token_id"] is None  # a char vocabulary has none
    trained = load_trained(char_checkpoint)
    ids = some_ids(trained)
    ours = engine_logits(trained.model(), ids)
    np.testing.assert_allclose(hf_logits(tmp_path / "gpt2", ids), ours, atol=1e-4, rtol=0)


def test_the_char_tokenizer_gives_the_same_ids_through_auto_tokenizer(char_checkpoint, tmp_path):
    transformers, _ = hf()
    export(char_checkpoint, tmp_path / "gpt2")
    tokenizer = load_trained(char_checkpoint).tokenizer
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "gpt2")
    ids = tokenizer.encode(TEXT)
    assert auto(TEXT)["input_ids"] == ids
    assert auto.decode(ids) == TEXT  # no spaces put between characters, " ," left alone
    with pytest.raises(Exception):  # a character outside the vocabulary fails on both sides, as in CharTokenizer
        auto("\u2603")["input_ids"]
    with pytest.raises(ValueError):
        tokenizer.encode("\u2603")


def test_the_char_form_maps_every_kind_of_character():
    """Control characters, line and paragraph separators, combining marks, astral emoji: one token each."""
    import tokenizers

    from coop.hf.tokenizer import char_tokenizer_json, tokenizer_from_hf_json

    text = "a\r\nb\x00\x0b\x0c\u2028\u2029\x85 e\u0301 \U0001F600\t\ufeff"
    tokenizer = CharTokenizer.from_text(text)
    serialized = char_tokenizer_json(tokenizer)
    assert tokenizers.Tokenizer.from_str(serialized).encode(text).ids == tokenizer.encode(text)
    assert tokenizers.Tokenizer.from_str(serialized).decode(tokenizer.encode(text)) == text
    back = tokenizer_from_hf_json(serialized)
    assert isinstance(back, CharTokenizer) and back.chars == tokenizer.chars


def test_the_export_reads_back_exactly(char_checkpoint, tmp_path):
    export(char_checkpoint, tmp_path / "gpt2")
    trained, back = load_trained(char_checkpoint), read_hf_dir(tmp_path / "gpt2")
    assert isinstance(back.tokenizer, CharTokenizer) and back.tokenizer.chars == trained.tokenizer.chars
    assert back.config == trained.config
    assert back.weights.keys() == trained.weights.keys()
    for name, array in trained.weights.items():
        np.testing.assert_array_equal(back.weights[name], array, err_msg=name)


def test_a_bpe_model_exports_as_gpt2_byte_level_bpe(tmp_path):
    transformers, _ = hf()
    checkpoint = trained_checkpoint(tmp_path / "bpe", tokenizer="bpe", vocab_size=300)
    export(checkpoint, tmp_path / "gpt2")
    trained = load_trained(checkpoint)
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "gpt2")
    text = TEXT + "\u2603 never seen <|endoftext|> after"
    assert auto(text)["input_ids"] == trained.tokenizer.encode(text)
    assert auto.decode(trained.tokenizer.encode(text)) == text
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == trained.tokenizer.eot_id
    model_config = json.loads((tmp_path / "gpt2" / "config.json").read_text())
    generation = json.loads((tmp_path / "gpt2" / "generation_config.json").read_text())
    assert model_config["eos_token_id"] == generation["eos_token_id"] == trained.tokenizer.eot_id
    ids = some_ids(trained)
    np.testing.assert_allclose(hf_logits(tmp_path / "gpt2", ids), engine_logits(trained.model(), ids), atol=1e-4,
                               rtol=0)


def test_a_model_without_biases_gets_zero_biases(tmp_path):
    transformers, _ = hf()
    checkpoint = trained_checkpoint(tmp_path / "nobias", bias=False)
    export(checkpoint, tmp_path / "gpt2")
    trained = load_trained(checkpoint)
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    assert all(not p.any() for name, p in model.named_parameters() if name.endswith(".bias"))
    ids = some_ids(trained)
    np.testing.assert_allclose(hf_logits(tmp_path / "gpt2", ids), engine_logits(trained.model(), ids), atol=1e-4,
                               rtol=0)


def fake_checkpoint(path, tokenizer, vocab_size: int) -> str:
    """A checkpoint with coop train's layout, for tokenizers and vocabularies training never makes."""
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=8, n_layer=1, n_head=1, n_embd=8))
    save_checkpoint(path, model=model.state_dict(), model_config=model.config.to_dict(), tokenizer=tokenizer.to_json(),
                    step=0)
    return str(path)


@pytest.mark.parametrize("case, expected", [
    ("surrogate", "lone surrogate"),
    ("small vocab", "the tokenizer has 3 tokens but the model only 2"),
    ("missing", "no checkpoint at"),
    ("not empty", "is not an empty directory"),
])
def test_what_cannot_be_exported_exits_2_with_one_line(tmp_path, capsys, case, expected):
    out = tmp_path / "out"
    if case == "surrogate":  # Python strings may hold lone surrogates; UTF-8 tokenizer.json cannot
        checkpoint = fake_checkpoint(tmp_path / "ckpt", CharTokenizer(["a", "b", "\ud800"]), 3)
    elif case == "small vocab":
        checkpoint = fake_checkpoint(tmp_path / "ckpt", CharTokenizer("abc"), 2)
    elif case == "missing":
        checkpoint = str(tmp_path / "nothing")
    else:
        checkpoint = fake_checkpoint(tmp_path / "ckpt", CharTokenizer("abc"), 3)
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert coop_main(["export", checkpoint, str(out), "--format", "hf"]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.startswith("coop export: ") and err.count("\n") == 1, err
    if case != "not empty":
        assert not out.exists()  # nothing half-written
    else:
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
