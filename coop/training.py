"""One training step for every way coop trains, and the helpers around it.

`TrainStep` is forward (under autocast), backward, gradient clipping, the optimizer update and
the learning-rate schedule; on a GPU the whole step is replayed as one captured CUDA graph.
`coop train` (coop.train.Trainer) and every DiLoCo replica (coop.replica.Replica) step through
it, so the two never drift apart. `evaluate` is the one validation loss both report.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

import numpy as np

import engine
import engine.fp8
from engine.data import TokenDataset
from engine.optim import SGD, AdamW, clip_grad_norm_, warmup_cosine_lr


def autocast_for(device: str, precision: str = "auto"):
    """The forward pass's precision: bf16 autocast (float32 master weights) on a GPU unless
    precision is "fp32"; float32 on the CPU, which has no bf16 arithmetic. "fp8" is bf16 autocast
    too, with the model's linear layers in FP8 (TrainStep turns that on: engine.fp8)."""
    on_gpu = str(device).startswith("cuda")
    if precision not in ("auto", "bf16", "fp8", "fp32"):
        raise ValueError(f"precision must be 'auto', 'bf16', 'fp8' or 'fp32', got {precision!r}")
    if precision in ("bf16", "fp8") and not on_gpu:
        raise ValueError(f"precision {precision!r} needs a CUDA device; the CPU backend trains in float32")
    if on_gpu and precision != "fp32":
        return engine.autocast("cuda", dtype=engine.bfloat16)
    return contextlib.nullcontext()


def weights_of(model: engine.nn.Module) -> dict[str, np.ndarray]:
    """Every trained tensor of the model as float32 numpy, keyed by parameter name (tied weights once)."""
    return to_host(dict(model.named_parameters()))


def to_host(tensors: Mapping[str, engine.Tensor]) -> dict[str, np.ndarray]:
    """Tensors on any device -> float32 numpy copies of their own. On a GPU in one copy to the host
    (views of one flat buffer): each copy waits for the device, and with several processes
    sharing a GPU every wait costs a time slice."""
    if not tensors or not _on_gpu(tensors):
        return {name: np.array(t.numpy(), dtype=np.float32) for name, t in tensors.items()}
    with engine.no_grad():
        flat = engine.cat([t.detach().reshape(-1) for t in tensors.values()]).numpy().astype(np.float32, copy=False)
    out, offset = {}, 0
    for name, t in tensors.items():  # views of the one host buffer
        out[name] = flat[offset : offset + t.numel()].reshape(t.shape)
        offset += t.numel()
    return out


def to_device(arrays: Mapping[str, np.ndarray], device) -> dict[str, engine.Tensor]:
    """float32 numpy arrays -> tensors of their own on `device` (the caller's arrays may move on).
    On a GPU in one copy to the device (views of one flat buffer there), for the same reason."""
    if not str(device).startswith("cuda"):
        return {name: engine.tensor(np.asarray(a, dtype=np.float32), device=device) for name, a in arrays.items()}
    host = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in arrays.values()]) if arrays \
        else np.empty(0, np.float32)
    flat = engine.tensor(host, device=device)
    out, offset = {}, 0
    for name, a in arrays.items():
        size = int(np.size(a))
        out[name] = flat[offset : offset + size].reshape(np.shape(a))
        offset += size
    return out


def _on_gpu(tensors: Mapping) -> bool:
    return str(next(iter(tensors.values())).device).startswith("cuda")


