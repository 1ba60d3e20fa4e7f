"""Adam and AdamW, as `torch.optim.Adam` and `torch.optim.AdamW`.

    m = beta1 * m + (1 - beta1) * g            v = beta2 * v + (1 - beta2) * g^2
    p = p - lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)

Weight decay differs: Adam adds it to the gradient (L2, g = grad + wd * p, so it passes through
the moments); AdamW decays the weights directly (p = p * (1 - lr * wd)) before the update.

The update of a whole group is one call of the backend's multi-tensor `adamw_`, so the CUDA
backend can do it in one launch. The step count t is a Python int kept in each parameter's state
(PyTorch's layout); the parameters of a group step together, so they share it. On a GPU the
kernel reads lr and t from device memory (device_scalars.py), so a captured CUDA graph of the step
follows the schedule.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import autograd
from ..factories import zeros_like
from ..backends import cuda as cuda_backend
from .optimizer import Optimizer, ParamsT, _all_float32, _refuse_host_scalars, grads_of


class Adam(Optimizer):
    """Adam (Kingma & Ba). `weight_decay` is L2 added to the gradient, unless
    `decoupled_weight_decay=True`, which makes it AdamW (as in PyTorch)."""

    state_tensor_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, decoupled_weight_decay: bool = False):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay))

    def _check_group(self, group: dict[str, Any]) -> None:
        name = type(self).__name__
        group["betas"] = tuple(group["betas"])
        if group["lr"] < 0:
            raise ValueError(f"{name}: lr must be >= 0, got {group['lr']}")
        if group["eps"] < 0:
            raise ValueError(f"{name}: eps must be >= 0, got {group['eps']}")
        if len(group["betas"]) != 2 or not all(0.0 <= b < 1.0 for b in group["betas"]):
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), got {group['betas']}")
        if group["weight_decay"] < 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, got {group['weight_decay']}")

    @autograd.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One update of every parameter that has a gradient; returns closure()'s loss if given."""
        loss = self._closure_loss(closure)
        capture = self._graph_capture()
        plans = []  # (group index, group, device, step, params)
        for gi, group in enumerate(self.param_groups):
            # Normally one bucket per group: parameters of one device at one step count. A parameter
            # that skipped steps (no gradient) keeps its own count, as in PyTorch.
            buckets: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                if not state:
                    if capture is not None:
                        raise RuntimeError(f"{type(self).__name__}: optimizer state would be created inside a CUDA "
                                           "graph capture; take an eager step first (CapturedStep's warm-up does)")
                    state["step"] = 0
                    state["exp_avg"] = zeros_like(p)
                    state["exp_avg_sq"] = zeros_like(p)
                state["step"] = int(state["step"]) + 1
                buckets.setdefault((p.device, state["step"]), []).append(p)
            per_device: dict = {}
            for device, _ in buckets:
                per_device[device] = per_device.get(device, 0) + 1
            for (device, step), params in buckets.items():
                # on a GPU, lr and step are read from device memory (one bucket per device and group)
                on_device = device.type == "cuda" and per_device[device] == 1 and _all_float32(params)
                plans.append((gi, group, device, step, params, on_device))
        scalars = self._prepare_device_scalars(plans, capture, track_steps=True)
        for gi, group, device, step, params, on_device in plans:
            beta1, beta2 = group["betas"]
            decoupled = group["decoupled_weight_decay"]
            weight_decay = group["weight_decay"]
            be = params[0]._backend
            grads = [g.data for g in grads_of(params, f"{type(self).__name__}.step")]
            if weight_decay and not decoupled:  # L2: g + wd * p (new arrays; the stored grads stay as they are)
                grads = [be.binary("add", g, be.binary("mul", p.data, weight_decay)) for g, p in zip(grads, params)]
            if on_device:
                ds = scalars[device.index]
                cuda_backend.adamw_device_(
                    [p.data for p in params], grads, [self.state[p]["exp_avg"].data for p in params],
                    [self.state[p]["exp_avg_sq"].data for p in params], ds.lr_ptr(gi), ds.step_ptr(gi),
                    beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=weight_decay if decoupled else 0.0,
                )
                if capture is not None:
                    self._note_captured_update(ds, gi, params, True)
                continue
            _refuse_host_scalars(self, device, capture)
            be.adamw_(
                [p.data for p in params], grads,
                [self.state[p]["exp_avg"].data for p in params],
                [self.state[p]["exp_avg_sq"].data for p in params],
                lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                weight_decay=weight_decay if decoupled else 0.0, step=step,
            )
        return loss


class AdamW(Adam):
    """AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, 0.01 by default."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        super().__init__(params, lr, betas, eps, weight_decay, decoupled_weight_decay=True)
