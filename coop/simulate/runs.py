"""The runs of `coop simulate`: DiLoCo per codec through the round loop, and the baselines."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import engine
from engine.data import TokenDataset

from ..eager import EagerOuter, eager_by_default
from ..replica import Replica
from ..devices import device_problem, spread_device
from ..round import RoundLoop
from . import report
from .adversary import AdversarialReplica
from .config import SimulateConfig, codec_for
from .setup import Setup, build_setup, copy_weights, data_seed, evaluate, inner_config, new_replica, outer_optimizer
from .transport import TOPOLOGIES, InProcessTransport, close_round, gossip_module


@dataclass
class RunResult:
    name: str
    records: list[dict]
    weights: dict[str, np.ndarray]  # final (global, or mean of peers) weights
    notes: list[str] = field(default_factory=list)


def run_diloco(setup: Setup, codec_name: str, jsonl: Path | None = None) -> RunResult:
    """One DiLoCo run: the warm start (synchronous steps) if asked for, then the local rounds.
    A point is logged every K inner steps; with P fragments that is every P rounds of the loop."""
    cfg = setup.cfg
    n, rounds, parts = cfg.replicas, cfg.total_rounds, cfg.fragments
    steps = cfg.round_steps  # inner steps of one round of the loop: K / P
    joins = cfg.join_rounds()
    inner = inner_config(cfg, cfg.batch_size, rounds * cfg.inner_steps)
    name = f"{'diloco' if cfg.topology == 'star' else cfg.topology}-{codec_name}" + (f"-{cfg.tag}" if cfg.tag else "")
    rec = report.RunLog(name, n, rounds, jsonl, cfg.quiet)
    initial, optimizer_state = warm_start(setup, rec) if cfg.warm_rounds else (setup.initial, None)
    first = cfg.warm_rounds * parts  # the loop's first round
    topology = TOPOLOGIES[cfg.topology](setup, initial, first)
    loops = []
    for i in range(n):
        replica = new_replica(setup, setup.shards[i], inner, data_seed(cfg.seed, i),  # --device cuda: round robin
                              device=spread_device(cfg.device, i), **adversary(cfg, i))
        eager = cfg.eager if cfg.eager is not None else eager_by_default(cfg.overlap_steps, steps)
        if cfg.overlap_steps and eager and cfg.topology == "star":  # the merge's outer step, known to it
            replica.eager = EagerOuter.of(outer_optimizer(cfg), first, parts)
        if optimizer_state is not None:  # every replica goes local from the synchronous phase's state
            replica.load_global(initial)
            replica.optimizer.load_state_dict(optimizer_state)
        loops.append(RoundLoop(replica, codec_for(cfg, codec_name),  # one codec per sender: top-k keeps its residual
                               InProcessTransport(topology, i, steps, cfg.overlap_steps), steps))
    churn = np.random.default_rng([cfg.seed, 7])
    version, holds = 0, {i: 0 for i in range(n) if joins.get(i, 0) <= cfg.warm_rounds}  # replica -> merge it holds
    losses, tokens, contributed = [], 0, set()
    for r in range(first, rounds * parts):
        point = r // parts  # the point (of K steps) this round belongs to
        active = [i for i in range(n) if joins.get(i, 0) <= point]
        taking_part = [i for i in active if not (churn.random() < cfg.drop_prob)]
        for i in taking_part:
            if holds.get(i) != version:  # a late joiner, or back after a missed round: the full weights
                rec.received[i] += setup.fp32_bytes
            round_report = loops[i].run_round()
            losses.append(round_report.result.mean_loss)
            if round_report.refused:
                topology.refused.append(f"round {r} replica {i}: {round_report.refused}")
        filed = sorted(topology.inbox.updates)
        tokens += sum(topology.inbox.tokens.values())
        merged = close_round(topology)
        if merged is not None:
            bytes_sent, bytes_received = merged
            version += 1
            for i in filed:
                rec.sent[i] += bytes_sent.get(i, 0)
                rec.received[i] += bytes_received.get(i, 0)
                holds[i] = version
        contributed |= set(filed)
        if (r + 1) % parts == 0:
            rec.point(point + 1, (point + 1) * cfg.inner_steps, float(np.mean(losses)) if losses else math.nan,
                      evaluate(setup, topology.eval_weights()) if cfg.evaluates_at(point + 1) else None,
                      tokens, sorted(contributed),
                      consensus_distance=topology.consensus_distance())
            losses, tokens, contributed = [], 0, set()
    return RunResult(name, rec.records, copy_weights(topology.eval_weights()), topology.refused)


def warm_start(setup: Setup, rec: report.RunLog) -> tuple[dict[str, np.ndarray], dict]:
    """The synchronous phase before going local (DiLoCo's warm start): --warm-start-steps steps of
    data parallel training at batch N x B, exactly the ddp baseline's first steps (same batches,
    same schedule), logged every K steps with DDP's traffic. Returns its weights and AdamW state."""
    cfg = setup.cfg
    n, inner_steps = cfg.replicas, cfg.inner_steps
    seeds = [data_seed(cfg.seed, i) for i in range(n)]
    ddp = new_replica(setup, setup.shards[0], inner_config(cfg, n * cfg.batch_size, cfg.total_rounds * inner_steps),
                      seeds[0], cls=DataParallelReplica, shards=setup.shards, seeds=seeds)
    for r in range(cfg.warm_rounds):
        losses = engine.stack([ddp.train_step() for _ in range(inner_steps)]).numpy()
        for i in range(n):
            rec.sent[i] += setup.fp32_bytes * inner_steps
            rec.received[i] += setup.fp32_bytes * inner_steps
        rec.point(r + 1, (r + 1) * inner_steps, float(np.mean(losses)),
                  evaluate(setup, ddp.weights()) if cfg.evaluates_at(r + 1) else None,
                  inner_steps * n * cfg.batch_size * cfg.block_size, list(range(n)))
    return ddp.weights(), ddp.optimizer.state_dict()


