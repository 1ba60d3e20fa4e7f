"""Tensor's arithmetic: operators with broadcasting and Python scalars, comparisons, in-place updates
for optimizers, elementwise math (exp, log, ...), and the functions `where` and `matmul`."""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..ops import elementwise as E
from ..ops.matmul import MatMul
from ..tensor import Tensor, install_methods, tensor
from .conversion import _promote

_SCALARS = (int, float, bool, np.integer, np.floating, np.bool_)


@install_methods
class ArithmeticMethods:
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

    # in-place arithmetic without autograd, for optimizers and hand-written updates
    def add_(self, other, alpha: float = 1.0) -> "Tensor":
        return self.copy_(self.detach() + (other.detach() if isinstance(other, Tensor) else other) * alpha)

    def mul_(self, other) -> "Tensor":
        return self.copy_(self.detach() * (other.detach() if isinstance(other, Tensor) else other))

    def clone(self) -> "Tensor":
        if self.dtype.is_floating_point:
            return self + 0.0
        return Tensor._wrap(self._backend.binary("add", self.data, 0), self.device)

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

    def masked_fill(self, mask: "Tensor", value: float):
        return where(mask, value, self)


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
