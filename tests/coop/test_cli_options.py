"""The real commands refuse every bad option with one line on stderr and exit status 2, before any
work; `--config FILE` (TOML) gives the same options, the flags given win over it, unknown keys are
named; `--device auto` is the default and says what it chose."""
from __future__ import annotations

import subprocess
import sys

import pytest

TINY_TRAIN = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "2",
              "--eval-batches", "1", "--sample-tokens", "0", "--default-corpus-chars", "20000", "--quiet"]


def coop(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coop.cli", *argv], capture_output=True, text=True, timeout=timeout)


def assert_refused_in_one_line(result: subprocess.CompletedProcess, prefix: str, *words: str) -> str:
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "\n" not in err and "Traceback" not in err and err.startswith(prefix), err
    for word in words:
        assert word in err, err
    return err


@pytest.mark.parametrize("argv, words", [
    (["--eval-every", "-1"], ["--eval-every -1", "greater than or equal to 0"]),
    (["--log-every", "0"], ["--log-every 0", "greater than or equal to 1"]),
    (["--grad-accum", "0"], ["--grad-accum 0"]),
    (["--precision", "bogus"], ["--precision", "'bogus'", "'auto', 'bf16', 'fp8', 'fp32'"]),
    (["--max-steps", "0"], ["--max-steps 0"]),
    (["--max-steps", "ten"], ["--max-steps", "'ten'"]),
    (["--tokenizer", "words"], ["--tokenizer", "'char', 'bpe'"]),
    (["--device", "tpu"], ["--device tpu", "auto, cpu, cuda"]),
    (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"]),
    (["--data", "absent.txt"], ["--data absent.txt: no such file"]),
])
def test_coop_train_refuses_a_bad_flag_in_one_line(tmp_path, argv, words):
    result = coop("train", "--out", str(tmp_path / "run"), *argv)
    # unknown flags are the top parser's to refuse (argparse gives it what no subcommand took)
    assert_refused_in_one_line(result, "coop: " if "--no-such-flag" in argv else "coop train: ", *words)
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.mark.parametrize("text, words", [
    ("max_step = 3\n", ["unknown key 'max_step'", "did you mean max_steps?"]),
    ("max_steps = 0\n", ["max_steps = 0", "greater than or equal to 1"]),
    ("max_steps = [\n", ["is not valid TOML"]),
    ("[model]\nn_layer = 2\n", ["[model] is a table", "run config"]),
    ("precision = \"fp64\"\n", ["precision = 'fp64'", "'auto', 'bf16', 'fp8' or 'fp32'"]),
    ("n_embd = 30\n", ["--n-embd 30 must be a multiple of --n-head 4"]),
])
def test_coop_train_refuses_a_bad_config_file_in_one_line(tmp_path, text, words):
    config = tmp_path / "train.toml"
    config.write_text(text)
    result = coop("train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert_refused_in_one_line(result, "coop train: ", *words)


def test_a_missing_config_file_is_refused(tmp_path):
    assert_refused_in_one_line(coop("train", "--config", str(tmp_path / "absent.toml")), "coop train: ",
                               "--config", "no such file")


def test_the_flags_given_override_the_config_file_and_device_auto_says_what_it_chose(tmp_path):
    config = tmp_path / "train.toml"
    out = tmp_path / "run"
    config.write_text(f'max-steps = 2\neval_every = 1\nout = "{out}"\nn_embd = 64\n')
    result = coop("train", "--config", str(config), "--max-steps", "3", "--n-embd", "16", *TINY_TRAIN)
    assert result.returncode == 0, result.stderr
    assert "done: 3 steps" in result.stdout  # --max-steps 3 wins over the file's 2
    assert (out / "metrics.jsonl").read_text().count("\n") == 3  # the file's eval_every = 1 stands
    import engine
    chosen = "device cuda:0" if engine.cuda.is_available() else "device cpu (no GPU"
    assert result.stdout.count(chosen) == 1  # --device auto chose, and said so once


@pytest.mark.parametrize("argv, words", [
    (["--rounds", "0"], ["--rounds 0", "greater than or equal to 1"]),
    (["--split", "random"], ["--split", "'random'"]),
    (["--compression", "zip"], ["--compression", "'zip'"]),
    (["--inner-steps", "0"], ["--inner-steps 0"]),
    (["--fragments", "3"], ["--fragments 3", "dividing --inner-steps 20"]),
    (["--drop-prob", "1"], ["--drop-prob 1.0", "less than 1"]),
    (["--rounds", "2", "--tokens", "100"], ["not both"]),
    (["--join-at", "x"], ["--join-at 'x'", "replica:round"]),
])
def test_coop_simulate_refuses_a_bad_flag_in_one_line(tmp_path, argv, words):
    result = coop("simulate", "--out", str(tmp_path / "sim"), *argv)
    assert_refused_in_one_line(result, "coop simulate: ", *words)
    assert not (tmp_path / "sim").exists()


def test_coop_simulate_reads_a_config_file_and_refuses_unknown_keys(tmp_path, capsys):
    from coop.cli import main as coop_main
    config = tmp_path / "sim.toml"
    config.write_text("replicas = 2\ninner_steps = 2\nrounds = 1\nn_layer = 1\nn_head = 2\nn_embd = 16\n"
                      "block_size = 16\nbatch_size = 2\neval_batches = 1\ndefault_corpus_chars = 20000\n"
                      'compression = "fp32"\nbaseline = ["none"]\nplot = false\nquiet = true\n')
    out = tmp_path / "sim"
    assert coop_main(["simulate", "--config", str(config), "--out", str(out), "--rounds", "2"]) == 0
    printed = capsys.readouterr().out
    assert "2 replicas x K=2 x 2 rounds" in printed and "| diloco-fp32 |" in printed
    config.write_text("replica = 2\n")
    assert coop_main(["simulate", "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == (f"coop simulate: --config {config}: unknown key 'replica' (did you mean "
                                               "replicas?); the keys are this command's long options, e.g. "
                                               "max_steps = 100")


def test_help_lists_the_choices_and_the_config_option():
    train_help = coop("train", "-h").stdout
    assert "{auto,bf16,fp8,fp32}" in train_help and "{char,bpe}" in train_help and "--config FILE" in train_help
    assert "auto (cuda when" in train_help
    simulate_help = coop("simulate", "-h").stdout
    assert "{iid,contiguous,whole}" in simulate_help and "--config FILE" in simulate_help


def test_workers_and_peers_take_device_auto_and_refuse_a_bad_device_in_one_line():
    import engine
    worker = [sys.executable, "-m", "coop.worker_cli", "join", "http://127.0.0.1:9", "--retry-for", "0"]
    result = subprocess.run([*worker, "--device", "tpu"], capture_output=True, text=True, timeout=60)
    assert_refused_in_one_line(result, "coop-worker join: ", "--device", "'tpu'")
    if not engine.cuda.is_available():
        result = subprocess.run([*worker, "--device", "cuda"], capture_output=True, text=True, timeout=60)
        assert_refused_in_one_line(result, "coop-worker join: ", "CUDA is not available")
    result = subprocess.run(worker, capture_output=True, text=True, timeout=60)  # auto, then nobody at the URL
    chosen = "cuda:0" if engine.cuda.is_available() else "cpu (no GPU"
    assert result.stderr.startswith(f"coop-worker: device {chosen}") and "cannot reach" in result.stderr, result.stderr
    assert_refused_in_one_line(coop("swarm", "start", "--device", "cuda:x"), "coop swarm start: ", "'cuda:x'")
