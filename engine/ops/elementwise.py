"""Elementwise ops: arithmetic with broadcasting and scalars, activations, where.

Each class is one op: forward and backward side by side. In binary ops either side may be a
Python scalar; backward then returns a gradient only for the array side(s), in argument order.
"""
from __future__ import annotations

import math

from ..autograd import Function


def _is_array(x) -> bool:
    return not isinstance(x, (int, float, bool))


def unbroadcast(be, grad, shape: tuple):
    """Sum `grad` down to `shape`, undoing numpy-style broadcasting. (..., *shape') -> shape"""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    lead = len(grad.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape) if n == 1 and grad.shape[i + lead] != 1)
    if axes:
        grad = be.sum(grad, axes, True)
    return be.reshape(grad, shape)


class _Binary(Function):
    def forward(self, a, b):
        self.a, self.b = a, b
        self.a_shape = tuple(a.shape) if _is_array(a) else None
        self.b_shape = tuple(b.shape) if _is_array(b) else None
        return self.be.binary(self.op, a, b)

    def _grads(self, ga, gb):
        out = []
        if self.a_shape is not None:
            out.append(None if ga is None else unbroadcast(self.be, ga, self.a_shape))
        if self.b_shape is not None:
            out.append(None if gb is None else unbroadcast(self.be, gb, self.b_shape))
        return tuple(out)


class Add(_Binary):
    op = "add"

    def backward(self, g):
        return self._grads(g, g)


class Sub(_Binary):
    op = "sub"

    def backward(self, g):
        return self._grads(g, self.be.unary("neg", g))


class Mul(_Binary):
    op = "mul"

    def backward(self, g):
        be = self.be
        ga = be.binary("mul", g, self.b) if self.a_shape is not None else None
        gb = be.binary("mul", g, self.a) if self.b_shape is not None else None
        return self._grads(ga, gb)


class Div(_Binary):
    op = "div"

    def backward(self, g):
        be = self.be
        ga = be.binary("div", g, self.b) if self.a_shape is not None else None
        gb = None
        if self.b_shape is not None:  # d(a/b)/db = -a / b^2
            gb = be.unary("neg", be.binary("div", be.binary("mul", g, self.a), be.binary("mul", self.b, self.b)))
        return self._grads(ga, gb)


class Pow(_Binary):
    """a ** b; the exponent's gradient (b a^b log a) is taken only where b is a tensor."""
    op = "pow"

    def forward(self, a, b):
        self.out = super().forward(a, b)
        return self.out

    def backward(self, g):
        be = self.be
        ga = gb = None
        if self.a_shape is not None:  # d/da = b a^(b-1)
            b_minus_1 = be.binary("sub", self.b, 1.0) if self.b_shape is not None else self.b - 1
            ga = be.binary("mul", g, be.binary("mul", be.binary("pow", self.a, b_minus_1), self.b))
        if self.b_shape is not None:  # d/db = a^b log a
            log_a = be.unary("log", self.a) if self.a_shape is not None else math.log(self.a)
            gb = be.binary("mul", g, be.binary("mul", self.out, log_a))
        return self._grads(ga, gb)


class Maximum(_Binary):
    """max(a, b); ties send the gradient to a."""
    op = "maximum"

    def backward(self, g):
        be = self.be
        mask = be.binary("ge", self.a, self.b)
        ga = be.where(mask, g, 0.0) if self.a_shape is not None else None
        gb = be.where(mask, 0.0, g) if self.b_shape is not None else None
        return self._grads(ga, gb)


class Compare(Function):
    """eq/ne/lt/le/gt/ge: a bool result, no gradient."""

    def forward(self, a, b, op: str):
        return self.be.binary(op, a, b)

    def backward(self, g):
        return tuple(None for _ in self.parents)


# ---- unary ------------------------------------------------------------------------------------

class Neg(Function):
    def forward(self, x):
        return self.be.unary("neg", x)

    def backward(self, g):
        return self.be.unary("neg", g)


class Exp(Function):
    def forward(self, x):
        self.out = self.be.unary("exp", x)
        return self.out

    def backward(self, g):
        return self.be.binary("mul", g, self.out)


class Log(Function):
    def forward(self, x):
        self.x = x
        return self.be.unary("log", x)

    def backward(self, g):
        return self.be.binary("div", g, self.x)


class Abs(Function):
    def forward(self, x):
        self.x = x
        return self.be.unary("abs", x)

    def backward(self, g):
        return self.be.binary("mul", g, self.be.unary("sign", self.x))


class Sqrt(Function):
    def forward(self, x):
        self.out = self.be.unary("sqrt", x)
        return self.out

    def backward(self, g):  # g / (2 sqrt x)
        return self.be.binary("div", self.be.binary("mul", g, 0.5), self.out)


class Tanh(Function):
    def forward(self, x):
        self.out = self.be.unary("tanh", x)
        return self.out

    def backward(self, g):  # g (1 - tanh^2)
        be = self.be
        return be.binary("mul", g, be.binary("sub", 1.0, be.binary("mul", self.out, self.out)))


class Sigmoid(Function):
    def forward(self, x):
        self.out = self.be.unary("sigmoid", x)
        return self.out

    def backward(self, g):  # g s (1 - s)
        be = self.be
        return be.binary("mul", g, be.binary("mul", self.out, be.binary("sub", 1.0, self.out)))


class Relu(Function):
    def forward(self, x):
        self.x = x
        return self.be.unary("relu", x)

    def backward(self, g):
        return self.be.relu_backward(self.x, g)


class Gelu(Function):
    """GELU, tanh approximation (GPT-2's)."""

    def forward(self, x):
        self.x = x
        return self.be.unary("gelu", x)

    def backward(self, g):
        return self.be.gelu_backward(self.x, g)


class Where(Function):
    """cond ? a : b; cond is a bool tensor (no gradient), a and b tensors or scalars."""

    def forward(self, cond, a, b):
        self.cond = cond
        self.a_shape = tuple(a.shape) if _is_array(a) else None
        self.b_shape = tuple(b.shape) if _is_array(b) else None
        return self.be.where(cond, a, b)

    def backward(self, g):
        be = self.be
        out = [None]  # cond
        if self.a_shape is not None:
            out.append(unbroadcast(be, be.where(self.cond, g, 0.0), self.a_shape))
        if self.b_shape is not None:
            out.append(unbroadcast(be, be.where(self.cond, 0.0, g), self.b_shape))
        return tuple(out)
