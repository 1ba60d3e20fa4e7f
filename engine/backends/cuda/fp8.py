"""FP8 of the CUDA backend: casts with delayed scaling (csrc/cuda/fp8/) and the FP8 GEMM (cuBLASLt,
csrc/cuda/matmul/). Same functions and meaning as cpu/fp8.py, the reference; a meta is 20 float32
words on the device (csrc/cuda/fp8/fp8.h), updated by the casts themselves, so a captured CUDA graph
replays the scaling without the host."""
from __future__ import annotations

import numpy as np

from ...dtypes import bfloat16, float32, int64, uint8
from ..._native import native
from .arrays import _CODE, CudaArray, _empty, _same_device
from .creation import astype, from_numpy, full
from .elementwise import unary

META_WORDS, HISTORY = 20, 16
DLOGITS_SCALE = 32768.0  # csrc/cuda/softmax/softmax.h's kDlogitsFp8Scale
_FORMAT = {"e4m3": 0, "e5m2": 1}
_EPI_NONE, _EPI_BIAS, _EPI_GELU_BIAS, _EPI_GELU = 0, 1, 2, 4


def fp8_meta(like: CudaArray) -> CudaArray:
    """A fresh meta (20,) float32 on like's device: scale 1, no history."""
    meta = np.zeros(META_WORDS, np.float32)
    meta[0] = 1.0
    return from_numpy(meta, like.device)


