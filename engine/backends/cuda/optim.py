"""Multi-tensor primitives of the CUDA backend for optimizers and gradient clipping: one launch
updates (or measures, or scales) a whole list of arrays."""
from __future__ import annotations

from ...dtypes import float32
from ..._native import native
from . import runtime as _api
from .arrays import CudaArray, _check_float32, _empty, _same_device
from .creation import astype


def adamw_(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, *, lr: float, beta1: float,
           beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """One AdamW step over all parameters in one launch (per 64 tensors)."""
    if not params:
        return
    dev = _same_device("adamw_", *params, *grads, *exp_avgs, *exp_avg_sqs)
    for group in (params, grads, exp_avgs, exp_avg_sqs):
        _check_float32("adamw_", *group)
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    native.adamw(dev, [p.ptr for p in params], [g.ptr for g in grads], [m.ptr for m in exp_avgs],
             [v.ptr for v in exp_avg_sqs], [p.size for p in params], float(lr), float(beta1), float(beta2),
             float(eps), float(weight_decay), float(bc1), float(bc2))


def sgd_(params: list, grads: list, momentum_buffers: list, *, lr: float, momentum: float,
         dampening: float, nesterov: bool, weight_decay: float, first_step: bool) -> None:
    """One SGD step (PyTorch semantics) over all parameters in one launch."""
    if not params:
        return
    dev = _same_device("sgd_", *params, *grads)
    _check_float32("sgd_", *params, *grads)
    bufs = [b.ptr if (momentum and b is not None) else 0 for b in (momentum_buffers or [None] * len(params))]
    native.sgd(dev, [p.ptr for p in params], [g.ptr for g in grads], bufs, [p.size for p in params], float(lr),
           float(momentum), float(dampening), bool(nesterov), float(weight_decay), bool(first_step))


def sum_of_squares(xs: list) -> CudaArray:
    """sum over all arrays of sum(x^2), as a 0-d float32 array on the device (no host sync)."""
    dev = _same_device("sum_of_squares", *xs) if xs else _api.current_device()
    xs = [astype(x, float32) for x in xs]
    out = _empty((), float32, dev)
    native.sum_of_squares(dev, out.ptr, [x.ptr for x in xs], [x.size for x in xs])
    return out


def scale_(xs: list, factor: CudaArray) -> None:
    """x *= factor for every array, factor a 0-d array on the same device."""
    if not xs:
        return
    dev = _same_device("scale_", *xs, factor)
    _check_float32("scale_", *xs)
    if factor.dtype is not float32:
        factor = astype(factor, float32)
    native.scale_multi(dev, [x.ptr for x in xs], [x.size for x in xs], factor.ptr)


# ---- the same updates, lr and step count read from device memory (engine/optim/device_scalars.py) ----
# A captured CUDA graph freezes kernel parameters; these read lr (and Adam's step) at launch time,
# so one graph of a training step serves the whole schedule.

def has_device_scalar_kernels() -> bool:
    """Whether this build of engine._C has the launchers that read lr and step from device memory."""
    return hasattr(native, "adamw_dev")


def adamw_device_(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, lr_ptr: int, step_ptr: int, *,
                  beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """adamw_ with lr and the step count read on the device: float32 values at lr_ptr and step_ptr."""
    native.adamw_dev(
        params[0].device, [p.ptr for p in params], [g.ptr for g in grads], [m.ptr for m in exp_avgs],
        [v.ptr for v in exp_avg_sqs], [p.size for p in params], lr_ptr, step_ptr, float(beta1), float(beta2),
        float(eps), float(weight_decay),
    )


def sgd_device_(params: list, grads: list, momentum_buffers: list, lr_ptr: int, *, momentum: float,
                dampening: float, nesterov: bool, weight_decay: float, first_step: bool) -> None:
    """sgd_ with lr read on the device (a float32 at lr_ptr); momentum_buffers' entries may be None."""
    native.sgd_dev(
        params[0].device, [p.ptr for p in params], [g.ptr for g in grads],
        [b.ptr if b is not None else 0 for b in momentum_buffers], [p.size for p in params], lr_ptr,
        float(momentum), float(dampening), bool(nesterov), float(weight_decay), bool(first_step),
    )


def optim_step_advance(device_index: int, step_ptr: int, group_mask: int) -> None:
    """+1 on the float32 step counts at step_ptr[g] of every group g in the 64-bit group_mask (one kernel)."""
    native.optim_step_advance(device_index, step_ptr, group_mask)
