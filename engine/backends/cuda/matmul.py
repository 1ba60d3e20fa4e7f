"""Matrix products of the CUDA backend (cuBLASLt): matmul, linear with its bias / GELU
epilogues, and their backward (weight gradient, bias gradient)."""
from __future__ import annotations

import math

from ...dtypes import DType, bfloat16, float32, float64, uint8
from ..._native import native
from .arrays import _CODE, CudaArray, _empty, _same_device, _view
from .creation import astype
from .elementwise import binary, gelu_backward, unary
from .fp8 import linear_grads_fp8
from .layout import _broadcast_shape
from .movement import broadcast_to
from .reduce import sum


def matmul(a: CudaArray, b: CudaArray, transpose_a: bool = False, transpose_b: bool = False) -> CudaArray:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast; the flags transpose the last two dims.
    cuBLASLt; float32 uses TF32 tensor cores unless engine.cuda.set_allow_tf32(False)."""
    dev = _same_device("matmul", a, b)
    if a.dtype is not b.dtype:
        raise TypeError(f"matmul: dtypes {a.dtype.name} and {b.dtype.name} differ")
    if a.dtype not in (float32, float64, bfloat16):
        raise TypeError(f"cuda backend: matmul supports float32, float64 and bfloat16, got {a.dtype.name}")
    squeeze_m = squeeze_n = False
    if a.ndim == 1:
        a, squeeze_m, transpose_a = _view(a, (1, a.shape[0])), True, False
    if b.ndim == 1:
        b, squeeze_n, transpose_b = _view(b, (b.shape[0], 1)), True, False
    M, K = (a.shape[-1], a.shape[-2]) if transpose_a else (a.shape[-2], a.shape[-1])
    K2, N = (b.shape[-1], b.shape[-2]) if transpose_b else (b.shape[-2], b.shape[-1])
    if K != K2:
        raise ValueError(f"matmul: shapes {a.shape}{'^T' if transpose_a else ''} and "
                         f"{b.shape}{'^T' if transpose_b else ''} do not fit (K = {K} vs {K2})")
    ab, bb = a.shape[:-2], b.shape[:-2]
    batch_shape = _broadcast_shape(ab, bb)
    out_shape = batch_shape + (M, N)
    out = _empty(out_shape, a.dtype, dev)
    code = _CODE[a.dtype]
    if math.prod(bb) == 1 and not transpose_a:
        # b has no batch: fold a's batch dims into rows, one GEMM
        rows = math.prod(ab) * M
        native.matmul(dev, code, out.ptr, a.ptr, b.ptr, 1, rows, N, K, False, transpose_b, 0, 0, 0)
    else:
        if ab != batch_shape:
            a = broadcast_to(a if len(ab) == len(batch_shape) else _view(a, (1,) * (len(batch_shape) - len(ab)) + a.shape),
                             batch_shape + a.shape[-2:])
        if bb != batch_shape:
            b = broadcast_to(b if len(bb) == len(batch_shape) else _view(b, (1,) * (len(batch_shape) - len(bb)) + b.shape),
                             batch_shape + b.shape[-2:])
        batch = math.prod(batch_shape)
        native.matmul(dev, code, out.ptr, a.ptr, b.ptr, batch, M, N, K, bool(transpose_a), bool(transpose_b),
                  M * K, K * N, M * N)
    if squeeze_m or squeeze_n:
        shape = out_shape[:-2] + (() if squeeze_m else (M,)) + (() if squeeze_n else (N,))
        out = _view(out, shape)
    return out


_EPI_BIAS, _EPI_GELU_BIAS, _EPI_BGRAD, _EPI_GELU, _EPI_DGELU = 1, 2, 3, 4, 5


def linear(x: CudaArray, w: CudaArray, b, activation: str | None):
    """x (N, I) @ w (O, I)^T + b (O,) -> out (N, O), then the activation ("gelu" or None); returns
    (out, pre), pre the pre-activation (None without one). The bias runs in cuBLASLt's epilogue, and
    in bf16 the GELU too (writing pre beside out), so neither costs a pass over the output; where
    cuBLASLt offers no such epilogue the unfused ops run instead."""
    if activation not in (None, "gelu"):
        raise ValueError(f"linear: unknown activation {activation!r} (only 'gelu')")
    dev = _same_device("linear", x, w, *([b] if b is not None else []))
    if x.dtype is not w.dtype or (b is not None and b.dtype is not x.dtype):
        raise TypeError(f"linear: dtypes differ (x {x.dtype.name}, weight {w.dtype.name}"
                        f"{', bias ' + b.dtype.name if b is not None else ''}); convert first")
    (N, I), O = x.shape, w.shape[0]
    if activation is None and b is None:
        return matmul(x, w, transpose_b=True), None
    if activation is not None and x.dtype is bfloat16:
        # cuBLASLt's GELU (a fast tanh, ~5e-4 relative) is exact to bf16's rounding, not to float32's:
        # float32 takes the bias epilogue and engine's own GELU kernel
        out, pre = _empty((N, O), x.dtype, dev), _empty((N, O), x.dtype, dev)
        if native.matmul_epilogue(dev, _CODE[x.dtype], _EPI_GELU_BIAS if b is not None else _EPI_GELU, out.ptr, x.ptr,
                              w.ptr, N, O, I, False, True, b.ptr if b is not None else 0, pre.ptr):
            return out, pre
    y = None
    if b is not None and x.dtype in (float32, bfloat16):
        y = _empty((N, O), x.dtype, dev)
        if not native.matmul_epilogue(dev, _CODE[x.dtype], _EPI_BIAS, y.ptr, x.ptr, w.ptr, N, O, I, False, True, b.ptr, 0):
            y = None
    if y is None:
        y = matmul(x, w, transpose_b=True)
        if b is not None:
            y = binary("add", y, b)
    return (y, None) if activation is None else (unary("gelu", y), y)


def _bias_grad(g: CudaArray, pre=None, db_dtype: DType | None = None, fp8_meta=None, transposed: bool = False):
    """db (O,) = column sums of g (N, O), of db_dtype (None: g's; or float32); with pre, the GELU backward
    first, dpre = gelu'(pre) * g, in the same pass. With fp8_meta (bf16 g) the E5M2 codes of d (dpre with
    pre, g without) too, as a delayed-scaling cast with that meta would make them, and with `transposed`
    their transpose as well (N a multiple of 16), and then no dpre: the codes are all its GEMMs read.
    -> (db, dpre or None, (d's codes, inverse scale, transposed codes or None) or None), or Nones where
    the kernel does not apply (float64, a width not a multiple of 16 bytes, unaligned data, a ragged N
    for the transpose)."""
    db_dtype = g.dtype if db_dtype is None else db_dtype
    if db_dtype not in (g.dtype, float32):
        return None, None, None
    N, O = g.shape
    db = _empty((O,), db_dtype, g.device)
    transposed = transposed and fp8_meta is not None
    dpre = _empty(pre.shape, pre.dtype, pre.device) if pre is not None and not transposed else None
    cast = None
    if fp8_meta is not None:
        cast = (_empty((N, O), uint8, g.device), _empty((1,), float32, g.device),
                _empty((O, N), uint8, g.device) if transposed else None)
    if native.linear_bias_grad(g.device, _CODE[g.dtype], db.ptr, dpre.ptr if dpre is not None else 0, g.ptr,
                               pre.ptr if pre is not None else 0, N, O, db_dtype=_CODE[db_dtype],
                               dpre8=cast[0].ptr if cast else 0, inv_scale=cast[1].ptr if cast else 0,
                               meta=fp8_meta.ptr if cast else 0,
                               dpre8_t=cast[2].ptr if cast and transposed else 0):
        return db, dpre, cast
    return None, None, None


def weight_grad(grad: CudaArray, x: CudaArray, dtype: DType) -> CudaArray:
    """dw (O, I) = grad (N, O)^T @ x (N, I) in `dtype`: x's, or float32 for bf16 x, which cuBLASLt writes
    from its float32 accumulator (no bf16 dw, no cast): the weight gradient of a float32 master weight
    under autocast."""
    if dtype is x.dtype:
        return matmul(grad, x, transpose_a=True)
    if not (x.dtype is bfloat16 and dtype is float32):
        return astype(matmul(grad, x, transpose_a=True), dtype)
    (N, O), I = grad.shape, x.shape[1]
    dw = _empty((O, I), dtype, x.device)
    native.matmul(x.device, _CODE[x.dtype], dw.ptr, grad.ptr, x.ptr, 1, O, I, N, True, False, 0, 0, 0,
              out_dtype=_CODE[dtype])
    return dw


def _dx_through_gelu(grad: CudaArray, w: CudaArray, x_gelu_pre: CudaArray) -> CudaArray:
    """gelu'(x_gelu_pre) * (grad (N, O) @ w (O, I)) -> (N, I): in bf16 the GELU's backward in the GEMM's
    epilogue (cuBLASLt's DGELU, reading x_gelu_pre there), else the GEMM and engine's GELU backward."""
    (N, O), I = grad.shape, w.shape[1]
    if grad.dtype is bfloat16 and w.dtype is bfloat16 and x_gelu_pre.dtype is bfloat16:
        dx = _empty((N, I), bfloat16, grad.device)
        if native.matmul_epilogue(grad.device, _CODE[bfloat16], _EPI_DGELU, dx.ptr, grad.ptr, w.ptr, N, I, O, False,
                                  False, 0, x_gelu_pre.ptr):
            return dx
    return gelu_backward(x_gelu_pre, matmul(grad, w))


def linear_backward(grad: CudaArray, x: CudaArray, w: CudaArray, pre, activation: str | None, need: tuple,
                    param_dtype: DType | None = None, fp8=None, x_gelu_pre=None):
    """grad (N, O) of linear's out -> dx (N, I), dw (O, I), db (O,); None where `need` (x, w, b) is
    False. dx is x's dtype; dw and db are param_dtype's (None: x's), float32 for bf16 x and w under
    autocast: the weight gradient's GEMM and the bias-gradient kernel write float32 themselves. The bias
    gradient is engine's column-sum kernel, which also runs the GELU backward in the same pass;
    cuBLASLt's BGRADB epilogue (a separate pass too) is the fallback where it does not apply.
    fp8 (an FP8 layer's operands, fp8.linear_grads_fp8's): dx, and dw where the forward kept x's
    transposed E4M3 copy, through FP8 GEMMs, bf16 where cuBLASLt has none. Once the gradient's meta has
    a history (its first cast scales by its own amax, a pass of its own) the bias kernel writes the
    E5M2 codes of the GEMMs' operand (dpre after the GELU, grad without) and their transpose for dw in
    the pass that sums the bias gradient; after the GELU the bf16 dpre is then not written, and made
    only if a GEMM has no FP8 algorithm. x_gelu_pre (N, I): x is gelu(x_gelu_pre) (the MLP's hidden
    layer), and dx is the gradient at x_gelu_pre instead, the GELU's backward in dx's GEMM (no FP8)."""
    if grad.dtype is not x.dtype:
        grad = astype(grad, x.dtype)
    pdt = x.dtype if param_dtype is None else param_dtype
    gelu = activation is not None
    # an FP8 layer whose gradient meta has a history: the bias kernel writes the codes (and their
    # transpose where dw runs in FP8), and the GELU's bf16 dpre only if a GEMM falls back to it
    fused = fp8[2] if fp8 is not None and need[2] and not fp8[3] else None
    transposed = fused is not None and need[1] and fp8[4] is not None and grad.shape[0] % 16 == 0
    db, dpre, cast = (_bias_grad(grad, pre if gelu else None, pdt, fused, transposed) if need[2]
                      else (None, None, None))
    g_out = grad  # the output's gradient
    if gelu:
        grad = dpre if dpre is not None or cast is not None else gelu_backward(pre, grad)
    dx = dw = None
    if fp8 is not None and (need[0] or need[1]):
        dx, dw = linear_grads_fp8(grad, fp8, need[0], need[1], pdt, cast)
    if grad is None and ((need[0] and dx is None) or (need[1] and dw is None)):
        grad = gelu_backward(pre, g_out)  # a GEMM with no FP8 algorithm: the bf16 dpre after all
    if need[0] and dx is None:
        dx = matmul(grad, w) if x_gelu_pre is None else _dx_through_gelu(grad, w, x_gelu_pre)
    if (need[1] and dw is None and need[2] and db is None and x.dtype in (float32, bfloat16)
            and pdt in (x.dtype, float32)):
        (N, O), I = grad.shape, x.shape[1]
        dw, db = _empty((O, I), pdt, x.device), _empty((O,), pdt, x.device)  # the bias gradient of dw's dtype
        if not native.matmul_epilogue(x.device, _CODE[x.dtype], _EPI_BGRAD, dw.ptr, grad.ptr, x.ptr, O, I, N, True, False,
                                  db.ptr, 0, out_dtype=_CODE[pdt]):
            dw = db = None
    if need[1] and dw is None:
        dw = weight_grad(grad, x, pdt)
    if need[2] and db is None:
        db = astype(sum(grad, (0,), False), pdt)
    return dx, dw, db
