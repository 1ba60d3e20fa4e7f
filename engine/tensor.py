"""Tensor: an n-dimensional array on a device, with reverse-mode autograd.

A Tensor wraps a raw backend array (`.data`: a numpy array on the CPU, a device array on CUDA).
Every op goes through one `Function` in `engine/ops/`, which calls the device's backend."""
from __future__ import annotations

import numpy as np

from . import autograd, dtypes
from .device import Device, as_device
from .dtypes import DType
from .backends import backend_for
from .ops import elementwise as E, movement as M, reduce as R
from .ops.matmul import MatMul

_SCALARS = (int, float, bool, np.integer, np.floating, np.bool_)


class Tensor:
    __array_priority__ = 1000  # numpy scalars on the left defer to our reflected operators

    def __init__(self, data, dtype=None, device=None, requires_grad: bool = False):
        t = tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)
        self.__dict__.update(t.__dict__)

    @classmethod
    def _wrap(cls, raw, device: Device, requires_grad: bool = False) -> "Tensor":
        t = cls.__new__(cls)
        t.data = raw
        t.device = device
        t.requires_grad = requires_grad
        t.grad = None
        t._ctx = None
        t._retains_grad = False
        return t

    # ---- basic properties -----------------------------------------------------------------------

    @property
    def _backend(self):
        return backend_for(self.device)

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> DType:
        return self._backend.dtype_of(self.data)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        dev = "" if self.device.type == "cpu" else f", device='{self.device}'"
        return f"tensor({np.array2string(self.numpy(), precision=4, separator=', ')}{dev}, dtype={self.dtype}{grad})"

    # ---- autograd -------------------------------------------------------------------------------

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        autograd.backward(self, gradient, retain_graph)

    def detach(self) -> "Tensor":
        return Tensor._wrap(self.data, self.device, False)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if requires_grad and not self.dtype.is_floating_point:
            raise TypeError(f"only floating-point tensors can require grad, this one is {self.dtype}")
        self.requires_grad = requires_grad
        return self

    def retain_grad(self) -> None:
        self._retains_grad = True

    def _accumulate_grad(self, raw) -> None:
        be = self._backend
        if self.grad is None:
            # own, contiguous, writeable memory: optimizers and clipping update grads in place
            self.grad = Tensor._wrap(be.contiguous(be.astype(raw, self.dtype)) if raw is not self.data else raw, self.device)
            if self.device.type == "cpu" and not self.grad.data.flags.writeable:
                self.grad.data = self.grad.data.copy()
        else:
            self.grad = Tensor._wrap(be.binary("add", self.grad.data, raw), self.device)

    # ---- conversion -----------------------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        return np.asarray(self._backend.to_numpy(self.data))

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item() needs a one-element tensor, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self):
        return self.numpy().tolist()

    def to(self, device=None, dtype=None) -> "Tensor":
        """`t.to("cuda")`, `t.to("cpu")`, `t.to(engine.float32)`, or both."""
        if isinstance(device, DType) or (isinstance(device, str) and device in dtypes._BY_NAME):
            device, dtype = None, device
        out = self
        if dtype is not None:
            out = out.type(dtypes.as_dtype(dtype))
        if device is not None:
            target = as_device(device)
            if target != out.device:
                out = _ToDevice.apply(out, target=target)
        return out

    def cuda(self, index: int = 0) -> "Tensor":
        return self.to(Device("cuda", index))

    def cpu(self) -> "Tensor":
        return self.to("cpu")

    def type(self, dtype: DType) -> "Tensor":
        dtype = dtypes.as_dtype(dtype)
        if dtype == self.dtype:
            return self
        return _Cast.apply(self, dtype=dtype)

    def float(self) -> "Tensor":
        return self.type(dtypes.float32)

    def double(self) -> "Tensor":
        return self.type(dtypes.float64)

    def long(self) -> "Tensor":
        return self.type(dtypes.int64)

    def bool(self) -> "Tensor":
        return self.type(dtypes.bool_)

    def contiguous(self) -> "Tensor":
        return self

    def clone(self) -> "Tensor":
        if self.dtype.is_floating_point:
            return self + 0.0
        return Tensor._wrap(self._backend.binary("add", self.data, 0), self.device)

    # DLPack: zero-copy exchange with other libraries (torch.from_dlpack(t))
    def __dlpack__(self, stream=None, max_version=None, **kwargs):
        if self.device.type == "cpu":
            extra = {"max_version": max_version} if max_version is not None else {}
            return np.ascontiguousarray(self.data).__dlpack__(**({"stream": stream} if stream is not None else {}), **extra)
        return self._backend.to_dlpack(self.data, stream, max_version=max_version)

    def __dlpack_device__(self):
        if self.device.type == "cpu":
            return (1, 0)
        return (2, self.device.index)

    # ---- arithmetic -----------------------------------------------------------------------------

    def _binary(self, fn, other, reverse: bool = False):
        if isinstance(other, Tensor):
            a, b = _promote(self, other, fn)
            try:
                np.broadcast_shapes(a.shape, b.shape)
            except ValueError:
                raise ValueError(f"{fn.__name__.lower()}: shapes {a.shape} and {b.shape} do not broadcast "
                                 "(trailing dims must be equal or 1)") from None
        elif isinstance(other, _SCALARS):
            a = self
            b = other.item() if isinstance(other, np.generic) else other
            if isinstance(b, float) and not a.dtype.is_floating_point:
                a = a.float()
            if isinstance(b, bool):
                b = int(b)
        elif isinstance(other, np.ndarray):
            return self._binary(fn, tensor(other, device=self.device, dtype=self.dtype if other.dtype.kind == "f" else None), reverse)
        else:
            return NotImplemented
        return fn.apply(b, a) if reverse else fn.apply(a, b)

    def __add__(self, o): return self._binary(E.Add, o)
    def __radd__(self, o): return self._binary(E.Add, o, True)
    def __sub__(self, o): return self._binary(E.Sub, o)
    def __rsub__(self, o): return self._binary(E.Sub, o, True)
    def __mul__(self, o): return self._binary(E.Mul, o)
    def __rmul__(self, o): return self._binary(E.Mul, o, True)
    def __truediv__(self, o): return self._binary(E.Div, o)
    def __rtruediv__(self, o): return self._binary(E.Div, o, True)
    def __pow__(self, o): return self._binary(E.Pow, o)
    def __rpow__(self, o): return self._binary(E.Pow, o, True)
    def __neg__(self): return E.Neg.apply(self)
    def __matmul__(self, o): return matmul(self, o)

    def _compare(self, other, op):
        if isinstance(other, Tensor):
            a, b = _promote(self, other, op)
        else:
            a, b = self, other
        return E.Compare.apply(a, b, op=op)

    def __eq__(self, o): return self._compare(o, "eq")
    def __ne__(self, o): return self._compare(o, "ne")
    def __lt__(self, o): return self._compare(o, "lt")
    def __le__(self, o): return self._compare(o, "le")
    def __gt__(self, o): return self._compare(o, "gt")
    def __ge__(self, o): return self._compare(o, "ge")
    __hash__ = object.__hash__

    def __invert__(self):
        if self.dtype != dtypes.bool_:
            raise TypeError(f"~ needs a bool tensor, got {self.dtype}")
        return self._compare(0, "eq")

    def __bool__(self):
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    # in-place arithmetic without autograd, for optimizers and hand-written updates
    def add_(self, other, alpha: float = 1.0) -> "Tensor":
        return self.copy_(self.detach() + (other.detach() if isinstance(other, Tensor) else other) * alpha)

    def mul_(self, other) -> "Tensor":
        return self.copy_(self.detach() * (other.detach() if isinstance(other, Tensor) else other))

    def zero_(self) -> "Tensor":
        return self.fill_(0)

    def fill_(self, value) -> "Tensor":
        self._backend.copy_(self.data, self._backend.full(self.shape, value, self.dtype, self.device.index))
        return self

    def copy_(self, src) -> "Tensor":
        """Overwrite this tensor's values with `src`'s (same shape; copied across devices)."""
        if autograd.is_grad_enabled() and self.requires_grad and self.is_leaf:
            raise RuntimeError("copy_ into a leaf that requires grad; wrap the update in engine.no_grad()")
        src = src if isinstance(src, Tensor) else tensor(src, dtype=self.dtype)
        if src.shape != self.shape:
            raise ValueError(f"copy_: shape {src.shape} does not match destination shape {self.shape}")
        src = src.to(self.device).type(self.dtype)
        self._backend.copy_(self.data, src.data)
        return self

    # ---- math methods ---------------------------------------------------------------------------

    def exp(self): return E.Exp.apply(self)
    def log(self): return E.Log.apply(self)
    def abs(self): return E.Abs.apply(self)
    def sqrt(self): return E.Sqrt.apply(self)
    def rsqrt(self): return 1.0 / E.Sqrt.apply(self)
    def tanh(self): return E.Tanh.apply(self)
    def sigmoid(self): return E.Sigmoid.apply(self)
    def relu(self): return E.Relu.apply(self)
    def neg(self): return E.Neg.apply(self)
    def pow(self, p): return self ** p
    def maximum(self, other): return self._binary(E.Maximum, other)
    def clamp_min(self, v): return self._binary(E.Maximum, v)

    def sign(self):
        return Tensor._wrap(self._backend.unary("sign", self.data), self.device)

    def sum(self, dim=None, keepdim: bool = False):
        return R.Sum.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        axes = _axes(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        return self.sum(axes, keepdim) * (1.0 / max(count, 1))

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        axes = _axes(dim, self.ndim)
        count = int(np.prod([self.shape[a] for a in axes], dtype=np.int64))
        centered = self - self.mean(axes, keepdim=True)
        return (centered * centered).sum(axes, keepdim) * (1.0 / max(count - int(unbiased), 1))

    def max(self, dim=None, keepdim: bool = False):
        return R.Max.apply(self, axes=_axes(dim, self.ndim), keepdim=keepdim)

    def amax(self, dim=None, keepdim: bool = False):
        return self.max(dim, keepdim)

    def min(self, dim=None, keepdim: bool = False):
        return -((-self).max(dim, keepdim))

    def argmax(self, dim: int = -1):
        return Tensor._wrap(self._backend.argmax(self.data, dim % self.ndim), self.device)

    def softmax(self, dim: int = -1):
        from .nn import functional as F
        return F.softmax(self, dim)

    def log_softmax(self, dim: int = -1):
        from .nn import functional as F
        return F.log_softmax(self, dim)

    def masked_fill(self, mask: "Tensor", value: float):
        return where(mask, value, self)

    # ---- shape ----------------------------------------------------------------------------------

    def reshape(self, *shape):
        shape = _shape_arg(shape)
        shape = _infer_shape(shape, self.numel(), self.shape)
        if shape == self.shape:
            return self
        return M.Reshape.apply(self, shape=shape)

    view = reshape

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        s = self.shape
        if not s:
            return self.reshape(1)
        start, end = start_dim % len(s), end_dim % len(s)
        return self.reshape(s[:start] + (-1,) + s[end + 1:])

    def permute(self, *dims):
        dims = tuple(d % self.ndim for d in _shape_arg(dims))
        if sorted(dims) != list(range(self.ndim)):
            raise ValueError(f"permute: {dims} is not a permutation of the {self.ndim} dims of shape {self.shape}")
        if dims == tuple(range(self.ndim)):
            return self
        return M.Permute.apply(self, dims=dims)

    def transpose(self, dim0: int, dim1: int):
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return self.permute(*dims)

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def unsqueeze(self, dim: int):
        dim = dim % (self.ndim + 1)
        return self.reshape(self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim=None):
        if dim is None:
            return self.reshape(tuple(n for n in self.shape if n != 1))
        dim = dim % self.ndim
        if self.shape[dim] != 1:
            return self
        return self.reshape(self.shape[:dim] + self.shape[dim + 1:])

    def expand(self, *shape):
        shape = _shape_arg(shape)
        lead = len(shape) - self.ndim
        shape = tuple(self.shape[i - lead] if n == -1 else n for i, n in enumerate(shape))
        if shape == self.shape:
            return self
        return M.Expand.apply(self, shape=shape)

    def split(self, split_size, dim: int = 0):
        dim = dim % self.ndim
        n = self.shape[dim]
        if isinstance(split_size, int):
            sizes = [min(split_size, n - s) for s in range(0, n, split_size)]
        else:
            sizes = list(split_size)
            if sum(sizes) != n:
                raise ValueError(f"split: sizes {sizes} add up to {sum(sizes)}, but dim {dim} has size {n}")
        out, start = [], 0
        for size in sizes:
            index = (slice(None),) * dim + (slice(start, start + size),)
            out.append(self[index])
            start += size
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0):
        n = self.shape[dim % self.ndim]
        return self.split(-(-n // chunks), dim)

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        for i in index:
            if not (i is None or i is Ellipsis or isinstance(i, (int, slice, np.integer))):
                raise TypeError(
                    f"indexing with {type(i).__name__} is not supported: use ints, slices, None and ..., "
                    "or F.embedding / gather-style ops for index tensors"
                )
        index = tuple(int(i) if isinstance(i, np.integer) else i for i in index)
        _check_index(index, self.shape)
        return M.GetItem.apply(self, index=index)


# ---- ops that need more than a method ------------------------------------------------------------

class _ToDevice(autograd.Function):
    def forward(self, x, target: Device):
        self.source = self.device
        dst = backend_for(target)
        out = dst.from_numpy(np.asarray(self.be.to_numpy(x)), target.index)
        self.device = target
        return out

    def backward(self, g):
        # g lives on the target device; send it back to where the input was
        return backend_for(self.source).from_numpy(np.asarray(backend_for(self.device).to_numpy(g)), self.source.index)

    @classmethod
    def apply(cls, x, target):
        ctx = cls()
        ctx.be, ctx.device = x._backend, x.device
        out = ctx.forward(x.data, target)
        requires_grad = autograd.is_grad_enabled() and x.requires_grad
        result = Tensor._wrap(out, target, requires_grad)
        if requires_grad:
            ctx.parents, ctx.needs_input_grad = (x,), (True,)
            result._ctx = ctx
        return result


class _Cast(autograd.Function):
    def forward(self, x, dtype: DType):
        self.in_dtype = self.be.dtype_of(x)
        return self.be.astype(x, dtype)

    def backward(self, g):
        if not self.in_dtype.is_floating_point:
            return None
        return self.be.astype(g, self.in_dtype)


_CATEGORY = {dtypes.bool_: 0, dtypes.uint8: 1, dtypes.int32: 1, dtypes.int64: 1,
             dtypes.float16: 2, dtypes.bfloat16: 2, dtypes.float32: 2, dtypes.float64: 2}


def _promote(a: Tensor, b: Tensor, what) -> tuple:
    """Mixed bool/int/float promote up to the higher category; two widths of one category are an error."""
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b
    ca, cb = _CATEGORY[da], _CATEGORY[db]
    if ca == cb:
        name = getattr(what, "__name__", what)
        raise TypeError(f"{str(name).lower()}: mixed dtypes {da} and {db}; convert one first, "
                        f"e.g. x.to(engine.{da.name}) or x.float()")
    return (a.type(db), b) if ca < cb else (a, b.type(da))


def _axes(dim, ndim: int) -> tuple:
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    for d in dims:
        if not -ndim <= d < max(ndim, 1):
            raise IndexError(f"dim {d} is out of range for a tensor with {ndim} dims")
    return tuple(sorted(d % max(ndim, 1) for d in dims))


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    return tuple(int(n) for n in shape)


def _infer_shape(shape: tuple, numel: int, old: tuple) -> tuple:
    if shape.count(-1) > 1:
        raise ValueError(f"reshape: only one dim can be -1, got {shape}")
    if -1 in shape:
        known = int(np.prod([n for n in shape if n != -1], dtype=np.int64))
        if known == 0 or numel % known:
            raise ValueError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
        shape = tuple(numel // known if n == -1 else n for n in shape)
    if int(np.prod(shape, dtype=np.int64)) != numel:
        raise ValueError(f"reshape: cannot reshape {old} ({numel} elements) into {shape}")
    return shape


def _check_index(index: tuple, shape: tuple) -> None:
    dim = 0
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > len(shape):
        raise IndexError(f"too many indices ({n_real}) for a tensor of shape {shape}")
    for i in index:
        if i is Ellipsis:
            dim += len(shape) - n_real
            continue
        if i is None:
            continue
        if isinstance(i, int) and not -shape[dim] <= i < shape[dim]:
            raise IndexError(f"index {i} is out of range for dim {dim} of size {shape[dim]} (shape {shape})")
        dim += 1


# ---- factories -----------------------------------------------------------------------------------

def _default_dtype_for(data, arr: np.ndarray) -> DType:
    if arr.dtype.kind == "f":  # numpy arrays keep their float width; Python floats become float32
        return dtypes.from_numpy(arr.dtype) if isinstance(data, np.ndarray) else dtypes.float32
    if arr.dtype.kind in "iu":
        return dtypes.int64
    if arr.dtype.kind == "b":
        return dtypes.bool_
    raise TypeError(f"cannot make a tensor from numpy dtype {arr.dtype}")


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """A new tensor from a Python number, nested list or numpy array (float32 by default for floats,
    int64 for integers); a Tensor is copied."""
    if isinstance(data, Tensor):
        return tensor(data.numpy(), dtype or data.dtype, device or data.device, requires_grad)
    arr = np.asarray(data)
    dtype = dtypes.as_dtype(dtype) or _default_dtype_for(data, arr)
    if dtype.numpy is None:
        raise TypeError(f"cannot build a {dtype} tensor from host data directly; build float32 and .to({dtype})")
    arr = arr.astype(dtype.numpy, copy=False)
    device = as_device(device)
    out = Tensor._wrap(backend_for(device).from_numpy(arr, device.index), device)
    if requires_grad:
        out.requires_grad_(True)
    return out


def from_numpy(arr: np.ndarray) -> Tensor:
    return tensor(arr, dtype=dtypes.from_numpy(arr.dtype))


def from_dlpack(obj) -> Tensor:
    """A tensor sharing memory with a DLPack-capable object (CPU: via numpy; CUDA: via the backend)."""
    kind, index = obj.__dlpack_device__()
    if int(kind) == 1:
        arr = np.from_dlpack(obj)
        return Tensor._wrap(arr, Device("cpu"))
    from .backends import cuda as cuda_backend

    return Tensor._wrap(cuda_backend.from_dlpack(obj), Device("cuda", int(index)))


def full(shape, value, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    shape = _shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,))
    dtype = dtypes.as_dtype(dtype) or (dtypes.float32 if isinstance(value, float) else dtypes.int64 if isinstance(value, int) and not isinstance(value, bool) else dtypes.bool_ if isinstance(value, bool) else dtypes.float32)
    device = as_device(device)
    out = Tensor._wrap(backend_for(device).full(shape, value, dtype, device.index), device)
    return out.requires_grad_(True) if requires_grad else out


def zeros(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 0.0, dtypes.as_dtype(dtype) or dtypes.float32, device, requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    return full(_shape_arg(shape), 1.0, dtypes.as_dtype(dtype) or dtypes.float32, device, requires_grad)


empty = zeros


def zeros_like(t: Tensor, dtype=None, device=None) -> Tensor:
    return zeros(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def ones_like(t: Tensor, dtype=None, device=None) -> Tensor:
    return ones(t.shape, dtype=dtype or t.dtype, device=device or t.device)


def full_like(t: Tensor, value, dtype=None, device=None) -> Tensor:
    return full(t.shape, value, dtype=dtype or t.dtype, device=device or t.device)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = dtypes.float32 if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.int64
    device = as_device(device)
    return Tensor._wrap(backend_for(device).arange(start, stop, step, dtypes.as_dtype(dtype), device.index), device)


def randn(*shape, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    from .random import default_generator

    gen = generator or default_generator()
    arr = gen.standard_normal(_shape_arg(shape), dtype=np.float32)
    return tensor(arr, dtype=dtype or dtypes.float32, device=device, requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad: bool = False, generator=None) -> Tensor:
    from .random import default_generator

    gen = generator or default_generator()
    arr = gen.random(_shape_arg(shape), dtype=np.float32)
    return tensor(arr, dtype=dtype or dtypes.float32, device=device, requires_grad=requires_grad)


def randint(low: int, high: int, size, device=None, generator=None) -> Tensor:
    from .random import default_generator

    gen = generator or default_generator()
    return tensor(gen.integers(low, high, size=tuple(size)), dtype=dtypes.int64, device=device)


# ---- functions over several tensors --------------------------------------------------------------

def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Batched matrix product with broadcast batch dims; 1-d operands as in numpy."""
    if a.dtype != b.dtype:
        a, b = _promote(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least one dim, got shapes {a.shape} and {b.shape}")
    squeeze_a, squeeze_b = a.ndim == 1, b.ndim == 1
    if squeeze_a:
        a = a.unsqueeze(0)
    if squeeze_b:
        b = b.unsqueeze(-1)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"matmul: shapes {a.shape} and {b.shape} do not fit: the last dim of the first ({a.shape[-1]}) "
            f"must equal the second-to-last dim of the second ({b.shape[-2]})"
        )
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: batch dims {a.shape[:-2]} and {b.shape[:-2]} do not broadcast") from None
    out = MatMul.apply(a, b)
    if squeeze_a:
        out = out.squeeze(-2)
    if squeeze_b:
        out = out.squeeze(-1)
    return out


def where(cond: Tensor, a, b) -> Tensor:
    """cond ? a : b, with broadcasting; a and b may be tensors or Python scalars."""
    if not isinstance(cond, Tensor) or cond.dtype != dtypes.bool_:
        raise TypeError(f"where: the condition must be a bool tensor, got {getattr(cond, 'dtype', type(cond))}")
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype != b.dtype:
        a, b = _promote(a, b, "where")
    return E.Where.apply(cond, a, b)


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: needs at least one tensor")
    ndim = tensors[0].ndim
    dim = dim % ndim
    for i, t in enumerate(tensors):
        if t.ndim != ndim or t.shape[:dim] + t.shape[dim + 1:] != tensors[0].shape[:dim] + tensors[0].shape[dim + 1:]:
            raise ValueError(f"cat: tensor {i} has shape {t.shape}, which does not match {tensors[0].shape} outside dim {dim}")
        if t.dtype != tensors[0].dtype:
            raise TypeError(f"cat: tensor {i} is {t.dtype}, tensor 0 is {tensors[0].dtype}")
    if len(tensors) == 1:
        return tensors[0]
    return M.Concat.apply(*tensors, axis=dim)


concat = cat


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    dim = dim % (tensors[0].ndim + 1)
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def split(t: Tensor, split_size, dim: int = 0):
    return t.split(split_size, dim)
