"""Gradient clipping, as `torch.nn.utils.clip_grad_norm_` / `clip_grad_value_`.

Everything stays on the device: the norm is one `sum_of_squares` call per device, the clip
coefficient min(1, max_norm / (norm + 1e-6)) is computed with backend ops, and `scale_` applies
it. Nothing here waits for the GPU (no .item()), so clipping costs no host synchronisation.
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from .. import autograd
from ..device import get_default_device
from ..dtypes import float32
from ..factories import zeros
from ..tensor import Tensor

_EPS = 1e-6  # PyTorch's: keeps max_norm / norm finite when the gradients are all zero


def _grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    return [p.grad for p in params if p.grad is not None]


def _by_device(grads: list[Tensor]) -> dict:
    out: dict = {}
    for g in grads:
        out.setdefault(g.device, []).append(g)
    return out


def _device_norm_power(be, arrays: list, norm_type: float, device_index):
    """sum(|g|^p) over the arrays (max(|g|) for p = inf), as a (1,)-shaped array on the device.
    (1,) rather than 0-d, because numpy turns 0-d results of elementwise ops into scalars."""
    if norm_type == 2.0:
        return be.reshape(be.sum_of_squares(arrays), (1,))
    total = None
    for a in arrays:
        flat = be.unary("abs", be.reshape(a, (-1,)))
        if flat.shape[0] == 0:
            continue
        if norm_type == math.inf:
            part = be.max(flat, (0,), True)
            total = part if total is None else be.binary("maximum", total, part)
        else:
            part = be.sum(be.binary("pow", flat, float(norm_type)), (0,), True)
            total = part if total is None else be.binary("add", total, part)
    if total is None:  # only empty gradients
        total = be.full((1,), 0.0, float32, device_index)
    return total


@autograd.no_grad()
def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Scale all gradients together so that their total `norm_type`-norm is at most `max_norm`.

    Returns the total norm before clipping, a 0-d float tensor on the (first) gradients' device.
    Parameters without a gradient are skipped.
    """
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 (or math.inf), got {norm_type}")
    grads = _grads(parameters)
    if not grads:
        return zeros((), device=get_default_device())
    by_device = _by_device(grads)
    first = grads[0].device
    be = grads[0]._backend

    # Per device: sum(|g|^p) (or max |g|), then combined on the first gradient's device.
    total = None
    for device, group in by_device.items():
        gbe = group[0]._backend
        part = _device_norm_power(gbe, [gbe.astype(g.data, float32) for g in group], norm_type, device.index)
        if device != first:
            part = Tensor._wrap(part, device).to(first).data
        if total is None:
            total = part
        elif norm_type == math.inf:
            total = be.binary("maximum", total, part)
        else:
            total = be.binary("add", total, part)
    if norm_type == 2.0:
        norm = be.unary("sqrt", total)
    elif norm_type == math.inf:
        norm = total
    else:
        norm = be.binary("pow", total, 1.0 / norm_type)

    # coefficient = min(1, max_norm / (norm + eps)), applied to every gradient (a no-op at 1)
    coef = be.binary("minimum", be.binary("div", float(max_norm), be.binary("add", norm, _EPS)), 1.0)
    coef = be.reshape(coef, ())
    for device, group in by_device.items():
        dev_coef = coef if device == first else Tensor._wrap(coef, first).to(device).data
        group[0]._backend.scale_([g.data for g in group], dev_coef)
    return Tensor._wrap(be.reshape(norm, ()), first)


@autograd.no_grad()
def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient element into [-clip_value, clip_value], in place."""
    clip_value = float(clip_value)
    if clip_value < 0:
        raise ValueError(f"clip_grad_value_: clip_value must be >= 0, got {clip_value}")
    for g in _grads(parameters):
        be = g._backend
        be.copy_(g.data, be.binary("maximum", be.binary("minimum", g.data, clip_value), -clip_value))
