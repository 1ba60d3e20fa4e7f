"""The eager step of an overlap (coop.eager): the outer momentum read off the merges equals the
merge side's own, and the guess is the merge exactly when the replica's update is the mean."""
from __future__ import annotations

import numpy as np
import pytest

import engine
from coop.coordinator.worker import eager_outer
from coop.eager import EagerOuter, eager_by_default
from coop.outer import NesterovSGD
from coop.replica import InnerConfig, Replica
from coop.runconfig import parse_run_config
from coop.training import weights_of
from engine.data import TokenDataset
from engine.nn import GPTConfig


def rounds_of(outer: NesterovSGD, rounds: int, seed: int = 0):
    """(weights before, mean pseudo-gradient, weights after) of `rounds` outer steps of `outer`."""
    rng = np.random.default_rng(seed)
    weights = {"w": rng.standard_normal(64).astype(np.float32)}
    for _ in range(rounds):
        before = weights["w"].copy()
        mean = (0.01 * rng.standard_normal(64)).astype(np.float32)
        outer.step(weights, {"w": mean})
        yield before, mean, weights["w"].copy(), outer.momentum_buffer["w"].copy()


def t(array: np.ndarray) -> engine.Tensor:
    return engine.tensor(array)


@pytest.mark.parametrize("nesterov", [True, False])
def test_the_momentum_read_off_the_merges_is_the_merge_sides(nesterov):
    outer = NesterovSGD(0.7, 0.9, nesterov)
    eager = EagerOuter.of(NesterovSGD(0.7, 0.9, nesterov))
    for r, (before, _, after, buffer) in enumerate(rounds_of(outer, 8)):
        eager.observe("w", t(before), t(after), r)
        np.testing.assert_allclose(eager.buffer["w"].numpy(), buffer, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("warmup", [0, 3])
def test_the_guess_is_the_merge_when_the_update_is_the_mean(warmup):
    outer = NesterovSGD(0.5, 0.9, True, warmup_steps=warmup)
    eager = EagerOuter.of(NesterovSGD(0.5, 0.9, True, warmup_steps=warmup))
    for r, (before, mean, after, _) in enumerate(rounds_of(outer, 6, seed=1)):
        guess = eager.guess("w", t(before), t(before - mean), r).numpy()  # its own update: the mean
        np.testing.assert_allclose(guess, after, rtol=1e-5, atol=1e-6)
        eager.observe("w", t(before), t(after), r)


def test_a_late_joiner_catches_up_with_the_momentum():
    outer = NesterovSGD(0.7, 0.9, True)
    eager = EagerOuter.of(NesterovSGD(0.7, 0.9, True))
    errors = []
    for r, (before, _, after, buffer) in enumerate(rounds_of(outer, 16, seed=2)):
        if r >= 6:  # joined at round 6: b starts from 0
            eager.observe("w", t(before), t(after), r)
            errors.append(np.abs(eager.buffer["w"].numpy() - buffer).max() / np.abs(buffer).max())
    assert errors[0] > 0.1  # far off at first
    assert errors[-1] < errors[0] * 0.5 ** 8  # shrinks by mu / (1 + mu) a merge
    eager.forget()
    assert eager.buffer == {}


def test_without_momentum_the_guess_is_the_plain_step():
    eager = EagerOuter.of(NesterovSGD(1.0, 0.0, False))  # plain averaging: the guess is the replica's own end
    anchor, local = np.ones(4, np.float32), np.full(4, 0.25, np.float32)
    np.testing.assert_allclose(eager.guess("w", t(anchor), t(local), 0).numpy(), local)
    eager.observe("w", t(anchor), t(local), 0)
    assert eager.buffer == {}


def one_replica_run(overlap: int, eager: bool, rounds: int = 4, steps: int = 6) -> dict[str, np.ndarray]:
    """The final global weights of DiLoCo with one replica, its merge `overlap` steps late."""
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=32, dropout=0.0)
    data = TokenDataset(np.random.default_rng(0).integers(0, 50, 4000))
    replica = Replica(config, data, InnerConfig(batch_size=2, block_size=16, warmup_steps=1, lr=3e-3), seed=0)
    replica.eager = EagerOuter.of(NesterovSGD(0.7, 0.9, True)) if eager else None
    outer, weights = NesterovSGD(0.7, 0.9, True), weights_of(replica.model)
    for r in range(rounds):
        result = replica.run_round({n: w.copy() for n, w in weights.items()}, steps, apply_after=overlap if r else 0,
                                   merge_round=r - 1 if r else None)
        outer.step(weights, result.pseudo_gradient)
    return weights


def test_with_one_replica_the_eager_overlap_is_plain_diloco():
    """Alone, a replica's update is the mean: the eager guess is the merge, so the steps beside it
    are those plain DiLoCo takes after it; the overlap from the round's end is not."""
    plain, eager, late = (one_replica_run(overlap, eager, rounds=2) for overlap, eager in [(0, False), (3, True),
                                                                                            (3, False)])
    off_eager = max(float(np.abs(eager[n] - plain[n]).max()) for n in plain)  # float32 rounding (weights ~1)
    off_late = max(float(np.abs(late[n] - plain[n]).max()) for n in plain)
    assert off_eager < 3e-5, off_eager  # (AdamW's steps on near-zero gradients grow it ~10x a round after)
    assert off_late > 300 * off_eager, (off_late, off_eager)


def test_by_default_the_eager_step_is_for_overlaps_of_a_quarter_of_the_round_or_more():
    """Its fixed cost loses to the round's end's growing one below ~10-30% (docs/scaling.md)."""
    assert [eager_by_default(steps, 100) for steps in (0, 10, 24, 25, 60)] == [False, False, False, True, True]

    def eager(**outer) -> bool:
        return parse_run_config({"inner": {"steps": 100}, "outer": outer}).eager_overlap
    assert not eager(overlap_steps=10) and eager(overlap_steps=30)
    assert eager(overlap_steps=10, eager=True) and not eager(overlap_steps=60, eager=False)
    assert eager(overlap_steps=10, fragments=4)  # of a round of 25 steps


def test_a_worker_reads_the_outer_step_from_the_join_and_falls_back_on_a_bad_one():
    outer = {**NesterovSGD(0.5, 0.8, True, warmup_steps=2).hyperparameters(), "eager": True}
    eager = eager_outer({"overlap_steps": 30, "outer": outer})
    assert (eager.momentum, eager.nesterov, eager.lr_of_round(0), eager.lr_of_round(5)) == (0.8, True, 0.25, 0.5)
    assert eager_outer({"overlap_steps": 0, "outer": outer}) is None  # no overlap
    assert eager_outer({"overlap_steps": 30, "outer": {**outer, "eager": False}}) is None
    assert eager_outer({"overlap_steps": 30}) is None  # an older coordinator
    assert eager_outer({"overlap_steps": 30, "outer": {"lr": "fast", "eager": True}}) is None  # unreadable
