"""DistributedDataParallel over the "cpu" backend with real processes: 2 ranks at batch B train as
1 process at batch 2B (same seed, same batches), the ranks stay bit-identical, a rank killed for
real stops the other with a clear error; and in one process (world size 1): the gradient hook of
engine.autograd, no_sync, the unused-parameter error."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import engine
import engine.distributed as dist
from engine.distributed import TCPStore
from engine.nn import GPT, GPTConfig, Linear
from engine.nn.parallel import DistributedDataParallel

HERE = os.path.dirname(os.path.abspath(__file__))
RANK = os.path.join(HERE, "ddp_rank.py")


def start_rank(rank: int, world: int, port: int, out, steps: int, batch: int, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, RANK, str(rank), str(world), str(port), "tok", str(out), str(steps),
                             str(batch), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_ranks_train_like_one_process_at_twice_the_batch(tmp_path):
    store = TCPStore("127.0.0.1", 0, "tok", is_server=True)
    try:
        ranks = [start_rank(r, 2, store.port, tmp_path / f"r{r}.json", 20, 4) for r in range(2)]
        single = start_rank(0, 1, 0, tmp_path / "single.json", 20, 8)
        for p in ranks + [single]:
            _, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
    finally:
        store.close()
    r0, r1, one = (json.load(open(tmp_path / name)) for name in ("r0.json", "r1.json", "single.json"))
    # each rank's loss is the mean over its half of the batch: their mean is the 2B batch's loss
    mean = (np.array(r0["losses"]) + np.array(r1["losses"])) / 2
    np.testing.assert_allclose(mean, one["losses"], rtol=1e-5, atol=1e-5)
    assert one["losses"][-1] < one["losses"][0] - 0.1, "the reference run must actually train"
    assert r0["weights"] == r1["weights"] and r0["first"] == r1["first"], "the replicas drifted apart"
    for name, value in one["weights"].items():
        assert abs(r0["weights"][name] - value) <= 1e-3 * max(1.0, abs(value)), name
    np.testing.assert_allclose(r0["first"], one["first"], atol=1e-5)


def test_a_killed_rank_stops_the_other_with_a_clear_error(tmp_path):
    store = TCPStore("127.0.0.1", 0, "tok", is_server=True)
    try:
        survivor = start_rank(0, 2, store.port, tmp_path / "r0.json", 50, 4)
        victim = start_rank(1, 2, store.port, tmp_path / "r1.json", 50, 4, "--die-at", "5")
        victim.communicate(timeout=300)
        assert victim.returncode == -9
        died = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        assert time.monotonic() - died < 30, "the surviving rank must notice within seconds, not at the timeout"
    finally:
        store.close()
    assert survivor.returncode != 0
    assert "RankDiedError" in err and "rank 1" in err and "died" in err, err[-2000:]


@pytest.fixture
def world_of_one():
    store = TCPStore("127.0.0.1", 0, "t", is_server=True)
    dist.init_process_group("cpu", 0, 1, store)
    yield
    dist.destroy_process_group()
    store.close()


def tiny_gpt() -> GPT:
    engine.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, dropout=0.0))


def batch(seed: int):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 16, size=(3, 9))
    return engine.tensor(rows[:, :-1]), engine.tensor(rows[:, 1:])


def test_world_of_one_gives_the_plain_gradients(world_of_one):
    plain, wrapped = tiny_gpt(), tiny_gpt()
    ddp = DistributedDataParallel(wrapped, bucket_cap_mb=0.001)
    assert len(ddp.buckets) > 3
    plain(*batch(0))[1].backward()
    ddp(*batch(0))[1].backward()
    for (name, p), q in zip(plain.named_parameters(), wrapped.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    assert ddp.config is wrapped.config  # the model's attributes read through the wrapper


def test_no_sync_accumulates_and_the_next_backward_reduces_the_sum(world_of_one):
    plain, wrapped = tiny_gpt(), tiny_gpt()
    ddp = DistributedDataParallel(wrapped)
    for seed in (0, 1):
        plain(*batch(seed))[1].backward()
    with ddp.no_sync():
        ddp(*batch(0))[1].backward()
    ddp(*batch(1))[1].backward()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_parameter_without_gradient_is_an_error_naming_it(world_of_one):
    class TwoHeads(engine.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = Linear(4, 4), Linear(4, 4)

        def forward(self, x):
            return self.used(x).sum()

    ddp = DistributedDataParallel(TwoHeads(), bucket_cap_mb=1e-5)
    ddp(engine.randn(2, 4)).backward()
    with pytest.raises(RuntimeError, match="did not give every parameter a gradient"):
        ddp(engine.randn(2, 4))
    ddp.remove_hooks()


def test_post_accumulate_grad_hook_sees_the_final_gradient_once():
    w = engine.tensor([1.0, 2.0], requires_grad=True)
    seen = []
    handle = w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    ((w * 3.0).sum() + (w * w).sum()).backward()  # two paths into w: the hook runs once, after both
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], [3.0 + 2.0, 3.0 + 4.0])
    handle.remove()
    (w * 1.0).sum().backward()
    assert len(seen) == 1
    with pytest.raises(RuntimeError, match="only leaf tensors"):
        (w * 2.0).register_post_accumulate_grad_hook(print)
