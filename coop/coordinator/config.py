"""The run config: everything a coordinator needs to run a DiLoCo training run, from a TOML or YAML
file, validated by pydantic (unknown keys are refused, so a typo never passes silently).

    [model]       n_layer = 4, n_head = 4, n_embd = 128, block_size = 128   (vocab from the tokenizer)
    [data]        path = "default" (the embedded stdlib corpus) or a text file; tokenizer = "char" | "bpe"
    [inner]       steps = K and the inner optimizer of every worker (coop.replica.InnerConfig)
    [outer]       Nesterov SGD on the global weights (coop.diloco.NesterovSGD)
    [compression] the codec workers encode their pseudo-gradients with (coop.codec)
    [aggregation] robust options of coop.diloco.Aggregator
    [rounds]      quorum, deadlines, worker timeout, max rounds, evaluation
    [limits]      body sizes and concurrency bounds

`coop-coordinator example-config` prints a complete file with the defaults.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(Section):
    """GPT shape. vocab_size None: the tokenizer's; a larger value pads the embedding (e.g. 50304,
    GPT-2's 50257 rounded up to a multiple of 64, as nanoGPT does)."""

    vocab_size: int | None = Field(None, ge=2)
    n_layer: int = Field(4, ge=1)
    n_head: int = Field(4, ge=1)
    n_embd: int = Field(128, ge=1)
    block_size: int = Field(128, ge=2)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class DataSection(Section):
    path: str = "default"  # a UTF-8 text file, or "default": the running Python's stdlib source
    default_chars: int = Field(2_000_000, ge=10_000)  # how much of the default corpus
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = Field(2048, ge=256)  # for bpe
    val_fraction: float = Field(0.05, gt=0.0, lt=0.5)
    shards: int = Field(8, ge=1, le=4096)  # the training tokens are cut into this many shards
    iid_shards: bool = True  # deal blocks round-robin so that every shard spans the whole corpus


class InnerSection(Section):
    """K inner steps per round and each worker's inner optimizer (fields of coop.replica.InnerConfig)."""

    steps: int = Field(50, ge=1, le=1_000_000)  # K
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0.0)
    min_lr: float = Field(1e-4, ge=0.0)
    warmup_steps: int = Field(100, ge=0)
    total_steps: int | None = Field(None, ge=1)  # of the cosine schedule; None = rounds.max_rounds * steps
    weight_decay: float = Field(0.1, ge=0.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.95, ge=0.0, lt=1.0)
    grad_clip: float = Field(1.0, ge=0.0)
    batch_size: int = Field(16, ge=1)


