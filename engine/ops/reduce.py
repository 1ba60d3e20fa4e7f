"""Reductions over axes: sum and max (mean is sum times a scalar: engine/methods/reductions.py)."""
from __future__ import annotations

from ..autograd import Function


def _kept_shape(shape: tuple, axes: tuple) -> tuple:
    """The shape of a keepdim reduction of `shape` over `axes`."""
    return tuple(1 if i in axes else n for i, n in enumerate(shape))


class Sum(Function):
    def forward(self, x, axes: tuple, keepdim: bool):
        self.in_shape = tuple(x.shape)
        self.kept = _kept_shape(self.in_shape, axes)
        return self.be.sum(x, axes, keepdim)

    def backward(self, g):  # every input element gets the gradient of its sum
        be = self.be
        return be.contiguous(be.broadcast_to(be.reshape(g, self.kept), self.in_shape))


class Max(Function):
    """max over axes; the gradient is shared equally among tied maxima (as torch.amax)."""

    def forward(self, x, axes: tuple, keepdim: bool):
        be = self.be
        self.x, self.in_shape = x, tuple(x.shape)
        self.kept = _kept_shape(self.in_shape, axes)
        self.axes = axes
        out = be.max(x, axes, True)
        self.out_kept = out
        return out if keepdim else be.reshape(out, tuple(n for i, n in enumerate(self.in_shape) if i not in axes))

    def backward(self, g):
        be = self.be
        mask = be.astype(be.binary("eq", self.x, self.out_kept), self.x_dtype())
        count = be.sum(mask, self.axes, True)
        share = be.binary("div", be.reshape(g, self.kept), count)
        return be.binary("mul", mask, share)

    def x_dtype(self):
        return self.be.dtype_of(self.x)
