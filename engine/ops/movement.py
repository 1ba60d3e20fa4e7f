"""Ops that move data without arithmetic: reshape, permute, expand, indexing, concatenation."""
from __future__ import annotations

from ..autograd import Function
from .elementwise import unbroadcast


class Reshape(Function):
    def forward(self, x, shape: tuple):
        self.in_shape = tuple(x.shape)
        return self.be.reshape(x, shape)

    def backward(self, g):
        return self.be.reshape(g, self.in_shape)


class Permute(Function):
    def forward(self, x, dims: tuple):
        self.inverse = tuple(sorted(range(len(dims)), key=lambda i: dims[i]))
        return self.be.permute(x, dims)

    def backward(self, g):
        return self.be.permute(g, self.inverse)


class Expand(Function):
    """Broadcast to a larger shape (a view on the CPU)."""

    def forward(self, x, shape: tuple):
        self.in_shape = tuple(x.shape)
        self._unbroadcast = unbroadcast
        return self.be.broadcast_to(x, shape)

    def backward(self, g):
        return self._unbroadcast(self.be, g, self.in_shape)


class GetItem(Function):
    """x[index] for basic indices (ints, slices, None, Ellipsis)."""

    def forward(self, x, index: tuple):
        self.index, self.in_shape = index, tuple(x.shape)
        return self.be.getitem(x, index)

    def backward(self, g):
        return self.be.getitem_backward(g, self.index, self.in_shape)


class Concat(Function):
    def forward(self, *xs, axis: int):
        self.axis = axis
        self.sizes = [x.shape[axis] for x in xs]
        return self.be.concat(list(xs), axis)

    def backward(self, g):
        grads, start = [], 0
        ndim = len(g.shape)
        for n in self.sizes:
            index = (slice(None),) * self.axis + (slice(start, start + n),) + (slice(None),) * (ndim - self.axis - 1)
            grads.append(self.be.getitem(g, index))
            start += n
        return tuple(grads)
