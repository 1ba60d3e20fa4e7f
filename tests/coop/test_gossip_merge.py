"""The gossip merge (coop.gossip.merge): groups, averaging, weight mixing, consensus distance."""
import numpy as np
import pytest

from coop.diloco import aggregate
from coop.outer import NesterovSGD
from coop.gossip.merge import (
    consensus_distance,
    exchange_bytes_per_replica,
    gossip_groups,
    gossip_round,
    partners_of,
    round_rng,
)


def _update(rng, scale=1.0):
    return {"a": (scale * rng.standard_normal((3, 4))).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}


@pytest.mark.parametrize("n,group_size", [(1, 2), (2, 2), (5, 2), (7, 3), (8, 4), (4, 8), (9, 2)])
def test_groups_partition_everyone(n, group_size):
    groups = gossip_groups(n, group_size, np.random.default_rng(0))
    flat = sorted(i for g in groups for i in g)
    assert flat == list(range(n))
    for g in groups:
        assert len(g) in ({n} if n <= group_size else {group_size, group_size + 1})
    if n > 1:
        assert all(len(g) >= 2 for g in groups)


def test_groups_are_redrawn_and_deterministic():
    a = gossip_groups(8, 2, round_rng(7, 3))
    assert a == gossip_groups(8, 2, round_rng(7, 3))
    assert any(gossip_groups(8, 2, round_rng(7, r)) != a for r in range(4, 10))
    with pytest.raises(ValueError):
        gossip_groups(4, 1, np.random.default_rng(0))


def test_partners_agree_between_peers():
    members = ["p3", "p1", "p0", "p2", "p4"]
    partners = {m: partners_of(members, m, 2, round_rng(1, 5)) for m in members}
    for m, ps in partners.items():
        assert m not in ps and ps
        for p in ps:  # symmetric: my partner counts me as its partner
            assert m in partners[p]
    assert partners_of(members, "stranger", 2, round_rng(1, 5)) == []
    assert partners_of(["solo"], "solo", 2, round_rng(1, 5)) == []


def test_gossip_round_averages_within_groups():
    rng = np.random.default_rng(1)
    deltas = [_update(rng) for _ in range(6)]
    weights = [1.0, 2.0, 3.0, 1.0, 1.0, 5.0]
    groups = gossip_groups(6, 3, np.random.default_rng(42))
    out = gossip_round(deltas, weights, 3, np.random.default_rng(42))
    for g in groups:
        expected = aggregate([deltas[i] for i in g], [weights[i] for i in g])
        for i in g:
            for name in expected:
                np.testing.assert_allclose(out[i][name], expected[name], rtol=1e-6)
    out[0]["a"][...] = 99  # copies, not shared
    assert not any(np.all(out[i]["a"] == 99) for i in range(1, 6))


def test_group_of_everyone_is_the_star_merge():
    rng = np.random.default_rng(2)
    deltas = [_update(rng) for _ in range(4)]
    out = gossip_round(deltas, [1, 1, 1, 1], 4, np.random.default_rng(0))
    star = aggregate(deltas)
    for o in out:
        np.testing.assert_allclose(o["a"], star["a"], rtol=1e-6)


def test_mixing_global_weights_and_consensus_distance():
    rng = np.random.default_rng(3)
    thetas = [_update(rng) for _ in range(4)]
    before = consensus_distance(thetas)
    mean_before = np.mean([t["a"] for t in thetas], axis=0)
    deltas = [_update(rng, 0.0) for _ in range(4)]
    gossip_round(deltas, [1] * 4, 2, np.random.default_rng(0), global_weights=thetas)
    after = consensus_distance(thetas)
    assert after < before
    np.testing.assert_allclose(np.mean([t["a"] for t in thetas], axis=0), mean_before, rtol=1e-5, atol=1e-6)
    assert consensus_distance([thetas[0], thetas[0]]) == 0.0
    a, b = {"x": np.zeros(3, np.float32)}, {"x": np.full(3, 2.0, np.float32)}
    assert consensus_distance([a, b]) == pytest.approx(np.sqrt(3.0))  # each is sqrt(3) from the mean


def test_repeated_gossip_with_outer_steps_stays_bounded():
    """Replicas that take outer steps on noisy pseudo-gradients: with weight mixing the
    consensus distance stays far below the no-mixing random walk."""
    n, rounds = 8, 60
    def run(mix):
        rng = np.random.default_rng(5)
        thetas = [{"w": np.zeros(50, np.float32)} for _ in range(n)]
        outers = [NesterovSGD(0.7, 0.9) for _ in range(n)]
        for r in range(rounds):
            deltas = [{"w": (0.01 * rng.standard_normal(50)).astype(np.float32)} for _ in range(n)]
            avg = gossip_round(deltas, [1.0] * n, 2, round_rng(0, r), global_weights=thetas if mix else None)
            for theta, outer, d in zip(thetas, outers, avg):
                outer.step(theta, d)
        return consensus_distance(thetas)
    assert run(True) < 0.5 * run(False)


def test_bytes():
    assert exchange_bytes_per_replica(100, 400, 3) == 1000
    assert exchange_bytes_per_replica(100, 400, 3, mix_weights=False) == 200
