"""Learning-rate schedules, as `torch.optim.lr_scheduler`.

Each scheduler computes the learning rate of every param group in closed form from `last_epoch`
(the number of `step()` calls so far) and the groups' base learning rates, and writes it into
`group["lr"]`. As in PyTorch, building a scheduler applies the rate of epoch 0, and `step()` is
called once per optimizer step (after `optimizer.step()`).

`WarmupCosine` (linear warm-up, then cosine decay) has no direct PyTorch counterpart; its rate is
also available without an optimizer as `warmup_cosine_lr(step, ...)`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses implement `get_lr()` (one rate per group, from `self.last_epoch`)."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(self).__name__} expects an engine.optim Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            missing = [i for i, g in enumerate(optimizer.param_groups) if "initial_lr" not in g]
            if missing:
                raise KeyError(
                    f"{type(self).__name__}: last_epoch={last_epoch} resumes a schedule, but param group(s) {missing} "
                    "have no 'initial_lr'; load the optimizer's state_dict first, or pass last_epoch=-1"
                )
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._last_lr: list[float] = []
        self.step()

    def get_lr(self) -> list[float]:  # pragma: no cover - interface
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The rates the last `step()` wrote, one per param group."""
        return list(self._last_lr)

    def step(self) -> None:
        """Advance one epoch/iteration and write the new rates into the optimizer's groups."""
        self.last_epoch += 1
        self._apply(self.get_lr())

    def _apply(self, lrs: list[float]) -> None:
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    # Names of the constructor arguments saved in the state dict (the schedule's shape).
    _hyper: tuple[str, ...] = ()

    def state_dict(self) -> dict[str, Any]:
        """JSON-friendly: last_epoch, base_lrs, the last rates and the schedule's arguments."""
        out: dict[str, Any] = {"last_epoch": self.last_epoch, "base_lrs": list(self.base_lrs),
                               "_last_lr": list(self._last_lr)}
        out.update({k: getattr(self, k) for k in self._hyper})
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a saved schedule and put its last rates back into the optimizer's groups, so that
        resuming gives the same rates whatever order the optimizer and scheduler are loaded in."""
        n = len(self.optimizer.param_groups)
        if len(state_dict.get("base_lrs", [])) != n:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the saved schedule has {len(state_dict.get('base_lrs', []))} "
                f"base learning rate(s), the optimizer has {n} param group(s); build it with the same groups"
            )
        self.last_epoch = int(state_dict["last_epoch"])
        self.base_lrs = [float(lr) for lr in state_dict["base_lrs"]]
        for k in self._hyper:
            if k in state_dict:
                setattr(self, k, state_dict[k])
        last = state_dict.get("_last_lr") or self.get_lr()
        self._apply([float(lr) for lr in last])


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (last_epoch // step_size)."""

    _hyper = ("step_size", "gamma")

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        if int(step_size) != step_size or step_size < 1:
            raise ValueError(f"StepLR: step_size must be a positive int, got {step_size!r}")
        self.step_size = int(step_size)
        self.gamma = float(gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(last_epoch); one function, or one per param group. The functions
    are not saved in the state dict (pass the same ones when resuming)."""

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | list[Callable[[int], float]],
                 last_epoch: int = -1):
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, list | tuple):
            if len(lr_lambda) != n:
                raise ValueError(f"LambdaLR: got {len(lr_lambda)} lr_lambda functions for {n} param group(s); give one, or one per group")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]


def warmup_cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int, min_lr: float = 0.0) -> float:
    """The rate at `step` (counted from 0): linear warm-up base_lr * (step + 1) / warmup_steps, so the
    first step already moves (as nanoGPT), then a half cosine from base_lr at step warmup_steps down
    to min_lr at step total_steps, and min_lr after that."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # in [0, 1)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class WarmupCosine(LRScheduler):
    """Linear warm-up to each group's base lr over `warmup_steps`, then cosine decay to
    `min_lr` at `total_steps` (held there after). See `warmup_cosine_lr` for the formula."""

    _hyper = ("warmup_steps", "total_steps", "min_lr")

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr: float = 0.0,
                 last_epoch: int = -1):
        if not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"WarmupCosine: expected 0 <= warmup_steps <= total_steps, got warmup_steps={warmup_steps}, "
                f"total_steps={total_steps}"
            )
        if min_lr < 0:
            raise ValueError(f"WarmupCosine: min_lr must be >= 0, got {min_lr}")
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_lr = float(min_lr)
        super().__init__(optimizer, last_epoch)

    def get_lr_at(self, step: int) -> list[float]:
        """The rate of every group at `step`, without changing anything."""
        return [warmup_cosine_lr(step, base, self.warmup_steps, self.total_steps, self.min_lr) for base in self.base_lrs]

    def get_lr(self) -> list[float]:
        return self.get_lr_at(self.last_epoch)
