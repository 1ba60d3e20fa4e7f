"""`coop simulate`: N DiLoCo replicas in one process, against the baselines, on one token budget.

Each round every taking-part replica starts from the merged weights, takes K inner steps on its
own shard, and sends its pseudo-gradient through the codec (encode -> decode, bytes counted
exactly); the merge (a topology: `star` = one global model and the outer optimizer, as the HTTP
coordinator does; `gossip` = coop.gossip.merge) makes the next round's weights. Baselines on the
same tokens: `ddp` (one model stepping on the concatenation of the N replicas' batches, drawn from
the same shards with the same RNGs: what synchronous data-parallel computes) and `single` (one
replica alone). Metrics go to OUT/metrics.jsonl, OUT/plot.png and a summary table.
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

import engine
from engine.data import CharTokenizer, TokenDataset, default_corpus, encode_corpus_in_memory
from engine.nn import GPT, GPTConfig

from . import simulate_report as report
from .codec import get_codec
from .diloco import Aggregator, NesterovSGD, Weights, shapes_of
from .progress import format_duration
from .replica import InnerConfig, Replica, load_weights, weights_of


@dataclass
class SimulateConfig:
    data: list[str] | None = None  # text files; None = the embedded default corpus (as `coop train`)
    default_corpus_chars: int = 2_000_000
    val_fraction: float = 0.1
    out: str = "runs/simulate"
    device: str = "cpu"
    seed: int = 0
    # model
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 64
    dropout: float = 0.0
    # the cooperation
    replicas: int = 4
    inner_steps: int = 50  # K
    rounds: int | None = None  # R; default 6, or from --tokens
    tokens: int | None = None  # budget over all replicas; rounds = ceil(tokens / (N K B T))
    split: str = "iid"  # "iid" (blocks dealt round-robin) or "contiguous" (non-iid shards)
    topology: str = "star"  # "star" or "gossip"
    gossip_group_size: int = 2
    gossip_mix: bool = True  # gossip also averages the group's weights (as the peers do by default)
    compression: list[str] = field(default_factory=lambda: ["fp32"])  # one DiLoCo run per codec
    int8_block: int = 256
    topk_ratio: float = 0.01
    downlink: str = "fp32"  # codec of the merged update sent back (fp32 = the full new weights' size)
    drop_prob: float = 0.0  # chance a replica misses a round
    join_at: list[str] = field(default_factory=list)  # "replica:round": absent before that round
    # inner optimisation (per replica)
    batch_size: int = 16
    inner_optimizer: str = "adamw"
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    # outer optimisation and aggregation
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    outer_warmup: int = 0  # rounds of linear outer-lr warm-up
    max_norm: float = 0.0  # clip each pseudo-gradient's global norm (0: off)
    trim_fraction: float = 0.0  # coordinate-wise trimmed mean (0: plain weighted mean)
    weight_by: str = "tokens"  # "tokens" or "equal"
    # what to run and show
    baseline: list[str] = field(default_factory=lambda: ["ddp"])  # "ddp", "single", or "none"
    no_diloco: bool = False
    tag: str = ""  # appended to run names (diloco-fp32-TAG), to tell runs apart in one report
    eval_batches: int = 10
    plot: bool = True
    quiet: bool = False

    def __post_init__(self) -> None:
        checks = [("split", self.split, self.split in ("iid", "contiguous"), "iid or contiguous"),
                  ("topology", self.topology, self.topology in ("star", "gossip"), "star or gossip"),
                  ("weight-by", self.weight_by, self.weight_by in ("tokens", "equal"), "tokens or equal"),
                  ("baseline", self.baseline, set(self.baseline) <= {"ddp", "single", "none"},
                   "ddp and/or single, or none"),
                  ("replicas", self.replicas, self.replicas >= 1, "at least 1"),
                  ("inner-steps", self.inner_steps, self.inner_steps >= 1, "at least 1"),
                  ("drop-prob", self.drop_prob, 0 <= self.drop_prob < 1, "in [0, 1)")]
        bad = [f"--{name} {value!r} (expected {expected})" for name, value, ok, expected in checks if not ok]
        if bad:
            raise ValueError(f"coop simulate: bad option(s): {'; '.join(bad)}")
        if self.rounds is not None and self.tokens is not None:
            raise ValueError("coop simulate: give --rounds or --tokens, not both")
        for name in [*self.compression, self.downlink]:
            codec_for(self, name)  # an unknown codec fails before any training

    @property
    def tokens_per_round(self) -> int:
        return self.replicas * self.inner_steps * self.batch_size * self.block_size

    @property
    def total_rounds(self) -> int:
        if self.tokens is not None:
            return max(1, math.ceil(self.tokens / self.tokens_per_round))
        return 6 if self.rounds is None else self.rounds

    def join_rounds(self) -> dict[int, int]:
        """replica -> first round it takes part in (from --join-at replica:round)."""
        out = {}
        for item in self.join_at:
            try:
                replica, round_index = (int(v) for v in item.split(":"))
            except ValueError:
                raise ValueError(f"--join-at {item!r}: expected replica:round, e.g. 3:5") from None
            if not (0 <= replica < self.replicas and round_index >= 0):
                raise ValueError(f"--join-at {item!r}: replica must be in [0, {self.replicas}), round >= 0")
            out[replica] = round_index
        if len(out) == self.replicas and min(out.values()) > 0:
            raise ValueError("--join-at: every replica joins late; at least one must start at round 0")
        return out


# ----------------------------------------------------------------------------------------------
# What every run of one invocation shares: data, shards, the initial model, the eval windows.


@dataclass
class Setup:
    cfg: SimulateConfig
    train: TokenDataset
    val: TokenDataset
    shards: list[TokenDataset]
    model_config: GPTConfig
    initial: dict[str, np.ndarray]
    eval_model: GPT
    eval_windows: list[tuple[engine.Tensor, engine.Tensor]]

    @property
    def fp32_bytes(self) -> int:
        return sum(4 * a.size for a in self.initial.values())


def load_text(cfg: SimulateConfig) -> str:
    if not cfg.data:
        return default_corpus(cfg.default_corpus_chars)
    missing = [name for name in cfg.data if not Path(name).is_file()]
    if missing:
        raise SystemExit(f"coop simulate: --data {missing[0]}: no such file")
    return "\n".join(Path(name).read_text(encoding="utf-8", errors="replace") for name in cfg.data)


def build_setup(cfg: SimulateConfig) -> Setup:
    text = load_text(cfg)
    tokenizer = CharTokenizer.from_text(text)
    train, val = encode_corpus_in_memory(text, tokenizer).split(cfg.val_fraction)
    n = cfg.replicas
    # iid: ~16 blocks per replica dealt round-robin, so each shard samples the whole corpus
    block_tokens = max(cfg.block_size + 1, min(1 << 16, len(train) // (16 * n)))
    shards = [train.shard(i, n, iid=cfg.split == "iid", block_tokens=block_tokens) for i in range(n)]
    if min(len(s) for s in shards) < cfg.block_size + 1 or len(val) < cfg.block_size + 1:
        raise SystemExit(f"coop simulate: {len(train):,} train / {len(val):,} val tokens are too few for "
                         f"{n} shards of block size {cfg.block_size}; give more text or a smaller --block-size")
    model_config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=cfg.block_size, n_layer=cfg.n_layer,
                             n_head=cfg.n_head, n_embd=cfg.n_embd, dropout=cfg.dropout)
    engine.manual_seed(cfg.seed)
    eval_model = GPT(model_config).to(cfg.device)
    eval_model.eval()
    initial = weights_of(eval_model)
    rng = np.random.default_rng(10_000 + cfg.seed)  # the same windows for every run and round
    windows = [val.get_batch(cfg.batch_size, cfg.block_size, rng) for _ in range(cfg.eval_batches)]
    windows = [(engine.tensor(x, device=cfg.device), engine.tensor(y, device=cfg.device)) for x, y in windows]
    return Setup(cfg, train, val, shards, model_config, initial, eval_model, windows)


@engine.no_grad()
def evaluate(setup: Setup, weights: Weights) -> float:
    load_weights(setup.eval_model, dict(weights))
    return float(engine.stack([setup.eval_model(x, y)[1] for x, y in setup.eval_windows]).mean().item())


def data_seed(seed: int, replica: int) -> int:
    """The batch RNG seed of replica i; the ddp baseline draws shard i's batches with the same one."""
    return 1000 * seed + 1 + replica


