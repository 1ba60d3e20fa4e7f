"""Robust aggregation (coop.diloco.Aggregator's rules, coop.robust) and the adversarial simulator."""
from __future__ import annotations

import numpy as np
import pytest

from coop import diloco, robust
from coop.diloco import Aggregator, aggregate, global_norm
from coop.runconfig import EXAMPLE_TOML, parse_run_config
from coop.simulate.adversary import attack

SHAPES = {"a": (3, 5), "b": (7,)}
ROBUST = ("trimmed_mean", "median", "centered_clip", "filtered_mean")


def updates_of(seeds, scale=1.0):
    out = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        out.append({n: (scale * rng.standard_normal(s)).astype(np.float32) for n, s in SHAPES.items()})
    return out


@pytest.mark.parametrize("rule", ROBUST + ("mean",))
def test_equal_updates_give_that_update(rule):
    update = updates_of([0])[0]
    result = aggregate([update] * 5, [1, 2, 3, 4, 5], rule=rule)
    for name in SHAPES:
        np.testing.assert_allclose(result[name], update[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule", ROBUST)
def test_few_contributions_take_the_plain_weighted_mean(rule):
    updates, weights = updates_of([0, 1]), [1.0, 3.0]
    robust_result = aggregate(updates, weights, rule=rule)  # 2 < min_contributions = 3
    plain = aggregate(updates, weights, rule="mean")
    for name in SHAPES:
        np.testing.assert_allclose(robust_result[name], plain[name], rtol=1e-6, atol=1e-7)


def test_trimmed_mean_without_clipping_or_trimming_is_the_plain_mean():
    updates, weights = updates_of(range(5)), [1.0, 2.0, 3.0, 1.0, 5.0]
    # clip_factor 10: no honest norm is 10x the median, nothing is clipped; floor(0.1 * 5) = 0 trimmed
    trimmed = aggregate(updates, weights, rule="trimmed_mean", trim_fraction=0.1, clip_factor=10.0)
    plain = aggregate(updates, weights, rule="mean")
    for name in SHAPES:
        np.testing.assert_allclose(trimmed[name], plain[name], rtol=1e-5, atol=1e-7)


def test_trimmed_mean_drops_exactly_the_extremes():
    updates = updates_of(range(8))
    result = aggregate(updates, rule="trimmed_mean", trim_fraction=0.25, clip_factor=None)  # 2 cut at each end
    for name in SHAPES:
        stack = np.sort(np.stack([u[name] for u in updates]).astype(np.float64), axis=0)[2:-2]
        np.testing.assert_allclose(result[name], stack.mean(axis=0), rtol=1e-6, atol=1e-7)


def test_median_is_the_coordinatewise_median():
    for n in (3, 4, 7):
        updates = updates_of(range(n))
        result = aggregate(updates, rule="median", clip_factor=None)
        for name in SHAPES:
            np.testing.assert_allclose(result[name], np.median(np.stack([u[name] for u in updates]), axis=0),
                                       rtol=1e-6, atol=1e-7)


def test_weighted_median_follows_the_weights():
    stack = np.array([[0.0], [1.0], [2.0], [10.0]])
    assert robust.weighted_median(stack, np.array([1.0, 1.0, 1.0, 5.0]))[0] == 10.0
    assert robust.weighted_median(stack, np.array([5.0, 1.0, 1.0, 1.0]))[0] == 0.0
    assert robust.weighted_median(stack, np.array([1.0, 1.0, 1.0, 1.0]))[0] == 1.5


def test_adaptive_clipping_bounds_every_norm():
    updates = updates_of(range(4)) + updates_of([9], scale=1e4)
    norms = [global_norm(u) for u in updates]
    bound = 2.0 * float(np.median(norms))
    aggregator = Aggregator(SHAPES, rule="trimmed_mean", trim_fraction=0.0, clip_factor=2.0)  # the mean of the clipped
    for u in updates:
        aggregator.add(u, 1.0)
    result = aggregator.result()
    assert aggregator.clip_bound == pytest.approx(bound)
    clipped = [{n: a * min(1.0, bound / norm) for n, a in u.items()} for u, norm in zip(updates, norms)]
    assert max(global_norm(c) for c in clipped) <= bound * (1 + 1e-6)
    for name in SHAPES:
        np.testing.assert_allclose(result[name], np.mean([c[name] for c in clipped], axis=0), rtol=1e-5, atol=1e-6)


def test_streamed_mean_clips_to_the_previous_rounds_median_and_stays_o_model():
    updates = updates_of(range(4))
    aggregator = Aggregator(SHAPES, rule="mean", clip_factor=2.0)
    for u in updates:
        aggregator.add(u, 1.0)
    assert aggregator.clip_bound is None  # first round: no reference yet, the plain mean
    plain = aggregator.result()
    for name in SHAPES:
        np.testing.assert_allclose(plain[name], np.mean([u[name] for u in updates], axis=0), rtol=1e-5, atol=1e-7)
    median = float(np.median(aggregator.norms))
    aggregator.reset()
    assert aggregator._kept == [] and aggregator.reference_norm == pytest.approx(median)
    huge = updates_of([7], scale=1e6)[0]
    aggregator.add(huge, 1.0)
    assert aggregator._kept == []  # streamed: no contribution kept
    assert global_norm(aggregator.result()) == pytest.approx(2.0 * median, rel=1e-5)


@pytest.mark.parametrize("rule", ROBUST)
@pytest.mark.parametrize("kind", ["signflip", "noise"])
def test_one_attacker_of_five_barely_moves_the_robust_rules(rule, kind):
    rng = np.random.default_rng(0)
    centre = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    honest = [{n: c + 0.05 * rng.standard_normal(c.shape).astype(np.float32) for n, c in centre.items()}
              for _ in range(4)]
    bad = attack(kind, honest[0], 100.0, rng)
    robust_result = aggregate(honest + [bad], rule=rule)
    plain = aggregate(honest + [bad], rule="mean")
    truth = aggregate(honest, rule="mean")
    error = global_norm({n: robust_result[n] - truth[n] for n in SHAPES})
    assert error < 0.6 * global_norm(truth)
    assert global_norm({n: plain[n] - truth[n] for n in SHAPES}) > 10 * global_norm(truth)


def test_bad_rule_options_are_refused():
    with pytest.raises(ValueError, match="rule"):
        Aggregator(SHAPES, rule="krum")
    with pytest.raises(ValueError, match="clip_factor"):
        Aggregator(SHAPES, clip_factor=-1.0)
    with pytest.raises(ValueError, match="min_contributions"):
        Aggregator(SHAPES, min_contributions=0)


def test_robust_is_the_default_of_aggregator_aggregate_and_the_run_config():
    aggregator = Aggregator(SHAPES)
    assert (aggregator.rule, aggregator.trim_fraction, aggregator.clip_factor, aggregator.min_contributions) == (
        diloco.DEFAULT_RULE, diloco.DEFAULT_TRIM_FRACTION, diloco.DEFAULT_CLIP_FACTOR, diloco.DEFAULT_MIN_CONTRIBUTIONS)
    assert diloco.DEFAULT_RULE != "mean"
    updates = updates_of(range(4)) + updates_of([9], scale=1e4)
    default = aggregate(updates)  # the gossip merge calls aggregate() with no options
    explicit = aggregate(updates, rule=diloco.DEFAULT_RULE, trim_fraction=diloco.DEFAULT_TRIM_FRACTION,
                         clip_factor=diloco.DEFAULT_CLIP_FACTOR)
    for name in SHAPES:
        np.testing.assert_array_equal(default[name], explicit[name])
    for config in (parse_run_config({}), parse_run_config(__import__("tomllib").loads(EXAMPLE_TOML))):
        options = config.coordinator.aggregator_options()
        built = Aggregator(SHAPES, **options)
        assert (built.rule, built.trim_fraction, built.clip_factor) == (aggregator.rule, aggregator.trim_fraction,
                                                                        aggregator.clip_factor)


def test_run_config_aggregation_keys_old_and_new():
    config = parse_run_config({"coordinator": {"aggregation": "median", "clip_factor": 0, "min_contributions": 5}})
    assert config.coordinator.aggregator_options() == {"rule": "median", "trim_fraction": diloco.DEFAULT_TRIM_FRACTION,
                                                       "clip_factor": None, "max_norm": None, "min_contributions": 5}
    old = parse_run_config({"aggregation": {"max_norm": 3.0, "trim_fraction": 0.1, "rule": "mean"}})
    assert old.coordinator.aggregator_options()["max_norm"] == 3.0
    assert old.coordinator.aggregation == "mean" and old.coordinator.trim_fraction == 0.1
    with pytest.raises(ValueError, match="aggregation"):
        parse_run_config({"coordinator": {"aggregation": "krum"}})


def test_the_coordinator_builds_its_aggregator_from_the_config(tmp_path):
    from coop.coordinator.service import Coordinator  # the coordinator's stack: only this test needs it

    raw = {"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8},
           "data": {"default_chars": 20_000, "shards": 2}, "rounds": {"eval_every": 0}}
    default = Coordinator(parse_run_config(raw), tmp_path / "a")
    assert default.aggregator.rule == diloco.DEFAULT_RULE and default.aggregator.clip_factor == diloco.DEFAULT_CLIP_FACTOR
    raw["coordinator"] = {"aggregation": "centered_clip", "max_norm": 5.0}
    chosen = Coordinator(parse_run_config(raw), tmp_path / "b")
    assert chosen.aggregator.rule == "centered_clip" and chosen.aggregator.max_norm == 5.0


def test_attacks_change_what_is_sent():
    rng = np.random.default_rng(0)
    honest = updates_of([0])[0]
    flipped = attack("signflip", honest, 100.0, rng)
    scaled = attack("scale", honest, 3.0, rng)
    noise = attack("noise", honest, 100.0, rng)
    for name in SHAPES:
        np.testing.assert_allclose(flipped[name], -100.0 * honest[name], rtol=1e-6)
        np.testing.assert_allclose(scaled[name], 3.0 * honest[name], rtol=1e-6)
    assert global_norm(noise) == pytest.approx(100.0 * global_norm(honest), rel=1e-5)
    with pytest.raises(ValueError, match="attack"):
        attack("krum", honest, 1.0, rng)


def _agreeing_updates(count, seed=0):
    """Updates that share a direction (a common signal plus each replica's own noise), as the
    pseudo-gradients of replicas that start from the same weights do."""
    rng = np.random.default_rng(seed)
    signal = {n: rng.standard_normal(s) for n, s in SHAPES.items()}
    return [{n: (signal[n] + 0.5 * rng.standard_normal(s)).astype(np.float32) for n, s in SHAPES.items()}
            for _ in range(count)]


def test_filtered_mean_leaves_out_what_points_away_and_averages_the_rest():
    honest = _agreeing_updates(6)
    flipped = {n: -100 * a for n, a in honest[0].items()}
    noise = {n: (100 * np.random.default_rng(9).standard_normal(a.shape)).astype(np.float32) for n, a in honest[1].items()}
    aggregator = Aggregator(SHAPES, rule="filtered_mean", clip_factor=None)
    for update in honest + [flipped, noise]:
        aggregator.add(update, 1.0)
    result = aggregator.result()
    assert aggregator.left_out == [6, 7]  # the flipped and the noise update, whatever their norm
    plain = aggregate(honest, rule="mean")
    for name in SHAPES:  # and the honest ones keep the mean's full step (no median shrinkage)
        np.testing.assert_allclose(result[name], plain[name], rtol=1e-5, atol=1e-6)


def test_filtered_mean_of_agreeing_updates_is_their_clipped_mean():
    updates = _agreeing_updates(5, seed=3)
    weights = [1.0, 2.0, 3.0, 4.0, 5.0]
    aggregator = Aggregator(SHAPES, rule="filtered_mean", clip_factor=None)
    for update, weight in zip(updates, weights):
        aggregator.add(update, weight)
    result = aggregator.result()
    assert aggregator.left_out == []
    plain = aggregate(updates, weights, rule="mean")
    for name in SHAPES:
        np.testing.assert_allclose(result[name], plain[name], rtol=1e-5, atol=1e-6)


def test_agreeing_is_never_empty_and_needs_a_positive_cosine():
    assert robust.agreeing(np.array([0.9, 0.8, 0.7, -0.9]), 0.5).tolist() == [0, 1, 2]
    assert robust.agreeing(np.array([0.9, 0.1, 0.8]), 0.5).tolist() == [0, 2]  # below half the median cosine
    assert robust.agreeing(np.array([-0.2, -0.5, -0.1]), 0.5).tolist() == [2]  # none agrees: the best one
