"""coop.replica on the CPU backend: a round's end and a merge's load are the host formulas bit for
bit (computed where the model lives), and evaluating the weights last loaded takes the anchor's
copy without changing the answer. tests/cuda/test_weights_transfer_gpu.py checks the same on a GPU."""
from __future__ import annotations

import numpy as np

from coop.replica import InnerConfig, Replica
from coop.training import weights_of
from engine.data import TokenDataset
from engine.nn import GPTConfig

CFG = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)


def make_replica() -> tuple[Replica, TokenDataset]:
    data = TokenDataset(np.random.default_rng(0).integers(0, 50, 4000))
    return Replica(CFG, data, InnerConfig(batch_size=2, block_size=16, warmup_steps=1), seed=0), data


def test_the_round_end_and_the_merge_are_the_host_formulas_bit_for_bit():
    replica, _ = make_replica()
    start = weights_of(replica.model)
    replica.load_global(start)
    for _ in range(3):
        replica.train_step()
    local = weights_of(replica.model)
    delta = replica.pseudo_gradient()
    for name in start:
        assert delta[name].dtype == np.float32
        np.testing.assert_array_equal(delta[name], start[name] - local[name], err_msg=name)
    replica.train_step()  # a step after sending, kept on top of the merge
    now = weights_of(replica.model)
    merged = {n: w - np.float32(0.25) for n, w in start.items()}
    replica.apply_merge(merged, keep_progress=True)
    for name, w in weights_of(replica.model).items():
        np.testing.assert_array_equal(w, merged[name] + (now[name] - local[name]), err_msg=name)
    loaded = {n: w.copy() for n, w in merged.items()}
    for name, array in merged.items():
        array += 1  # the caller's arrays move on: the anchor is a copy of its own
        np.testing.assert_array_equal(replica.anchor[name].numpy(), loaded[name], err_msg=name)


def test_the_weights_last_loaded_evaluate_as_a_copy_of_them_does():
    replica, data = make_replica()
    weights = {n: w * np.float32(0.9) for n, w in weights_of(replica.model).items()}
    replica.load_global(weights)
    for _ in range(2):
        replica.train_step()  # the replica's own weights move on; the global ones stay what was loaded
    anchored = replica.evaluate_weights(weights, data, batches=2)  # from the anchor
    copied = replica.evaluate_weights({n: w.copy() for n, w in weights.items()}, data, batches=2)  # loaded
    assert anchored == copied
    assert replica.evaluate_weights(weights_of(replica.model), data, batches=2) != anchored


def test_an_evaluation_queued_beside_the_inner_steps_gives_the_loss_of_the_weights_it_started_with():
    replica, data = make_replica()
    first = {n: w * np.float32(0.9) for n, w in weights_of(replica.model).items()}
    second = {n: w * np.float32(1.1) for n, w in first.items()}
    want = [replica.evaluate_weights(w, data, batches=3) for w in (first, second)]
    replica.load_global(first)
    pending = replica.start_evaluation(first, data, batches=3)
    calls = []

    def beside() -> bool:  # what the round loop runs after each inner step, until it says False
        calls.append(len(pending.losses))
        return pending.step()

    replica.run_round(first, 5, beside=beside)
    assert calls == [0, 1, 2]  # one window queued a step, then no more calls
    later = replica.start_evaluation(second, data, batches=3)  # reloads the evaluation's model
    assert pending.result() == want[0] and later.result() == want[1]
    unfinished = replica.start_evaluation(first, data, batches=3)
    assert unfinished.step()  # one window of three queued
    assert replica.start_evaluation(second, data, batches=3).result() == want[1]
    assert unfinished.result() == want[0]  # its other windows were queued before the second load


def test_host_lead_is_nothing_on_the_cpu():
    from coop.training import HostLead

    lead = HostLead("cpu")  # the CPU backend runs each op as it is called: nobody is ahead
    for _ in range(3):
        lead.step_queued()
    assert lead.events == []


def test_a_round_stops_its_steps_at_its_time_budget_and_counts_the_tokens_taken():
    import time

    replica, _ = make_replica()
    start = weights_of(replica.model)
    past = replica.run_round(start, 10, until=time.perf_counter() - 1.0)  # the deadline has passed: one step
    assert len(past.losses) == 1 and past.tokens == 1 * 2 * 16
    assert replica.step == 1
    far = replica.run_round(start, 10, until=time.perf_counter() + 3600.0)  # nothing binds: all K steps
    assert len(far.losses) == 10 and far.tokens == 10 * 2 * 16
    steps_before = replica.step
    began = time.perf_counter()
    budget = replica.run_round(start, 100_000, until=began + 0.3)  # stops at the budget, not at K
    assert time.perf_counter() - began < 5.0
    assert 1 <= len(budget.losses) < 100_000 and budget.tokens == len(budget.losses) * 2 * 16
    assert replica.step == steps_before + len(budget.losses)
