"""The CUDA backend: the primitive op set of `cpu.py`, over `CudaArray`s in GPU memory.

Every function here has the signature and meaning of its namesake in `cpu.py` (the reference).
The work is done by engine._C (csrc/cuda/): kernels queued on one stream per device, memory from a
caching allocator. Nothing here waits for the GPU except `to_numpy` (and what calls it).

A `CudaArray` is always C-contiguous: reshape and leading-axis slices are views sharing the
buffer (as numpy's are); permute, broadcast_to and general slicing copy through one strided-copy
kernel. Shapes, strides and broadcasting are worked out here in Python, with small caches, so the
C++ side stays a thin layer of kernel launches.
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from .. import cuda as _api
from ..dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64, uint8

_C = _api._C
name = "cuda"

_CODE = {float32: 0, float64: 1, float16: 2, bfloat16: 3, int64: 4, int32: 5, uint8: 6, bool_: 7}
_BY_CODE = {v: k for k, v in _CODE.items()}
_NUMPY_TO_DTYPE = {d.numpy: d for d in _CODE if d.numpy is not None}
_HOST_NUMPY = {d: (d.numpy if d.numpy is not None else np.dtype(np.uint16)) for d in _CODE}  # bf16 as bits


class CudaArray:
    """A contiguous n-d array in GPU memory: `buf` (an engine._C.DeviceBuffer, kept alive here),
    `ptr` (address of element 0), `shape`, `dtype` (engine DType) and `device` (index)."""

    __slots__ = ("buf", "ptr", "shape", "dtype", "device", "size")

    def __init__(self, buf, ptr: int, shape: tuple, dtype: DType, device: int):
        self.buf = buf
        self.ptr = ptr
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.size = math.prod(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype.name}, device='cuda:{self.device}')"

    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        return to_dlpack(self, stream, max_version=max_version)

    def __dlpack_device__(self):
        return (2, self.device)


Array = CudaArray


def _empty(shape: tuple, dtype: DType, device: int) -> CudaArray:
    shape = tuple(shape)
    buf = _C.DeviceBuffer(math.prod(shape) * dtype.itemsize, device)
    return CudaArray(buf, buf.ptr, shape, dtype, device)


def _device(device_index) -> int:
    return _api.current_device() if device_index is None else int(device_index)


def _view(x: CudaArray, shape: tuple, byte_offset: int = 0) -> CudaArray:
    return CudaArray(x.buf, x.ptr + byte_offset, tuple(shape), x.dtype, x.device)


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


def _same_device(op: str, *arrays) -> int:
    dev = None
    for a in arrays:
        if isinstance(a, CudaArray):
            if dev is None:
                dev = a.device
            elif a.device != dev:
                where = ", ".join(f"cuda:{x.device}" for x in arrays if isinstance(x, CudaArray))
                raise RuntimeError(f"{op}: arrays on different devices ({where}); move them to one device first")
    return dev


def _check_float32(op: str, *arrays) -> None:
    for a in arrays:
        if a is not None and a.dtype is not float32:
            raise TypeError(f"cuda backend: {op} supports float32, got {a.dtype.name}; convert with .float()")


# ---- transfer, creation, dtypes ---------------------------------------------------------------

def from_numpy(a: np.ndarray, device_index=None) -> CudaArray:
    """A device array holding a copy of `a`."""
    a = np.asarray(a)
    dtype = _NUMPY_TO_DTYPE.get(a.dtype)
    if dtype is None:
        from ..dtypes import from_numpy as engine_dtype

        dtype = engine_dtype(a.dtype)
        a = a.astype(dtype.numpy)
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    dev = _device(device_index)
    out = _empty(a.shape, dtype, dev)
    if out.size:
        _C.copy_from_host(out.ptr, a.reshape(-1).view(np.uint8), out.nbytes, dev)
    return out


def to_numpy(x: CudaArray) -> np.ndarray:
    """A host copy (waits for the GPU: a sync point, like torch's .cpu())."""
    out = np.empty(x.shape, dtype=_HOST_NUMPY[x.dtype])
    if x.size:
        _C.copy_to_host(out.reshape(-1).view(np.uint8), x.ptr, x.nbytes, x.device)
    return out


def dtype_of(x: CudaArray) -> DType:
    return x.dtype


def full(shape: tuple, value, dtype: DType, device_index=None) -> CudaArray:
    out = _empty(tuple(shape), dtype, _device(device_index))
    _C.fill(out.device, _CODE[dtype], out.ptr, float(value), out.size)
    return out


def arange(start, stop, step, dtype: DType, device_index=None) -> CudaArray:
    n = builtins.max(0, math.ceil((stop - start) / step))
    out = _empty((n,), dtype, _device(device_index))
    _C.arange(out.device, _CODE[dtype], out.ptr, float(start), float(step), n)
    return out


def astype(x: CudaArray, dtype: DType) -> CudaArray:
    if x.dtype is dtype:
        return x
    out = _empty(x.shape, dtype, x.device)
    _C.astype(x.device, _CODE[x.dtype], _CODE[dtype], out.ptr, x.ptr, x.size)
    return out


def copy_(dst: CudaArray, src: CudaArray) -> None:
    """dst[...] = src (same shape, or broadcastable to it; converted to dst's dtype)."""
    _same_device("copy_", dst, src)
    if src.dtype is not dst.dtype:
        src = astype(src, dst.dtype)
    if src.shape != dst.shape:
        src = broadcast_to(src, dst.shape)
    if dst.ptr != src.ptr and dst.size:
        _C.copy_device(dst.ptr, src.ptr, dst.nbytes, dst.device)


def contiguous(x: CudaArray) -> CudaArray:
    return x  # always contiguous


def dropout_mask(shape: tuple, p: float, seed: int, dtype: DType, device_index=None) -> CudaArray:
    """Inverted-dropout multiplier: 0 with probability p, else 1/(1-p); Philox, reproducible from `seed`."""
    if dtype is bfloat16:  # drawn in float32 (the same mask), stored as bf16
        return astype(dropout_mask(shape, p, seed, float32, device_index), bfloat16)
    out = _empty(tuple(shape), dtype, _device(device_index))
    _C.dropout_mask(out.device, _CODE[dtype], out.ptr, out.size, float(p), int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


def random_normal(shape: tuple, seed: int, device_index=None) -> CudaArray:
    """float32 standard normal numbers drawn on the device (Philox + Box-Muller). Not in cpu.py's set."""
    out = _empty(tuple(shape), float32, _device(device_index))
    _C.random_normal(out.device, out.ptr, out.size, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


def random_uniform(shape: tuple, seed: int, device_index=None) -> CudaArray:
    """float32 numbers in [0, 1) drawn on the device. Not in cpu.py's set."""
    out = _empty(tuple(shape), float32, _device(device_index))
    _C.random_uniform(out.device, out.ptr, out.size, int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


# ---- elementwise ------------------------------------------------------------------------------

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
            _C.binary(dev, code, _CODE[dtype], out.ptr, a.ptr, b.ptr, 0.0, 0, [n], _FLAT1, n)
            return out
        out_shape, shape, strides = _binary_plan(a.shape, b.shape)
        out = _empty(out_shape, out_dtype, dev)
        _C.binary(dev, code, _CODE[dtype], out.ptr, a.ptr, b.ptr, 0.0, 0, shape, strides, out.size)
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
    _C.binary(x.device, code, _CODE[dtype], out.ptr, x.ptr, x.ptr, float(scalar), mode, [n], _FLAT1, n)
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
    _C.unary(x.device, _UNARY[op], _CODE[x.dtype], out.ptr, x.ptr, x.size)
    return out


def relu_backward(x: CudaArray, grad: CudaArray) -> CudaArray:
    out = _empty(x.shape, x.dtype, x.device)
    _C.act_backward(x.device, 8, _CODE[x.dtype], out.ptr, x.ptr, grad.ptr, x.size)
    return out


def gelu_backward(x: CudaArray, grad: CudaArray) -> CudaArray:
    out = _empty(x.shape, x.dtype, x.device)
    _C.act_backward(x.device, 9, _CODE[x.dtype], out.ptr, x.ptr, grad.ptr, x.size)
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
    _C.where(dev, _CODE[dtype], out.ptr, cond.ptr, a.ptr if a_arr else 0, b.ptr if b_arr else 0, sa, sb,
             not a_arr, not b_arr, shape, st, out.size)
    return out


# ---- reductions -------------------------------------------------------------------------------

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
            _C.copy_device(out.ptr, x.ptr, x.nbytes, x.device)
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
    _C.reduce(x.device, op, _CODE[x.dtype], out.ptr, x.ptr, outer, R, inner)
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
    _C.argmax_lastdim(x.device, _CODE[x.dtype], out.ptr, x.ptr, x.size // L, L)
    return out


# ---- movement ---------------------------------------------------------------------------------

def reshape(x: CudaArray, shape: tuple) -> CudaArray:
    shape = tuple(shape)
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        shape = tuple(x.size // known if n == -1 else n for n in shape) if known else shape
    if math.prod(shape) != x.size:
        raise ValueError(f"reshape: cannot reshape {x.shape} ({x.size} elements) into {shape}")
    return _view(x, shape)


def _strided_copy(dst: CudaArray, dst_offset: int, dst_strides, src: CudaArray, src_offset: int, src_strides,
                  shape: tuple) -> None:
    n = math.prod(shape)
    if n == 0:
        return
    cshape, cstr = _coalesce(tuple(shape), (tuple(dst_strides), tuple(src_strides)))
    isz = dst.dtype.itemsize
    _C.strided_copy(dst.device, isz, dst.ptr + dst_offset * isz, src.ptr + src_offset * isz, cshape, cstr, n)


def permute(x: CudaArray, dims: tuple) -> CudaArray:
    dims = tuple(dims)
    if dims == tuple(range(x.ndim)):
        return x
    out_shape = tuple(x.shape[d] for d in dims)
    cs = _contiguous_strides(x.shape)
    out = _empty(out_shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(out_shape), x, 0, [cs[d] for d in dims], out_shape)
    return out


def broadcast_to(x: CudaArray, shape: tuple) -> CudaArray:
    shape = tuple(shape)
    if shape == x.shape:
        return x
    if _broadcast_shape(x.shape, shape) != shape:
        raise ValueError(f"broadcast_to: cannot broadcast {x.shape} to {shape}")
    out = _empty(shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(shape), x, 0, _broadcast_strides(x.shape, shape), shape)
    return out


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


def getitem(x: CudaArray, index: tuple) -> CudaArray:
    """Basic indexing: a tuple of ints, slices, None and Ellipsis (a view when the result is contiguous)."""
    if not isinstance(index, tuple):
        index = (index,)
    out_shape, offset, strides = _index_view(x.shape, index)
    if _is_contiguous(out_shape, strides):
        return _view(x, out_shape, offset * x.dtype.itemsize)
    out = _empty(out_shape, x.dtype, x.device)
    _strided_copy(out, 0, _contiguous_strides(out_shape), x, offset, strides, out_shape)
    return out


def getitem_backward(grad: CudaArray, index: tuple, shape: tuple) -> CudaArray:
    """Zeros of `shape` with `grad` written at `index`."""
    if not isinstance(index, tuple):
        index = (index,)
    out = _empty(tuple(shape), grad.dtype, grad.device)
    _C.fill(out.device, _CODE[out.dtype], out.ptr, 0.0, out.size)
    view_shape, offset, strides = _index_view(tuple(shape), index)
    if view_shape != grad.shape:
        grad = broadcast_to(grad, view_shape)
    _strided_copy(out, offset, strides, grad, 0, _contiguous_strides(view_shape), view_shape)
    return out


def concat(xs: list, axis: int) -> CudaArray:
    first = xs[0]
    axis = axis % first.ndim
    dev = _same_device("concat", *xs)
    for x in xs:
        if x.dtype is not first.dtype:
            raise TypeError(f"concat: mixed dtypes {first.dtype.name} and {x.dtype.name}")
        if x.ndim != first.ndim or x.shape[:axis] != first.shape[:axis] or x.shape[axis + 1:] != first.shape[axis + 1:]:
            raise ValueError(f"concat: shapes {[x.shape for x in xs]} do not match except on axis {axis}")
    out_shape = first.shape[:axis] + (builtins.sum(x.shape[axis] for x in xs),) + first.shape[axis + 1:]
    out = _empty(out_shape, first.dtype, dev)
    ostr = _contiguous_strides(out_shape)
    start = 0
    for x in xs:
        if x.size:
            _strided_copy(out, start * ostr[axis], ostr, x, 0, _contiguous_strides(x.shape), x.shape)
        start += x.shape[axis]
    return out


# ---- matmul -----------------------------------------------------------------------------------

def matmul(a: CudaArray, b: CudaArray, transpose_a: bool = False, transpose_b: bool = False) -> CudaArray:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast; the flags transpose the last two dims.
    cuBLASLt; float32 uses TF32 tensor cores unless engine.cuda.set_allow_tf32(False)."""
    dev = _same_device("matmul", a, b)
    if a.dtype is not b.dtype:
        raise TypeError(f"matmul: dtypes {a.dtype.name} and {b.dtype.name} differ")
    if a.dtype not in (float32, float64, bfloat16):
        raise TypeError(f"cuda backend: matmul supports float32, float64 and bfloat16, got {a.dtype.name}")
    squeeze_m = squeeze_n = False
    if a.ndim == 1:
        a, squeeze_m, transpose_a = _view(a, (1, a.shape[0])), True, False
    if b.ndim == 1:
        b, squeeze_n, transpose_b = _view(b, (b.shape[0], 1)), True, False
    M, K = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    K2, N = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape}{'^T' if transpose_a else ''} and "
                         f"{b.shape}{'^T' if transpose_b else ''} do not fit (K = {K} vs {K2})")
    ab, bb = a.shape[:-2], b.shape[:-2]
    batch_shape = _broadcast_shape(ab, bb)
    out_shape = batch_shape + (M, N)
    out = _empty(out_shape, a.dtype, dev)
    code = _CODE[a.dtype]
    if math.prod(bb) == 1 and not transpose_a:
        # b has no batch: fold a's batch dims into rows, one GEMM
        rows = math.prod(ab) * M
        _C.matmul(dev, code, out.ptr, a.ptr, b.ptr, 1, rows, N, K, False, transpose_b, 0, 0, 0)
    else:
        if ab != batch_shape:
            a = broadcast_to(a if len(ab) == len(batch_shape) else _view(a, (1,) * (len(batch_shape) - len(ab)) + a.shape),
                             batch_shape + a.shape[-2:])
        if bb != batch_shape:
            b = broadcast_to(b if len(bb) == len(batch_shape) else _view(b, (1,) * (len(batch_shape) - len(bb)) + b.shape),
                             batch_shape + b.shape[-2:])
        batch = math.prod(batch_shape)
        _C.matmul(dev, code, out.ptr, a.ptr, b.ptr, batch, M, N, K, bool(transpose_a), bool(transpose_b),
                  M * K, K * N, M * N)
    if squeeze_m or squeeze_n:
        shape = out_shape[:-2] + (() if squeeze_m else (M,)) + (() if squeeze_n else (N,))
        out = _view(out, shape)
    return out


_EPI_BIAS, _EPI_GELU_BIAS, _EPI_BGRAD, _EPI_GELU = 1, 2, 3, 4


def linear(x: CudaArray, w: CudaArray, b, activation: str | None):
    """x (N, I) @ w (O, I)^T + b (O,) -> out (N, O), then the activation ("gelu" or None); returns
    (out, pre), pre the pre-activation (None without one). The bias runs in cuBLASLt's epilogue, and
    in bf16 the GELU too (writing pre beside out), so neither costs a pass over the output; where
    cuBLASLt offers no such epilogue the unfused ops run instead."""
    if activation not in (None, "gelu"):
        raise ValueError(f"linear: unknown activation {activation!r} (only 'gelu')")
    dev = _same_device("linear", x, w, *([b] if b is not None else []))
    if x.dtype is not w.dtype or (b is not None and b.dtype is not x.dtype):
        raise TypeError(f"linear: dtypes differ (x {x.dtype.name}, weight {w.dtype.name}"
                        f"{', bias ' + b.dtype.name if b is not None else ''}); convert first")
    (N, I), O = x.shape, w.shape[0]
    if activation is None and b is None:
        return matmul(x, w, transpose_b=True), None
    if activation is not None and x.dtype is bfloat16:
        # cuBLASLt's GELU (a fast tanh, ~5e-4 relative) is exact to bf16's rounding, not to float32's:
        # float32 takes the bias epilogue and engine's own GELU kernel
        out, pre = _empty((N, O), x.dtype, dev), _empty((N, O), x.dtype, dev)
        if _C.matmul_epilogue(dev, _CODE[x.dtype], _EPI_GELU_BIAS if b is not None else _EPI_GELU, out.ptr, x.ptr,
                              w.ptr, N, O, I, False, True, b.ptr if b is not None else 0, pre.ptr):
            return out, pre
    y = None
    if b is not None and x.dtype in (float32, bfloat16):
        y = _empty((N, O), x.dtype, dev)
        if not _C.matmul_epilogue(dev, _CODE[x.dtype], _EPI_BIAS, y.ptr, x.ptr, w.ptr, N, O, I, False, True, b.ptr, 0):
            y = None
    if y is None:
        y = matmul(x, w, transpose_b=True)
        if b is not None:
            y = binary("add", y, b)
    return (y, None) if activation is None else (unary("gelu", y), y)


def _bias_grad(g: CudaArray, pre=None, db_dtype: DType | None = None):
    """db (O,) = column sums of g (N, O), of db_dtype (None: g's; or float32); with pre, the GELU backward
    first, dpre = gelu'(pre) * g, in the same pass. -> (db, dpre or None), or (None, None) where the kernel
    does not apply (float64, a width not a multiple of 16 bytes, unaligned data)."""
    db_dtype = g.dtype if db_dtype is None else db_dtype
    if db_dtype not in (g.dtype, float32):
        return None, None
    db = _empty((g.shape[1],), db_dtype, g.device)
    dpre = _empty(pre.shape, pre.dtype, pre.device) if pre is not None else None
    if _C.linear_bias_grad(g.device, _CODE[g.dtype], db.ptr, dpre.ptr if dpre is not None else 0, g.ptr,
                           pre.ptr if pre is not None else 0, *g.shape, db_dtype=_CODE[db_dtype]):
        return db, dpre
    return None, None


def weight_grad(grad: CudaArray, x: CudaArray, dtype: DType) -> CudaArray:
    """dw (O, I) = grad (N, O)^T @ x (N, I) in `dtype`: x's, or float32 for bf16 x, which cuBLASLt writes
    from its float32 accumulator (no bf16 dw, no cast): the weight gradient of a float32 master weight
    under autocast."""
    if dtype is x.dtype:
        return matmul(grad, x, transpose_a=True)
    if not (x.dtype is bfloat16 and dtype is float32):
        return astype(matmul(grad, x, transpose_a=True), dtype)
    (N, O), I = grad.shape, x.shape[1]
    dw = _empty((O, I), dtype, x.device)
    _C.matmul(x.device, _CODE[x.dtype], dw.ptr, grad.ptr, x.ptr, 1, O, I, N, True, False, 0, 0, 0,
              out_dtype=_CODE[dtype])
    return dw


def linear_backward(grad: CudaArray, x: CudaArray, w: CudaArray, pre, activation: str | None, need: tuple,
                    param_dtype: DType | None = None):
    """grad (N, O) of linear's out -> dx (N, I), dw (O, I), db (O,); None where `need` (x, w, b) is
    False. dx is x's dtype; dw and db are param_dtype's (None: x's), float32 for bf16 x and w under
    autocast: the weight gradient's GEMM and the bias-gradient kernel write float32 themselves. The bias
    gradient is engine's column-sum kernel, which also runs the GELU backward in the same pass;
    cuBLASLt's BGRADB epilogue (a separate pass too) is the fallback where it does not apply."""
    if grad.dtype is not x.dtype:
        grad = astype(grad, x.dtype)
    pdt = x.dtype if param_dtype is None else param_dtype
    db, dpre = _bias_grad(grad, pre if activation is not None else None, pdt) if need[2] else (None, None)
    if activation is not None:
        grad = dpre if dpre is not None else gelu_backward(pre, grad)
    dx = matmul(grad, w) if need[0] else None
    dw = None
    if need[1] and need[2] and db is None and x.dtype in (float32, bfloat16) and pdt in (x.dtype, float32):
        (N, O), I = grad.shape, x.shape[1]
        dw, db = _empty((O, I), pdt, x.device), _empty((O,), pdt, x.device)  # the bias gradient of dw's dtype
        if not _C.matmul_epilogue(x.device, _CODE[x.dtype], _EPI_BGRAD, dw.ptr, grad.ptr, x.ptr, O, I, N, True, False,
                                  db.ptr, 0, out_dtype=_CODE[pdt]):
            dw = db = None
    if need[1] and dw is None:
        dw = weight_grad(grad, x, pdt)
    if need[2] and db is None:
        db = astype(sum(grad, (0,), False), pdt)
    return dx, dw, db


# ---- normalisation, softmax, losses -----------------------------------------------------------

def layer_norm(x: CudaArray, weight, bias, eps: float):
    """x (..., C) -> out (..., C), mean (...,), rstd (...,); weight, bias (C,) or None."""
    _check_float32("layer_norm", weight, bias)
    if x.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: layer_norm supports float32 and bfloat16 inputs, got {x.dtype.name}")
    C = x.shape[-1]
    N = x.size // C if C else 0
    out = _empty(x.shape, x.dtype, x.device)  # bf16 in, bf16 out; statistics and weights in float32
    mean = _empty(x.shape[:-1], float32, x.device)
    rstd = _empty(x.shape[:-1], float32, x.device)
    _C.layernorm_forward_dt(x.device, _CODE[x.dtype], out.ptr, mean.ptr, rstd.ptr, x.ptr,
                            weight.ptr if weight is not None else 0, bias.ptr if bias is not None else 0, N, C,
                            float(eps))
    return out, mean, rstd


def add_layer_norm(x: CudaArray, residual: CudaArray, weight, bias, eps: float):
    """s = x + residual (..., C) and layer_norm(s) -> s, out, mean, rstd, in one kernel (the sum rounded
    to x's dtype before the statistics, as the two ops would); inputs of two dtypes or shapes take the
    add and the layer norm."""
    _check_float32("layer_norm", weight, bias)
    if x.dtype in (float32, bfloat16) and residual.dtype is x.dtype and residual.shape == x.shape:
        C = x.shape[-1]
        N = x.size // C if C else 0
        s, out = _empty(x.shape, x.dtype, x.device), _empty(x.shape, x.dtype, x.device)
        mean, rstd = _empty(x.shape[:-1], float32, x.device), _empty(x.shape[:-1], float32, x.device)
        _C.layernorm_add_forward_dt(x.device, _CODE[x.dtype], out.ptr, s.ptr, mean.ptr, rstd.ptr, x.ptr, residual.ptr,
                                    weight.ptr if weight is not None else 0, bias.ptr if bias is not None else 0, N, C,
                                    float(eps))
        return s, out, mean, rstd
    s = binary("add", x, residual)
    return (s,) + layer_norm(s, weight, bias, eps)


def layer_norm_backward(grad: CudaArray, x: CudaArray, weight, mean: CudaArray, rstd: CudaArray,
                        need_weight_grads: bool = True, residual_grad=None):
    """grad (..., C) -> dx (..., C), dweight (C,) or None, dbias (C,) or None. With residual_grad (..., C),
    dx + residual_grad (x is a residual stream that also went on unnormalised), added inside the kernel."""
    _check_float32("layer_norm_backward", weight)
    if grad.dtype is not x.dtype:
        grad = astype(grad, x.dtype)
    C = x.shape[-1]
    N = x.size // C if C else 0
    dx = _empty(x.shape, x.dtype, x.device)
    dweight = dbias = None
    if need_weight_grads:
        dweight = _empty((C,), float32, x.device) if weight is not None else None
        dbias = _empty((C,), float32, x.device)
    res = None
    if residual_grad is not None:  # (..., C) as x
        res = residual_grad if residual_grad.dtype is x.dtype else astype(residual_grad, x.dtype)
    _C.layernorm_backward_dt(x.device, _CODE[x.dtype], dx.ptr, dweight.ptr if dweight is not None else 0,
                             dbias.ptr if dbias is not None else 0, grad.ptr, x.ptr,
                             weight.ptr if weight is not None else 0, mean.ptr, rstd.ptr, N, C,
                             res.ptr if res is not None else 0)
    return dx, dweight, dbias


def _softmax(x: CudaArray, log: bool) -> CudaArray:
    if x.dtype is bfloat16:  # statistics in float32
        return astype(_softmax(astype(x, float32), log), bfloat16)
    _check_float32("log_softmax" if log else "softmax", x)
    L = x.shape[-1] if x.ndim else 1
    out = _empty(x.shape, float32, x.device)
    _C.softmax_forward(x.device, out.ptr, x.ptr, x.size // L if L else 0, L, log)
    return out


def _softmax_backward(out: CudaArray, grad: CudaArray, log: bool) -> CudaArray:
    if out.dtype is bfloat16:
        return astype(_softmax_backward(astype(out, float32), astype(grad, float32), log), bfloat16)
    _check_float32("softmax_backward", out, grad)
    L = out.shape[-1] if out.ndim else 1
    dx = _empty(out.shape, float32, out.device)
    _C.softmax_backward(out.device, dx.ptr, out.ptr, grad.ptr, out.size // L if L else 0, L, log)
    return dx


def softmax(x: CudaArray) -> CudaArray:
    """Softmax over the last axis."""
    return _softmax(x, False)


def softmax_backward(out: CudaArray, grad: CudaArray) -> CudaArray:
    return _softmax_backward(out, grad, False)


def log_softmax(x: CudaArray) -> CudaArray:
    return _softmax(x, True)


def log_softmax_backward(out: CudaArray, grad: CudaArray) -> CudaArray:
    return _softmax_backward(out, grad, True)


def cross_entropy(logits: CudaArray, targets: CudaArray, ignore_index: int):
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored), lse (N,).
    An out-of-range target gives a NaN loss (checking would need a host sync)."""
    if logits.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: cross_entropy supports float32 and bfloat16 logits, got {logits.dtype.name}")
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    losses = _empty((N,), float32, logits.device)  # float32 losses and statistics, also for bf16 logits
    lse = _empty((N,), float32, logits.device)
    _C.cross_entropy_forward_dt(logits.device, _CODE[logits.dtype], losses.ptr, lse.ptr, logits.ptr, targets.ptr, N, V,
                                int(ignore_index))
    return losses, lse


def cross_entropy_backward(logits: CudaArray, targets: CudaArray, lse: CudaArray, grad: CudaArray,
                           ignore_index: int) -> CudaArray:
    """grad (N,) -> dlogits (N, V) = (softmax - onehot) * grad (0 where ignored)."""
    _check_float32("cross_entropy_backward", grad)
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    d = _empty((N, V), logits.dtype, logits.device)  # the logits' dtype (bf16 under autocast)
    _C.cross_entropy_backward_dt(logits.device, _CODE[logits.dtype], d.ptr, logits.ptr, targets.ptr, lse.ptr,
                                 grad.ptr, N, V, int(ignore_index))
    return d


def cross_entropy_with_grad_(logits: CudaArray, targets: CudaArray, ignore_index: int) -> CudaArray:
    """logits (N, V), targets (N,) int64 -> losses (N,) float32 (0 where ignored); the logits are
    overwritten in place by softmax - onehot(target), the gradient of sum(losses) (0 on ignored rows).
    One kernel (the fused classifier's). An out-of-range target gives a NaN loss."""
    if logits.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: cross_entropy_with_grad_ supports float32 and bfloat16 logits, "
                        f"got {logits.dtype.name}")
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    losses = _empty((N,), float32, logits.device)
    _C.cross_entropy_with_grad_dt(logits.device, _CODE[logits.dtype], losses.ptr, logits.ptr, targets.ptr, N, V,
                                  int(ignore_index))
    return losses


def scale(x: CudaArray, factor: CudaArray) -> CudaArray:
    """x * factor, factor a 0-d array on the device (no host sync): float32 arithmetic, x's dtype
    (float32 or bfloat16) out. The binary ops want one dtype; this is bf16 times a float32 scalar."""
    _same_device("scale", x, factor)
    if x.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: scale supports float32 and bfloat16 arrays, got {x.dtype.name}")
    if factor.dtype is not float32:
        factor = astype(factor, float32)
    out = _empty(x.shape, x.dtype, x.device)
    _C.scale_dt(x.device, _CODE[x.dtype], out.ptr, x.ptr, factor.ptr, x.size)
    return out


def embedding(weight: CudaArray, idx: CudaArray) -> CudaArray:
    """weight (V, C), idx (...) int64 -> (..., C). An out-of-range index gives a NaN row."""
    _same_device("embedding", weight, idx)
    if idx.dtype is not int64:
        idx = astype(idx, int64)
    V, C = weight.shape
    out = _empty(idx.shape + (C,), weight.dtype, weight.device)
    _C.embedding_forward(weight.device, _CODE[weight.dtype], out.ptr, weight.ptr, idx.ptr, idx.size, V, C)
    return out


def embedding_backward(grad: CudaArray, idx: CudaArray, num_embeddings: int) -> CudaArray:
    """grad (..., C) -> dweight (V, C), rows scatter-added."""
    if grad.dtype is bfloat16:
        grad = astype(grad, float32)
    _check_float32("embedding_backward", grad)
    if idx.dtype is not int64:
        idx = astype(idx, int64)
    C = grad.shape[-1]
    out = _empty((num_embeddings, C), float32, grad.device)
    _C.embedding_backward(grad.device, out.ptr, grad.ptr, idx.ptr, idx.size, num_embeddings, C)
    return out


# ---- optimizers (in place, over lists of arrays) ------------------------------------------------

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
    _C.adamw(dev, [p.ptr for p in params], [g.ptr for g in grads], [m.ptr for m in exp_avgs],
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
    _C.sgd(dev, [p.ptr for p in params], [g.ptr for g in grads], bufs, [p.size for p in params], float(lr),
           float(momentum), float(dampening), bool(nesterov), float(weight_decay), bool(first_step))


def sum_of_squares(xs: list) -> CudaArray:
    """sum over all arrays of sum(x^2), as a 0-d float32 array on the device (no host sync)."""
    dev = _same_device("sum_of_squares", *xs) if xs else _api.current_device()
    xs = [astype(x, float32) for x in xs]
    out = _empty((), float32, dev)
    _C.sum_of_squares(dev, out.ptr, [x.ptr for x in xs], [x.size for x in xs])
    return out


def scale_(xs: list, factor: CudaArray) -> None:
    """x *= factor for every array, factor a 0-d array on the same device."""
    if not xs:
        return
    dev = _same_device("scale_", *xs, factor)
    _check_float32("scale_", *xs)
    if factor.dtype is not float32:
        factor = astype(factor, float32)
    _C.scale_multi(dev, [x.ptr for x in xs], [x.size for x in xs], factor.ptr)


# ---- DLPack -----------------------------------------------------------------------------------

def to_dlpack(x: CudaArray, stream=None, max_version=None):
    """A DLPack capsule sharing `x`'s memory; `stream` (the consumer's) is made to wait for our work."""
    versioned = max_version is not None and tuple(max_version) >= (1, 0)
    return _C.to_dlpack(x.buf, x.ptr, list(x.shape), _CODE[x.dtype], stream, versioned)


def from_dlpack(obj) -> CudaArray:
    """A CudaArray sharing the memory of a CUDA DLPack producer (torch tensor, CuPy array, capsule).
    Non-contiguous producers are copied into a contiguous array."""
    if hasattr(obj, "__dlpack__"):
        kind, index = obj.__dlpack_device__()
        if int(kind) != 2:
            raise ValueError(f"from_dlpack: the object is on DLPack device type {int(kind)}, not CUDA (2)")
        stream = _C.stream_handle(int(index))
        try:
            cap = obj.__dlpack__(stream=stream, max_version=(1, 0))
        except TypeError:
            cap = obj.__dlpack__(stream=stream)
    else:
        cap = obj  # a capsule
    buf, shape, strides, code, device = _C.from_dlpack_capsule(cap)
    shape = tuple(shape)
    dtype = _BY_CODE[code]
    arr = CudaArray(buf, buf.ptr, shape, dtype, device)
    if _is_contiguous(shape, strides) or arr.size == 0:
        return arr
    out = _empty(shape, dtype, device)
    _strided_copy(out, 0, _contiguous_strides(shape), arr, 0, strides, shape)
    return out


def synchronize(device_index=None) -> None:
    _C.synchronize(_device(device_index))


# the attention primitives live in their own module (cuda_attention.py), which uses the helpers above;
# imported last, so that those exist when it imports them
from .cuda_attention import (attention, attention_backward, attention_dropout_mask,  # noqa: E402,F401
                             attention_qkv, attention_qkv_backward)
