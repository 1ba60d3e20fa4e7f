"""Streaming DiLoCo, overlap, warm start and the outer lr decay: the exact algebra of each.

- fragments cover the model once, strided over the blocks;
- one fragment and no overlap is plain DiLoCo, number for number;
- a replica loads only the merged fragment and sends only this round's fragment;
- overlap keeps the steps taken since sending: local <- global + (local - local_when_sent);
- with one replica and plain averaging, every merge is a no-op, with or without fragments and
  overlap: the run is one replica training on, uninterrupted (nothing counted twice or lost);
- the warm start is the ddp baseline's first steps exactly;
- the outer lr follows warm-up then cosine, and old optimizer states still load.
"""
import math
from dataclasses import replace

import numpy as np
import pytest

from coop import simulate as sim
from coop.outer import NesterovSGD
from coop.streaming import fragment_of_round, fragments
from coop.training import load_weights

TWO_BLOCKS = dict(default_corpus_chars=60_000, n_layer=2, n_head=2, n_embd=16, block_size=16, batch_size=4,
                  replicas=2, inner_steps=4, rounds=3, eval_batches=2, warmup_steps=2, plot=False, quiet=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return sim.build_setup(sim.SimulateConfig(**{**TWO_BLOCKS, "out": str(tmp_path_factory.mktemp("streaming"))}))


def with_cfg(setup, **changes):
    return replace(setup, cfg=replace(setup.cfg, **changes))


NAMES = ["transformer.wte.weight", "transformer.wpe.weight",
         *[f"transformer.h.{i}.{p}" for i in range(4) for p in ("ln_1.weight", "attn.c_attn.weight")],
         "transformer.ln_f.weight", "transformer.ln_f.bias"]


def test_fragments_cover_every_tensor_once_strided_over_the_blocks():
    parts = fragments(NAMES, 2)
    assert sorted(n for part in parts for n in part) == sorted(NAMES)
    assert parts[0] == ["transformer.wte.weight", "transformer.wpe.weight",
                        *[f"transformer.h.{i}.{p}" for i in (0, 2) for p in ("ln_1.weight", "attn.c_attn.weight")]]
    assert parts[1][-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert all("h.1." in n or "h.3." in n for n in parts[1][:-2])
    assert fragments(NAMES, 1) == [NAMES]
    assert [fragment_of_round(r, 3) for r in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="at most one fragment per block"):
        fragments(NAMES, 5)
    with pytest.raises(ValueError, match="at least 1"):
        fragments(NAMES, 0)


def test_one_fragment_without_overlap_is_plain_diloco_number_for_number(setup):
    # the reference: the plain DiLoCo round written out by hand, every replica reloading every weight
    cfg = setup.cfg
    inner = sim.inner_config(cfg, cfg.batch_size, cfg.total_rounds * cfg.inner_steps)
    replicas = [sim.new_replica(setup, setup.shards[i], inner, sim.data_seed(cfg.seed, i)) for i in range(2)]
    global_weights, outer = sim.copy_weights(setup.initial), sim.outer_optimizer(cfg)
    aggregator = cfg.aggregator({n: w.shape for n, w in global_weights.items()})
    for r in range(cfg.total_rounds):
        aggregator.reset()
        for replica in replicas:
            replica.step = r * cfg.inner_steps
            load_weights(replica.model, global_weights)
            for _ in range(cfg.inner_steps):
                replica.train_step()
            local = replica.weights()
            aggregator.add({n: global_weights[n] - local[n] for n in local}, weight=1.0)
        outer.step(global_weights, aggregator.result())
    run = sim.run_diloco(setup, "fp32")
    for name, w in global_weights.items():
        np.testing.assert_array_equal(run.weights[name], w, err_msg=name)


def test_a_replica_loads_only_the_merged_fragment_and_sends_only_its_own(setup):
    cfg = setup.cfg
    parts = fragments(setup.initial, 2)
    replica = sim.new_replica(setup, setup.shards[0], sim.inner_config(cfg, cfg.batch_size, 100), 5)
    first = replica.run_round(setup.initial, 2, send=parts[0])
    assert set(first.pseudo_gradient) == set(parts[0])
    before = replica.weights()
    merged = {n: w + 0.5 for n, w in setup.initial.items()}  # a "global" that differs everywhere
    second = replica.run_round(merged, 0, merged=parts[0], send=parts[1])  # zero steps: just the load
    after = replica.weights()
    for n in parts[0]:
        np.testing.assert_array_equal(after[n], merged[n], err_msg=n)  # loaded
        np.testing.assert_array_equal(replica.anchor[n].numpy(), merged[n], err_msg=n)
    for n in parts[1]:
        np.testing.assert_array_equal(after[n], before[n], err_msg=n)  # trained on, untouched
        # its pseudo-gradient is against the weights it was last loaded with: the initial ones
        np.testing.assert_allclose(second.pseudo_gradient[n], setup.initial[n] - before[n], atol=1e-7, err_msg=n)
    assert set(second.pseudo_gradient) == set(parts[1])


def test_overlap_keeps_the_steps_taken_since_sending(setup):
    cfg = setup.cfg
    replica = sim.new_replica(setup, setup.shards[0], sim.inner_config(cfg, cfg.batch_size, 100), 6)
    replica.run_round(setup.initial, 3)
    sent = {n: w.numpy().copy() for n, w in replica.sent_at.items()}
    for _ in range(2):  # the steps of the next round taken before the merge arrives
        replica.train_step()
    now = replica.weights()
    merged = {n: w - 0.25 for n, w in setup.initial.items()}
    replica.apply_merge(merged, keep_progress=True)
    after = replica.weights()
    moved = 0.0
    for n in merged:
        np.testing.assert_allclose(after[n], merged[n] + (now[n] - sent[n]), atol=1e-6, err_msg=n)
        np.testing.assert_array_equal(replica.anchor[n].numpy(), merged[n], err_msg=n)
        moved = max(moved, float(np.abs(now[n] - sent[n]).max()))
    assert moved > 1e-4 and not replica.sent_at  # the two steps really moved it; nothing left pending


@pytest.mark.parametrize("parts, overlap", [(1, 0), (1, 3), (2, 0), (2, 1)])
def test_one_replica_with_plain_averaging_trains_on_uninterrupted(setup, parts, overlap):
    # outer lr 1, no momentum, one replica: the merge gives back what was sent, so loading it (or
    # adding the progress since sending to it) must change nothing: the run is one replica alone
    s = with_cfg(setup, replicas=1, fragments=parts, overlap_steps=overlap, outer_lr=1.0, outer_momentum=0.0,
                 nesterov=False, aggregation="mean", rounds=4)
    s = replace(s, shards=[s.train])
    cfg = s.cfg
    run = sim.run_diloco(s, "fp32")
    alone = sim.new_replica(s, s.train, sim.inner_config(cfg, cfg.batch_size, cfg.total_rounds * cfg.inner_steps),
                            sim.data_seed(cfg.seed, 0))
    snapshots = []
    for _ in range(cfg.total_rounds * parts):
        for _ in range(cfg.round_steps):
            alone.train_step()
        snapshots.append(alone.weights())
    # the global weights hold each fragment as last sent: the last fragment at the end, the others earlier
    for f, part in enumerate(fragments(s.initial, parts)):
        expected = snapshots[-parts + f]
        for n in part:
            np.testing.assert_allclose(run.weights[n], expected[n], atol=2e-5, err_msg=f"fragment {f}: {n}")
    assert len(run.records) == cfg.total_rounds  # a point every K steps, whatever P


def test_streaming_sends_a_fragment_a_round_and_the_same_bytes_over_the_run(setup):
    plain, streaming = sim.run_diloco(setup, "fp32"), sim.run_diloco(with_cfg(setup, fragments=2), "fp32")
    assert streaming.records[-1]["bytes_sent"] == plain.records[-1]["bytes_sent"]
    assert [r["step"] for r in streaming.records] == [r["step"] for r in plain.records]
    assert streaming.records[-1]["tokens"] == plain.records[-1]["tokens"]
    assert math.isfinite(streaming.records[-1]["val_loss"])
    assert streaming.records[-1]["val_loss"] < streaming.records[0]["val_loss"] + 0.5
    assert any(not np.array_equal(streaming.weights[n], plain.weights[n]) for n in plain.weights)


def test_warm_start_is_the_ddp_baselines_first_steps(setup):
    s = with_cfg(setup, warm_start_steps=setup.cfg.inner_steps, rounds=3)
    warm, ddp = sim.run_diloco(s, "fp32"), sim.run_baseline(s, "ddp")
    assert warm.records[0]["val_loss"] == ddp.records[0]["val_loss"]
    assert warm.records[0]["bytes_sent"] == ddp.records[0]["bytes_sent"]
    assert warm.records[1]["val_loss"] != ddp.records[1]["val_loss"]  # then local rounds
    assert [r["tokens"] for r in warm.records] == [r["tokens"] for r in ddp.records]


def test_bad_streaming_options_are_refused(tmp_path):
    base = {**TWO_BLOCKS, "out": str(tmp_path)}
    with pytest.raises(ValueError, match="--fragments 3"):
        sim.SimulateConfig(**base, fragments=3)  # does not divide K = 4
    with pytest.raises(ValueError, match="--overlap-steps 2"):
        sim.SimulateConfig(**base, fragments=2, overlap_steps=2)  # a round is 2 steps
    with pytest.raises(ValueError, match="--warm-start-steps 6"):
        sim.SimulateConfig(**base, warm_start_steps=6)
    with pytest.raises(ValueError, match="no local rounds"):
        sim.SimulateConfig(**base, warm_start_steps=12)


def test_outer_lr_warms_up_then_decays_on_a_cosine():
    outer = NesterovSGD(1.0, 0.9, warmup_steps=2, decay_steps=6, min_lr_factor=0.1)
    weights, grad = {"w": np.zeros(3, np.float32)}, {"w": np.ones(3, np.float32)}
    lrs = []
    for _ in range(8):
        lrs.append(outer.current_lr())
        outer.step(weights, grad)
    expected = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)] + [0.1, 0.1]
    assert lrs == pytest.approx(expected)
    restored = NesterovSGD()
    restored.load_state_dict(outer.state_dict())
    assert restored.current_lr() == pytest.approx(0.1) and restored.decay_steps == 6
    old = outer.state_dict()
    del old["decay_steps"], old["min_lr_factor"]  # a state saved before the decay existed
    restored.load_state_dict(old)
    assert restored.decay_steps == 0 and restored.current_lr() == 1.0
    with pytest.raises(ValueError, match="decay_steps"):
        NesterovSGD(warmup_steps=5, decay_steps=5)


