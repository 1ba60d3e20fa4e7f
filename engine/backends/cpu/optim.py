"""Multi-tensor primitives of the CPU backend for optimizers and gradient clipping (in place, over
lists of arrays).

bf16 parameters are refused by the updates, as on the GPU: a bf16 moment or momentum buffer loses
most updates to rounding (beta2 = 0.999 times a bf16 value rounds back to it). Training in bf16 keeps
float32 master weights: autocast runs the forward in bf16 and hands the optimizer float32 gradients."""
from __future__ import annotations

import numpy as np

from .bf16 import any_bf16, widen
from .creation import Array


def _refuse_bf16(op: str, *groups: list) -> None:
    for group in groups:
        if any_bf16(*group):
            raise TypeError(f"cpu backend: {op} updates float32 (or float64) parameters, got bfloat16 ones; keep the "
                            "parameters in float32 (model.float()) and run the forward under "
                            "engine.autocast(device_type, dtype=engine.bfloat16)")


def adamw_(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, *, lr: float, beta1: float,
           beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """One AdamW step over all parameters (decoupled weight decay, bias-corrected moments)."""
    _refuse_bf16("adamw_", params, grads, exp_avgs, exp_avg_sqs)
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    step_size = lr / bc1
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if weight_decay:
            p *= 1.0 - lr * weight_decay
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += (1.0 - beta2) * (g * g)
        denom = np.sqrt(v / bc2)
        denom += eps
        p -= step_size * (m / denom)


def sgd_(params: list, grads: list, momentum_buffers: list, *, lr: float, momentum: float,
         dampening: float, nesterov: bool, weight_decay: float, first_step: bool) -> None:
    """One SGD step (PyTorch semantics: the buffer starts as the first gradient)."""
    _refuse_bf16("sgd_", params, grads, [b for b in (momentum_buffers or []) if b is not None])
    for i, (p, g) in enumerate(zip(params, grads)):
        if weight_decay:
            g = g + weight_decay * p
        if momentum:
            buf = momentum_buffers[i]
            if first_step:
                np.copyto(buf, g)
            else:
                buf *= momentum
                buf += (1.0 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p -= lr * g


def sum_of_squares(xs: list) -> Array:
    """sum over all arrays of sum(x^2), as a 0-d float32 array (stays on the device)."""
    total = np.zeros((), dtype=np.float32)
    for x in xs:
        flat = x.reshape(-1).astype(np.float32, copy=False)
        total += np.dot(flat, flat)
    return total


def scale_(xs: list, factor: Array) -> None:
    """x *= factor for every array, factor a 0-d array on the same device (bf16 x: the product in float32,
    rounded once)."""
    for x in xs:
        if any_bf16(x):
            np.copyto(x, widen(x) * widen(factor).astype(np.float32), casting="same_kind")
        else:
            x *= factor.astype(x.dtype)
