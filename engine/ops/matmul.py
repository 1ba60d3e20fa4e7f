"""Matrix multiplication, batched with broadcast batch dimensions."""
from __future__ import annotations

from ..autocast import weight_cast
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
    """act(x (..., I) @ w (O, I)^T + b (O,)) -> (..., O), act None or "gelu"; batch dims folded into
    rows for one GEMM, with bias and GELU in the GEMM's epilogue on the GPU.

    compute_dtype (autocast's bf16, or None): x is of it already, w and b are float32 master weights.
    The GEMM runs on w cast once to compute_dtype (the copy kept for the backward's dx) and on b cast
    too (O values: cuBLASLt's bias epilogue takes no float32 bias beside a bf16 output); the backward
    writes dw and db in w's dtype directly, so no cast of their gradients runs."""

    def forward(self, x, w, b=None, activation=None, compute_dtype=None):
        be = self.be
        self.x_shape = tuple(x.shape)
        self.x2 = be.reshape(x, (-1, x.shape[-1]))  # (N, I)
        self.param_dtype = None  # the dtype of dw and db: None for x's
        if compute_dtype is not None and be.dtype_of(w) is not compute_dtype:
            self.param_dtype = be.dtype_of(w)
            # (O, I) in compute_dtype, for the forward and dx: the model's one cast of its weights, or now
            w = weight_cast(be, w, compute_dtype)
            b = weight_cast(be, b, compute_dtype) if b is not None else None
        self.w, self.activation = w, activation
        out, self.pre = be.linear(self.x2, w, b, activation)  # (N, O), pre-activation (N, O) or None
        return be.reshape(out, self.x_shape[:-1] + (w.shape[0],))

    def backward(self, g):
        be = self.be
        g2 = be.reshape(g, (-1, g.shape[-1]))  # (N, O)
        need = tuple(self.needs_input_grad) + (False,) * (3 - len(self.needs_input_grad))
        gx, gw, gb = be.linear_backward(g2, self.x2, self.w, self.pre, self.activation, need,
                                        param_dtype=self.param_dtype)
        if gx is not None:
            gx = be.reshape(gx, self.x_shape)
        return (gx, gw, gb)[: len(self.parents)]
