"""GPT-2 into coop: a tiny random GPT2LMHeadModel made and saved by transformers is read into engine
with the same logits and the same tokenizer, `coop train --init-from` starts from it, `[model]
init_from` fills in a run config; a directory that is missing, not a GPT-2, or of another shape than
the options given is refused with a message that says what to do."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import engine
from coop.cli import main as coop_main
from coop.hf import HFFormatError, read_hf_dir, write_hf_dir
from coop.hf.gpt2 import from_hf_tensors, to_hf_tensors
from coop.init_from import load_init_from
from coop.model_source import load_trained
from coop.runconfig import ConfigError, parse_run_config
from coop.trained import TrainedModel
from coop.training import weights_of
from engine.nn import GPT, GPTConfig

from hf_models import engine_logits, hf, hf_logits, small_bpe, tiny_gpt2_dir

TEXT = "def main(argv):\n    return 0  # done\n"


@pytest.fixture(scope="module")
def tokenizer():
    return small_bpe()


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tokenizer):
    """Made and saved by transformers (the test is skipped without it)."""
    return tiny_gpt2_dir(tmp_path_factory.mktemp("gpt2") / "tiny", tokenizer)


@pytest.fixture(scope="module")
def exported_dir(tmp_path_factory, tokenizer):
    """The same shape (2 layers, 2 heads, 32 wide, 64 positions) written by coop itself: for the tests
    of what is refused, which need no transformers."""
    engine.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=64, n_layer=2, n_head=2, n_embd=32))
    path = tmp_path_factory.mktemp("exported") / "tiny"
    write_hf_dir(TrainedModel(weights_of(model), model.config, tokenizer, "test"), path)
    return path


def ids_of(tokenizer, rows: int = 2, length: int = 40) -> np.ndarray:
    ids = tokenizer.encode(TEXT * 10)
    return np.array([ids[i:i + length] for i in range(rows)], dtype=np.int64)


def test_a_transformers_gpt2_reads_into_engine_with_the_same_logits_and_tokenizer(gpt2_dir, tokenizer):
    transformers, _ = hf()
    trained = read_hf_dir(gpt2_dir)
    assert (trained.config.n_layer, trained.config.n_head, trained.config.n_embd, trained.config.block_size,
            trained.config.vocab_size, trained.config.bias) == (2, 2, 32, 64, tokenizer.vocab_size, True)
    ids = ids_of(tokenizer)
    np.testing.assert_allclose(engine_logits(trained.model(), ids), hf_logits(gpt2_dir, ids), atol=1e-4, rtol=0)
    auto = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    assert trained.tokenizer.encode(TEXT) == auto(TEXT)["input_ids"] == tokenizer.encode(TEXT)
    assert trained.tokenizer.eot_id == tokenizer.eot_id


def test_coop_train_init_from_starts_from_the_gpt2_and_tokenizes_with_its_tokenizer(gpt2_dir, tokenizer, tmp_path):
    hf()
    out = tmp_path / "run"
    # one step at lr 1e-12: the checkpoint holds the imported weights (to far below the tolerance)
    assert coop_main(["train", "--init-from", str(gpt2_dir), "--out", str(out), "--max-steps", "1", "--lr", "1e-12",
                      "--min-lr", "0", "--warmup-steps", "0", "--batch-size", "2", "--eval-batches", "1",
                      "--default-corpus-chars", "20000", "--sample-tokens", "0", "--quiet"]) == 0
    trained = load_trained(out)
    # the directory's tokenizer (as transformers saved it), not a new one
    assert json.loads(trained.tokenizer.to_json()) == json.loads((gpt2_dir / "tokenizer.json").read_text())
    assert trained.tokenizer.encode(TEXT) == tokenizer.encode(TEXT)
    assert trained.config.block_size == 64 and trained.config.n_embd == 32
    ids = ids_of(tokenizer)
    np.testing.assert_allclose(engine_logits(trained.model(), ids), hf_logits(gpt2_dir, ids), atol=1e-4, rtol=0)
    saved = json.loads((out / "checkpoint" / "state.json").read_text())["state"]["train_config"]
    assert (saved["n_layer"], saved["block_size"], saved["init_from"]) == (2, 64, str(gpt2_dir))
    # and on from there: --resume continues with the checkpoint's tokenizer and shape
    assert coop_main(["train", "--init-from", str(gpt2_dir), "--out", str(out), "--max-steps", "2", "--resume",
                      "--batch-size", "2", "--eval-batches", "1", "--default-corpus-chars", "20000",
                      "--sample-tokens", "0", "--quiet"]) == 0
    assert load_trained(out).round == 2


def test_a_half_precision_gpt2_reads_as_float32(tmp_path, tokenizer):
    _, torch = hf()
    path = tiny_gpt2_dir(tmp_path / "bf16", tokenizer, dtype=torch.bfloat16)
    trained = read_hf_dir(path)
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(path, dtype=torch.bfloat16)
    wte = model.transformer.wte.weight.float().detach().numpy()
    np.testing.assert_array_equal(trained.weights["transformer.wte.weight"], wte)
    c_fc = model.transformer.h[1].mlp.c_fc.weight.float().detach().numpy()
    np.testing.assert_array_equal(trained.weights["transformer.h.1.mlp.c_fc.weight"], c_fc.T)


def test_old_gpt2_files_without_the_prefix_and_with_mask_buffers_read(exported_dir):
    trained = read_hf_dir(exported_dir)
    tensors = to_hf_tensors(trained.weights, trained.config)
    old = {name.removeprefix("transformer."): array for name, array in tensors.items()}
    T = trained.config.block_size
    old.update({f"h.{i}.attn.bias": np.tril(np.ones((1, 1, T, T), np.float32)) for i in range(2)})
    old["lm_head.weight"] = tensors["transformer.wte.weight"]
    back = from_hf_tensors(old, trained.config)
    assert all(np.array_equal(back[n], trained.weights[n]) for n in trained.weights)
    old["lm_head.weight"] = old["lm_head.weight"] + 1  # an untied head: engine's GPT cannot hold it
    with pytest.raises(HFFormatError, match="ties its head"):
        from_hf_tensors(old, trained.config)


def edited_copy(source, target, config=None, remove=()):
    shutil.copytree(source, target)
    if config:
        path = target / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    for name in remove:
        (target / name).unlink()
    return target


@pytest.mark.parametrize("case, expected", [
    ("missing", "no such directory"),
    ("llama", "model_type 'llama', expected 'gpt2'"),
    ("erf gelu", "activation_function 'gelu'"),
    ("eps", "layer_norm_epsilon"),
    ("pickle", "pickle"),
    ("no tokenizer", "no tokenizer.json"),
    ("shape", "--n-layer 3 (the model's: 2); --block-size 128 (the model's: 64)"),
    ("bias", "--no-bias (the model's: biases)"),
])
def test_coop_train_refuses_what_it_cannot_start_from(exported_dir, tmp_path, capsys, case, expected):
    gpt2_dir = exported_dir
    source, extra = tmp_path / "gpt2", []
    if case == "missing":
        source = tmp_path / "nowhere"
    elif case == "llama":
        edited_copy(gpt2_dir, source, {"model_type": "llama"})
    elif case == "erf gelu":
        edited_copy(gpt2_dir, source, {"activation_function": "gelu"})
    elif case == "eps":
        edited_copy(gpt2_dir, source, {"layer_norm_epsilon": 1e-6})
    elif case == "pickle":
        edited_copy(gpt2_dir, source, remove=["model.safetensors"])
        (source / "pytorch_model.bin").write_bytes(b"not read")
    elif case == "no tokenizer":
        edited_copy(gpt2_dir, source, remove=["tokenizer.json"])
    elif case == "shape":
        source, extra = gpt2_dir, ["--n-layer", "3", "--n-head", "2", "--block-size", "128"]
    else:
        source, extra = gpt2_dir, ["--no-bias"]
    code = coop_main(["train", "--init-from", str(source), "--out", str(tmp_path / "run"), "--max-steps", "1",
                      "--quiet", *extra])
    err = capsys.readouterr().err
    assert code == 2 and f"coop train: --init-from {source}: " in err and expected in err, err
    assert err.count("\n") == 1
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_a_run_config_init_from_fills_in_the_shape_and_refuses_a_disagreeing_one(exported_dir, tokenizer, tmp_path):
    gpt2_dir = exported_dir
    config, trained = load_init_from(parse_run_config({"model": {"init_from": str(gpt2_dir), "dropout": 0.1}}))
    model = config.model
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size, model.vocab_size, model.dropout) == \
        (2, 2, 32, 64, tokenizer.vocab_size, 0.1)
    assert config.gpt_config(trained.tokenizer.vocab_size) == trained.config
    # the filled-in config needs no directory: it is what the coordinator records and the peers receive
    assert parse_run_config(config.model_dump()) == config
    agreeing = parse_run_config({"model": {"init_from": str(gpt2_dir), "n_layer": 2, "n_embd": 32, "n_head": 2}})
    assert load_init_from(agreeing)[0] == config.model_copy(update={"model": model.model_copy(update={"dropout": 0.0})})
    with pytest.raises(ConfigError, match=r"model.n_layer = 4 \(the directory's: 2\); model.block_size = 32 "
                                          r"\(the directory's: 64\); leave these keys out"):
        load_init_from(parse_run_config({"model": {"init_from": str(gpt2_dir), "n_layer": 4, "block_size": 32}}))
    with pytest.raises(ConfigError, match="no such directory"):
        load_init_from(parse_run_config({"model": {"init_from": str(tmp_path / "nowhere")}}))
    with pytest.raises(ConfigError, match="outer.fragments 4 is more than the model's 2 layers"):
        load_init_from(parse_run_config({"model": {"init_from": str(gpt2_dir)}, "outer": {"fragments": 4},
                                         "inner": {"steps": 8}}))