def adversary(cfg: SimulateConfig, i: int) -> dict:
    """new_replica's extra arguments for replica i: an AdversarialReplica's if i < --adversaries."""
    if i >= cfg.adversaries:
        return {}
    return {"cls": AdversarialReplica, "attack": cfg.attack, "attack_scale": cfg.attack_scale,
            "attack_seed": 1000 * cfg.seed + 500 + i}


class DataParallelReplica(Replica):
    """One model whose batch is the concatenation of every replica's batch, each drawn from that
    replica's shard with that replica's RNG: exactly the gradient synchronous DDP averages."""

    def __init__(self, *args, shards: list[TokenDataset], seeds: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.shards, self.rngs = shards, [np.random.default_rng(s) for s in seeds]

    def next_batch(self):
        per_replica = self.inner.batch_size // len(self.shards)
        pairs = [s.get_batch(per_replica, self.inner.block_size, rng) for s, rng in zip(self.shards, self.rngs)]
        x, y = np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])  # (N B, T)
        return engine.tensor(x, device=self.device), engine.tensor(y, device=self.device)


def run_baseline(setup: Setup, kind: str, jsonl: Path | None = None) -> RunResult:
    """`ddp`: R*K steps at batch N*B, one fp32 gradient sent and received per step and replica.
    `single`: one replica at batch B for N*R*K steps on the whole train set, nothing sent.
    `solo`: one replica at batch B for R*K steps (the same wall time as each DiLoCo replica: what
    one GPU would have reached alone), nothing sent."""
    cfg = setup.cfg
    n, inner_steps, rounds = cfg.replicas, cfg.inner_steps, cfg.total_rounds
    if kind == "ddp":
        seeds = [data_seed(cfg.seed, i) for i in range(n)]
        model = new_replica(setup, setup.shards[0], inner_config(cfg, n * cfg.batch_size, rounds * inner_steps),
                            seeds[0], cls=DataParallelReplica, shards=setup.shards, seeds=seeds)
        steps_per_point, bytes_per_step = inner_steps, setup.fp32_bytes
    else:
        scale = n if kind == "single" else 1
        model = new_replica(setup, setup.train, inner_config(cfg, cfg.batch_size, scale * rounds * inner_steps),
                            data_seed(cfg.seed, -1))
        steps_per_point, bytes_per_step = scale * inner_steps, 0
    name = kind + (f"-{cfg.tag}" if cfg.tag else "")
    rec = report.RunLog(name, n, rounds, jsonl, cfg.quiet)
    for r in range(rounds):
        losses = engine.stack([model.train_step() for _ in range(steps_per_point)]).numpy()
        for i in range(n):
            rec.sent[i] += bytes_per_step * steps_per_point
            rec.received[i] += bytes_per_step * steps_per_point
        rec.point(r + 1, (r + 1) * steps_per_point, float(np.mean(losses)),
                  evaluate(setup, model.weights()) if cfg.evaluates_at(r + 1) else None,
                  steps_per_point * model.inner.batch_size * cfg.block_size, list(range(n)) if kind == "ddp" else [0])
    return RunResult(name, rec.records, model.weights())


def simulate(cfg: SimulateConfig, log=print) -> list[RunResult]:
    """Every requested run, in order: DiLoCo per codec, then the baselines. Writes OUT/metrics.jsonl
    (replaced), OUT/plot.png, and logs the summary table."""
    if problem := device_problem("coop simulate", cfg.device):
        raise SystemExit(problem)
    if cfg.topology == "gossip" and not cfg.no_diloco:
        gossip_module()  # fail before any training
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "metrics.jsonl"
    jsonl.write_text("")
    setup = build_setup(cfg)
    params = sum(a.size for a in setup.initial.values())
    log(f"coop simulate: {params / 1e6:.2f}M parameters ({report.human_bytes(setup.fp32_bytes)} fp32), "
        f"{cfg.replicas} replicas x K={cfg.inner_steps} x {cfg.total_rounds} rounds, "
        f"{cfg.tokens_per_round * cfg.total_rounds:,} tokens, split {cfg.split}, topology {cfg.topology}; "
        f"data {len(setup.train):,} train / {len(setup.val):,} val tokens")
    results = []
    if not cfg.no_diloco:
        results += [run_diloco(setup, codec, jsonl) for codec in cfg.compression]
    results += [run_baseline(setup, kind, jsonl) for kind in cfg.baseline if kind != "none"]
    for result in results:
        for note in result.notes:
            log(f"{result.name}: refused an update, {note}")
    records = [r for result in results for r in result.records]
    report.finish(records, out, cfg.plot, log, title=f"coop simulate: {cfg.replicas} replicas, K={cfg.inner_steps}")
    log(f"metrics: {jsonl}")
    return results
