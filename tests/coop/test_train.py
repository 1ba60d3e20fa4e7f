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


@pytest.mark.parametrize("option, message", [
    (["--grad-accum", "0"], "--grad-accum 0: input should be greater than or equal to 1"),
    (["--log-every", "0"], "--log-every 0: input should be greater than or equal to 1"),
    (["--max-steps", "0"], "--max-steps 0: input should be greater than or equal to 1"),
    (["--lr", "-1"], "--lr -1.0: input should be greater than 0"),
    (["--n-embd", "30", "--n-head", "4"], "--n-embd 30 must be a multiple of --n-head 4"),
    (["--val-fraction", "1.5"], "--val-fraction 1.5: input should be less than 1"),
    (["--eval-every", "-1"], "--eval-every -1: input should be greater than or equal to 0"),
    (["--device", "tpu"], "--device tpu: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
])
def test_bad_train_options_exit_2_with_one_line_before_any_work(tmp_path, capsys, option, message):
    from coop.cli import main as coop_main
    assert coop_main(["train", "--out", str(tmp_path / "run"), *option]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("coop train: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_bad_choice_is_refused_by_the_parser_in_one_line_and_listed_in_help(tmp_path, capsys):
    from coop.cli import main as coop_main
    with pytest.raises(SystemExit) as exit_info:
        coop_main(["train", "--precision", "bogus"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "choose from 'auto', 'bf16', 'fp8', 'fp32'" in err and "\n" not in err, err
    with pytest.raises(SystemExit):
        coop_main(["train", "-h"])
    assert "{auto,bf16,fp8,fp32}" in capsys.readouterr().out


def test_eval_and_checkpoint_every_0_mean_only_at_the_end(tmp_path, capsys):
    from coop.cli import main as coop_main
    out = tmp_path / "run"
    assert coop_main(["train", "--out", str(out), "--eval-every", "0", "--checkpoint-every", "0", "--max-steps", "3",
                      "--quiet", "--sample-tokens", "0", "--default-corpus-chars", "20000", "--n-layer", "1",
                      "--n-embd", "16", "--n-head", "2", "--block-size", "16", "--eval-batches", "1"]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and '"step": 3' in lines[0]  # one evaluation: the last step's
    assert (out / "checkpoint").exists()


def test_coop_version(capsys):
    from coop import __version__
    from coop.cli import main as coop_main
    with pytest.raises(SystemExit) as exit_info:
        coop_main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"coop {__version__}"


def test_ctrl_c_writes_a_checkpoint_that_resume_continues_from(tmp_path):
    import signal
    import time
    out = tmp_path / "run"
    args = [sys.executable, "-m", "coop.cli", "train", "--out", str(out), "--max-steps", "100000",
            "--eval-every", "5", "--checkpoint-every", "0", "--eval-batches", "1", "--sample-tokens", "0",
            "--default-corpus-chars", "20000", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
            "--block-size", "16", "--quiet"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert "checkpoint written to" in output and "Traceback" not in output, output
    step = load_checkpoint(out / "checkpoint")["step"]
    assert step >= 10  # nothing lost: the step it stopped at
    resumed = subprocess.run([*args[:7], str(step + 3), *args[8:], "--resume"], capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert load_checkpoint(out / "checkpoint")["step"] == step + 3
