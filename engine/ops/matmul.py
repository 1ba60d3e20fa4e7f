"""Matrix multiplication, batched with broadcast batch dimensions."""
from __future__ import annotations

from ..autocast import weight_cast
from ..dtypes import bfloat16
from ..autograd import Function, is_grad_enabled
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
    writes dw and db in w's dtype directly, so no cast of their gradients runs.

    fp8 (an engine.fp8.Fp8State, under bf16 compute only): the GEMMs in FP8, x and w cast to E4M3 and the
    gradient to E5M2, each scaled by its meta: the forward, dx, and dw on the transposed copies of x and
    the gradient (dpre after a GELU, whose codes and transpose the backward's bias kernel writes)."""

    def forward(self, x, w, b=None, activation=None, compute_dtype=None, fp8=None):
        be = self.be
        self.x_shape = tuple(x.shape)
        self.x2 = be.reshape(x, (-1, x.shape[-1]))  # (N, I)
        self.param_dtype = None  # the dtype of dw and db: None for x's
        if compute_dtype is not None and be.dtype_of(w) is not compute_dtype:
            self.param_dtype = be.dtype_of(w)
            # (O, I) in compute_dtype, for the forward and dx: the model's one cast of its weights, or now
            w = weight_cast(be, w, compute_dtype)
            b = weight_cast(be, b, compute_dtype) if b is not None else None
        self.w, self.activation, self.fp8 = w, activation, None
        use_fp8 = fp8 is not None and not fp8.unavailable and be.dtype_of(self.x2) is bfloat16
        res = self._forward_fp8(fp8, b) if use_fp8 else None
        # (N, O), pre-activation (N, O) or None
        out, self.pre = res if res is not None else be.linear(self.x2, w, b, activation)
        return be.reshape(out, self.x_shape[:-1] + (w.shape[0],))

    def _forward_fp8(self, state, b):
        """(out, pre) through the FP8 GEMM, keeping the E4M3 transposed weight for dx; None where the
        backend has no FP8 GEMM for it."""
        be = self.be
        x_meta, x_current = state.meta(be, "x", self.x2)
        w_meta, w_current = state.meta(be, "w", self.w)
        grads = is_grad_enabled()
        # (N, I), and x^T (I, N) for dw
        x8, x_t, x_inv = be.fp8_cast(self.x2, "e4m3", x_meta, x_current, transpose=grads)
        w8, w_t, w_inv = be.fp8_cast(self.w, "e4m3", w_meta, w_current, transpose=grads)  # (O, I), (I, O)
        res = be.matmul_fp8(x8, "e4m3", x_inv, w8, "e4m3", w_inv, b, self.activation, fast_accum=True)
        if res is None:
            state.fall_back(self.w.shape)
        elif grads:
            self.fp8 = (state, w_t, w_inv, x_t, x_inv)
        return res

    def backward(self, g):
        be = self.be
        g2 = be.reshape(g, (-1, g.shape[-1]))  # (N, O)
        need = tuple(self.needs_input_grad) + (False,) * (3 - len(self.needs_input_grad))
        fp8 = None
        if self.fp8 is not None and (need[0] or need[1]):
            state, w_t, w_inv, x_t, x_inv = self.fp8
            fp8 = (w_t, w_inv) + state.meta(be, "grad", g2) + (x_t, x_inv)
        gx, gw, gb = be.linear_backward(g2, self.x2, self.w, self.pre, self.activation, need,
                                        param_dtype=self.param_dtype, fp8=fp8)
        if gx is not None:
            gx = be.reshape(gx, self.x_shape)
        return (gx, gw, gb)[: len(self.parents)]
