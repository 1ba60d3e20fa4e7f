"""The run config: one file that describes a DiLoCo training run, whichever transport runs it.

`coop-coordinator serve --config run.toml` and `coop swarm start --config run.toml` read the same
file (TOML, YAML or JSON), validated by pydantic; unknown keys are refused, so a typo never passes
silently, and every error names the field (`coordinator.min_deadline_s: ...`).

    seed          initial weights, worker seeds, the swarm's group draws
    [model]       GPT shape (vocab from the tokenizer unless given); init_from: a Hugging Face GPT-2
                  directory to start from (coop.init_from)
    [data]        path = "default" (Python's stdlib source) or a text file; tokenizer = "char" | "bpe"
    [inner]       steps = K and the inner optimizer of every worker/peer (coop.replica.InnerConfig)
    [outer]       Nesterov SGD on the global weights (coop.outer.NesterovSGD)
    [compression] the codec pseudo-gradients travel with (coop.codec)
    [rounds]      how many outer rounds, and evaluation
    [coordinator] read only in HTTP mode: quorum, deadlines, timeouts, robust aggregation, size limits
                  (the gossip merge uses coop.diloco.aggregate's defaults, the same robust ones)
    [gossip]      read only in peer-to-peer mode: group size, weight mixing, timeouts, heartbeats

`coop-coordinator example-config` (or `coop swarm example-config`) prints `EXAMPLE_TOML`. Files in
the two older layouts (the coordinator's `[rounds] quorum_fraction`, `[aggregation]`, `[limits]`;
the swarm's top-level `inner_steps`/`rounds`, `[gossip] codec`) are still read: `_move_legacy_keys`.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from coop.codec import Codec, get_codec
from coop.diloco import DEFAULT_CLIP_FACTOR, DEFAULT_MIN_CONTRIBUTIONS, DEFAULT_RULE, DEFAULT_TRIM_FRACTION
from coop.eager import eager_by_default
from coop.outer import NesterovSGD
from coop.replica import InnerConfig
from engine.data import BPETokenizer, CharTokenizer, default_corpus
from engine.nn import GPTConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(Section):
    """GPT shape. vocab_size None: the tokenizer's; a larger value pads the embedding (e.g. 50304,
    GPT-2's 50257 rounded up to a multiple of 64, as nanoGPT does). init_from: a Hugging Face GPT-2
    directory (config.json, model.safetensors, tokenizer.json) the global model starts from; the run
    then tokenizes with its tokenizer, and the shape keys left out are its (coop.init_from fills
    them in where the run starts; given ones must agree)."""

    vocab_size: int | None = Field(None, ge=2)
    n_layer: int = Field(4, ge=1)
    n_head: int = Field(4, ge=1)
    n_embd: int = Field(128, ge=1)
    block_size: int = Field(128, ge=2)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True
    init_from: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class DataSection(Section):
    """Read once, by the coordinator or by the swarm's first peer; the others receive the tokens."""

    path: str = "default"  # a UTF-8 text file, or "default": the running Python's stdlib source
    default_chars: int = Field(2_000_000, ge=10_000)  # how much of the default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = Field(2048, ge=256)  # for bpe
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    shards: int = Field(8, ge=1, le=4096)  # HTTP mode: the training tokens are cut into this many shards
    iid_shards: bool = True  # deal blocks round-robin so that every shard spans the whole corpus

    def corpus_text(self) -> str:
        if self.path == "default":
            return default_corpus(self.default_chars)
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"data.path = {self.path!r}: no such file on this machine; give a UTF-8 text "
                                    "file or \"default\"")
        return path.read_text(encoding="utf-8", errors="replace")

    def new_tokenizer(self, text: str):
        """A tokenizer made for `text`: characters, or byte-level BPE trained to `vocab_size`."""
        if self.tokenizer == "char":
            return CharTokenizer.from_text(text)
        return BPETokenizer.train(texts=[text], vocab_size=self.vocab_size)