def test_which_fragment_a_tensor_is_in_does_not_depend_on_the_order_of_names():
    forward, backward, shuffled = fragments(NAMES, 2), fragments(NAMES[::-1], 2), fragments(sorted(NAMES), 2)
    assert [set(p) for p in forward] == [set(p) for p in backward] == [set(p) for p in shuffled]


def test_gossip_topology_streams_fragments_too(setup):
    run = sim.run_diloco(with_cfg(setup, topology="gossip", fragments=2, gossip_group_size=2), "fp32")
    plain = sim.run_diloco(with_cfg(setup, topology="gossip"), "fp32")
    # half the model a round, twice the rounds: the same bytes over the run, mixed weights included
    assert run.records[-1]["bytes_sent"] == plain.records[-1]["bytes_sent"]
    assert math.isfinite(run.records[-1]["val_loss"])
    assert any(not np.array_equal(run.weights[n], plain.weights[n]) for n in plain.weights)


class ArrivesAfter:
    """A Future-like start that is done after `polls` calls of done(): the merge of a real link."""

    def __init__(self, start, polls: int):
        self.start, self.polls = start, polls

    def done(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def result(self):
        return self.start


def test_a_merge_arriving_mid_round_keeps_the_steps_taken_meanwhile(setup):
    # one replica with plain averaging over a link: the merge is what it sent; arriving 3 steps
    # into the next round it must change nothing, so two rounds = 2K steps of training alone
    from coop.round import RoundStart
    cfg, k = setup.cfg, 4
    inner = sim.inner_config(cfg, cfg.batch_size, 100)
    replica = sim.new_replica(setup, setup.train, inner, 11)
    alone = sim.new_replica(setup, setup.train, inner, 11)
    first = replica.run_round(setup.initial, k)
    merged = {n: setup.initial[n] - first.pseudo_gradient[n] for n in setup.initial}  # = what it sent
    second = replica.run_round(None, k, arrival=ArrivesAfter(RoundStart(1, merged), polls=3))
    for _ in range(2 * k):
        alone.train_step()
    expected, got = alone.weights(), replica.weights()
    for n in expected:
        np.testing.assert_allclose(got[n], expected[n], atol=2e-5, err_msg=n)
        # and the second pseudo-gradient is this round's k steps, the 3 before the merge included
        np.testing.assert_allclose(second.pseudo_gradient[n], merged[n] - got[n], atol=1e-6, err_msg=n)
    assert len(second.losses) == k
    assert replica.run_round(None, k, arrival=ArrivesAfter(None, polls=1)) is None  # the run ended meanwhile