class OuterSection(Section):
    lr: float = Field(0.7, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    nesterov: bool = True
    warmup_steps: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _nesterov_needs_momentum(self) -> OuterSection:
        if self.nesterov and self.momentum == 0:
            raise ValueError("outer.nesterov needs outer.momentum > 0; set nesterov = false for plain averaging")
        return self


class CompressionSection(Section):
    codec: Literal["fp32", "fp16", "bf16", "int8", "topk"] = "fp32"
    options: dict[str, Any] = Field(default_factory=dict)  # e.g. {block_size = 256} or {ratio = 0.01}

    @model_validator(mode="after")
    def _codec_accepts_options(self) -> CompressionSection:
        from coop.codec import get_codec

        get_codec(self.codec, **self.options)  # raises ValueError with the codec's own message
        return self


class AggregationSection(Section):
    max_norm: float | None = Field(None, gt=0.0)  # clip each contribution's global L2 norm
    trim_fraction: float = Field(0.0, ge=0.0, lt=0.5)  # coordinate-wise trimmed mean (memory O(N x model))


class RoundsSection(Section):
    """When a round closes: every active worker has reported, or the quorum has reported and the
    deadline has passed. The deadline is `deadline_factor` x the median time workers took in
    recent rounds, clamped to [min_deadline_s, max_deadline_s]."""

    max_rounds: int = Field(100, ge=1)
    min_workers: int = Field(1, ge=1)  # no round closes with fewer reports
    quorum_fraction: float = Field(0.5, gt=0.0, le=1.0)  # of the active workers, once the deadline has passed
    deadline_factor: float = Field(1.5, ge=1.0)
    min_deadline_s: float = Field(10.0, gt=0.0)
    max_deadline_s: float = Field(600.0, gt=0.0)
    worker_timeout_s: float = Field(60.0, gt=0.0)  # no heartbeat for this long: the worker is inactive
    heartbeat_s: float = Field(10.0, gt=0.0)  # how often workers say they are alive
    eval_every: int = Field(1, ge=0)  # evaluate the global model on the val split every N rounds; 0: never
    eval_batches: int = Field(8, ge=1)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> RoundsSection:
        if self.min_deadline_s > self.max_deadline_s:
            raise ValueError(f"min_deadline_s ({self.min_deadline_s}) exceeds max_deadline_s ({self.max_deadline_s})")
        if self.heartbeat_s >= self.worker_timeout_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be below worker_timeout_s ({self.worker_timeout_s})")
        return self


class LimitsSection(Section):
    max_update_bytes: int | None = Field(None, ge=1024)  # None: the fp32 size of the model plus headers
    max_json_bytes: int = Field(65536, ge=1024)
    max_workers: int = Field(1024, ge=1)
    concurrent_uploads: int = Field(2, ge=1)  # bodies held in memory at once (memory ~ this x one update)


class RunConfig(Section):
    seed: int = 0
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    inner: InnerSection = Field(default_factory=InnerSection)
    outer: OuterSection = Field(default_factory=OuterSection)
    compression: CompressionSection = Field(default_factory=CompressionSection)
    aggregation: AggregationSection = Field(default_factory=AggregationSection)
    rounds: RoundsSection = Field(default_factory=RoundsSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)

    @field_validator("seed")
    @classmethod
    def _seed_fits(cls, seed: int) -> int:
        if not 0 <= seed < 2**32:
            raise ValueError(f"seed must be in [0, 2^32), got {seed}")
        return seed

    def inner_total_steps(self) -> int:
        return self.inner.total_steps or self.rounds.max_rounds * self.inner.steps

    def training_identity(self) -> dict[str, Any]:
        """The parts that must not change when a run resumes (model, data, seed): changing them
        would make the saved weights or shards mean something else."""
        return {"seed": self.seed, "model": self.model.model_dump(), "data": self.data.model_dump()}


class ConfigError(ValueError):
    """A run config file that cannot be read or does not validate; the message says where and why."""


def parse_run_config(raw: Any, source: str = "run config") -> RunConfig:
    from pydantic import ValidationError

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
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover - Python 3.10
                import tomli as tomllib
            raw = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

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


def default_update_limit(n_params: int, n_tensors: int) -> int:
    """Largest honest update: fp32 values (the largest codec except topk with ratio near 1, which
    sends 8 bytes per kept value) plus the safetensors header, with some slack."""
    return int(math.ceil(8 * n_params + 512 * n_tensors + 65536))


EXAMPLE_TOML = '''\
# coop run config: `coop-coordinator serve --config run.toml --state-dir state/`
seed = 0

[model]            # GPT shape; the vocabulary size comes from the tokenizer
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128

[data]
path = "default"   # a UTF-8 text file on the coordinator, or "default" (Python's stdlib source)
tokenizer = "char" # "char" or "bpe" (then vocab_size = 2048)
val_fraction = 0.05
shards = 8         # the training tokens are cut into this many shards, handed out to workers

[inner]            # each worker: K steps per round with AdamW
steps = 50
lr = 1e-3
min_lr = 1e-4
warmup_steps = 100
batch_size = 16

[outer]            # Nesterov SGD on the averaged pseudo-gradients (DiLoCo's defaults)
lr = 0.7
momentum = 0.9

[compression]
codec = "int8"     # fp32, fp16, bf16, int8, topk
options = { block_size = 256 }

[aggregation]
# max_norm = 10.0      # clip each worker's update to this global L2 norm
# trim_fraction = 0.1  # coordinate-wise trimmed mean (memory grows with workers)

[rounds]
max_rounds = 100
min_workers = 1
quorum_fraction = 0.5
deadline_factor = 1.5
min_deadline_s = 10
max_deadline_s = 600
worker_timeout_s = 60
heartbeat_s = 10
eval_every = 1
eval_batches = 8
'''
