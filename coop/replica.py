"""One local trainer: a GPT replica, its inner optimizer and schedule, its data shard and its RNG.

A replica runs K inner steps from given global weights and reports what DiLoCo needs: the
pseudo-gradient (global - local), the tokens it processed, its losses and the time it took.
The round loop (coop.round) drives one of these for every mode; its steps are coop.training's."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field

import numpy as np

import engine
from engine.data import TokenDataset
from engine.nn import GPT, GPTConfig

from .eager import EagerOuter
from .training import (Evaluation, HostLead, PendingEvaluation, TrainStep, evaluate, fixed_windows, load_weights,
                       make_optimizer, parameters_for, to_device, to_host, weights_of)


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
    precision: str = "auto"  # "auto" (bf16 autocast on a GPU, float32 on the CPU), "bf16", "fp8" or "fp32"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RoundResult:
    pseudo_gradient: dict[str, np.ndarray]
    tokens: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0  # in inner steps
    waited: float = 0.0  # blocked on the last round's merge (overlap), not counted in `seconds`
    finished_at: float = 0.0  # time.perf_counter() when the steps had run (before the pseudo-gradient)

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
        self.step_callback: Callable[[int], None] | None = None  # after each inner step, with its tokens (progress)
        # on the replica's device, so that a round's end and a merge's load are device work and one copy
        # each way (on a GPU, host numpy on the model's every number was most of a round's own overhead)
        self.anchor: dict[str, engine.Tensor] = {}  # global weights last loaded: what deltas are taken against
        self.sent_at: dict[str, engine.Tensor] = {}  # local weights when last sent, until their merge is loaded
        self.anchored: dict[str, np.ndarray] = {}  # the host arrays the anchor was loaded from (not copies)
        # overlap: the outer step taken at once with this replica's own update (coop.eager); None: the
        # steps beside the merge start from the replica's end of round
        self.eager: EagerOuter | None = None
        self.graph = graph
        self._evaluation: Evaluation | None = None  # evaluate_weights' own copy of the model, made on first use
        self._staged: tuple | None = None  # (data, batches, part, the windows on the device) of the last evaluation

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
        if self.step_callback is not None:
            self.step_callback(x.numel())
        return loss

    def weights(self) -> dict[str, np.ndarray]:
        return weights_of(self.model)

    def load_global(self, global_weights: dict[str, np.ndarray]) -> None:
        """Start over from the global weights: all of them loaded and made the anchor."""
        self.reset_anchor()
        self.apply_merge(global_weights)

    def evaluate_weights(self, weights: dict[str, np.ndarray], data: TokenDataset, batches: int = 8,
                         part: tuple[int, int] = (0, 1)) -> float:
        """`evaluate` of other weights (e.g. the global ones), on a second copy of the model made for
        it (on the replica's device, no optimizer state): the replica's own weights are never
        touched, nor copied back and forth (on a GPU that is the slow part of an evaluation)."""
        return self.start_evaluation(weights, data, batches, part).result()

    def start_evaluation(self, weights: dict[str, np.ndarray], data: TokenDataset, batches: int = 8,
                         part: tuple[int, int] = (0, 1)) -> PendingEvaluation:
        """`evaluate_weights`, its windows still to run: `step()` queues one beside the inner steps
        (the round loop's `beside`), `result()` the rest and waits. The weights are loaded now."""
        if self._evaluation is None:
            state = engine.random.get_rng_state()  # its initial weights are overwritten: keep the RNG stream as it was
            model = GPT(self.model.config).to(self.device)
            engine.random.set_rng_state(state)
            self._evaluation = Evaluation(model, self.device, self.inner.precision, graph=self.graph)
        evaluation, model = self._evaluation, self._evaluation.model
        if evaluation.pending is not None:
            evaluation.pending.flush()  # its windows see the weights it was started with, queued before the load
        if self.anchored and all(self.anchored.get(n) is a for n, a in weights.items()) and len(weights) == len(self.anchor):
            with engine.no_grad():  # the global weights last loaded (a worker's usual case): copied on the device
                for name, p in model.named_parameters():
                    p.copy_(self.anchor[name])
        else:
            load_weights(model, weights)  # in place: a captured forward stays valid
        staged = self._staged
        if staged is None or staged[0] is not data or staged[1:3] != (batches, part):  # the same windows every call
            staged = self._staged = (data, batches, part, evaluation.stage(self._windows(data, batches, part)))
        return evaluation.start(staged[3])

    def run_round(self, global_weights: dict[str, np.ndarray] | None, inner_steps: int, *,
                  merged: Collection[str] | None = None, send: Collection[str] | None = None,
                  apply_after: int = 0, arrival: Future | None = None,
                  idle: Callable[[], None] | None = None,
                  beside: Callable[[], bool] | None = None, until: float | None = None,
                  merge_round: int | None = None) -> RoundResult | None:
        """Take `inner_steps` (K) inner steps from the global weights, return the pseudo-gradient.

        Plain DiLoCo uses the defaults: load every global weight, train, send global - local.
        Streaming DiLoCo (coop.streaming) loads only the fragment the last round `merged` and
        sends only the fragment this round's merge takes (`send`); every other tensor trains on.
        With overlap (`apply_after` > 0) the merge arrives that many inner steps into the round:
        the steps taken since the update was sent are kept on top of it (one-step-delayed outer
        update), local <- global + (local - local_when_sent), as streaming DiLoCo's overlap and
        "eager updates" do. With `eager` set and `merge_round` (the round whose merge is awaited)
        given, those steps start from the eager guess of the merge (coop.eager) instead of the
        replica's own end of round, and local <- global + (local - guess). Each pseudo-gradient is
        taken against the global weights last loaded (the anchor), so nothing is counted twice or
        lost; apply_after = 0 is plain DiLoCo exactly.

        Over a real link the merge's arrival time is not known: `arrival` is a Future of the round's
        start (anything with .weights, .merged, .send; None: the run ended) that the replica trains
        on beside, from its own weights, until it is done or `apply_after` steps are taken (then it
        waits: the delay stays bounded); it then applies it the same way. `idle`, if given, runs
        once before that wait when there is one (the transport's evaluation of the last global
        weights: work for the device that would otherwise sit idle); its seconds count as neither
        training nor waiting. `beside`, if given, is called after each inner step until it returns
        False (the transport's evaluation, one window queued at a time between the steps: on the
        device it runs in the steps' shadow instead of after them). `until`, if given, is a
        time.perf_counter() at which the steps after the merge stop, however many are left (at
        least one is taken; the pseudo-gradient and its tokens are those of the steps taken: the
        round's deadline, for a worker too slow for K steps). Returns None when the run ended while
        it trained."""
        start = time.perf_counter()
        losses, waited = [], 0.0

        def step() -> engine.Tensor:
            nonlocal beside
            loss = self.train_step()
            if beside is not None and not beside():
                beside = None  # all of its work is queued
            return loss

        if arrival is not None:  # overlap over a link: train on until the merge has arrived
            ahead = min(inner_steps, apply_after or inner_steps)  # then wait for it
            lead = HostLead(self.device)  # "arrived?" asked of the step the device is at, the GIL left free
            self.step_eagerly(merge_round)
            while len(losses) < ahead and not arrival.done():
                losses.append(step())
                lead.step_queued()
            if not arrival.done() and str(self.device).startswith("cuda"):
                engine.cuda.synchronize(self.device)  # the steps queued so far run out first: training time
            if idle is not None and not arrival.done():  # the GPU would wait anyway: the transport's work first
                began = time.perf_counter()
                idle()
                start += time.perf_counter() - began
            waiting = time.perf_counter()
            arrived = arrival.result()  # blocks only once the round's steps are all taken
            waited = time.perf_counter() - waiting
            start += waited  # the round's seconds are those of its inner steps
            if arrived is None:
                return None
            if arrived.reset:  # it missed a merge: the steps taken meanwhile cannot be kept
                self.reset_anchor()
                losses = []
            global_weights, merged, send = arrived.weights, arrived.merged, arrived.send
            apply_after = len(losses)
        if not self.anchor:  # the first round (or after a reset): everything from the global weights
            merged, apply_after = None, 0
        names = list(global_weights) if merged is None else list(merged)
        apply_after = min(apply_after, inner_steps) if any(n in self.sent_at for n in names) else 0
        if apply_after > len(losses) and arrival is None:  # the merge comes this many steps into the round
            self.step_eagerly(merge_round)
        losses += [step() for _ in range(apply_after - len(losses))]
        self.apply_merge({n: global_weights[n] for n in names}, keep_progress=apply_after > 0, merge_round=merge_round)
        lead = HostLead(self.device) if until is not None else None  # the clock read at the device's step
        for _ in range(inner_steps - apply_after):
            if until is not None and losses and time.perf_counter() >= until:
                break
            losses.append(step())
            if lead is not None:
                lead.step_queued()
        taken = len(losses)
        losses = [float(v) for v in engine.stack(losses).numpy()] if losses else []  # one sync per round
        finished_at = time.perf_counter()
        delta = self.pseudo_gradient(send)
        return RoundResult(delta, taken * self.inner.batch_size * self.inner.block_size, losses,
                           finished_at - start, waited, finished_at)

    def pseudo_gradient(self, send: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """anchor - local for the tensors sent (all, or a streaming fragment), in float32, with the
        sign of a gradient; computed on the device and copied to the host once. The local weights
        are kept (on the device) as those sent, for the merge that answers them."""
        params = dict(self.model.named_parameters())
        sent = list(params) if send is None else list(send)
        with engine.no_grad():
            delta = to_host({n: self.anchor[n] - params[n] for n in sent})
            self.sent_at = {n: params[n].detach().clone() for n in sent}
        return delta

    def step_eagerly(self, merge_round: int | None) -> None:
        """Before training beside the merge of `merge_round`: move the tensors sent to the eager
        guess of that merge (coop.eager), which the merge's arrival then takes as "when sent"."""
        if self.eager is None or merge_round is None:
            return
        params = dict(self.model.named_parameters())
        with engine.no_grad():
            for name, sent in self.sent_at.items():
                guess = self.eager.guess(name, self.anchor[name], sent, merge_round)
                params[name].copy_(params[name] - sent + guess)
                self.sent_at[name] = guess

    def apply_merge(self, global_weights: dict[str, np.ndarray], keep_progress: bool = False,
                    merge_round: int | None = None) -> None:
        """Load merged global weights (all or a fragment) and make them the anchor of the next
        pseudo-gradient; with keep_progress, the steps taken since sending are added on top:
        local <- global + (local - local when sent), on the device after one copy there. With
        `merge_round` (the round this merge closed) the eager step's momentum follows the move."""
        params = parameters_for(self.model, global_weights, partial=True)  # names and shapes checked first
        merged = to_device(global_weights, self.device)  # copies: the caller's arrays move on
        with engine.no_grad():
            for name, weight in merged.items():
                sent = self.sent_at.pop(name, None)
                p = params[name]
                p.copy_(weight + (p - sent) if keep_progress and sent is not None else weight)
                if self.eager is not None and merge_round is not None and name in self.anchor:
                    self.eager.observe(name, self.anchor[name], weight, merge_round)
                self.anchor[name] = weight
                self.anchored[name] = global_weights[name]  # what evaluate_weights may be asked about again

    def reset_anchor(self) -> None:
        """Forget the anchor and what was sent: the next round loads every global weight (a replica
        that missed merges, or rejoined, must not take a pseudo-gradient against stale weights)."""
        self.anchor, self.sent_at, self.anchored = {}, {}, {}
        if self.eager is not None:
            self.eager.forget()

    def evaluate(self, data: TokenDataset, batches: int = 8, part: tuple[int, int] = (0, 1)) -> float:
        """Mean loss of the replica's own weights over `batches` fixed random windows of `data` (the
        same windows every call), under the training's autocast. part (i, n): only the windows i,
        i + n, i + 2n, ... of them, so that n workers share one evaluation (the token-weighted mean
        of their n losses is the whole evaluation's)."""
        return evaluate(self.model, self._windows(data, batches, part), self.device, self.inner.precision)

    def _windows(self, data: TokenDataset, batches: int, part: tuple[int, int], seed: int = 1234) -> list:
        index, count = part
        return fixed_windows(data, batches, self.inner.batch_size, self.inner.block_size, seed)[index::count]
