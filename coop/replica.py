"""One local trainer: a GPT replica, its inner optimizer and schedule, its data shard and its RNG.

A replica runs K inner steps from given global weights and reports what DiLoCo needs: the
pseudo-gradient (global - local), the tokens it processed, its losses and the time it took.
The simulation, the HTTP worker and the peers all train through this class."""
from __future__ import annotations

import os
import contextlib
import time
from dataclasses import asdict, dataclass, field

import numpy as np

import engine
from engine.data import TokenDataset
from engine.nn import GPT, GPTConfig
from engine.optim import SGD, AdamW, clip_grad_norm_, warmup_cosine_lr

from .diloco import pseudo_gradient


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


def autocast_for(device: str, precision: str = "auto"):
    """The forward pass's precision: bf16 autocast (float32 master weights) on a GPU unless
    precision is "fp32"; float32 on the CPU, which has no bf16 arithmetic."""
    on_gpu = str(device).startswith("cuda")
    if precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"precision must be 'auto', 'bf16' or 'fp32', got {precision!r}")
    if precision == "bf16" and not on_gpu:
        raise ValueError("precision 'bf16' needs a CUDA device; the CPU backend trains in float32")
    if on_gpu and precision != "fp32":
        return engine.autocast("cuda", dtype=engine.bfloat16)
    return contextlib.nullcontext()


def weights_of(model: engine.nn.Module) -> dict[str, np.ndarray]:
    """Every trained tensor of the model as float32 numpy, keyed by parameter name (tied weights once)."""
    return {name: np.array(p.numpy(), dtype=np.float32) for name, p in model.named_parameters()}


def load_weights(model: engine.nn.Module, weights: dict[str, np.ndarray]) -> None:
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        raise KeyError(f"weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    with engine.no_grad():
        for name, p in params.items():
            p.copy_(engine.tensor(weights[name], device=p.device))


class Replica:
    """A GPT replica training on its own data shard with its own inner optimizer state."""

    def __init__(self, model_config: GPTConfig, data: TokenDataset, inner: InnerConfig | None = None,
                 device: str = "cpu", seed: int = 0, model: GPT | None = None, graph: bool | None = None):
        self.inner = inner or InnerConfig()
        autocast_for(device, self.inner.precision)  # a bad precision fails here, not mid-round
        self.data = data
        self.device = device
        self.rng = np.random.default_rng(seed)
        if model is None:
            engine.manual_seed(seed)
            model = GPT(model_config)
        self.model = model.to(device)
        groups = self.model.optimizer_groups(self.inner.weight_decay)
        if self.inner.optimizer == "adamw":
            self.optimizer = AdamW(groups, lr=self.inner.lr, betas=(self.inner.beta1, self.inner.beta2))
        elif self.inner.optimizer == "sgd":
            self.optimizer = SGD(groups, lr=self.inner.lr)
        else:
            raise ValueError(f"inner optimizer must be 'adamw' or 'sgd', got {self.inner.optimizer!r}")
        self.step = 0  # inner steps taken, drives the schedule
        self.tokens_seen = 0
        # on a GPU, each inner step is one captured CUDA graph (graph=None: on unless COOP_GRAPH=0)
        if graph is None:
            graph = os.environ.get("COOP_GRAPH", "1") != "0"
        self.captured = (engine.cuda.graphs.CapturedStep(self._update)
                         if graph and str(device).startswith("cuda") else None)

    def lr_at(self, step: int) -> float:
        c = self.inner
        if c.warmup_steps == 0 and c.min_lr == c.lr:
            return c.lr
        return warmup_cosine_lr(step, c.lr, c.warmup_steps, c.total_steps, c.min_lr)

    def next_batch(self) -> tuple[engine.Tensor, engine.Tensor]:
        x, y = self.data.get_batch(self.inner.batch_size, self.inner.block_size, self.rng)
        return engine.tensor(x, device=self.device), engine.tensor(y, device=self.device)

    def train_step(self) -> engine.Tensor:
        """One inner step; returns the loss as a 0-d tensor on the device (no host sync here)."""
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.next_batch()
        loss = self.captured(x, y) if self.captured is not None else self._update(x, y)
        self.step += 1
        self.tokens_seen += x.numel()
        return loss

    def _update(self, x: engine.Tensor, y: engine.Tensor) -> engine.Tensor:
        """Forward, backward, clipping and the optimizer update on one batch; the loss, detached."""
        with autocast_for(self.device, self.inner.precision):
            _, loss = self.model(x, y)
        self.optimizer.zero_grad()
        loss.backward()
        if self.inner.grad_clip:
            clip_grad_norm_(self.model.parameters(), self.inner.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.model)

    def load_global(self, global_weights: dict[str, np.ndarray]) -> None:
        load_weights(self.model, global_weights)

    def run_round(self, global_weights: dict[str, np.ndarray], steps: int) -> RoundResult:
        """Start from the global weights, take `steps` inner steps, return the pseudo-gradient."""
        start = time.perf_counter()
        self.load_global(global_weights)
        losses = [self.train_step() for _ in range(steps)]
        losses = [float(v) for v in engine.stack(losses).numpy()] if losses else []  # one sync per round
        delta = pseudo_gradient(global_weights, self.weights())
        return RoundResult(delta, steps * self.inner.batch_size * self.inner.block_size, losses,
                           time.perf_counter() - start)

    @engine.no_grad()
    def evaluate(self, data: TokenDataset, batches: int = 8, seed: int = 1234) -> float:
        """Mean loss over `batches` fixed random windows of `data` (the same windows every call)."""
        was_training = self.model.training
        self.model.eval()
        rng = np.random.default_rng(seed)
        total = []
        for _ in range(batches):
            x, y = data.get_batch(self.inner.batch_size, self.inner.block_size, rng)
            _, loss = self.model(engine.tensor(x, device=self.device), engine.tensor(y, device=self.device))
            total.append(loss)
        self.model.train(was_training)
        return float(engine.stack(total).mean().item())
