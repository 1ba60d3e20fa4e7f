"""coop simulate: the DiLoCo = DDP algebra at K=1, churn, determinism, exact byte counts, the CLI."""
import json
import math
import sys
from dataclasses import replace

import numpy as np
import pytest

from coop import simulate as sim
from coop.cli import main as coop_main
from coop.codec import get_codec
from coop.diloco import shapes_of
from coop.replica import Replica
from coop.simulate.report import read_jsonl, write_plot

# A tiny GPT on a slice of the embedded corpus: a few ms per step.
TINY = dict(default_corpus_chars=60_000, n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4,
            replicas=3, inner_steps=3, rounds=3, eval_batches=2, warmup_steps=2, plot=False, quiet=True)


def config(tmp_path, **overrides) -> sim.SimulateConfig:
    return sim.SimulateConfig(**{**TINY, "out": str(tmp_path), **overrides})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return sim.build_setup(config(tmp_path_factory.mktemp("sim")))


def assert_same_weights(a, b, rtol=0.0, atol=0.0):
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


def test_k1_plain_averaging_with_sgd_equals_ddp(setup):
    # K=1, outer SGD lr 1 without momentum, fp32, inner SGD at a constant lr without clipping or decay:
    # the global step is w - lr * mean_i g_i, the gradient of the concatenated batch DDP steps on.
    cfg = replace(setup.cfg, inner_steps=1, rounds=6, inner_optimizer="sgd", lr=0.5, min_lr=0.5, warmup_steps=0,
                  grad_clip=0.0, weight_decay=0.0, outer_lr=1.0, outer_momentum=0.0, compression=["fp32"],
                  aggregation="mean", clip_factor=0.0)  # the plain mean, unclipped (the default merge is robust)
    s = replace(setup, cfg=cfg)
    diloco, ddp = sim.run_diloco(s, "fp32"), sim.run_baseline(s, "ddp")
    assert_same_weights(diloco.weights, ddp.weights, rtol=1e-5, atol=1e-6)  # seen: 2.4e-7
    moved = max(float(np.abs(diloco.weights[n] - setup.initial[n]).max()) for n in setup.initial)
    assert moved > 1e-2  # the check compares weights that really trained
    assert [r["tokens"] for r in diloco.records] == [r["tokens"] for r in ddp.records]
    assert diloco.records[-1]["val_loss"] == pytest.approx(ddp.records[-1]["val_loss"], abs=1e-4)


def replay_plain_averaging(setup, cfg, records):
    """The survivors' average, round by round, from fresh replicas and the run's own list of who took part."""
    inner = sim.inner_config(cfg, cfg.batch_size, cfg.total_rounds * cfg.inner_steps)
    replicas = [sim.new_replica(setup, setup.shards[i], inner, sim.data_seed(cfg.seed, i)) for i in range(cfg.replicas)]
    global_weights = sim.copy_weights(setup.initial)
    for r, record in enumerate(records):
        if not record["taking_part"]:
            continue
        local = []
        for i in record["taking_part"]:
            replicas[i].step = r * cfg.inner_steps
            replicas[i].run_round(global_weights, cfg.inner_steps)
            local.append(replicas[i].weights())
        global_weights = {n: np.mean([w[n] for w in local], axis=0) for n in global_weights}
    return global_weights


def test_dropped_and_late_replicas_give_the_survivors_average(setup):
    cfg = replace(setup.cfg, rounds=5, drop_prob=0.4, join_at=["2:2"], outer_lr=1.0, outer_momentum=0.0,
                  aggregation="mean")  # the plain mean (the default merge is robust)
    s = replace(setup, cfg=cfg)
    result = sim.run_diloco(s, "fp32")
    parts = [r["taking_part"] for r in result.records]
    assert all(2 not in p for p in parts[:2])  # the late joiner is absent before round 2 ...
    assert any(2 in p for p in parts[2:])  # ... and takes part after
    assert any(len(p) < len([i for i in range(3) if i != 2 or r >= 2]) for r, p in enumerate(parts))  # drops
    assert all(np.isfinite(w).all() for w in result.weights.values())
    assert_same_weights(result.weights, replay_plain_averaging(setup, cfg, result.records), rtol=1e-5, atol=1e-6)
    # a late joiner downloads the full fp32 weights once, then the merged weights every round it takes part
    joined = [r for r, p in enumerate(parts) if 2 in p]
    assert result.records[-1]["bytes_received_by_replica"][2] >= (len(joined) + 1) * setup.fp32_bytes
    assert math.isfinite(result.records[-1]["val_loss"])


def test_same_seed_same_numbers(setup, tmp_path):
    cfg = replace(setup.cfg, drop_prob=0.3, compression=["topk"])
    first, second = (sim.run_diloco(sim.build_setup(cfg), "topk") for _ in range(2))
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in first.records]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in second.records]
    assert_same_weights(first.weights, second.weights)
    other = sim.run_diloco(sim.build_setup(replace(cfg, seed=1)), "topk")
    assert other.records[-1]["val_loss"] != first.records[-1]["val_loss"]