def parameters_for(model: engine.nn.Module, weights: Mapping[str, np.ndarray],
                   partial: bool = False) -> dict[str, engine.Tensor]:
    """The model's parameters that `weights` would load (all of them, or with `partial` the ones
    named), after checking names and shapes: KeyError or ValueError before anything is copied."""
    params = dict(model.named_parameters())
    if partial:
        unknown = sorted(set(weights) - set(params))
        if unknown:
            raise KeyError(f"weights do not match the model: unexpected {unknown[:5]}")
        params = {name: params[name] for name in weights}
    elif set(params) != set(weights):
        missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        raise KeyError(f"weights do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, p in params.items():
        if tuple(np.shape(weights[name])) != tuple(p.shape):
            raise ValueError(f"weight {name!r} has shape {tuple(np.shape(weights[name]))}, the model's is {tuple(p.shape)}")
    return params


def load_weights(model: engine.nn.Module, weights: Mapping[str, np.ndarray], partial: bool = False) -> None:
    """Copy `weights` into the model's parameters: all of them, or (partial) the ones named. On a
    GPU one copy to the device, then device-side copies into each parameter (no wait in between)."""
    params = parameters_for(model, weights, partial)
    if not params:
        return
    loaded = to_device({name: weights[name] for name in params}, next(iter(params.values())).device)
    with engine.no_grad():
        for name, p in params.items():
            p.copy_(loaded[name])


def make_optimizer(model: engine.nn.Module, name: str, lr: float, weight_decay: float,
                   betas: tuple[float, float] = (0.9, 0.95)):
    """AdamW (decoupled weight decay on the matrices only, as nanoGPT) or plain SGD."""
    groups = model.optimizer_groups(weight_decay)
    if name == "adamw":
        return AdamW(groups, lr=lr, betas=betas)
    if name == "sgd":
        return SGD(groups, lr=lr)
    raise ValueError(f"inner optimizer must be 'adamw' or 'sgd', got {name!r}")


class TrainStep:
    """`step(x, y)`: one optimizer step on a batch; returns the loss as a 0-d tensor on the device
    (no host sync). With `grad_accum` A > 1, x and y are (A, B, T) and the gradients of the A
    micro-batches (each loss scaled by 1/A) are summed before the update; otherwise (B, T).

    `step_count` drives the schedule (linear warm-up, then cosine from lr to min_lr at
    total_steps): the lr of step s is set on the optimizer before the step runs, outside the
    captured graph, which sends it to the device on every replay."""

    def __init__(self, model: engine.nn.Module, optimizer, *, device: str, lr: float, min_lr: float,
                 warmup_steps: int, total_steps: int, precision: str = "auto", grad_clip: float = 1.0,
                 grad_accum: int = 1, graph: bool = True):
        autocast_for(device, precision)  # a bad precision fails here, before any work
        self.model, self.optimizer, self.device, self.precision = model, optimizer, device, precision
        if precision == "fp8":  # the linear layers' forward and input-gradient GEMMs in FP8 (engine.fp8)
            engine.fp8.enable(model)
        self.lr, self.min_lr, self.warmup_steps, self.total_steps = lr, min_lr, warmup_steps, total_steps
        self.grad_clip, self.grad_accum = grad_clip, grad_accum
        self.step_count = 0
        # forward, backward, clipping and the update as one CUDA graph after two eager warm-up steps
        # (on the step's own GPU: a replica on cuda:1 captures cuda:1's stream)
        self.captured = engine.cuda.graphs.CapturedStep(self._update, device=device) \
            if graph and str(device).startswith("cuda") else None

    def lr_at(self, step: int) -> float:
        return warmup_cosine_lr(step, self.lr, self.warmup_steps, self.total_steps, self.min_lr)

    def __call__(self, x, y) -> engine.Tensor:
        lr = self.lr_at(self.step_count)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.captured is not None:
            loss = self.captured(x, y)  # copied into the graph's input buffers, then one replay
        else:
            loss = self._update(_on(x, self.device), _on(y, self.device))
        self.step_count += 1
        return loss

    def _update(self, x: engine.Tensor, y: engine.Tensor) -> engine.Tensor:
        """Forward and backward (over the micro-batches), clipping, the optimizer update; the loss, detached."""
        self.optimizer.zero_grad()
        if self.grad_accum == 1:
            with autocast_for(self.device, self.precision):
                _, loss = self.model(x, y)
            loss.backward()
            total = loss.detach()
        else:
            total = None
            no_sync = getattr(self.model, "no_sync", None)  # data parallel: reduce only the last micro-batch's sum
            for i in range(self.grad_accum):
                with autocast_for(self.device, self.precision):
                    _, loss = self.model(x[i], y[i])
                loss = loss * (1.0 / self.grad_accum)
                with no_sync() if no_sync is not None and i < self.grad_accum - 1 else contextlib.nullcontext():
                    loss.backward()
                total = loss.detach() if total is None else total + loss.detach()
        if self.grad_clip:
            clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return total

    def reset(self) -> None:
        """After the optimizer's state or the model's parameters were replaced (not their values)."""
        if self.captured is not None:
            self.captured.reset()


class HostLead:
    """Keeps the host at most `steps` inner steps ahead of the device (nothing on the CPU). Left
    alone, the host queues steps as fast as it can launch them: a check made between them (has the
    merge arrived?) then answers for a step the device reaches seconds later, and the host holds
    the GIL in long runs of launches that the process's other threads (the upload and download
    beside the steps) wait behind."""

    def __init__(self, device: str, steps: int = 2):
        on_gpu = str(device).startswith("cuda")
        self.events = [engine.cuda.Event(device) for _ in range(steps)] if on_gpu else []
        self.next = 0

    def step_queued(self) -> None:
        """After queueing a step: mark it, and wait for the one `steps` before it."""
        if not self.events:
            return
        event = self.events[self.next]
        event.synchronize()  # the step `steps` before this one (at once when never recorded)
        event.record()
        self.next = (self.next + 1) % len(self.events)


def _on(batch, device: str) -> engine.Tensor:
    return batch if isinstance(batch, engine.Tensor) else engine.tensor(batch, device=device)


@engine.no_grad()
def evaluate(model: engine.nn.Module, batches: Iterable[tuple], device: str, precision: str = "auto") -> float:
    """Mean loss of `model` over the (x, y) batches (numpy or tensors), in eval mode and under
    the same autocast as training; the model's train/eval mode is restored after."""
    was_training = model.training
    model.eval()
    with autocast_for(device, precision):
        losses = [model(_on(x, device), _on(y, device))[1] for x, y in batches]
    model.train(was_training)
    return float(engine.stack(losses).mean().item())


class Evaluation:
    """`evaluate` of one model that is evaluated again and again on windows of one shape (a
    replica's copy for the global weights, reloaded in place each time): on a GPU each window's
    forward pass is replayed as one captured CUDA graph, one launch where an eager pass makes
    hundreds (each a wait for a time slice when several processes share the GPU); eager elsewhere,
    or with graph=False. The model stays in eval mode (it is used for nothing else)."""

    def __init__(self, model: engine.nn.Module, device: str, precision: str = "auto", graph: bool = True):
        autocast_for(device, precision)  # a bad precision fails here
        self.model, self.device, self.precision = model, device, precision
        model.eval()
        self.captured = engine.cuda.graphs.CapturedStep(self._loss, device=device) \
            if graph and str(device).startswith("cuda") else None
        self.pending: PendingEvaluation | None = None  # the last started

    @engine.no_grad()
    def window(self, x, y) -> engine.Tensor:
        """One window's loss, queued (no wait): a replay of the captured forward, or an eager pass."""
        if self.captured is not None:
            return self.captured(x, y)  # copied into the graph's inputs, one replay
        return self._loss(_on(x, self.device), _on(y, self.device))

    def _loss(self, x: engine.Tensor, y: engine.Tensor) -> engine.Tensor:
        with autocast_for(self.device, self.precision):
            return self.model(x, y)[1]

    def __call__(self, batches: Iterable[tuple]) -> float:
        """Mean loss over the (x, y) batches (numpy or tensors): one wait for the device, at the end."""
        return self.start(batches).result()

    def start(self, batches: Iterable[tuple]) -> "PendingEvaluation":
        """The evaluation of the model as it is now, its windows run by `PendingEvaluation.step` one at
        a time beside other work (the round's inner steps), or all at once by `result()`. On a GPU the
        windows queue on the one stream: what the model holds when each is queued is what it sees."""
        if self.pending is not None:
            self.pending.flush()  # the last one's windows read the weights before a load changes them
        self.pending = PendingEvaluation(self, list(batches))
        return self.pending

    def stage(self, batches: list[tuple]) -> list[tuple]:
        """The (x, y) numpy windows as tensors on the device, in one copy each way (a copy from host
        memory waits for the device: one wait instead of two per window), to be passed again and again."""
        if not batches or not str(self.device).startswith("cuda"):
            return batches
        xs = engine.tensor(np.stack([x for x, _ in batches]), device=self.device)  # (n, B, T)
        ys = engine.tensor(np.stack([y for _, y in batches]), device=self.device)
        return [(xs[i], ys[i]) for i in range(len(batches))]


class PendingEvaluation:
    """An evaluation started by `Evaluation.start`: its windows still to run, and their losses."""

    def __init__(self, evaluation: Evaluation, batches: list[tuple]):
        self.evaluation, self.batches, self.losses = evaluation, batches, []

    def step(self) -> bool:
        """Queue the next window's forward pass; False once none is left."""
        if len(self.losses) < len(self.batches):
            self.losses.append(self.evaluation.window(*self.batches[len(self.losses)]))
        return len(self.losses) < len(self.batches)

    def flush(self) -> None:
        while self.step():
            pass

    def result(self) -> float:
        """The mean loss (the rest of the windows first): the one wait for the device."""
        self.flush()
        return float(engine.stack(self.losses).mean().item())


def fixed_windows(data: TokenDataset, batches: int, batch_size: int, block_size: int, seed: int):
    """`batches` random (x, y) windows of `data`, the same for the same seed: losses comparable across calls."""
    rng = np.random.default_rng(seed)
    return [data.get_batch(batch_size, block_size, rng) for _ in range(batches)]
