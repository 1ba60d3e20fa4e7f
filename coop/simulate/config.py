"""What one `coop simulate` invocation runs: the model, the cooperation, the optimisers, the runs."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..codec import Codec, get_codec
from ..diloco import (DEFAULT_CLIP_FACTOR, DEFAULT_MIN_CONTRIBUTIONS, DEFAULT_RULE, DEFAULT_TRIM_FRACTION, RULES,
                      Aggregator)
from .adversary import ATTACKS


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
    inner_steps: int = 20  # K (20, int4, outer lr 0.5: the best of docs/results.md's sweep)
    rounds: int | None = None  # R; default 6, or from --tokens
    tokens: int | None = None  # budget over all replicas; rounds = ceil(tokens / (N K B T))
    # "iid" (blocks dealt round-robin), "contiguous" (non-iid shards), or "whole": every replica
    # samples its windows from the whole train split with its own RNG (as the PyTorch reference does)
    split: str = "iid"
    topology: str = "star"  # "star" or "gossip"
    gossip_group_size: int = 2
    gossip_mix: bool = True  # gossip also averages the group's weights (as the peers do by default)
    compression: list[str] = field(default_factory=lambda: ["int4"])  # one DiLoCo run per codec
    int8_block: int = 256
    int4_block: int = 64
    topk_ratio: float = 0.01  # topk and topk8
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
    outer_lr: float = 0.5
    outer_momentum: float = 0.9
    nesterov: bool = True
    outer_warmup: int = 0  # rounds of linear outer-lr warm-up
    outer_decay: bool = False  # cosine decay of the outer lr over the run, to outer_min_lr_factor x
    outer_min_lr_factor: float = 0.1
    # streaming DiLoCo (coop.streaming) and overlap
    fragments: int = 1  # P: the model in P fragments merged in turn; a round is K / P inner steps
    overlap_steps: int = 0  # the merge is applied this many inner steps into the next round (one-step delay)
    warm_start_steps: int = 0  # synchronous (DDP) inner steps before going local, a multiple of K
    aggregation: str = DEFAULT_RULE  # coop.diloco.RULES: filtered_mean, median, trimmed_mean, centered_clip, mean
    trim_fraction: float = DEFAULT_TRIM_FRACTION  # trimmed_mean: drop this fraction at each end
    clip_factor: float = DEFAULT_CLIP_FACTOR  # clip each update to this x the round's median norm (0: off)
    max_norm: float = 0.0  # clip each pseudo-gradient's global norm (0: off)
    min_contributions: int = DEFAULT_MIN_CONTRIBUTIONS  # fewer: the plain weighted mean
    weight_by: str = "tokens"  # "tokens" or "equal"
    # adversarial replicas (coop.simulate.adversary): the first `adversaries` replicas send the attack
    adversaries: int = 0
    attack: str = "signflip"  # signflip | noise | scale
    attack_scale: float = 100.0
    # what to run and show
    baseline: list[str] = field(default_factory=lambda: ["ddp"])  # "ddp", "single", "solo", or "none"
    no_diloco: bool = False
    tag: str = ""  # appended to run names (diloco-fp32-TAG), to tell runs apart in one report
    eval_batches: int = 10
    eval_every: int = 1  # evaluate every N points (of K steps), and always at the end
    plot: bool = True
    quiet: bool = False

    def __post_init__(self) -> None:
        checks = [("split", self.split, self.split in ("iid", "contiguous", "whole"), "iid, contiguous or whole"),
                  ("topology", self.topology, self.topology in ("star", "gossip"), "star or gossip"),
                  ("weight-by", self.weight_by, self.weight_by in ("tokens", "equal"), "tokens or equal"),
                  ("baseline", self.baseline, set(self.baseline) <= {"ddp", "single", "solo", "none"},
                   "ddp, single and/or solo, or none"),
                  ("replicas", self.replicas, self.replicas >= 1, "at least 1"),
                  ("inner-steps", self.inner_steps, self.inner_steps >= 1, "at least 1"),
                  ("drop-prob", self.drop_prob, 0 <= self.drop_prob < 1, "in [0, 1)"),
                  ("aggregation", self.aggregation, self.aggregation in RULES, " | ".join(RULES)),
                  ("adversaries", self.adversaries, 0 <= self.adversaries <= self.replicas, "in [0, replicas]"),
                  ("attack", self.attack, self.attack in ATTACKS, " | ".join(ATTACKS)),
                  ("fragments", self.fragments, self.fragments >= 1 and self.inner_steps % self.fragments == 0,
                   f"at least 1 and dividing --inner-steps {self.inner_steps}"),
                  ("overlap-steps", self.overlap_steps,
                   0 <= self.overlap_steps < self.inner_steps // max(1, self.fragments),
                   f"in [0, K / fragments = {self.inner_steps // max(1, self.fragments)})"),
                  ("warm-start-steps", self.warm_start_steps,
                   self.warm_start_steps >= 0 and self.warm_start_steps % self.inner_steps == 0,
                   f"a multiple of --inner-steps {self.inner_steps}"),
                  ("eval-every", self.eval_every, self.eval_every >= 1, "at least 1"),
                  ("outer-min-lr-factor", self.outer_min_lr_factor, 0 <= self.outer_min_lr_factor <= 1, "in [0, 1]")]
        bad = [f"--{name} {value!r} (expected {expected})" for name, value, ok, expected in checks if not ok]
        if bad:
            raise ValueError(f"coop simulate: bad option(s): {'; '.join(bad)}")
        if self.warm_start_steps and self.warm_start_steps >= self.total_rounds * self.inner_steps:
            raise ValueError(f"coop simulate: --warm-start-steps {self.warm_start_steps} leaves no local rounds "
                             f"(the run has {self.total_rounds * self.inner_steps} inner steps)")
        if self.rounds is not None and self.tokens is not None:
            raise ValueError("coop simulate: give --rounds or --tokens, not both")
        for name in [*self.compression, self.downlink]:
            codec_for(self, name)  # an unknown codec fails before any training
        try:
            self.aggregator({"w": (1,)})  # bad aggregation options fail before any training
        except ValueError as error:
            raise ValueError(f"coop simulate: {error}") from None

    def aggregator(self, shapes) -> Aggregator:
        """The merge's aggregator, from --aggregation, --trim-fraction, --clip-factor, --max-norm."""
        return Aggregator(shapes, rule=self.aggregation, trim_fraction=self.trim_fraction,
                          clip_factor=self.clip_factor or None, max_norm=self.max_norm or None,
                          min_contributions=self.min_contributions)

    @property
    def tokens_per_round(self) -> int:
        return self.replicas * self.inner_steps * self.batch_size * self.block_size

    @property
    def total_rounds(self) -> int:
        if self.tokens is not None:
            return max(1, math.ceil(self.tokens / self.tokens_per_round))
        return 6 if self.rounds is None else self.rounds

    @property
    def round_steps(self) -> int:
        """Inner steps of one round of the loop: K, or K / P when streaming P fragments."""
        return self.inner_steps // self.fragments

    @property
    def warm_rounds(self) -> int:
        """Rounds (of K steps) trained synchronously before the local rounds start."""
        return self.warm_start_steps // self.inner_steps

    def evaluates_at(self, point: int) -> bool:
        """Whether point `point` (1-based, one per K inner steps) measures the val loss."""
        return point % self.eval_every == 0 or point == self.total_rounds

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


def codec_for(cfg: SimulateConfig, name: str) -> Codec:
    options = {"int8": {"block_size": cfg.int8_block}, "int4": {"block_size": cfg.int4_block},
               "topk": {"ratio": cfg.topk_ratio}, "topk8": {"ratio": cfg.topk_ratio}}.get(name, {})
    return get_codec(name, **options)
