"""coop.training's weights_of / load_weights on a GPU: one flat copy each way, the same numbers as
the CPU model's, a wrong shape refused, and a captured train step still valid after a load."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from coop.training import TrainStep, load_weights, make_optimizer, weights_of
from engine.nn import GPT, GPTConfig

CFG = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def test_weights_round_trip_through_the_gpu():
    engine.manual_seed(0)
    cpu = GPT(CFG)
    gpu = GPT(CFG).to("cuda")
    expected = weights_of(cpu)
    load_weights(gpu, expected)
    got = weights_of(gpu)
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == np.float32 and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    partial = {name: np.full_like(array, 0.5) for name, array in list(expected.items())[:2]}
    load_weights(gpu, partial, partial=True)
    after = weights_of(gpu)
    assert all(np.all(after[n] == 0.5) for n in partial)
    rest = [n for n in expected if n not in partial]
    assert all(np.array_equal(after[n], expected[n]) for n in rest)


def test_a_wrong_shape_is_refused_before_anything_is_copied():
    gpu = GPT(CFG).to("cuda")
    before = weights_of(gpu)
    bad = dict(before)
    name = next(n for n, a in before.items() if a.ndim == 2)
    bad[name] = before[name].T.copy()  # same size, other shape
    with pytest.raises(ValueError, match="shape"):
        load_weights(gpu, bad)
    assert all(np.array_equal(weights_of(gpu)[n], a) for n, a in before.items())


def test_a_captured_step_trains_on_loaded_weights():
    # the graph replays on the parameters' storage: a load copies into it, so the next step starts from it
    engine.manual_seed(0)
    model = GPT(CFG).to("cuda")
    step = TrainStep(model, make_optimizer(model, "sgd", 0.0, 0.0), device="cuda", lr=0.0, min_lr=0.0,
                     warmup_steps=1, total_steps=10, precision="fp32", grad_clip=0.0, graph=True)
    rng = np.random.default_rng(0)
    x = engine.tensor(rng.integers(0, 50, (2, 16)), device="cuda")
    y = engine.tensor(rng.integers(0, 50, (2, 16)), device="cuda")
    for _ in range(3):
        step(x, y)  # captured by now
    loaded = {n: np.zeros_like(a) for n, a in weights_of(model).items()}
    load_weights(model, loaded)
    step(x, y)  # lr 0: the weights stay what was loaded
    assert all(np.all(a == 0) for a in weights_of(model).values())


def _replica(device: str):
    from coop.replica import InnerConfig, Replica
    from engine.data import TokenDataset

    data = TokenDataset(np.random.default_rng(0).integers(0, 50, 4000))
    return Replica(CFG, data, InnerConfig(batch_size=2, block_size=16, warmup_steps=1), device=device, seed=0), data


def test_a_gpu_replicas_round_end_and_merge_are_the_host_formulas_bit_for_bit():
    # pseudo-gradient = anchor - local and local <- global + (local - sent) run on the device now
    replica, _ = _replica("cuda")
    start = weights_of(replica.model)
    replica.load_global(start)
    for _ in range(3):
        replica.train_step()
    local = weights_of(replica.model)
    delta = replica.pseudo_gradient()
    for name in start:
        np.testing.assert_array_equal(delta[name], start[name] - local[name], err_msg=name)
    for _ in range(2):  # steps taken after sending, kept on top of the merge
        replica.train_step()
    now = weights_of(replica.model)
    merged = {n: w - np.float32(0.25) for n, w in start.items()}
    replica.apply_merge(merged, keep_progress=True)
    after = weights_of(replica.model)
    for name in merged:
        np.testing.assert_array_equal(after[name], merged[name] + (now[name] - local[name]), err_msg=name)
        np.testing.assert_array_equal(replica.anchor[name].numpy(), merged[name], err_msg=name)
    assert not replica.sent_at


def test_the_captured_evaluation_gives_the_eager_loss_and_follows_reloaded_weights():
    replica, data = _replica("cuda")
    eager, _ = _replica("cuda")
    eager.graph = False
    first = weights_of(replica.model)
    second = {n: w * np.float32(0.9) for n, w in first.items()}
    for weights in (first, second, first, second):  # warm-up, capture, then replays of reloaded weights
        got = replica.evaluate_weights(weights, data, batches=3)
        want = eager.evaluate_weights(weights, data, batches=3)
        assert abs(got - want) <= 1e-6 * abs(want), (got, want)
    assert replica._evaluation.captured is not None and replica._evaluation.captured.captured
    assert eager._evaluation.captured is None
    replica.load_global(second)  # the anchored weights: copied into the evaluation's model on the device
    got = replica.evaluate_weights(second, data, batches=3)
    assert abs(got - eager.evaluate_weights(second, data, batches=3)) <= 1e-6 * abs(got)


def test_windows_queued_before_a_reload_see_the_weights_they_were_started_with():
    # on the one stream: an evaluation's windows queued beside the steps, then another evaluation's load
    replica, data = _replica("cuda")
    first = weights_of(replica.model)
    second = {n: w * np.float32(0.9) for n, w in first.items()}
    want = [replica.evaluate_weights(w, data, batches=3) for w in (first, second, first)]  # captured by now
    pending = replica.start_evaluation(first, data, batches=3)
    assert pending.step()
    later = replica.start_evaluation(second, data, batches=3)
    assert abs(later.result() - want[1]) <= 1e-6 * abs(want[1])
    assert abs(pending.result() - want[0]) <= 1e-6 * abs(want[0])
