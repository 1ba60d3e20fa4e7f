"""The outer optimizer: Nesterov SGD on the global weights, along the round's aggregated
pseudo-gradient (coop.diloco makes and aggregates those)."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from .diloco import Weights, check_same_tensors, shapes_of
from .threads import parallel_map, pieces

_OUTER_CHUNK = 1 << 18  # elements per task of the outer step: its one temporary (1 MB) per thread stays small


class OuterOptimizer(Protocol):
    """What the round loop needs from an outer optimizer."""

    def step(self, global_weights: dict[str, np.ndarray], pseudo_grad: Weights) -> None: ...
    def state_dict(self, copy: bool = True) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


class NesterovSGD:
    """SGD with (Nesterov) momentum on the global weights, applied in place.

    Same update as torch.optim.SGD (dampening 0, no weight decay), with g the aggregated
    pseudo-gradient and b the momentum buffer (b = g on the first step):

        b <- momentum * b + g
        d  = g + momentum * b   if nesterov else   b
        w <- w - lr_t * d

    Defaults are DiLoCo's (lr 0.7, momentum 0.9, Nesterov). lr 1 and momentum 0 is plain
    averaging: the new global weights are the mean of the replicas' weights (see `plain_averaging`).
    Optional linear warm-up: lr_t = lr * min(1, (t + 1) / warmup_steps) at outer step t = 0, 1, ...
    Optional cosine decay: from the end of the warm-up to outer step `decay_steps` the lr falls
    from lr to lr * min_lr_factor (and stays there), as the inner schedule does.
    """

    def __init__(self, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True, warmup_steps: int = 0,
                 decay_steps: int = 0, min_lr_factor: float = 0.1):
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"outer lr must be positive, got {lr!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"outer momentum must be in [0, 1), got {momentum!r}")
        if nesterov and momentum == 0:
            raise ValueError("Nesterov needs momentum > 0; use nesterov=False for momentum 0")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}")
        if decay_steps < 0 or (decay_steps and decay_steps <= warmup_steps):
            raise ValueError(f"decay_steps must be 0 (no decay) or more than warmup_steps ({warmup_steps}), "
                             f"got {decay_steps!r}")
        if not 0.0 <= min_lr_factor <= 1.0:
            raise ValueError(f"min_lr_factor must be in [0, 1], got {min_lr_factor!r}")
        self.decay_steps, self.min_lr_factor = int(decay_steps), float(min_lr_factor)
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.warmup_steps = int(warmup_steps)
        self.step_count = 0  # outer steps taken
        self.momentum_buffer: dict[str, np.ndarray] = {}

    def current_lr(self) -> float:
        """The lr the next step will use (warm-up, then the cosine decay if any)."""
        t = self.step_count
        if t < self.warmup_steps:
            return self.lr * (t + 1) / self.warmup_steps
        if self.decay_steps == 0:
            return self.lr
        progress = min(1.0, (t - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
        return self.lr * (self.min_lr_factor + (1 - self.min_lr_factor) * 0.5 * (1 + math.cos(math.pi * progress)))

    def step(self, global_weights: dict[str, np.ndarray], pseudo_grad: Weights,
             out: dict[str, np.ndarray] | None = None) -> None:
        """Move `global_weights` (float32 arrays, modified in place) along the aggregated pseudo-gradient.
        With `out` (arrays of the same shapes), the moved weights are written there instead and
        `global_weights` is left as it was: the coordinator computes the next round's weights
        straight into the body it will serve (coop.wire.lay_out) while this round's is still served."""
        check_same_tensors(shapes_of(global_weights), pseudo_grad, "pseudo-gradient")
        if out is not None:
            check_same_tensors(shapes_of(global_weights), out, "outer step's output")
        targets = global_weights if out is None else out
        for name, weight in global_weights.items():
            target = targets[name]
            if not (isinstance(target, np.ndarray) and target.dtype == np.float32 and target.flags.writeable):
                got = getattr(target, "dtype", type(target).__name__)
                what = "global weight" if out is None else "output"
                raise TypeError(f"{what} {name!r} must be a writable float32 numpy array (updated in place), got {got}")
            buffer = self.momentum_buffer.get(name)
            if buffer is not None and buffer.shape != weight.shape:
                raise ValueError(
                    f"momentum buffer {name!r} has shape {buffer.shape}, the weight {weight.shape}; state from another model?"
                )
            if not all(np.isfinite(p).all() for p in pieces([np.asarray(pseudo_grad[name])])):  # no NaN/inf, ever
                raise ValueError(f"pseudo-gradient {name!r} has NaN/inf values; refusing the outer step")
        lr = np.float32(self.current_lr())
        momentum = np.float32(self.momentum)
        fresh = {name for name in global_weights if self.momentum != 0 and name not in self.momentum_buffer}
        for name in fresh:  # b = g on a tensor's first step
            self.momentum_buffer[name] = np.zeros_like(global_weights[name])

        def flat(array: np.ndarray, start: int, stop: int) -> np.ndarray:  # a view: updates land in place
            return array.reshape(-1)[start:stop] if stop >= 0 else array

        def update(piece: tuple[str, int, int]) -> None:  # one chunk of one tensor (stop -1: all of it)
            name, start, stop = piece
            weight = flat(global_weights[name], start, stop)
            target = flat(targets[name], start, stop)
            grad = np.asarray(pseudo_grad[name], dtype=np.float32)
            grad = flat(grad, start, stop) if stop >= 0 else grad
            if self.momentum == 0:
                direction = grad
            else:
                buffer = flat(self.momentum_buffer[name], start, stop)
                if name in fresh:
                    buffer[...] = grad
                else:
                    buffer *= momentum
                    buffer += grad
                direction = buffer
                if self.nesterov:  # grad + momentum * buffer, in one temporary
                    direction = np.multiply(buffer, momentum)
                    np.add(grad, direction, out=direction)
            step = np.multiply(direction, lr, out=None if direction is grad or direction is buffer else direction)
            np.subtract(weight, step, out=target)

        chunks = []
        for name, w in global_weights.items():
            contiguous = (w.flags.c_contiguous and self.momentum_buffer.get(name, w).flags.c_contiguous
                          and targets[name].flags.c_contiguous)
            chunks += ([(name, start, min(start + _OUTER_CHUNK, w.size)) for start in range(0, w.size, _OUTER_CHUNK)]
                       if contiguous else [(name, 0, -1)])
        parallel_map(update, chunks, sum(w.size for w in global_weights.values()))  # the same numbers, on every core
        self.step_count += 1

    def take_hyperparameters(self, other: NesterovSGD) -> None:
        """Use `other`'s lr, momentum and schedule, keeping this one's momentum buffers and step count
        (a resumed run whose config changed them)."""
        self.lr, self.momentum, self.nesterov = other.lr, other.momentum, other.nesterov
        self.warmup_steps, self.decay_steps, self.min_lr_factor = other.warmup_steps, other.decay_steps, other.min_lr_factor

    def hyperparameters(self) -> dict[str, Any]:
        """The scalars of `state_dict` (JSON-able), without the momentum buffers."""
        return {k: v for k, v in self.state_dict(copy=False).items() if k != "momentum_buffer"}

    def state_dict(self, copy: bool = True) -> dict[str, Any]:
        """Scalars (JSON-able) plus "momentum_buffer": name -> float32 array (copies; with copy=False
        the buffers themselves, for a writer that finishes before the next step).
        Persist with e.g. `coop.wire.pack(state.pop("momentum_buffer"), state)`; no pickle."""
        return {
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "min_lr_factor": self.min_lr_factor,
            "step_count": self.step_count,
            "momentum_buffer": {name: buffer.copy() if copy else buffer for name, buffer in self.momentum_buffer.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned (hyper-parameters included, like torch). States saved
        before the decay existed (no decay_steps / min_lr_factor) load as no decay."""
        required = {"lr", "momentum", "nesterov", "warmup_steps", "step_count", "momentum_buffer"}
        optional = {"decay_steps", "min_lr_factor"}
        if not required <= set(state) <= required | optional:
            raise ValueError(f"outer optimizer state must have keys {sorted(required)} (and optionally "
                             f"{sorted(optional)}), got {sorted(state)}")
        buffers = state["momentum_buffer"]
        for name, buffer in buffers.items():
            if not (isinstance(buffer, np.ndarray) and buffer.dtype == np.float32 and np.isfinite(buffer).all()):
                got = getattr(buffer, "dtype", type(buffer).__name__)
                raise ValueError(f"momentum buffer {name!r} must be a finite float32 array, got {got}")
        restored = NesterovSGD(float(state["lr"]), float(state["momentum"]), bool(state["nesterov"]),
                               int(state["warmup_steps"]), int(state.get("decay_steps", 0)),
                               float(state.get("min_lr_factor", 0.1)))
        self.lr, self.momentum = restored.lr, restored.momentum
        self.nesterov, self.warmup_steps = restored.nesterov, restored.warmup_steps
        self.decay_steps, self.min_lr_factor = restored.decay_steps, restored.min_lr_factor
        self.step_count = int(state["step_count"])
        self.momentum_buffer = {name: buffer.copy() for name, buffer in buffers.items()}


def plain_averaging() -> NesterovSGD:
    """Outer SGD with lr 1 and no momentum: the global weights become the replicas' mean."""
    return NesterovSGD(lr=1.0, momentum=0.0, nesterov=False)
