"""One local trainer: a GPT replica, its inner optimizer and schedule, its data shard and its RNG.

A replica runs K inner steps from given global weights and reports what DiLoCo needs: the
pseudo-gradient (global - local), the tokens it processed, its losses and the time it took.
The round loop (coop.round) drives one of these for every mode; its steps are coop.training's."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import engine
from engine.data import TokenDataset
from engine.nn import GPT, GPTConfig

from .diloco import pseudo_gradient
from .training import TrainStep, evaluate, fixed_windows, load_weights, make_optimizer, weights_of


@dataclass
class InnerConfig:
    """The inner (local) optimisation of every replica."""

    optimizer: str = "adamw"  # "adamw" or "sgd"
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    total_steps: int = 2000  # of the cosine schedule, counted in inner steps of this replica
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    batch_size: int = 16
    block_size: int = 128
    precision: str = "auto"  # "auto" (bf16 autocast on a GPU, float32 on the CPU), "bf16" or "fp32"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoundResult:
    pseudo_gradient: dict[str, np.ndarray]
    tokens: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses)) if self.losses else float("nan")


class Replica:
    """A GPT replica training on its own data shard with its own inner optimizer state."""

    def __init__(self, model_config: GPTConfig, data: TokenDataset, inner: InnerConfig | None = None,
                 device: str = "cpu", seed: int = 0, model: GPT | None = None, graph: bool | None = None):
        self.inner = inner or InnerConfig()
        self.data = data
        self.device = device
        self.rng = np.random.default_rng(seed)
        if model is None:
            engine.manual_seed(seed)
            model = GPT(model_config)
        self.model = model.to(device)
        c = self.inner
        self.optimizer = make_optimizer(self.model, c.optimizer, c.lr, c.weight_decay, (c.beta1, c.beta2))
        # on a GPU, each inner step is one captured CUDA graph (graph=None: on unless COOP_GRAPH=0)
        if graph is None:
            graph = os.environ.get("COOP_GRAPH", "1") != "0"
        self.train_step_fn = TrainStep(self.model, self.optimizer, device=device, lr=c.lr, min_lr=c.min_lr,
                                       warmup_steps=c.warmup_steps, total_steps=c.total_steps,
                                       precision=c.precision, grad_clip=c.grad_clip, graph=graph)
        self.tokens_seen = 0

    @property
    def step(self) -> int:
        """Inner steps taken; drives the schedule (the round loop sets it so that every replica
        follows the same schedule whatever rounds it missed)."""
        return self.train_step_fn.step_count

    @step.setter
    def step(self, value: int) -> None:
        self.train_step_fn.step_count = int(value)

    def lr_at(self, step: int) -> float:
        return self.train_step_fn.lr_at(step)

    def next_batch(self) -> tuple[engine.Tensor, engine.Tensor]:
        x, y = self.data.get_batch(self.inner.batch_size, self.inner.block_size, self.rng)
        return engine.tensor(x, device=self.device), engine.tensor(y, device=self.device)

    def train_step(self) -> engine.Tensor:
        """One inner step; returns the loss as a 0-d tensor on the device (no host sync here)."""
        x, y = self.next_batch()
        loss = self.train_step_fn(x, y)
        self.tokens_seen += x.numel()
        return loss

    def weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.model)

    def load_global(self, global_weights: dict[str, np.ndarray]) -> None:
        load_weights(self.model, global_weights)

    def run_round(self, global_weights: dict[str, np.ndarray], inner_steps: int) -> RoundResult:
        """Start from the global weights, take `inner_steps` (K) inner steps, return the pseudo-gradient."""
        start = time.perf_counter()
        self.load_global(global_weights)
        losses = [self.train_step() for _ in range(inner_steps)]
        losses = [float(v) for v in engine.stack(losses).numpy()] if losses else []  # one sync per round
        delta = pseudo_gradient(global_weights, self.weights())
        return RoundResult(delta, inner_steps * self.inner.batch_size * self.inner.block_size, losses,
                           time.perf_counter() - start)

    def evaluate(self, data: TokenDataset, batches: int = 8, seed: int = 1234) -> float:
        """Mean loss over `batches` fixed random windows of `data` (the same windows every call),
        under the training's autocast."""
        windows = fixed_windows(data, batches, self.inner.batch_size, self.inner.block_size, seed)
        return evaluate(self.model, windows, self.device, self.inner.precision)
