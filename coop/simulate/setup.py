"""What every run of one invocation shares: data, shards, the initial model, the eval windows;
and the pieces each run is built of (replicas, the outer optimizer)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

import engine
from engine.data import CharTokenizer, TokenDataset, default_corpus, encode_corpus_in_memory
from engine.nn import GPT, GPTConfig

from ..diloco import Weights
from ..outer import NesterovSGD
from ..replica import InnerConfig, Replica
from ..training import load_weights, weights_of
from .config import SimulateConfig


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
    shards = [train if cfg.split == "whole" else train.shard(i, n, iid=cfg.split == "iid", block_tokens=block_tokens)
              for i in range(n)]
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


def new_replica(setup: Setup, data: TokenDataset, inner: InnerConfig, seed: int, cls=Replica, device: str | None = None,
                **extra) -> Replica:
    """A replica of the setup's model on `device` (default: --device)."""
    replica = cls(setup.model_config, data, inner, device or setup.cfg.device, seed=seed, model=GPT(setup.model_config),
                  **extra)
    replica.load_global(setup.initial)
    return replica


def outer_optimizer(cfg: SimulateConfig) -> NesterovSGD:
    """One outer optimizer (of the model, or of one fragment: each gets one outer step per K
    inner steps). --outer-decay: cosine over the local rounds, to --outer-min-lr-factor x lr."""
    outer_steps = cfg.total_rounds - cfg.warm_rounds
    decay = outer_steps if cfg.outer_decay and outer_steps > cfg.outer_warmup else 0
    return NesterovSGD(cfg.outer_lr, cfg.outer_momentum, cfg.nesterov and cfg.outer_momentum > 0, cfg.outer_warmup,
                       decay, cfg.outer_min_lr_factor)


def copy_weights(weights: Weights) -> dict[str, np.ndarray]:
    return {name: np.array(a, dtype=np.float32) for name, a in weights.items()}