class InnerSection(Section):
    """K inner steps per round and each replica's inner optimizer (fields of coop.replica.InnerConfig).
    K is `inner_steps` in code; its key in a config file is `[inner] steps` (read and written so)."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    inner_steps: int = Field(50, ge=1, le=1_000_000, alias="steps")  # K
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0.0)
    min_lr: float = Field(1e-4, ge=0.0)
    warmup_steps: int = Field(100, ge=0)
    total_steps: int | None = Field(None, ge=1)  # of the cosine schedule; None = rounds.max_rounds * inner_steps
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, ge=0.0)
    batch_size: int = Field(16, ge=1)


class OuterSection(Section):
    lr: float = Field(0.7, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    nesterov: bool = True
    warmup_steps: int = Field(0, ge=0)  # rounds of linear warm-up of the outer lr
    decay: bool = False  # cosine decay of the outer lr over rounds.max_rounds, to min_lr_factor x lr
    min_lr_factor: float = Field(0.1, ge=0.0, le=1.0)
    # streaming DiLoCo (coop.streaming): the model in P fragments merged in turn; a round is
    # inner.steps / P inner steps and sends one fragment, each fragment is merged every inner.steps
    fragments: int = Field(1, ge=1)
    # overlap (HTTP): a worker starts the next round's inner steps once its update is accepted and
    # applies the merge when it arrives, keeping the steps taken meanwhile (one-step-delayed update),
    # at most this many steps ahead: then it waits for the merge (the delay stays a fraction of a
    # round, as streaming DiLoCo's overlap; a whole round of delay cost 8-90% in val loss). 0: off
    overlap_steps: int = Field(0, ge=0)
    # overlap: the steps beside the merge start from the outer step the worker can take alone, its own
    # update standing in for the round's mean (eager updates, coop.eager); false: from its end of round;
    # unset: eager for an overlap of at least a quarter of the round (coop.eager.eager_by_default)
    eager: bool | None = None

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> OuterSection:
        if self.nesterov and self.momentum == 0:
            raise ValueError("outer.nesterov needs outer.momentum > 0; set nesterov = false for plain averaging")
        return self


class CompressionSection(Section):
    codec: Literal["fp32", "fp16", "bf16", "int8", "int4", "topk", "topk8"] = "fp32"
    options: dict[str, Any] = Field(default_factory=dict)  # e.g. {block_size = 256} or {ratio = 0.01}
    # HTTP: "codec" sends workers the change of the weights in this codec (coop.coordinator.downlink)
    # instead of the fp32 weights every round, with a full snapshot every `snapshot_every` rounds
    downlink: Literal["fp32", "codec"] = "fp32"
    snapshot_every: int = Field(50, ge=0)  # 0: only on join

    @model_validator(mode="after")
    def _codec_accepts_options(self) -> CompressionSection:
        get_codec(self.codec, **self.options)  # raises ValueError with the codec's own message
        return self


class RoundsSection(Section):
    max_rounds: int = Field(100, ge=1)  # outer rounds of the run (HTTP) or of each peer (gossip)
    eval_every: int = Field(1, ge=0)  # val loss of the global weights every N rounds; 0: never
    eval_batches: int = Field(8, ge=1)


class CoordinatorSection(Section):
    """HTTP mode. A round closes when every active worker has reported, or when the quorum has
    reported and the deadline has passed: `deadline_factor` x the median time workers took in
    recent rounds, clamped to [min_deadline_s, max_deadline_s]."""

    min_workers: int = Field(1, ge=1)  # no round closes with fewer reports
    quorum_fraction: float = Field(0.5, gt=0.0, le=1.0)  # of the active workers, once the deadline has passed
    deadline_factor: float = Field(1.5, ge=1.0)
    min_deadline_s: float = Field(10.0, gt=0.0)
    max_deadline_s: float = Field(600.0, gt=0.0)
    worker_timeout_s: float = Field(60.0, gt=0.0)  # no heartbeat for this long: the worker is inactive
    heartbeat_s: float = Field(10.0, gt=0.0)  # how often workers say they are alive
    # robust aggregation (coop.diloco.Aggregator; docs/results.md, "Robust aggregation")
    aggregation: Literal["median", "trimmed_mean", "centered_clip", "filtered_mean", "mean"] = DEFAULT_RULE  # mean: plain, O(model)
    trim_fraction: float = Field(DEFAULT_TRIM_FRACTION, ge=0.0, lt=0.5)  # trimmed_mean: dropped at each end
    clip_factor: float | None = Field(DEFAULT_CLIP_FACTOR, ge=0.0)  # clip to this x the median norm; 0/None: off
    max_norm: float | None = Field(None, gt=0.0)  # clip each contribution's global L2 norm to this, too
    min_contributions: int = Field(DEFAULT_MIN_CONTRIBUTIONS, ge=1)  # fewer: the plain weighted mean
    # uploads, and the updates the robust rules keep until the round closes, stay in RAM up to
    # this many MB; past it they go to files in state_dir/spool (read back by chunks; the page
    # cache keeps what fits): memory O(model) + this. None: half the memory available when the
    # coordinator starts. 0: everything through the disk
    ram_for_updates_mb: float | None = Field(None, ge=0.0)
    # limits on what the network may send
    max_update_bytes: int | None = Field(None, ge=1024)  # None: the fp32 size of the model plus headers
    max_json_bytes: int = Field(65536, ge=1024)
    max_workers: int = Field(1024, ge=1)
    concurrent_uploads: int = Field(2, ge=1)  # uploads decoded at once (each received in full first)
    # limits on time and connections (a slow or hostile client must not hold the server)
    body_timeout_s: float = Field(600.0, gt=0.0)  # to send one request body; then 408 (an update at 1 MB/s: 600 MB)
    header_timeout_s: float = Field(10.0, gt=0.0)  # to send a request's line and headers; then the connection is closed
    keep_alive_s: int = Field(30, ge=1)  # an idle keep-alive connection is closed after this long
    max_connections: int = Field(512, ge=4)  # open connections at once; beyond: 503
    joins_per_minute: float = Field(30.0, gt=0.0)  # per client address (a burst of this many, then this rate); 429

    def aggregator_options(self) -> dict[str, Any]:
        """The keyword arguments of coop.diloco.Aggregator these keys give."""
        return {"rule": self.aggregation, "trim_fraction": self.trim_fraction, "clip_factor": self.clip_factor or None,
                "max_norm": self.max_norm, "min_contributions": self.min_contributions}

    @model_validator(mode="after")
    def _bounds_ordered(self) -> CoordinatorSection:
        if self.min_deadline_s > self.max_deadline_s:
            raise ValueError(f"min_deadline_s ({self.min_deadline_s}) exceeds max_deadline_s ({self.max_deadline_s})")
        if self.heartbeat_s >= self.worker_timeout_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below worker_timeout_s ({self.worker_timeout_s})")
        return self


class GossipSection(Section):
    """Peer-to-peer mode (docs/p2p.md)."""

    group_size: int = Field(2, ge=2, le=64)  # peers per exchange group, the peer itself included
    mix_weights: bool = True  # also send and average the group's global weights
    exchange_timeout_s: float = Field(30.0, gt=0, le=3600)  # to wait for partners after sending
    request_timeout_s: float = Field(10.0, gt=0, le=3600)  # one HTTP request to a peer
    heartbeat_s: float = Field(1.0, gt=0, le=600)  # how often peers exchange member lists
    dead_after_s: float = Field(5.0, gt=0, le=3600)  # no contact for this long: the member is dropped
    body_timeout_s: float = Field(300.0, gt=0, le=86400)  # to send one update body to a peer; then 408

    @model_validator(mode="after")
    def _dead_after_heartbeats(self) -> GossipSection:
        if self.dead_after_s <= self.heartbeat_s:
            raise ValueError(f"dead_after_s ({self.dead_after_s}) must exceed heartbeat_s ({self.heartbeat_s})")
        return self


# Keys of the two layouts used before the config was shared -> where they live now.
_MOVED = {
    "rounds.min_workers": "coordinator.min_workers",
    "rounds.quorum_fraction": "coordinator.quorum_fraction",
    "rounds.deadline_factor": "coordinator.deadline_factor",
    "rounds.min_deadline_s": "coordinator.min_deadline_s",
    "rounds.max_deadline_s": "coordinator.max_deadline_s",
    "rounds.worker_timeout_s": "coordinator.worker_timeout_s",
    "rounds.heartbeat_s": "coordinator.heartbeat_s",
    "aggregation.max_norm": "coordinator.max_norm",
    "aggregation.trim_fraction": "coordinator.trim_fraction",
    "aggregation.rule": "coordinator.aggregation",
    "aggregation.clip_factor": "coordinator.clip_factor",
    "aggregation.min_contributions": "coordinator.min_contributions",
    "limits.max_update_bytes": "coordinator.max_update_bytes",
    "limits.max_json_bytes": "coordinator.max_json_bytes",
    "limits.max_workers": "coordinator.max_workers",
    "limits.concurrent_uploads": "coordinator.concurrent_uploads",
    "inner_steps": "inner.steps",
    "eval_every": "rounds.eval_every",
    "eval_batches": "rounds.eval_batches",
    "data.default_corpus_chars": "data.default_chars",
    "gossip.codec": "compression.codec",
    "gossip.codec_options": "compression.options",
    "gossip.exchange_timeout": "gossip.exchange_timeout_s",
    "gossip.request_timeout": "gossip.request_timeout_s",
    "gossip.heartbeat_interval": "gossip.heartbeat_s",
    "gossip.dead_after": "gossip.dead_after_s",
}


def _move_legacy_keys(raw: dict[str, Any]) -> dict[str, Any]:
    """Rewrite the older layouts into this one (a copy; `raw` is left alone)."""
    raw = copy.deepcopy(raw)
    rounds = raw.get("rounds")
    if isinstance(rounds, int) and not isinstance(rounds, bool):  # the swarm's `rounds = N`
        raw["rounds"] = {"max_rounds": rounds}
    data = raw.get("data")
    if isinstance(data, dict) and isinstance(data.get("files"), list):  # the swarm's `files = [...]`
        files = data.pop("files")
        if len(files) > 1:
            raise ValueError("data.files is now data.path, one text file: concatenate the files into one")
        if files:
            data.setdefault("path", files[0])
    for old, new in _MOVED.items():
        old_section, _, old_key = old.rpartition(".")
        source = raw.get(old_section) if old_section else raw
        if not isinstance(source, dict) or old_key not in source:
            continue
        new_section, _, new_key = new.rpartition(".")
        target = raw.setdefault(new_section, {})
        if not isinstance(target, dict):
            continue  # left for validation to refuse
        if new_key in target:
            raise ValueError(f"{old} (the older layout) and {new} are both given; keep {new}")
        target[new_key] = source.pop(old_key)
    for section in ("aggregation", "limits"):
        if raw.get(section) == {}:
            del raw[section]
    return raw


class RunConfig(Section):
    seed: int = 0
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    inner: InnerSection = Field(default_factory=InnerSection)
    outer: OuterSection = Field(default_factory=OuterSection)
    compression: CompressionSection = Field(default_factory=CompressionSection)
    rounds: RoundsSection = Field(default_factory=RoundsSection)
    coordinator: CoordinatorSection = Field(default_factory=CoordinatorSection)
    gossip: GossipSection = Field(default_factory=GossipSection)

    @model_validator(mode="before")
    @classmethod
    def _legacy_layouts(cls, raw: Any) -> Any:
        return _move_legacy_keys(raw) if isinstance(raw, dict) else raw

    @field_validator("seed")
    @classmethod
    def _seed_fits(cls, seed: int) -> int:
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2^32), got {seed}")
        return seed

    @model_validator(mode="after")
    def _fragments_fit(self) -> RunConfig:
        p, k, layers = self.outer.fragments, self.inner.inner_steps, self.model.n_layer
        if k % p:
            raise ValueError(f"outer.fragments {p} must divide inner.steps {k} (a round is inner.steps / fragments)")
        if p > layers:
            raise ValueError(f"outer.fragments {p} is more than the model's {layers} layers (one fragment per layer at most)")
        return self

    @model_validator(mode="after")
    def _overlap_fits(self) -> RunConfig:
        if self.outer.overlap_steps >= self.round_steps:
            raise ValueError(f"outer.overlap_steps {self.outer.overlap_steps} must be less than a round's "
                             f"{self.round_steps} inner steps")
        return self

    @property
    def eager_overlap(self) -> bool:
        """[outer] eager, or its default for this overlap (coop.eager.eager_by_default)."""
        o = self.outer
        return o.eager if o.eager is not None else eager_by_default(o.overlap_steps, self.round_steps)

    @property
    def round_steps(self) -> int:
        """Inner steps of one round: inner.steps (K), or K / outer.fragments when streaming."""
        return self.inner.inner_steps // self.outer.fragments

    def inner_total_steps(self) -> int:
        return self.inner.total_steps or self.rounds.max_rounds * self.round_steps

    def training_identity(self) -> dict[str, Any]:
        """The parts that must not change when a run resumes (model, data, seed): changing them
        would make the saved weights or shards mean something else."""
        return {"seed": self.seed, "model": self.model.model_dump(), "data": self.data.model_dump()}

    # -- what the transports build from it -------------------------------------------------------
    def gpt_config(self, tokenizer_vocab_size: int) -> GPTConfig:
        vocab = self.model.vocab_size or tokenizer_vocab_size
        if vocab < tokenizer_vocab_size:
            raise ValueError(f"model.vocab_size {vocab} is smaller than the tokenizer's {tokenizer_vocab_size}; "
                             "leave it out or make it larger")
        return GPTConfig(vocab_size=vocab, **self.model.model_dump(exclude={"vocab_size", "init_from"}))

    def inner_config(self) -> InnerConfig:
        return InnerConfig(**self.inner.model_dump(exclude={"inner_steps", "total_steps"}),
                           total_steps=self.inner_total_steps(), block_size=self.model.block_size)

    def outer_optimizer(self) -> NesterovSGD:
        """One outer optimizer over the whole model, counting rounds: with fragments each round
        steps one fragment (its momentum is per tensor), the lr schedule runs over all rounds."""
        o = self.outer
        decay = self.rounds.max_rounds if o.decay and self.rounds.max_rounds > o.warmup_steps else 0
        return NesterovSGD(o.lr, o.momentum, o.nesterov, o.warmup_steps, decay, o.min_lr_factor)

    def codec(self) -> Codec:
        return get_codec(self.compression.codec, **self.compression.options)


class ConfigError(ValueError):
    """A run config file that cannot be read or does not validate; the message says where and why."""


def parse_run_config(raw: Any, source: str = "run config") -> RunConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a table/mapping at the top level, got {type(raw).__name__}")
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as error:
        lines = [f"  {'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in error.errors()]
        raise ConfigError(f"{source} is not a valid run config:\n" + "\n".join(lines)) from None


def load_run_config(path: str | Path) -> RunConfig:
    """Read a .toml, .yaml/.yml or .json run config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no run config at {path}; write one (`coop-coordinator example-config > run.toml`)")
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            raw = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            raw = yaml.safe_load(text)
        elif suffix == ".json":
            raw = json.loads(text)
        else:
            raise ConfigError(f"{path}: unknown config format {suffix!r}; use .toml, .yaml or .json")
    except ConfigError:
        raise
    except Exception as error:  # the parsers' own syntax errors, with line numbers
        raise ConfigError(f"{path} could not be parsed: {error}") from error
    return parse_run_config(raw, str(path))


