"""Reductions of the CUDA backend: sum and max over axes, argmax over one."""
from __future__ import annotations

import builtins
import math

from ...dtypes import bool_, int64, uint8
from ..._native import native
from .arrays import _CODE, CudaArray, _empty
from .creation import astype
from .movement import permute


def _reduce(x: CudaArray, axes: tuple, keepdim: bool, op: int, opname: str) -> CudaArray:
    axes = tuple(axes)
    out_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdim else \
        tuple(n for i, n in enumerate(x.shape) if i not in axes)
    if op == 1 and any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"{opname}: reduction over an empty axis has no identity")
    if x.dtype in (bool_, uint8):  # numpy semantics via a wider type
        y = _reduce(astype(x, int64), axes, keepdim, op, opname)
        return astype(y, x.dtype)
    # runs of (size, reduced?) over the dims that are not 1
    runs: list = []
    for i, n in enumerate(x.shape):
        if n == 1:
            continue
        r = i in axes
        if runs and runs[-1][1] == r:
            runs[-1][0] *= n
        else:
            runs.append([n, r])
    nred = builtins.sum(1 for _, r in runs if r)
    if nred == 0:  # nothing to reduce (all reduced axes have size 1)
        out = _empty(out_shape, x.dtype, x.device)
        if x.size:
            native.copy_device(out.ptr, x.ptr, x.nbytes, x.device)
        return out
    if nred > 1:
        # move the reduced axes last (one strided copy), then reduce rows
        kept = [i for i in range(x.ndim) if i not in axes]
        x = permute(x, tuple(kept) + axes)
        R = math.prod(x.shape[len(kept):])
        outer, inner = x.size // builtins.max(R, 1), 1
    else:
        k = next(i for i, (_, r) in enumerate(runs) if r)
        outer = math.prod(n for n, _ in runs[:k])
        R = runs[k][0]
        inner = math.prod(n for n, _ in runs[k + 1:])
    out = _empty(out_shape, x.dtype, x.device)
    native.reduce(x.device, op, _CODE[x.dtype], out.ptr, x.ptr, outer, R, inner)
    return out


def sum(x: CudaArray, axes: tuple, keepdim: bool) -> CudaArray:  # noqa: A001 - the primitive's name
    return _reduce(x, axes, keepdim, 0, "sum")


def max(x: CudaArray, axes: tuple, keepdim: bool) -> CudaArray:  # noqa: A001
    return _reduce(x, axes, keepdim, 1, "max")


def argmax(x: CudaArray, axis: int) -> CudaArray:
    if axis != x.ndim - 1:
        x = permute(x, tuple(i for i in range(x.ndim) if i != axis) + (axis,))
    L = x.shape[-1]
    if L == 0:
        raise ValueError("argmax of an empty axis")
    out = _empty(x.shape[:-1], int64, x.device)
    native.argmax_lastdim(x.device, _CODE[x.dtype], out.ptr, x.ptr, x.size // L, L)
    return out
