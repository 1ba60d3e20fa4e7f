"""SGD with momentum, dampening, Nesterov momentum and (L2) weight decay, as `torch.optim.SGD`.

    g = grad + weight_decay * p
    buf = g                                      (first step)
    buf = momentum * buf + (1 - dampening) * g   (later steps)
    g = g + momentum * buf if nesterov else buf
    p = p - lr * g

The update of a whole group is one call of the backend's multi-tensor `sgd_`, so the CUDA backend
can do it in one launch.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import autograd
from ..factories import zeros_like
from ..backends import cuda as cuda_backend
from .optimizer import Optimizer, ParamsT, _all_float32, _refuse_host_scalars, grads_of


class SGD(Optimizer):
    state_tensor_names = ("momentum_buffer",)

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    def _check_group(self, group: dict[str, Any]) -> None:
        if group["lr"] < 0:
            raise ValueError(f"SGD: lr must be >= 0, got {group['lr']}")
        if group["momentum"] < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {group['momentum']}")
        if group["weight_decay"] < 0:
            raise ValueError(f"SGD: weight_decay must be >= 0, got {group['weight_decay']}")
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening == 0, got momentum={group['momentum']}, "
                f"dampening={group['dampening']}"
            )

    @autograd.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):
        """One update of every parameter that has a gradient; returns closure()'s loss if given."""
        loss = self._closure_loss(closure)
        capture = self._graph_capture()
        plans = []  # (group index, group, device, first_step, params, on_device)
        for gi, group in enumerate(self.param_groups):
            momentum = group["momentum"]
            # Normally one bucket per group: parameters of one device that all have (or all lack) a
            # momentum buffer. A parameter that first gets a gradient late starts its buffer late.
            buckets: dict[tuple, list] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                first_step = momentum != 0 and "momentum_buffer" not in state
                if first_step:
                    if capture is not None:
                        raise RuntimeError("SGD: a momentum buffer would be created inside a CUDA graph capture; take "
                                           "an eager step first (CapturedStep's warm-up does)")
                    state["momentum_buffer"] = zeros_like(p)  # sgd_ copies the first gradient into it
                buckets.setdefault((p.device, first_step), []).append(p)
            per_device: dict = {}
            for device, _ in buckets:
                per_device[device] = per_device.get(device, 0) + 1
            for (device, first_step), params in buckets.items():
                on_device = device.type == "cuda" and per_device[device] == 1 and _all_float32(params)
                plans.append((gi, group, device, first_step, params, on_device))
        scalars = self._prepare_device_scalars(plans, capture, track_steps=False)
        for gi, group, device, first_step, params, on_device in plans:
            momentum = group["momentum"]
            grads = grads_of(params, "SGD.step")
            buffers = [self.state[p]["momentum_buffer"].data if momentum != 0 else None for p in params]
            if on_device:
                ds = scalars[device.index]
                cuda_backend.sgd_device_(
                    [p.data for p in params], [g.data for g in grads], buffers, ds.lr_ptr(gi),
                    momentum=momentum, dampening=group["dampening"], nesterov=group["nesterov"],
                    weight_decay=group["weight_decay"], first_step=first_step,
                )
                if capture is not None:
                    self._note_captured_update(ds, gi, params, False)
                continue
            _refuse_host_scalars(self, device, capture)
            params[0]._backend.sgd_(
                [p.data for p in params], [g.data for g in grads], buffers,
                lr=group["lr"], momentum=momentum, dampening=group["dampening"],
                nesterov=group["nesterov"], weight_decay=group["weight_decay"], first_step=first_step,
            )
        return loss
