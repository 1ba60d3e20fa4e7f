"""The swarm's run config: one pydantic model, read from TOML, YAML or JSON by the first peer and
handed to every newcomer in the join reply (so a newcomer needs nothing but a peer's URL).

    [model]   n_layer = 1  n_head = 2  n_embd = 32  block_size = 32
    [data]    files = []  (empty: the embedded default corpus)  default_corpus_chars  val_fraction
    [inner]   optimizer lr min_lr warmup_steps total_steps weight_decay beta1 beta2 grad_clip batch_size
    [outer]   lr = 0.7  momentum = 0.9  nesterov = true  warmup_steps = 0
    [gossip]  group_size = 2  mix_weights = true  codec = "fp32"  exchange_timeout = 30  heartbeat_interval = 1  dead_after = 5
    inner_steps = 50   rounds = 100   eval_every = 5   seed = 0
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from coop.codec import get_codec
from coop.diloco import NesterovSGD
from coop.replica import InnerConfig
from engine.nn import GPTConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Section):
    n_layer: int = Field(1, ge=1, le=96)
    n_head: int = Field(2, ge=1, le=128)
    n_embd: int = Field(32, ge=1, le=16384)
    block_size: int = Field(32, ge=2, le=65536)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelSection:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        return self


class DataSection(_Section):
    files: list[str] = Field(default_factory=list, description="text files read by the first peer; empty: the default corpus")
    default_corpus_chars: int = Field(200_000, ge=1000)
    val_fraction: float = Field(0.1, gt=0.0, lt=0.5)


class InnerSection(_Section):
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(3e-3, gt=0)
    min_lr: float = Field(3e-4, ge=0)
    warmup_steps: int = Field(20, ge=0)
    total_steps: int = Field(5000, ge=1)
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    grad_clip: float = Field(1.0, ge=0)
    batch_size: int = Field(8, ge=1)


class OuterSection(_Section):
    lr: float = Field(0.7, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    warmup_steps: int = Field(0, ge=0)


class GossipSection(_Section):
    group_size: int = Field(2, ge=2, le=64, description="peers per exchange group, the peer itself included")
    mix_weights: bool = Field(True, description="also send and average the global weights within each group")
    codec: str = "fp32"
    codec_options: dict[str, Any] = Field(default_factory=dict)
    exchange_timeout: float = Field(30.0, gt=0, le=3600, description="seconds to wait for partners after sending")
    request_timeout: float = Field(10.0, gt=0, le=3600, description="seconds for one HTTP request to a peer")
    heartbeat_interval: float = Field(1.0, gt=0, le=600)
    dead_after: float = Field(5.0, gt=0, le=3600, description="seconds without contact before a member is dropped")

    @model_validator(mode="after")
    def _check(self) -> GossipSection:
        get_codec(self.codec, **self.codec_options)  # raises ValueError on an unknown codec or bad options
        if self.dead_after <= self.heartbeat_interval:
            raise ValueError(f"dead_after ({self.dead_after}s) must exceed heartbeat_interval ({self.heartbeat_interval}s)")
        return self


class SwarmConfig(_Section):
    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    inner: InnerSection = Field(default_factory=InnerSection)
    outer: OuterSection = Field(default_factory=OuterSection)
    gossip: GossipSection = Field(default_factory=GossipSection)
    inner_steps: int = Field(50, ge=1, description="K: inner steps per round")
    rounds: int = Field(100, ge=0, description="outer rounds each peer runs; 0 = until stopped")
    eval_every: int = Field(5, ge=0, description="rounds between val-loss evaluations; 0 = never")
    eval_batches: int = Field(4, ge=1)
    seed: int = Field(0, ge=0, description="initial weights and the groups' random draw")

    def gpt_config(self, vocab_size: int) -> GPTConfig:
        m = self.model
        return GPTConfig(vocab_size=vocab_size, block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                         n_embd=m.n_embd, dropout=m.dropout)

    def inner_config(self) -> InnerConfig:
        return InnerConfig(**self.inner.model_dump(), block_size=self.model.block_size)

    def outer_optimizer(self) -> NesterovSGD:
        o = self.outer
        return NesterovSGD(o.lr, o.momentum, o.nesterov and o.momentum > 0, o.warmup_steps)

    def codec(self):
        return get_codec(self.gossip.codec, **self.gossip.codec_options)


def load_config(path: str | Path) -> SwarmConfig:
    """Read a run config file (.toml, .yaml/.yml or .json); errors name the file and the field."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"swarm config {path}: no such file")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            import tomllib

            raw = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            raw = yaml.safe_load(text) or {}
        elif path.suffix == ".json":
            raw = json.loads(text)
        else:
            raise SystemExit(f"swarm config {path}: expected a .toml, .yaml or .json file")
    except (ValueError, ImportError) as error:  # tomllib/yaml/json parse errors are ValueErrors or YAMLError
        raise SystemExit(f"swarm config {path}: cannot parse: {error}") from error
    except Exception as error:  # yaml.YAMLError
        raise SystemExit(f"swarm config {path}: cannot parse: {error}") from error
    try:
        return SwarmConfig.model_validate(raw)
    except ValueError as error:
        raise SystemExit(f"swarm config {path}: {error}") from error


def gossip_body_limit(config: SwarmConfig, shapes: dict[str, tuple[int, ...]]) -> int:
    """Largest gossip message a peer accepts: the exact payload (encoded pseudo-gradient, plus the
    fp32 global weights when mixing) plus room for the safetensors header and metadata."""
    payload = config.codec().payload_nbytes(shapes)
    if config.gossip.mix_weights:
        payload += sum(4 * math.prod(s) for s in shapes.values())
    return payload + 512 * 4 * len(shapes) + (1 << 16)
