"""Models in and out of cooperative runs, end to end: a real coordinator started from a GPT-2
directory ([model] init_from) serves its global model at GET /v1/model to those with the run's
token, and `coop sample` / `coop export` read what it returns and its state directory; a real peer
started from the same directory writes its final model to --out."""
from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest
from p2p_helpers import PeerProcess

import engine
from coop.cli import main as coop_main
from coop.hf import read_hf_dir, write_hf_dir
from coop.trained import TrainedModel, read_model_file
from coop.training import weights_of
from engine.data import BPETokenizer, default_corpus
from engine.nn import GPT, GPTConfig

from conftest import REPO, Coordinator, Worker, child_env, run_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A GPT-2 directory of TINY_RUN's shape (1 layer, 2 heads, 32 wide, 32 positions) with a small
    byte-level BPE, random weights: what `coop export` writes and transformers reads."""
    tokenizer = BPETokenizer.train(texts=[default_corpus(30_000)], vocab_size=300)
    engine.manual_seed(11)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=32))
    path = tmp_path_factory.mktemp("gpt2") / "tiny"
    write_hf_dir(TrainedModel(weights_of(model), model.config, tokenizer, "test"), path)
    return path


def coop_sample(path, prompt: str = "def ") -> str:
    """`coop sample PATH` as a user runs it: a process of its own."""
    result = subprocess.run([sys.executable, "-m", "coop.cli", "sample", str(path), "--prompt", prompt,
                             "--max-new-tokens", "12", "--seed", "1"], cwd=REPO, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def download(coordinator: Coordinator, path) -> int:
    response = httpx.get(coordinator.url + "/v1/model", headers=coordinator.headers(), timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    path.write_bytes(response.content)
    return int(response.headers["X-Coop-Round"])


def test_a_coordinator_run_starts_from_gpt2_and_serves_its_model(tmp_path, procs, gpt2_dir):
    imported = read_hf_dir(gpt2_dir)
    config = run_config(model={"init_from": str(gpt2_dir)}, rounds={"max_rounds": 2, "eval_every": 0})
    coordinator = procs(Coordinator(tmp_path, config))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        response = httpx.get(coordinator.url + "/v1/model", headers=headers, timeout=30)
        assert response.status_code == 401 and "token" in response.json()["detail"]

    # before any round: the global model is the directory's, with its tokenizer
    assert download(coordinator, tmp_path / "r0.safetensors") == 0
    start = read_model_file(tmp_path / "r0.safetensors")
    assert start.config == imported.config and start.tokenizer.to_json() == imported.tokenizer.to_json()
    assert all(np.array_equal(start.weights[n], imported.weights[n]) for n in imported.weights)
    assert coordinator.status()["data"]["tokenizer"] == imported.tokenizer.info()  # the run tokenizes with it
    assert coop_sample(tmp_path / "r0.safetensors").startswith("def ")

    worker = procs(Worker(tmp_path, coordinator, "w1"))
    coordinator.wait_status(lambda s: s["done"], 120, "the run to finish its 2 rounds", [worker.log])
    assert download(coordinator, tmp_path / "final.safetensors") == 2
    final = read_model_file(tmp_path / "final.safetensors")
    assert not np.array_equal(final.weights["transformer.wte.weight"], imported.weights["transformer.wte.weight"])

    # the state directory itself is a model for coop sample and coop export, the same as the download
    assert coop_sample(coordinator.state_dir).startswith("def ")
    assert coop_main(["export", str(coordinator.state_dir), str(tmp_path / "hf"), "--format", "hf"]) == 0
    exported = read_hf_dir(tmp_path / "hf")
    assert all(np.array_equal(exported.weights[n], final.weights[n]) for n in final.weights)
    for source in (tmp_path / "final.safetensors", coordinator.state_dir / "checkpoint"):
        assert coop_main(["export", str(source), str(tmp_path / f"hf-{source.name}")]) == 0
        assert read_hf_dir(tmp_path / f"hf-{source.name}").config == final.config

    # started again with the same config, it resumes its own run: the directory is not read again
    coordinator.kill()
    moved = gpt2_dir.rename(gpt2_dir.with_name("moved"))
    try:
        coordinator.start()
        assert download(coordinator, tmp_path / "again.safetensors") == 2
    finally:
        moved.rename(gpt2_dir)
    again = read_model_file(tmp_path / "again.safetensors")
    assert all(np.array_equal(again.weights[n], final.weights[n]) for n in final.weights)


def test_a_peer_starts_from_gpt2_and_writes_its_final_model(tmp_path, gpt2_dir):
    imported = read_hf_dir(gpt2_dir)
    # inner lr 1e-9: after two rounds the weights are still the directory's, so they show where the run began
    (tmp_path / "run.toml").write_text(f"""
seed = 1
[model]
init_from = "{gpt2_dir}"
[data]
default_chars = 60000
val_fraction = 0.1
[inner]
steps = 3
lr = 1e-9
min_lr = 0
warmup_steps = 0
batch_size = 4
[rounds]
max_rounds = 2
eval_every = 0
[gossip]
exchange_timeout_s = 2
""")
    out = tmp_path / "peer0-out"
    peer = PeerProcess("peer0", ["start", "--config", str(tmp_path / "run.toml"), "--out", str(out)], tmp_path,
                       "peer-token")
    try:
        assert peer.process.wait(180) == 0, peer.log_tail()
    finally:
        peer.stop()
    final = read_model_file(out / "model.safetensors")
    assert final.round == 2 and final.config == imported.config
    assert final.tokenizer.to_json() == imported.tokenizer.to_json()
    for name, array in imported.weights.items():
        np.testing.assert_allclose(final.weights[name], array, atol=1e-5, err_msg=name)
    assert coop_sample(out).startswith("def ")
