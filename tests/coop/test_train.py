"""coop train: a run interrupted and resumed from its checkpoint is bit-for-bit the uninterrupted run."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from coop.train import TrainConfig, train
from engine.checkpoint import load_checkpoint

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


def tiny(tmp_path, name, **overrides) -> TrainConfig:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    cfg = dict(data=[str(corpus)], out=str(tmp_path / name), n_layer=1, n_head=2, n_embd=16, block_size=16,
               batch_size=4, max_steps=12, warmup_steps=3, eval_every=4, eval_batches=2, checkpoint_every=4,
               log_every=2, sample_tokens=0, dropout=0.1, quiet=True)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def test_resume_continues_bit_for_bit(tmp_path):
    straight = train(tiny(tmp_path, "straight"), log=lambda *a: None)
    interrupted = tiny(tmp_path, "cut", max_steps=12)
    # simulate a crash after step 6: train 6 steps with the 12-step schedule, then resume
    from coop.train import Trainer

    t = Trainer(interrupted, log=lambda *a: None)
    t.out.mkdir(parents=True, exist_ok=True)
    for _ in range(6):
        t.train_step()
    t.save()
    del t
    resumed = train(tiny(tmp_path, "cut", resume=True), log=lambda *a: None)
    a = load_checkpoint(tmp_path / "straight" / "checkpoint")["model"]
    b = load_checkpoint(tmp_path / "cut" / "checkpoint")["model"]
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert resumed["steps"] == straight["steps"] == 12


def test_training_lowers_the_loss_and_writes_metrics(tmp_path):
    summary = train(tiny(tmp_path, "run", max_steps=40, lr=3e-3, dropout=0.0, eval_every=20), log=lambda *a: None)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [20, 40]
    assert summary["val_loss"] < 3.0 < np.log(26)  # a char model at chance would sit near log(vocab)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint"):
        train(tiny(tmp_path, "none", resume=True), log=lambda *a: None)


def test_resume_with_another_model_is_a_clear_error(tmp_path):
    train(tiny(tmp_path, "run", max_steps=4), log=lambda *a: None)
    with pytest.raises(SystemExit, match="differs"):
        train(tiny(tmp_path, "run", max_steps=8, n_embd=32, resume=True), log=lambda *a: None)


def test_cli_runs_on_the_default_corpus(tmp_path):
    out = subprocess.run([sys.executable, "-m", "coop.cli", "train", "--max-steps", "3", "--n-layer", "1",
                          "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--batch-size", "2",
                          "--eval-every", "3", "--eval-batches", "1", "--sample-tokens", "20",
                          "--default-corpus-chars", "200000", "--out", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "done: 3 steps" in out.stdout and "sample:" in out.stdout


def test_no_bias_trains_a_model_without_biases(tmp_path):
    """--no-bias (nanoGPT's shakespeare_char model): no bias parameters in the Linear and LayerNorm layers."""
    train(tiny(tmp_path, "nobias", max_steps=4, bias=False), log=lambda *a: None)
    names = list(load_checkpoint(tmp_path / "nobias" / "checkpoint")["model"])
    assert names and not [n for n in names if n.endswith(".bias")]
    with_bias = tiny(tmp_path, "bias", max_steps=4)
    train(with_bias, log=lambda *a: None)
    assert [n for n in load_checkpoint(tmp_path / "bias" / "checkpoint")["model"] if n.endswith(".bias")]
