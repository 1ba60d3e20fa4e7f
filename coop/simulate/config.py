"""What one `coop simulate` invocation runs: the model, the cooperation, the optimisers, the runs."""
from __future__ import annotations

import math
from dataclasses import field
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

from ..codec import CODECS, Codec, get_codec
from ..diloco import (DEFAULT_CLIP_FACTOR, DEFAULT_MIN_CONTRIBUTIONS, DEFAULT_RULE, DEFAULT_TRIM_FRACTION, RULES,
                      Aggregator)
from ..devices import resolve_device
from ..options import existing_files
from .adversary import ATTACKS

CODEC_NAMES = tuple(CODECS)


AtLeast1 = Annotated[int, Field(ge=1)]
AtLeast0 = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # [0, 1)


@dataclass(config=ConfigDict(extra="forbid"))
class SimulateConfig:
    """Every option of `coop simulate`, checked (pydantic) before any work; a bad value raises a
    ValueError naming it (`coop simulate` prints it as one line and exits 2: coop.options)."""

    data: list[str] | None = None  # text files; None = the embedded default corpus (as `coop train`)
    default_corpus_chars: AtLeast1 = 2_000_000
    val_fraction: Annotated[float, Field(gt=0, lt=1)] = 0.1
    out: str = "runs/simulate"
    device: Annotated[str, Field(validate_default=True)] = "auto"  # auto: cuda when a GPU is seen, else cpu
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    # model
    n_layer: AtLeast1 = 4
    n_head: AtLeast1 = 4
    n_embd: AtLeast1 = 128
    block_size: AtLeast1 = 64
    dropout: Fraction = 0.0
    # the cooperation
    replicas: AtLeast1 = 4
    inner_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 20  # K (20, int4, outer lr 0.5: docs/results.md's best)
    rounds: AtLeast1 | None = None  # R; default 6, or from --tokens
    tokens: AtLeast1 | None = None  # budget over all replicas; rounds = ceil(tokens / (N K B T))
    # "iid" (blocks dealt round-robin), "contiguous" (non-iid shards), or "whole": every replica
    # samples its windows from the whole train split with its own RNG (as the PyTorch reference does)
    split: Literal["iid", "contiguous", "whole"] = "iid"
    topology: Literal["star", "gossip"] = "star"
    gossip_group_size: Annotated[int, Field(ge=2)] = 2
    gossip_mix: bool = True  # gossip also averages the group's weights (as the peers do by default)
    compression: list[Literal[CODEC_NAMES]] = field(default_factory=lambda: ["int4"])  # one DiLoCo run per codec
    int8_block: AtLeast1 = 256
    int4_block: AtLeast1 = 64
    topk_ratio: Annotated[float, Field(gt=0, le=1)] = 0.01  # topk and topk8
    downlink: Literal[CODEC_NAMES] = "fp32"  # codec of the merged update sent back (fp32 = the new weights' size)
    drop_prob: Fraction = 0.0  # chance a replica misses a round
    join_at: list[str] = field(default_factory=list)  # "replica:round": absent before that round
    # inner optimisation (per replica)
    batch_size: AtLeast1 = 16
    inner_optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: Annotated[float, Field(gt=0)] = 1e-3
    min_lr: NonNegative = 1e-4
    warmup_steps: AtLeast0 = 100
    weight_decay: NonNegative = 0.1
    beta2: Fraction = 0.95
    grad_clip: NonNegative = 1.0
    # outer optimisation and aggregation
    outer_lr: Annotated[float, Field(gt=0)] = 0.5
    outer_momentum: Fraction = 0.9
    nesterov: bool = True
    outer_warmup: AtLeast0 = 0  # rounds of linear outer-lr warm-up
    outer_decay: bool = False  # cosine decay of the outer lr over the run, to outer_min_lr_factor x
    outer_min_lr_factor: Annotated[float, Field(ge=0, le=1)] = 0.1
    # streaming DiLoCo (coop.streaming) and overlap
    fragments: AtLeast1 = 1  # P: the model in P fragments merged in turn; a round is K / P inner steps
    overlap_steps: AtLeast0 = 0  # the merge is applied this many inner steps into the next round (one-step delay)
    eager: bool | None = None  # overlap (star): the steps beside the merge from its eager guess (coop.eager);
    # None: for an overlap of at least a quarter of the round (coop.eager.eager_by_default)
    warm_start_steps: AtLeast0 = 0  # synchronous (DDP) inner steps before going local, a multiple of K
    aggregation: Literal[RULES] = DEFAULT_RULE  # filtered_mean, median, trimmed_mean, centered_clip, mean
    trim_fraction: Annotated[float, Field(ge=0, lt=0.5)] = DEFAULT_TRIM_FRACTION  # trimmed_mean: dropped at each end
    clip_factor: NonNegative = DEFAULT_CLIP_FACTOR  # clip each update to this x the round's median norm (0: off)
    max_norm: NonNegative = 0.0  # clip each pseudo-gradient's global norm (0: off)
    min_contributions: AtLeast1 = DEFAULT_MIN_CONTRIBUTIONS  # fewer: the plain weighted mean
    weight_by: Literal["tokens", "equal"] = "tokens"
    # adversarial replicas (coop.simulate.adversary): the first `adversaries` replicas send the attack
    adversaries: AtLeast0 = 0
    attack: Literal[ATTACKS] = "signflip"
    attack_scale: float = 100.0  # negative too: scale -S is a sign flip
    # what to run and show
    baseline: list[Literal["ddp", "single", "solo", "none"]] = field(default_factory=lambda: ["ddp"])
    no_diloco: bool = False
    tag: str = ""  # appended to run names (diloco-fp32-TAG), to tell runs apart in one report
    eval_batches: AtLeast1 = 10
    eval_every: AtLeast1 = 1  # evaluate every N points (of K steps), and always at the end
    plot: bool = True
    quiet: bool = False

    _real_device = field_validator("device")(resolve_device)  # "auto" -> cuda or cpu
    _data_files = field_validator("data")(existing_files)

    def __post_init__(self) -> None:
        """The checks across options (each field's own are its constraints above)."""
        checks = [("n-embd", self.n_embd, self.n_embd % self.n_head == 0, f"a multiple of --n-head {self.n_head}"),
                  ("adversaries", self.adversaries, self.adversaries <= self.replicas, "in [0, replicas]"),
                  ("fragments", self.fragments, self.inner_steps % self.fragments == 0,
                   f"dividing --inner-steps {self.inner_steps}"),
                  ("overlap-steps", self.overlap_steps, self.overlap_steps < self.inner_steps // self.fragments,
                   f"in [0, K / fragments = {self.inner_steps // self.fragments})"),
                  ("warm-start-steps", self.warm_start_steps, self.warm_start_steps % self.inner_steps == 0,
                   f"a multiple of --inner-steps {self.inner_steps}")]
        bad = [f"--{name} {value!r} (expected {expected})" for name, value, ok, expected in checks if not ok]
        if bad:
            raise ValueError(f"bad option(s): {'; '.join(bad)}")
        if self.rounds is not None and self.tokens is not None:
            raise ValueError("give --rounds or --tokens, not both")
        if self.warm_start_steps and self.warm_start_steps >= self.total_rounds * self.inner_steps:
            raise ValueError(f"--warm-start-steps {self.warm_start_steps} leaves no local rounds "
                             f"(the run has {self.total_rounds * self.inner_steps} inner steps)")
        for name in [*self.compression, self.downlink]:
            codec_for(self, name)  # bad codec options fail before any training
        self.aggregator({"w": (1,)})  # bad aggregation options fail before any training
        self.join_rounds()  # a bad --join-at too

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