@pytest.mark.parametrize("codec", ["fp32", "fp16", "int8", "topk"])
def test_bytes_are_the_codecs_exact_payload(setup, codec):
    cfg = replace(setup.cfg, rounds=2, topk_ratio=0.05, int8_block=64, downlink="int8" if codec == "int8" else "fp32")
    result = sim.run_diloco(replace(setup, cfg=cfg), codec)
    shapes = shapes_of(setup.initial)
    payload = sim.codec_for(cfg, codec).payload_nbytes(shapes)
    down = get_codec("int8", block_size=64).payload_nbytes(shapes) if codec == "int8" else setup.fp32_bytes
    last = result.records[-1]
    assert last["bytes_sent_by_replica"] == [2 * payload] * 3
    assert last["bytes_received_by_replica"] == [2 * down] * 3
    assert setup.fp32_bytes == 4 * sum(a.size for a in setup.initial.values())
    if codec == "topk":
        assert payload == sum(8 * math.ceil(0.05 * math.prod(s)) for s in shapes.values())


def test_topk_keeps_one_error_feedback_residual_per_replica(setup, monkeypatch):
    made = []
    real = sim.codec_for

    def spy(cfg, name):
        made.append(real(cfg, name))
        return made[-1]

    monkeypatch.setattr(sim.runs, "codec_for", spy)  # where run_diloco looks it up
    sim.run_diloco(replace(setup, cfg=replace(setup.cfg, rounds=2)), "topk")
    residuals = [c.residual for c in made if getattr(c, "residual", None)]
    assert len(residuals) == 3  # one encoder per replica, each with its own residual
    assert not np.array_equal(residuals[0]["transformer.wte.weight"], residuals[1]["transformer.wte.weight"])


def test_baselines_match_the_token_budget_and_count_a_gradient_per_step(setup):
    ddp, single = sim.run_baseline(setup, "ddp"), sim.run_baseline(setup, "single")
    diloco_tokens = setup.cfg.tokens_per_round * setup.cfg.total_rounds
    assert ddp.records[-1]["tokens"] == single.records[-1]["tokens"] == diloco_tokens
    steps = setup.cfg.inner_steps * setup.cfg.total_rounds
    assert ddp.records[-1]["bytes_sent_by_replica"] == [steps * setup.fp32_bytes] * 3
    assert single.records[-1]["bytes_sent"] == 0 and single.records[-1]["step"] == 3 * steps


def test_token_budget_sets_the_rounds(tmp_path):
    cfg = config(tmp_path, rounds=None, tokens=1000)
    assert cfg.total_rounds == math.ceil(1000 / (3 * 3 * 4 * 16))
    with pytest.raises(ValueError, match="not both"):
        config(tmp_path, tokens=1000)