EXAMPLE_TOML = '''\
# coop run config, the same file for both modes:
#   coop-coordinator serve --config run.toml --state-dir state/     (HTTP: reads [coordinator])
#   coop swarm start --config run.toml                              (peer to peer: reads [gossip])
seed = 0

[model]            # GPT shape; the vocabulary size comes from the tokenizer
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
# init_from = "gpt2-dir"  # start from a Hugging Face GPT-2 directory: its weights, shape and tokenizer

[data]             # read by the coordinator, or by the swarm's first peer
path = "default"   # a UTF-8 text file, or "default" (Python's stdlib source)
tokenizer = "char" # "char" or "bpe" (then vocab_size = 2048)
val_fraction = 0.05
shards = 8         # HTTP: the training tokens are cut into this many shards, handed out to workers

[inner]            # each worker or peer: K steps per round with AdamW
steps = 20         # K = 20 with int4 and outer lr 0.5: 0.3% from DDP at 142x fewer bytes (docs/results.md)
lr = 1e-3
min_lr = 1e-4
warmup_steps = 100
batch_size = 16

[outer]            # Nesterov SGD on the averaged pseudo-gradients
lr = 0.5           # DiLoCo's 0.7 is best at K = 50; at K = 10-20, 0.5
momentum = 0.9
# decay = true     # cosine decay of the outer lr over max_rounds (to min_lr_factor x lr): it hurt in our runs
# fragments = 4    # streaming DiLoCo: a round is steps / fragments steps and sends 1/fragments of the model

[compression]
codec = "int4"     # fp32, fp16, bf16, int8, int4, topk, topk8 (int4 and the top-k codecs: error feedback)
options = { block_size = 64 }
# downlink = "codec"   # HTTP: send workers each round's change in this codec, not the fp32 weights
# snapshot_every = 50  # (then the exact weights every 50 rounds)

[rounds]
max_rounds = 100
eval_every = 1     # val loss every N rounds (0: never)
eval_batches = 8

[coordinator]      # HTTP mode only
min_workers = 1
quorum_fraction = 0.5
deadline_factor = 1.5
min_deadline_s = 10
max_deadline_s = 600
worker_timeout_s = 60
heartbeat_s = 10
aggregation = "filtered_mean"  # robust: filtered_mean, median, trimmed_mean, centered_clip; "mean" = plain, O(model)
trim_fraction = 0.25  # trimmed_mean drops this fraction of the values at each end, coordinate by coordinate
clip_factor = 2.0     # first clip each update to 2x the round's median norm (0: off)
min_contributions = 3 # rounds with fewer updates take the plain weighted mean
# max_norm = 10.0     # also clip each worker's update to this global L2 norm
# ram_for_updates_mb = 4096  # uploads and kept updates in RAM up to this, the rest in state_dir/spool
                             # (default: half the memory available at start; 0: all through the disk)
max_workers = 1024     # worker records at most (records of workers gone for worker_timeout_s are pruned)
concurrent_uploads = 2 # uploads decoded at once (one upload per worker at a time)
body_timeout_s = 600   # to send one request body, then 408
header_timeout_s = 10  # to send a request's headers, then the connection is closed
keep_alive_s = 30      # idle keep-alive connections are closed after this long
max_connections = 512  # open connections at once; beyond: 503
joins_per_minute = 30  # per client address; beyond: 429 with Retry-After

[gossip]           # peer-to-peer mode only
group_size = 2         # peers per exchange group, this one included
mix_weights = true     # also average the group's copies of the global weights
exchange_timeout_s = 30
body_timeout_s = 300   # to send one update body to this peer, then 408
request_timeout_s = 10
heartbeat_s = 1
dead_after_s = 5
'''
