"""Matrix multiplication, batched with broadcast batch dimensions."""
from __future__ import annotations

from ..autograd import Function
from .elementwise import unbroadcast


class MatMul(Function):
    """a (..., M, K) @ b (..., K, N) -> (..., M, N)."""

    def forward(self, a, b):
        self.a, self.b = a, b
        return self.be.matmul(a, b)

    def backward(self, g):
        be, a, b = self.be, self.a, self.b
        ga = gb = None
        if self.needs_input_grad[0]:  # dA = dC B^T  (..., M, N) @ (..., N, K)
            ga = unbroadcast(be, be.matmul(g, b, transpose_b=True), tuple(a.shape))
        if self.needs_input_grad[1]:  # dB = A^T dC  (..., K, M) @ (..., M, N)
            gb = unbroadcast(be, be.matmul(a, g, transpose_a=True), tuple(b.shape))
        return ga, gb


class Linear(Function):
    """x (..., I) @ w (O, I)^T + b (O,) -> (..., O); batch dims folded into rows for one GEMM."""

    def forward(self, x, w, b=None):
        be = self.be
        self.x_shape = tuple(x.shape)
        self.x2 = be.reshape(x, (-1, x.shape[-1]))  # (N, I)
        self.w = w
        out = be.matmul(self.x2, w, transpose_b=True)  # (N, O)
        if b is not None:
            out = be.binary("add", out, b)
        return be.reshape(out, self.x_shape[:-1] + (w.shape[0],))

    def backward(self, g):
        be = self.be
        g2 = be.reshape(g, (-1, g.shape[-1]))  # (N, O)
        gx = gw = gb = None
        if self.needs_input_grad[0]:
            gx = be.reshape(be.matmul(g2, self.w), self.x_shape)  # (N, O) @ (O, I)
        if self.needs_input_grad[1]:
            gw = be.matmul(g2, self.x2, transpose_a=True)  # (O, N) @ (N, I)
        if len(self.needs_input_grad) > 2 and self.needs_input_grad[2]:
            gb = be.sum(g2, (0,), False)
        return (gx, gw, gb)[: len(self.parents)]
