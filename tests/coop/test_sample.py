"""`coop sample`: text from a real `coop train` checkpoint; greedy is deterministic, a seed repeats
a sample, the KV cache gives what the full forward gives, bad input exits 2 with one line."""
import pytest

from coop.cli import main as coop_main
from coop.sample import sample
from coop.train import TrainConfig, train


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    train(TrainConfig(out=str(out), max_steps=30, n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=8,
                      default_corpus_chars=30_000, eval_batches=1, sample_tokens=0, quiet=True), log=lambda *_: None)
    return str(out / "checkpoint")


def test_samples_continue_the_prompt_and_repeat_with_the_seed(checkpoint):
    a = sample(checkpoint, "def ", 40, temperature=0.8, top_k=10, seed=3, samples=2)
    b = sample(checkpoint, "def ", 40, temperature=0.8, top_k=10, seed=3, samples=2)
    assert a == b and all(text.startswith("def ") and len(text) == 44 for text in a)
    assert a[0] != a[1]  # two samples, two texts
    assert sample(checkpoint, "def ", 40, temperature=0.8, seed=4) != sample(checkpoint, "def ", 40, temperature=0.8,
                                                                              seed=5)


def test_greedy_is_deterministic_and_the_nucleus_of_a_tiny_p_is_greedy(checkpoint):
    greedy = sample(checkpoint, "class ", 20, temperature=0)
    assert greedy == sample(checkpoint, "class ", 20, temperature=0, seed=9)
    assert sample(checkpoint, "class ", 20, temperature=1.0, top_p=1e-9, seed=1) == greedy


def test_the_command_prints_the_text_and_refuses_bad_options(checkpoint, capsys, tmp_path):
    assert coop_main(["sample", checkpoint, "--prompt", "import ", "--max-new-tokens", "10", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("import ")
    assert coop_main(["sample", checkpoint, "--top-p", "1.5"]) == 2
    assert "--top-p 1.5 (expected in (0, 1])" in capsys.readouterr().err
    assert coop_main(["sample", str(tmp_path / "none")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