def fp8_cast(x: CudaArray, fmt: str, meta: CudaArray, current: bool, transpose: bool = False):
    """x (R, C) float32 or bf16 -> (q (R, C) uint8, q_t (C, R) uint8 or None, inv_scale (1,) float32), as
    cpu/fp8.py; the meta is updated on the device by the cast's last block."""
    if x.dtype not in (float32, bfloat16):
        raise TypeError(f"fp8_cast: float32 or bfloat16 input, got {x.dtype.name}")
    if fmt not in _FORMAT:
        raise ValueError(f"fp8_cast: format must be 'e4m3' or 'e5m2', got {fmt!r}")
    dev = _same_device("fp8_cast", x, meta)
    rows, cols = (x.shape[0], x.size // x.shape[0]) if x.ndim >= 1 and x.shape[0] else (1, x.size)
    q = _empty(x.shape, uint8, dev)
    q_t = _empty((cols, rows), uint8, dev) if transpose else None
    inv_scale = _empty((1,), float32, dev)
    native.fp8_cast(dev, _CODE[x.dtype], _FORMAT[fmt], q.ptr, q_t.ptr if transpose else 0, inv_scale.ptr, meta.ptr,
                    x.ptr, rows, cols, bool(current))
    return q, q_t, inv_scale


def cross_entropy_with_grad_fp8_(logits: CudaArray, targets: CudaArray, ignore_index: int):
    """nn.cross_entropy_with_grad_ on bf16 logits (overwritten by softmax - onehot(target)) writing that
    gradient's E5M2 codes too, fixed-scaled by DLOGITS_SCALE, in the same kernel: -> (losses (N,), codes
    (N, V) uint8, inv_scale (1,) float32), as cpu/fp8.py."""
    if logits.dtype is not bfloat16:
        raise TypeError(f"cross_entropy_with_grad_fp8_: bfloat16 logits, got {logits.dtype.name}")
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    losses, codes = _empty((N,), float32, logits.device), _empty((N, V), uint8, logits.device)
    native.cross_entropy_with_grad_dt(logits.device, _CODE[logits.dtype], losses.ptr, logits.ptr, targets.ptr, N, V,
                                      int(ignore_index), dlogits8=codes.ptr)
    return losses, codes, full((1,), 1.0 / DLOGITS_SCALE, float32, logits.device)


def matmul_fp8(a: CudaArray, a_fmt: str, a_inv: CudaArray, b: CudaArray, b_fmt: str, b_inv: CudaArray,
               bias=None, activation: str | None = None, fast_accum: bool = False, out_dtype=bfloat16):
    """(out (M, N) bf16, pre (M, N) bf16 or None), out = act(deq(a) (M, K) @ deq(b) (N, K)^T + bias (N,)
    bf16), as cpu/fp8.py; bias and GELU in cuBLASLt's epilogue. out_dtype float32 (no bias, no
    activation): a weight gradient in float32. None where cuBLASLt has no FP8 GEMM for it (a GPU before
    Hopper, a shape it refuses): the caller runs the GEMM in bf16."""
    if activation not in (None, "gelu"):
        raise ValueError(f"matmul_fp8: unknown activation {activation!r} (only 'gelu')")
    if a_fmt == "e5m2" and b_fmt == "e5m2":
        raise ValueError("matmul_fp8: E5M2 x E5M2 is not a GEMM Hopper offers; one operand must be E4M3")
    dev = _same_device("matmul_fp8", a, b, a_inv, b_inv, *([bias] if bias is not None else []))
    if out_dtype is not bfloat16 and (out_dtype is not float32 or bias is not None or activation is not None):
        raise ValueError("matmul_fp8: out_dtype is bfloat16, or float32 with no bias and no activation")
    (M, K), N = a.shape, b.shape[0]
    out = _empty((M, N), out_dtype, dev)
    pre = _empty((M, N), bfloat16, dev) if activation is not None else None
    epilogue = ((_EPI_GELU_BIAS if bias is not None else _EPI_GELU) if activation is not None
                else (_EPI_BIAS if bias is not None else _EPI_NONE))
    if native.matmul_fp8(dev, epilogue, out.ptr, a.ptr, b.ptr, _FORMAT[a_fmt], _FORMAT[b_fmt], a_inv.ptr,
                         b_inv.ptr, M, N, K, bias.ptr if bias is not None else 0,
                         pre.ptr if pre is not None else 0, bool(fast_accum), out_dtype=_CODE[out_dtype]):
        return out, pre
    if activation is not None:  # no GELU epilogue for it: the GEMM with its bias, then engine's GELU
        res = matmul_fp8(a, a_fmt, a_inv, b, b_fmt, b_inv, bias, None, fast_accum)
        return None if res is None else (unary("gelu", res[0]), res[0])
    return None


def linear_grads_fp8(grad: CudaArray, fp8: tuple, need_dx: bool, need_dw: bool, dw_dtype, cast=None):
    """An FP8 linear layer's GEMM gradients -> (dx (N, I) bf16 or None, dw (O, I) of dw_dtype or None).
    fp8 = (w_t, w_inv, meta, current, x_t, x_inv): the forward's E4M3 transposed weight (I, O) and
    transposed input (I, N) (None: dw stays the caller's bf16 GEMM) with their inverse scales, and the
    gradient's meta. grad (N, O) is cast to E5M2 with it, and transposed too for dw = grad^T x (both
    operands K-major over the N rows); `cast`: grad's (codes, inverse scale, transposed codes or None)
    already made (by the bias-gradient kernel); dw then runs here only with the transposed codes. None
    where not asked, or where cuBLASLt has no such GEMM."""
    w_t, w_inv, meta, current, x_t, x_inv = fp8
    want_dw = need_dw and x_t is not None and (cast is None or cast[2] is not None)
    if cast is not None:
        g8, g_inv, g8_t = cast
    else:
        g8, g8_t, g_inv = fp8_cast(grad, "e5m2", meta, current, transpose=want_dw)
    dx = matmul_fp8(g8, "e5m2", g_inv, w_t, "e4m3", w_inv) if need_dx else None
    dw = matmul_fp8(g8_t, "e5m2", g_inv, x_t, "e4m3", x_inv, out_dtype=dw_dtype) if want_dw else None
    return (dx[0] if dx is not None else None), (dw[0] if dw is not None else None)
