"""The "nccl" backend and DistributedDataParallel on GPUs (marked cuda: run on a GPU machine).

World size 1 on one GPU: collectives in place on engine CUDA tensors (on engine's stream and on
the side stream), the bounded init when a rank never comes, DDP's gradients equal the plain
ones, and a captured CUDA-graph training step (coop.training.TrainStep) with DDP's bucketed
all-reduces inside equals the eager step. Two GPUs: two real processes (skipped: "needs 2 GPUs")."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import engine
import engine.distributed as dist
from engine.distributed import DistributedError, TCPStore
from engine.nn import GPT, GPTConfig
from engine.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.skipif(not dist.is_nccl_available(),
                                reason=f"needs NCCL in engine._C: {dist.nccl_unavailable_reason()}")
two_gpus = pytest.mark.skipif(engine.cuda.is_available() and engine.cuda.device_count() < 2, reason="needs 2 GPUs")


@pytest.fixture
def nccl_world_of_one():
    store = TCPStore("127.0.0.1", 0, "t", is_server=True)
    group = dist.init_process_group("nccl", 0, 1, store, device="cuda:0", timeout=60.0)
    yield group
    dist.destroy_process_group()
    store.close()


def test_collectives_in_place_on_gpu_tensors(nccl_world_of_one):
    x = engine.tensor(np.arange(10, dtype=np.float32), device="cuda")
    dist.all_reduce(x, "sum")
    dist.all_reduce(x, "avg")
    np.testing.assert_array_equal(x.numpy(), np.arange(10, dtype=np.float32))
    b = engine.tensor([[1.5, 2.5]], device="cuda").to(engine.bfloat16)
    work = dist.all_reduce(b, "max", async_op=True)
    work.wait()  # engine's stream waits for the side stream: what follows sees the result
    np.testing.assert_array_equal(b.float().numpy(), [[1.5, 2.5]])
    dist.broadcast(x, 0)
    ints = engine.tensor([3, 4], device="cuda")
    dist.all_reduce(ints, "sum")
    assert ints.tolist() == [3, 4]
    with pytest.raises(ValueError, match="cuda:0 tensors"):
        dist.all_reduce(engine.tensor([1.0]))


def test_init_is_bounded_when_a_rank_never_comes():
    store = TCPStore("127.0.0.1", 0, "t", is_server=True)
    started = time.monotonic()
    try:
        with pytest.raises(DistributedError, match="did not finish within 5 s"):
            dist.init_process_group("nccl", 0, 2, store, device="cuda:0", timeout=5.0)
    finally:
        dist.destroy_process_group()
        store.close()
    assert time.monotonic() - started < 60


def tiny_gpt() -> GPT:
    engine.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=64, dropout=0.0)).to("cuda")


def batch(seed: int):
    rows = np.random.default_rng(seed).integers(0, 64, size=(4, 33))
    return engine.tensor(rows[:, :-1], device="cuda"), engine.tensor(rows[:, 1:], device="cuda")


def test_ddp_on_one_gpu_gives_the_plain_gradients(nccl_world_of_one):
    plain, wrapped = tiny_gpt(), tiny_gpt()
    ddp = DistributedDataParallel(wrapped, bucket_cap_mb=0.05)
    assert len(ddp.buckets) > 2
    plain(*batch(0))[1].backward()
    ddp(*batch(0))[1].backward()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_captured_ddp_step_equals_the_eager_step(nccl_world_of_one, precision):
    from coop.training import TrainStep, make_optimizer  # (coop's one training step, as a worker runs it)
    losses = {}
    for graph in (False, True):
        model = tiny_gpt()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.05)
        step = TrainStep(ddp, make_optimizer(model, "adamw", 1e-3, 0.1), device="cuda", lr=1e-3, min_lr=1e-4,
                         warmup_steps=2, total_steps=20, precision=precision, graph=graph)
        losses[graph] = [float(step(*batch(s)).item()) for s in range(6)]
        if graph:
            assert step.captured.captured, step.captured.fallback_reason  # the collectives were captured
    tol = 1e-5 if precision == "fp32" else 2e-2
    np.testing.assert_allclose(losses[True], losses[False], rtol=tol, atol=tol)


def start_ranks(world: int, *extra: str):
    store = TCPStore("127.0.0.1", 0, "tok", is_server=True)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "nccl_rank.py"), str(r), str(world),
                               str(store.port), "tok", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    return store, procs


@two_gpus
def test_two_gpus_all_reduce_and_broadcast():
    store, procs = start_ranks(2)
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        store.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["sum_head"] == [0.0, 3.0, 6.0, 9.0]
        assert result["broadcast"] == [1.0] * 7 and result["avg"] == [1.5] * 3


@two_gpus
def test_two_gpus_a_dead_rank_is_an_error_not_a_hang():
    store, procs = start_ranks(2, "--die-after-init")
    try:
        out, err = procs[0].communicate(timeout=180)
        procs[1].wait(60)
    finally:
        store.close()
    assert procs[1].returncode == -9
    assert procs[0].returncode == 3, err
    result = json.loads(out.strip().splitlines()[-1])
    assert "rank 1" in result["error"] and "died" in result["error"], result
    assert result["seconds"] < 60


@two_gpus
def test_coop_train_on_two_gpus(tmp_path):
    out = subprocess.run([sys.executable, "-m", "coop.cli", "train", "--gpus", "0,1", "--max-steps", "30",
                          "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size", "64", "--batch-size",
                          "8", "--eval-every", "15", "--default-corpus-chars", "200000", "--sample-tokens", "0",
                          "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "started 2 ranks on GPUs 0,1" in out.stderr and "done: 30 steps" in out.stdout
