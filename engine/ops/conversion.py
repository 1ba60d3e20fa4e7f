"""Ops that change where a tensor lives or what it holds: a copy to another device, a cast to another
dtype (the gradient goes back the same way)."""
from __future__ import annotations

import numpy as np

from ..autograd import Function, is_grad_enabled
from ..backends import backend_for
from ..device import Device
from ..dtypes import DType
from ..tensor import Tensor


class _ToDevice(Function):
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
        requires_grad = is_grad_enabled() and x.requires_grad
        result = Tensor._wrap(out, target, requires_grad)
        if requires_grad:
            ctx.parents, ctx.needs_input_grad = (x,), (True,)
            result._ctx = ctx
        return result


class _Cast(Function):
    def forward(self, x, dtype: DType):
        self.in_dtype = self.be.dtype_of(x)
        return self.be.astype(x, dtype)

    def backward(self, g):
        if not self.in_dtype.is_floating_point:
            return None
        return self.be.astype(g, self.in_dtype)
