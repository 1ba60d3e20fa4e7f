"""Elementwise primitives of the CUDA backend: binary ops with broadcasting and scalars, unary
ops and activation backwards, where, scale by a device scalar."""
from __future__ import annotations

import numpy as np

from ...dtypes import bfloat16, bool_, float32, float64
from ..._native import native
from .arrays import _CODE, CudaArray, _empty, _same_device
from .creation import astype
from .layout import _broadcast_shape, _broadcast_strides, _coalesce


_BINARY = {"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "maximum": 5, "minimum": 6,
           "eq": 7, "ne": 8, "lt": 9, "le": 10, "gt": 11, "ge": 12}


_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}


_FLAT1 = [[1], [1]]


_plan_cache: dict = {}


def _binary_plan(sa: tuple, sb: tuple) -> tuple:
    key = (sa, sb)
    plan = _plan_cache.get(key)
    if plan is None:
        out_shape = _broadcast_shape(sa, sb)
        shape, strides = _coalesce(out_shape, (_broadcast_strides(sa, out_shape), _broadcast_strides(sb, out_shape)))
        plan = (out_shape, shape, strides)
        if len(_plan_cache) > 4096:
            _plan_cache.clear()
        _plan_cache[key] = plan
    return plan


def binary(op: str, a, b) -> CudaArray:
    """op(a, b) elementwise with broadcasting; a or b may be a scalar (not both)."""
    code = _BINARY[op]
    a_arr, b_arr = isinstance(a, CudaArray), isinstance(b, CudaArray)
    if a_arr and b_arr:
        if a.device != b.device:
            raise RuntimeError(f"{op}: arrays on different devices (cuda:{a.device} and cuda:{b.device})")
        if a.dtype is not b.dtype:
            raise TypeError(f"{op}: arrays of different dtypes ({a.dtype.name} and {b.dtype.name}); convert one first")
        dtype, dev = a.dtype, a.device
        out_dtype = bool_ if op in _COMPARE else dtype
        if a.shape == b.shape:
            out = _empty(a.shape, out_dtype, dev)
            n = out.size
            native.binary(dev, code, _CODE[dtype], out.ptr, a.ptr, b.ptr, 0.0, 0, [n], _FLAT1, n)
            return out
        out_shape, shape, strides = _binary_plan(a.shape, b.shape)
        out = _empty(out_shape, out_dtype, dev)
        native.binary(dev, code, _CODE[dtype], out.ptr, a.ptr, b.ptr, 0.0, 0, shape, strides, out.size)
        return out
    if a_arr:
        x, scalar, mode = a, b, 1
    elif b_arr:
        x, scalar, mode = b, a, 2
    else:
        raise TypeError(f"{op}: needs at least one array, got {type(a).__name__} and {type(b).__name__}")
    scalar = _as_number(scalar)
    dtype = x.dtype
    if not dtype.is_floating_point and isinstance(scalar, float) and not scalar.is_integer() and op not in _COMPARE:
        # numpy computes int-array (op) float in floating point, then cpu.binary casts back
        y = binary(op, *((astype(x, float64), scalar) if mode == 1 else (scalar, astype(x, float64))))
        return astype(y, dtype)
    out = _empty(x.shape, bool_ if op in _COMPARE else dtype, x.device)
    n = out.size
    native.binary(x.device, code, _CODE[dtype], out.ptr, x.ptr, x.ptr, float(scalar), mode, [n], _FLAT1, n)
    return out


def _as_number(v):
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, CudaArray):
        raise TypeError("internal: expected a scalar")
    return v


_UNARY = {"neg": 0, "exp": 1, "log": 2, "abs": 3, "sqrt": 4, "tanh": 5, "sign": 6, "sigmoid": 7, "relu": 8,
          "gelu": 9}


def unary(op: str, x: CudaArray) -> CudaArray:
    out = _empty(x.shape, x.dtype, x.device)
    native.unary(x.device, _UNARY[op], _CODE[x.dtype], out.ptr, x.ptr, x.size)
    return out


def relu_backward(x: CudaArray, grad: CudaArray) -> CudaArray:
    out = _empty(x.shape, x.dtype, x.device)
    native.act_backward(x.device, 8, _CODE[x.dtype], out.ptr, x.ptr, grad.ptr, x.size)
    return out


def gelu_backward(x: CudaArray, grad: CudaArray) -> CudaArray:
    out = _empty(x.shape, x.dtype, x.device)
    native.act_backward(x.device, 9, _CODE[x.dtype], out.ptr, x.ptr, grad.ptr, x.size)
    return out


def where(cond: CudaArray, a, b) -> CudaArray:
    """cond ? a : b with broadcasting; a or b may be a scalar."""
    a_arr, b_arr = isinstance(a, CudaArray), isinstance(b, CudaArray)
    if not (a_arr or b_arr):
        raise TypeError("where: needs at least one of a, b to be an array")
    dev = _same_device("where", cond, a, b)
    if a_arr and b_arr and a.dtype is not b.dtype:
        raise TypeError(f"where: a and b have different dtypes ({a.dtype.name} and {b.dtype.name})")
    dtype = a.dtype if a_arr else b.dtype
    if cond.dtype is not bool_:
        cond = astype(cond, bool_)
    shapes = (cond.shape,) + ((a.shape,) if a_arr else ()) + ((b.shape,) if b_arr else ())
    out_shape = _broadcast_shape(*shapes)
    zeros = (0,) * len(out_shape)
    strides = (_broadcast_strides(cond.shape, out_shape),
               _broadcast_strides(a.shape, out_shape) if a_arr else zeros,
               _broadcast_strides(b.shape, out_shape) if b_arr else zeros)
    shape, st = _coalesce(out_shape, strides)
    out = _empty(out_shape, dtype, dev)
    sa = 0.0 if a_arr else float(_as_number(a))
    sb = 0.0 if b_arr else float(_as_number(b))
    native.where(dev, _CODE[dtype], out.ptr, cond.ptr, a.ptr if a_arr else 0, b.ptr if b_arr else 0, sa, sb,
             not a_arr, not b_arr, shape, st, out.size)
    return out


def scale(x: CudaArray, factor: CudaArray) -> CudaArray:
    """x * factor, factor a 0-d array on the device (no host sync): float32 arithmetic, x's dtype
    (float32 or bfloat16) out. The binary ops want one dtype; this is bf16 times a float32 scalar."""
    _same_device("scale", x, factor)
    if x.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: scale supports float32 and bfloat16 arrays, got {x.dtype.name}")
    if factor.dtype is not float32:
        factor = astype(factor, float32)
    out = _empty(x.shape, x.dtype, x.device)
    native.scale_dt(x.device, _CODE[x.dtype], out.ptr, x.ptr, factor.ptr, x.size)
    return out