def test_cli_writes_jsonl_plot_and_table(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["simulate", "--default-corpus-chars", "60000", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
            "--block-size", "16", "--batch-size", "4", "--replicas", "2", "--inner-steps", "2", "--rounds", "2",
            "--eval-batches", "2", "--compression", "fp32", "int8", "--baseline", "ddp", "single",
            "--join-at", "1:1", "--outer-warmup", "2", "--out", str(out), "--quiet"]
    assert coop_main(argv) == 0
    records = read_jsonl([out / "metrics.jsonl"])
    assert {r["run"] for r in records} == {"diloco-fp32", "diloco-int8", "ddp", "single"}
    assert len(records) == 8 and all(math.isfinite(r["val_loss"]) for r in records)
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "| diloco-int8 |" in printed and "val vs ddp" in printed
    (out / "plot.png").unlink()
    assert coop_main(["simulate", "--report", str(out / "metrics.jsonl"), "--out", str(out)]) == 0
    assert (out / "plot.png").is_file()


def test_cli_refuses_bad_options_and_missing_gossip(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices: one line, exit 2
        coop_main(["simulate", "--split", "random", "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and "invalid choice: 'random'" in capsys.readouterr().err
    assert coop_main(["simulate", "--join-at", "9:1", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "coop simulate: --join-at '9:1': replica must be in [0, 4), round >= 0"
    monkeypatch.setitem(sys.modules, "coop.gossip.merge", None)  # as if it were not written yet
    with pytest.raises(SystemExit, match="needs coop.gossip.merge"):
        coop_main(["simulate", "--topology", "gossip", "--out", str(tmp_path)])


def test_gossip_with_one_group_is_the_star_merge_and_counts_partner_bytes(setup):
    pytest.importorskip("coop.gossip.merge")
    # fp32 on the wire: the two merges round differently in the last bit at most (the group's global
    # copies are mixed, the star has one), and an int8 code at a rounding edge would turn that bit
    # into a whole quantisation step
    star = sim.run_diloco(setup, "fp32")
    one_group = sim.run_diloco(replace(setup, cfg=replace(setup.cfg, topology="gossip", gossip_group_size=3)), "fp32")
    assert_same_weights(one_group.weights, star.weights, rtol=1e-5, atol=1e-6)
    # one group keeps every copy identical; the star has one model
    assert all(r["consensus_distance"] < 1e-6 for r in one_group.records + star.records)
    cfg = replace(setup.cfg, replicas=4, topology="gossip", gossip_group_size=2, join_at=["3:1"], drop_prob=0.2)
    pairs = sim.run_diloco(sim.build_setup(cfg), "int8")
    assert pairs.name == "gossip-int8" and all(np.isfinite(w).all() for w in pairs.weights.values())
    message = sim.codec_for(cfg, "int8").payload_nbytes(shapes_of(setup.initial)) + setup.fp32_bytes
    sent = pairs.records[-1]["bytes_sent_by_replica"]
    assert all(b % message == 0 for b in sent) and max(sent) > 0  # whole messages to partners
    distances = [r["consensus_distance"] for r in pairs.records]
    assert all(np.isfinite(distances)) and max(distances) > 0  # pairs let the copies drift apart a little


def test_replica_class_is_the_one_the_workers_use():
    assert issubclass(sim.DataParallelReplica, Replica)
    assert json.dumps(sim.SimulateConfig().__dict__)  # the config is plain data (logged, compared)


def test_whole_split_samples_every_replica_from_the_whole_train_split(tmp_path):
    setup = sim.build_setup(config(tmp_path, split="whole"))
    assert all(shard is setup.train for shard in setup.shards)
    inner = sim.inner_config(setup.cfg, setup.cfg.batch_size, 10)
    first, second = (sim.new_replica(setup, setup.shards[i], inner, sim.data_seed(0, i)) for i in range(2))
    x0, x1 = first.next_batch()[0].numpy(), second.next_batch()[0].numpy()
    assert x0.shape == x1.shape and not np.array_equal(x0, x1)  # one corpus, each replica its own windows
    result = sim.run_diloco(setup, "fp32")
    assert np.isfinite(result.records[-1]["val_loss"])
    assert result.records[-1]["tokens"] == setup.cfg.tokens_per_round * setup.cfg.total_rounds  # cumulative


def test_adversaries_send_the_attack_and_the_default_merge_holds(tmp_path, monkeypatch):
    cfg = config(tmp_path, replicas=4, rounds=4, baseline=["none"])
    setup4 = sim.build_setup(cfg)
    sent = []
    original = sim.InProcessTransport.exchange

    def spy(self, round_index, contribution):
        sent.append((self.index, contribution.result.pseudo_gradient, contribution.decoded()))
        return original(self, round_index, contribution)

    monkeypatch.setattr(sim.InProcessTransport, "exchange", spy)
    attacked = replace(cfg, adversaries=1, attack="scale", attack_scale=-100.0)
    sim.run_diloco(replace(setup4, cfg=attacked), "fp32")
    first = [(i, honest, decoded) for i, honest, decoded in sent if i == 0]
    assert first and all(np.allclose(decoded[n], honest[n]) for _, honest, decoded in first for n in honest)
    # what replica 0 returned (and the codec sent) is the attack; the others send their own updates
    norms = {i: max(float(np.abs(d[n]).max()) for n in d) for i, _, d in sent}
    assert norms[0] > 20 * max(norms[i] for i in (1, 2, 3))
    monkeypatch.setattr(sim.InProcessTransport, "exchange", original)
    clean_run = sim.run_diloco(replace(setup4, cfg=cfg), "fp32")
    clean = clean_run.records[-1]["val_loss"]

    def moved_from_clean(run) -> float:  # how far the attack took the weights from the clean run's
        return float(np.sqrt(sum(np.sum((run.weights[n] - w) ** 2) for n, w in clean_run.weights.items())))

    for kind in ("signflip", "noise"):
        robust = sim.run_diloco(replace(setup4, cfg=replace(cfg, adversaries=1, attack=kind)), "fp32")
        plain = sim.run_diloco(replace(setup4, cfg=replace(cfg, adversaries=1, attack=kind, aggregation="mean",
                                                           clip_factor=0.0)), "fp32")
        assert abs(robust.records[-1]["val_loss"] / clean - 1) < 0.03
        # the plain mean does not hold: the attack takes its weights far away. (Not read off its val
        # loss: on a model this small, 4 rounds in, a wrecked model's loss can land anywhere; seen
        # below the clean run's, on another Python's stdlib as the corpus.)
        assert moved_from_clean(plain) > 10 * moved_from_clean(robust)
    with pytest.raises(ValueError, match="adversaries"):
        replace(cfg, adversaries=5)
    with pytest.raises(ValueError, match="attack"):
        replace(cfg, attack="krum")


def test_without_matplotlib_the_plot_is_skipped_with_the_install_line(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = ["simulate", "--default-corpus-chars", "30000", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
            "--block-size", "16", "--batch-size", "2", "--replicas", "2", "--inner-steps", "2", "--rounds", "1",
            "--eval-batches", "1", "--compression", "fp32", "--baseline", "none", "--out", str(out), "--quiet"]
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on an install without the [plot] extra
    assert coop_main(argv) == 0
    printed = capsys.readouterr().out
    assert "pip install 'coop[plot]'" in printed and "| diloco-fp32 |" in printed
    assert (out / "metrics.jsonl").read_text() and not (out / "plot.png").exists()
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'coop\[plot\]'"):
        write_plot(read_jsonl([out / "metrics.jsonl"]), out / "plot.png")
