"""The transformer's MLP as one op: gelu(x W1^T + b1) W2^T + b2, forward and backward side by side.

One op instead of linear, gelu, linear so that the backward can fold the GELU's derivative (and the
first layer's bias gradient) into the epilogue of the GEMM that computes the GELU's output gradient:
on the GPU in bf16 no pass over the (N, 4C) hidden activations is spent on the GELU at all."""
from __future__ import annotations

from ..autograd import Function


class MLP(Function):
    """x (..., C) -> (..., C) through w1 (H, C), b1 (H,), w2 (C, H), b2 (C,); either bias may be None."""

    def forward(self, x, w1, b1, w2, b2):
        be = self.be
        self.x_shape = tuple(x.shape)
        self.has_b1, self.has_b2 = b1 is not None, b2 is not None
        self.x2 = be.reshape(x, (-1, x.shape[-1]))  # (N, C)
        self.w1, self.w2 = w1, w2
        self.h, self.pre = be.linear(self.x2, w1, b1, "gelu")  # (N, H) each: gelu(pre), pre
        y, _ = be.linear(self.h, w2, b2, None)  # (N, C)
        return be.reshape(y, self.x_shape[:-1] + (w2.shape[0],))

    def backward(self, g):
        be = self.be
        need = iter(self.needs_input_grad)  # x, w1, [b1], w2, [b2]
        nx, nw1 = next(need), next(need)
        nb1 = next(need) if self.has_b1 else False
        nw2 = next(need)
        nb2 = next(need) if self.has_b2 else False
        g2 = be.reshape(g, (-1, g.shape[-1]))  # (N, C)
        _, gw2, gb2 = be.linear_backward(g2, self.h, self.w2, None, None, (False, nw2, nb2))
        dpre, gb1 = be.linear_grad_through_gelu(g2, self.w2, self.pre)  # (N, H), (H,)
        gx, gw1, _ = be.linear_backward(dpre, self.x2, self.w1, None, None, (nx, nw1, False))
        if gx is not None:
            gx = be.reshape(gx, self.x_shape)
        grads = [gx, gw1] + ([gb1 if nb1 else None] if self.has_b1 else []) + [gw2] + \
            ([gb2] if self.has_b2 else [])
        return tuple(grads)
