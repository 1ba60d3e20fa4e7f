"""The transformer's MLP as one op: linear(gelu(linear(x, w1, b1)), w2, b2)."""
from __future__ import annotations

from ..autograd import Function
from .matmul import Linear


class MLP(Function):
    """x (..., I) -> gelu(x w1^T + b1) (..., H) -> (..., H) w2^T + b2 (..., O); b1, b2 may be None.

    Both layers run as Linear does (the GELU in the first GEMM's epilogue on the GPU), so the values are
    the same; the op exists for the backward: the second layer's dx GEMM writes the gradient at the GELU's
    input directly (gelu'(pre) * (g w2), cuBLASLt's DGELU epilogue in bf16), so the (..., H) gradient of
    the GELU's output is never written and read back by a GELU backward of its own; the first layer's
    bias gradient is then a plain column sum. compute_dtype: Linear's (autocast's bf16 over float32
    master weights). No FP8 (an FP8 layer's gradient pass writes FP8 codes this op has no place for)."""

    def forward(self, x, w1, b1, w2, b2=None, compute_dtype=None):
        self.fc, self.proj = self.inner(Linear), self.inner(Linear)
        self.has_b1, self.has_b2 = b1 is not None, b2 is not None
        h = self.fc.forward(x, w1, b1, "gelu", compute_dtype)
        return self.proj.forward(h, w2, b2, None, compute_dtype)

    def backward(self, g):
        be, fc, proj = self.be, self.fc, self.proj
        need = iter(self.needs_input_grad)  # the parents: x, w1, (b1), w2, (b2)
        nx, nw1 = next(need), next(need)
        nb1 = next(need) if self.has_b1 else False
        nw2 = next(need)
        nb2 = next(need) if self.has_b2 else False
        g2 = be.reshape(g, (-1, g.shape[-1]))  # (N, O)
        # dpre (N, H): the gradient at the GELU's input, from the second layer's dx GEMM
        dpre, dw2, db2 = be.linear_backward(g2, proj.x2, proj.w, None, None, (nx or nw1 or nb1, nw2, nb2),
                                            param_dtype=proj.param_dtype, x_gelu_pre=fc.pre)
        dx = dw1 = db1 = None
        if dpre is not None:
            dx, dw1, db1 = be.linear_backward(dpre, fc.x2, fc.w, None, None, (nx, nw1, nb1),
                                              param_dtype=fc.param_dtype)
        if dx is not None:
            dx = be.reshape(dx, fc.x_shape)
        return (dx, dw1) + ((db1,) if self.has_b1 else ()) + (dw2,) + ((db2,) if self.has_b2 else ())
