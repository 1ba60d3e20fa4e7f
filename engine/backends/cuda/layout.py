"""Shape and stride arithmetic of the CUDA backend, in Python with small caches: contiguous
strides, broadcasting, coalescing dims for the strided kernels, basic-index views."""
from __future__ import annotations

import builtins


def _contiguous_strides(shape: tuple) -> list:
    strides, s = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = s
        s *= shape[d]
    return strides


_coalesce_cache: dict = {}


def _coalesce(shape: tuple, strides: tuple) -> tuple:
    """Drop size-1 dims and merge neighbours that are contiguous in every operand.
    shape (n0, ...), strides ((s0, ...) per operand) -> (shape list, [strides list per operand])."""
    key = (shape, strides)
    hit = _coalesce_cache.get(key)
    if hit is not None:
        return hit
    nops = len(strides)
    out_shape: list = []
    out_strides: list = [[] for _ in range(nops)]
    for d, n in enumerate(shape):
        if n == 1:
            continue
        if out_shape and all(out_strides[k][-1] == strides[k][d] * n for k in range(nops)):
            out_shape[-1] *= n
            for k in range(nops):
                out_strides[k][-1] = strides[k][d]
        else:
            out_shape.append(n)
            for k in range(nops):
                out_strides[k].append(strides[k][d])
    if not out_shape:
        out_shape = [1]
        out_strides = [[0] for _ in range(nops)]
    result = (out_shape, out_strides)
    if len(_coalesce_cache) > 4096:
        _coalesce_cache.clear()
    _coalesce_cache[key] = result
    return result


_bshape_cache: dict = {}


def _broadcast_shape(*shapes) -> tuple:
    hit = _bshape_cache.get(shapes)
    if hit is not None:
        return hit
    ndim = builtins.max(len(s) for s in shapes)
    out = []
    for d in range(ndim):
        n = 1
        for s in shapes:
            i = d - (ndim - len(s))
            if i < 0:
                continue
            m = s[i]
            if m != 1:
                if n != 1 and n != m:
                    raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
                n = m
        out.append(n)
    out = tuple(out)
    if len(_bshape_cache) > 4096:
        _bshape_cache.clear()
    _bshape_cache[shapes] = out
    return out


def _broadcast_strides(shape: tuple, out_shape: tuple) -> tuple:
    """Element strides of a contiguous array of `shape` read as `out_shape` (0 on broadcast dims)."""
    lead = len(out_shape) - len(shape)
    cs = _contiguous_strides(shape)
    return tuple(0 if d < lead or shape[d - lead] == 1 else cs[d - lead] for d in range(len(out_shape)))


def _index_view(shape: tuple, index: tuple):
    """Basic indexing of a contiguous array: -> (out shape, element offset, element strides)."""
    n_real = 0
    for i in index:
        if i is not None and i is not Ellipsis:
            n_real += 1
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for an array of shape {shape}")
    cs = _contiguous_strides(shape)
    out_shape, out_strides, offset, d = [], [], 0, 0
    seen_ellipsis = False
    for i in index:
        if i is Ellipsis:
            if seen_ellipsis:
                raise IndexError("an index can only have a single ellipsis ('...')")
            seen_ellipsis = True
            for _ in range(len(shape) - n_real):
                out_shape.append(shape[d])
                out_strides.append(cs[d])
                d += 1
        elif i is None:
            out_shape.append(1)
            out_strides.append(0)
        elif isinstance(i, slice):
            start, stop, step = i.indices(shape[d])
            out_shape.append(len(range(start, stop, step)))
            out_strides.append(cs[d] * step)
            offset += start * cs[d]
            d += 1
        else:
            k = int(i)
            if not -shape[d] <= k < shape[d]:
                raise IndexError(f"index {k} is out of range for dim {d} of size {shape[d]}")
            offset += (k % shape[d]) * cs[d]
            d += 1
    while d < len(shape):
        out_shape.append(shape[d])
        out_strides.append(cs[d])
        d += 1
    return tuple(out_shape), offset, out_strides


def _is_contiguous(shape: tuple, strides) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True