def inner_config(cfg: SimulateConfig, batch_size: int, total_steps: int) -> InnerConfig:
    return InnerConfig(optimizer=cfg.inner_optimizer, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                       total_steps=total_steps, weight_decay=cfg.weight_decay, beta2=cfg.beta2,
                       grad_clip=cfg.grad_clip, batch_size=batch_size, block_size=cfg.block_size)


def new_replica(setup: Setup, data: TokenDataset, inner: InnerConfig, seed: int, cls=Replica, **extra) -> Replica:
    replica = cls(setup.model_config, data, inner, setup.cfg.device, seed=seed, model=GPT(setup.model_config), **extra)
    replica.load_global(setup.initial)
    return replica


def outer_optimizer(cfg: SimulateConfig) -> NesterovSGD:
    return NesterovSGD(cfg.outer_lr, cfg.outer_momentum, cfg.nesterov and cfg.outer_momentum > 0, cfg.outer_warmup)


def copy_weights(weights: Weights) -> dict[str, np.ndarray]:
    return {name: np.array(a, dtype=np.float32) for name, a in weights.items()}


# ----------------------------------------------------------------------------------------------
# Topologies: how the round's pseudo-gradients become the next round's starting weights.


class StarTopology:
    """Everyone averages into one global model: aggregate (weighted, optionally clipped/trimmed),
    one outer step, then every replica receives the result (the HTTP coordinator's merge).
    With a lossy `downlink` codec the coordinator sends the outer update through it and applies
    the decoded update itself too, so coordinator and replicas keep identical weights."""

    name = "star"

    def __init__(self, setup: Setup):
        cfg = setup.cfg
        self.cfg, self.fp32_bytes = cfg, setup.fp32_bytes
        self.global_weights = copy_weights(setup.initial)
        self.outer = outer_optimizer(cfg)
        self.downlink = None if cfg.downlink == "fp32" else codec_for(cfg, cfg.downlink)
        self.refused: list[str] = []

    def base_for(self, replica: int) -> dict[str, np.ndarray]:
        return self.global_weights

    def eval_weights(self) -> Weights:
        return self.global_weights

    def consensus_distance(self) -> float:
        return 0.0  # one model

    def merge(self, round_index: int, updates: dict[int, Weights], tokens: dict[int, int],
              sent: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
        """Returns (bytes sent, bytes received) per replica for this merge."""
        aggregator = Aggregator(shapes_of(self.global_weights), max_norm=self.cfg.max_norm or None,
                                trim_fraction=self.cfg.trim_fraction)
        for i, update in updates.items():
            try:
                aggregator.add(update, weight=tokens[i] if self.cfg.weight_by == "tokens" else 1.0)
            except ValueError as error:  # a diverged replica: leave it out, keep the global weights clean
                self.refused.append(f"round {round_index} replica {i}: {error}")
        if aggregator.count == 0:
            return sent, {i: 0 for i in updates}
        before = copy_weights(self.global_weights) if self.downlink else None
        self.outer.step(self.global_weights, aggregator.result())
        received = self.fp32_bytes
        if self.downlink is not None:
            step = {n: before[n] - w for n, w in self.global_weights.items()}
            encoded = self.downlink.encode(step)
            decoded = self.downlink.decode(encoded.tensors, encoded.metadata)
            for n, w in self.global_weights.items():
                np.subtract(before[n], decoded[n], out=w)
            received = encoded.nbytes
        return sent, {i: received for i in updates}


class GossipTopology:
    """No global model: each replica (peer) keeps its own copy of the global weights and its own
    outer optimizer. A round is `coop.gossip.merge.gossip_round` (the rule the real peers follow):
    random disjoint groups of `--gossip-group-size` drawn with `round_rng(seed, round)`, each
    replica averages its group's pseudo-gradients (and, with `--gossip-mix`, its group's weights),
    then takes its own outer step. With a group size >= N it is exactly the star merge.
    Bytes: to each partner, the encoded pseudo-gradient (plus the fp32 weights when mixing).
    The evaluated model is the mean of the copies of the replicas that have joined."""

    name = "gossip"

    def __init__(self, setup: Setup):
        self.gossip = gossip_module()
        self.cfg, self.fp32_bytes = setup.cfg, setup.fp32_bytes
        n = setup.cfg.replicas
        self.bases = {i: copy_weights(setup.initial) for i in range(n)}
        self.outers = {i: outer_optimizer(setup.cfg) for i in range(n)}
        self.joined = {i for i in range(n) if setup.cfg.join_rounds().get(i, 0) == 0}
        self.refused: list[str] = []

    def base_for(self, replica: int) -> dict[str, np.ndarray]:
        if replica not in self.joined:  # a new peer fetches the weights of one that is already in
            self.bases[replica] = copy_weights(self.bases[min(self.joined)])
            self.joined.add(replica)
        return self.bases[replica]

    def eval_weights(self) -> Weights:
        copies = [self.bases[i] for i in sorted(self.joined)]
        return {n: np.mean([b[n] for b in copies], axis=0, dtype=np.float64).astype(np.float32) for n in copies[0]}

    def consensus_distance(self) -> float:
        """How far the joined replicas' copies of the global weights are from their mean."""
        return self.gossip.consensus_distance([self.bases[i] for i in sorted(self.joined)])

    def merge(self, round_index, updates, tokens, sent):
        ids = sorted(updates)  # the active replicas in index order, as the rule says
        size, mix = self.cfg.gossip_group_size, self.cfg.gossip_mix
        groups = self.gossip.gossip_groups(len(ids), size, self.gossip.round_rng(self.cfg.seed, round_index)) \
            if len(ids) > 1 else [[0]]
        averaged = self.gossip.gossip_round([updates[i] for i in ids], [float(tokens[i]) for i in ids], size,
                                            self.gossip.round_rng(self.cfg.seed, round_index),
                                            [self.bases[i] for i in ids] if mix else None)
        for i, update in zip(ids, averaged):
            self.outers[i].step(self.bases[i], update)
        message = {i: sent[i] + (self.fp32_bytes if mix else 0) for i in ids}
        bytes_sent, bytes_received = {}, {}
        for group in groups:
            members = [ids[k] for k in group]
            for i in members:
                bytes_sent[i] = (len(members) - 1) * message[i]
                bytes_received[i] = sum(message[j] for j in members if j != i)
        return bytes_sent, bytes_received


TOPOLOGIES = {"star": StarTopology, "gossip": GossipTopology}


def gossip_module():
    try:
        return importlib.import_module("coop.gossip.merge")
    except ImportError as error:
        raise SystemExit(f"coop simulate: --topology gossip needs coop.gossip.merge (gossip_round, gossip_groups, "
                         f"round_rng), which is not available here ({error}); use --topology star") from None


def codec_for(cfg: SimulateConfig, name: str):
    options = {"int8": {"block_size": cfg.int8_block}, "topk": {"ratio": cfg.topk_ratio}}.get(name, {})
    return get_codec(name, **options)


# ----------------------------------------------------------------------------------------------
# The runs.


@dataclass
class RunResult:
    name: str
    records: list[dict]
    weights: dict[str, np.ndarray]  # final (global, or mean of peers) weights
    notes: list[str] = field(default_factory=list)


def run_diloco(setup: Setup, codec_name: str, jsonl: Path | None = None) -> RunResult:
    cfg = setup.cfg
    n, K, R = cfg.replicas, cfg.inner_steps, cfg.total_rounds
    joins = cfg.join_rounds()
    inner = inner_config(cfg, cfg.batch_size, R * K)
    replicas = [new_replica(setup, setup.shards[i], inner, data_seed(cfg.seed, i)) for i in range(n)]
    codecs = [codec_for(cfg, codec_name) for _ in range(n)]  # one per sender: top-k keeps its residual
    topology = TOPOLOGIES[cfg.topology](setup)
    churn = np.random.default_rng([cfg.seed, 7])
    name = f"{'diloco' if cfg.topology == 'star' else cfg.topology}-{codec_name}" + (f"-{cfg.tag}" if cfg.tag else "")
    rec = report.RunLog(name, n, R, jsonl, cfg.quiet)
    version, holds = 0, {i: 0 for i in range(n) if joins.get(i, 0) == 0}  # replica -> merge it holds
    for r in range(R):
        active = [i for i in range(n) if joins.get(i, 0) <= r]
        taking_part = [i for i in active if not (churn.random() < cfg.drop_prob)]
        updates, tokens, losses, sent = {}, {}, [], {}
        for i in taking_part:
            if holds.get(i) != version:  # a late joiner, or back after a missed round: the full weights
                rec.received[i] += setup.fp32_bytes
            replicas[i].step = r * K  # everyone follows the same inner lr schedule
            result = replicas[i].run_round(topology.base_for(i), K)
            losses.append(result.mean_loss)
            try:
                encoded = codecs[i].encode(result.pseudo_gradient)
            except ValueError as error:  # NaN/inf: the replica diverged; its update must not count
                topology.refused.append(f"round {r} replica {i}: {error}")
                continue
            updates[i] = codecs[i].decode(encoded.tensors, encoded.metadata)
            tokens[i], sent[i] = result.tokens, encoded.nbytes
        if updates:
            bytes_sent, bytes_received = topology.merge(r, updates, tokens, sent)
            version += 1
            for i in updates:
                rec.sent[i] += bytes_sent.get(i, 0)
                rec.received[i] += bytes_received.get(i, 0)
                holds[i] = version
        rec.point(r + 1, (r + 1) * K, float(np.mean(losses)) if losses else math.nan,
                  evaluate(setup, topology.eval_weights()), sum(tokens.values()), sorted(tokens),
                  consensus_distance=topology.consensus_distance())
    return RunResult(name, rec.records, copy_weights(topology.eval_weights()), topology.refused)


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
    `single`: one replica at batch B for N*R*K steps on the whole train set, nothing sent."""
    cfg = setup.cfg
    n, K, R = cfg.replicas, cfg.inner_steps, cfg.total_rounds
    if kind == "ddp":
        seeds = [data_seed(cfg.seed, i) for i in range(n)]
        model = new_replica(setup, setup.shards[0], inner_config(cfg, n * cfg.batch_size, R * K), seeds[0],
                            cls=DataParallelReplica, shards=setup.shards, seeds=seeds)
        steps_per_point, bytes_per_step = K, setup.fp32_bytes
    else:
        model = new_replica(setup, setup.train, inner_config(cfg, cfg.batch_size, n * R * K), data_seed(cfg.seed, -1))
        steps_per_point, bytes_per_step = n * K, 0
    name = kind + (f"-{cfg.tag}" if cfg.tag else "")
    rec = report.RunLog(name, n, R, jsonl, cfg.quiet)
    for r in range(R):
        losses = engine.stack([model.train_step() for _ in range(steps_per_point)]).numpy()
        for i in range(n):
            rec.sent[i] += bytes_per_step * steps_per_point
            rec.received[i] += bytes_per_step * steps_per_point
        rec.point(r + 1, (r + 1) * steps_per_point, float(np.mean(losses)), evaluate(setup, model.weights()),
                  steps_per_point * model.inner.batch_size * cfg.block_size, list(range(n)) if kind == "ddp" else [0])
    return RunResult(name, rec.records, model.weights())


def simulate(cfg: SimulateConfig, log=print) -> list[RunResult]:
    """Every requested run, in order: DiLoCo per codec, then the baselines. Writes OUT/metrics.jsonl
    (replaced), OUT/plot.png, and logs the summary table."""
    if cfg.device.startswith("cuda") and not engine.cuda.is_available():
        raise SystemExit(f"coop simulate: --device {cfg.device} but CUDA is not available: "
                         f"{engine.cuda.unavailable_reason()}")
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


# ----------------------------------------------------------------------------------------------
# CLI.

HELP = {
    "data": "text file(s) (default: the embedded corpus of `coop train`)",
    "replicas": "N, replicas training together", "inner_steps": "K, inner steps between merges",
    "rounds": "R rounds (default 6)", "tokens": "token budget over all replicas, instead of --rounds",
    "split": "iid | contiguous (non-iid shards)", "topology": "star (one global model) | gossip",
    "gossip_group_size": "gossip: replicas averaging together each round",
    "gossip_mix": "gossip: also average the group's weights",
    "compression": "codec(s) of the pseudo-gradients: fp32 fp16 bf16 int8 topk; one DiLoCo run each",
    "downlink": "codec of the merged update sent back to the replicas",
    "drop_prob": "chance that a replica misses a round",
    "join_at": "replica:round, a replica that arrives late, e.g. --join-at 3:5 2:8",
    "inner_optimizer": "adamw | sgd", "warmup_steps": "inner lr warm-up, then cosine to --min-lr",
    "outer_lr": "outer Nesterov SGD lr (1 with --outer-momentum 0: plain averaging)",
    "outer_warmup": "rounds of linear outer-lr warm-up",
    "max_norm": "clip each pseudo-gradient to this global L2 norm (0: off)",
    "trim_fraction": "coordinate-wise trimmed mean: drop this fraction at each end",
    "weight_by": "tokens | equal: the weight of each replica's update",
    "baseline": "baselines on the same tokens: ddp and/or single, or none (default: ddp)",
    "no_diloco": "run only the baselines", "tag": "suffix of the run names (to tell runs apart in --report)",
    "quiet": "no progress line", "plot": "write OUT/plot.png",
}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="N DiLoCo replicas in one process, against ddp / single baselines",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SimulateConfig()
    for f in fields(SimulateConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        text = HELP["data"] if f.name == "data" else f"{HELP.get(f.name, '')} (default: {default})".lstrip()
        if isinstance(default, list) or f.name == "data":
            p.add_argument(flag, nargs="+", default=default, help=text)
        elif f.name in ("no_diloco", "quiet"):
            p.add_argument(flag, action="store_true", help=HELP[f.name])
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        else:
            kind = int if f.name in ("rounds", "tokens") else type(default)
            p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--report", nargs="+", metavar="JSONL",
                   help="train nothing: rebuild the table and OUT/plot.png from metrics.jsonl file(s)")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.report:
        report.finish(report.read_jsonl(args.report), Path(args.out), args.plot)
        return 0
    try:
        cfg = SimulateConfig(**{f.name: getattr(args, f.name) for f in fields(SimulateConfig)})
        cfg.join_rounds()
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    start = time.perf_counter()
    simulate(cfg)
    print(f"done in {format_duration(time.perf_counter() - start)}")
    return 0


