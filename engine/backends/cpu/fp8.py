"""FP8 of the CPU backend: the casts with delayed scaling and the FP8 GEMM, in numpy (ml_dtypes'
float8 types round to nearest even as the GPU's conversion does). This is the reference the CUDA
kernels (csrc/cuda/fp8/, matmul_fp8) are tested against, and it runs an FP8 model on the CPU too.

A tensor's scaling state, its meta, is 20 float32 words (csrc/cuda/fp8/fp8.h): [0] the next cast's
scale, [1:4] the GPU's in-flight words (always 0 here), [4:20] the amax of the last 16 casts, newest
first. A cast multiplies by the scale, saturates at the format's largest finite value and rounds;
then its amax joins the history and the next scale is fp8_max / max(history). With `current` the
cast scales by its own amax instead (a fresh meta's first cast)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ...dtypes import bfloat16 as BF16_DTYPE, float32
from .bf16 import BF16, narrow, widen
from .elementwise import _gelu
from .nn import cross_entropy_with_grad_

META_WORDS, HISTORY = 20, 16
DLOGITS_SCALE = 32768.0  # the classifier gradient's fixed E5M2 scale (|softmax - onehot| <= 1): 2^15
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def fp8_meta(like) -> np.ndarray:
    """A fresh meta (20,) float32: scale 1, no history."""
    meta = np.zeros(META_WORDS, np.float32)
    meta[0] = 1.0
    return meta


def fp8_cast(x: np.ndarray, fmt: str, meta: np.ndarray, current: bool, transpose: bool = False):
    """x (R, C) float32 or bf16 -> (q (R, C) uint8, q_t (C, R) uint8 or None, inv_scale (1,) float32):
    q = fp8(x * scale) in `fmt` ("e4m3" or "e5m2"), q_t its transpose (with `transpose`), inv_scale =
    1 / scale (the GEMM's dequantisation factor); meta updated in place for the next cast."""
    kind, fmax = FORMATS[fmt]
    v = widen(x).astype(np.float32, copy=False)
    magnitude = np.abs(v)
    finite_or_inf = magnitude[~np.isnan(magnitude)]
    amax = np.float32(finite_or_inf.max()) if finite_or_inf.size else np.float32(0)
    scale = meta[0]
    if current and amax > 0 and np.isfinite(amax):
        scale = np.float32(fmax) / amax
    q = np.clip(v * scale, -fmax, fmax).astype(kind).view(np.uint8)
    inv_scale = np.array([np.float32(1) / scale], np.float32)
    history = meta[4:4 + HISTORY]
    if np.isfinite(amax):
        history[1:] = history[:-1].copy()
        history[0] = amax
    if history.max() > 0:
        meta[0] = np.float32(fmax) / history.max()
    return q, (np.ascontiguousarray(q.T) if transpose else None), inv_scale


def cross_entropy_with_grad_fp8_(logits: np.ndarray, targets: np.ndarray, ignore_index: int):
    """nn.cross_entropy_with_grad_ (logits (N, V) bf16 overwritten by softmax - onehot(target)) and that
    gradient's E5M2 codes, fixed-scaled by DLOGITS_SCALE: -> (losses (N,), codes (N, V) uint8,
    inv_scale (1,) float32) for the FP8 classifier's input-gradient GEMM."""
    losses = cross_entropy_with_grad_(logits, targets, ignore_index)
    codes = (widen(logits).astype(np.float32) * np.float32(DLOGITS_SCALE)).astype(FORMATS["e5m2"][0]).view(np.uint8)
    return losses, codes, np.array([1.0 / DLOGITS_SCALE], np.float32)


def fp8_values(q: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 codes of `fmt` -> their float32 values (exact)."""
    return q.view(FORMATS[fmt][0]).astype(np.float32)


def matmul_fp8(a: np.ndarray, a_fmt: str, a_inv: np.ndarray, b: np.ndarray, b_fmt: str, b_inv: np.ndarray,
               bias=None, activation: str | None = None, fast_accum: bool = False, out_dtype=BF16_DTYPE):
    """(out (M, N) bf16, pre (M, N) bf16 or None) with out = act(deq(a) (M, K) @ deq(b) (N, K)^T + bias),
    deq(q) = q's values * its inverse scale; float32 sums, bias and GELU in float32, each output rounded
    once to bf16 (the GPU's epilogue). out_dtype float32 (no bias, no activation): not rounded, a weight
    gradient in float32. fast_accum is the GPU's choice of accumulation: the same here."""
    if out_dtype is not BF16_DTYPE and (out_dtype is not float32 or bias is not None or activation is not None):
        raise ValueError("matmul_fp8: out_dtype is bfloat16, or float32 with no bias and no activation")
    if a_fmt == "e5m2" and b_fmt == "e5m2":
        raise ValueError("matmul_fp8: E5M2 x E5M2 is not a GEMM Hopper offers; one operand must be E4M3")
    acc = fp8_values(a, a_fmt) @ fp8_values(b, b_fmt).T
    pre = acc * (a_inv[0] * b_inv[0])
    if out_dtype is float32:
        return pre.astype(np.float32), None
    if bias is not None:
        pre = pre + widen(bias)
    if activation is None:
        return narrow(pre, BF16), None
    if activation != "gelu":
        raise ValueError(f"matmul_fp8: unknown activation {activation!r} (only 'gelu')")
    return narrow(_gelu(pre), BF16), narrow(pre, BF16)


def linear_grads_fp8(grad: np.ndarray, fp8: tuple, need_dx: bool, need_dw: bool, dw_dtype, cast=None):
    """An FP8 linear layer's GEMM gradients -> (dx (N, I) bf16 or None, dw (O, I) of dw_dtype or None),
    as the CUDA backend's: fp8 = (w_t, w_inv, meta, current, x_t, x_inv); grad (N, O) bf16 cast to E5M2
    with meta (and transposed, for dw = grad^T x where x_t is kept), or `cast` its (codes, inverse scale,
    transposed codes or None) already made; dw None without x_t or without the transposed codes."""
    w_t, w_inv, meta, current, x_t, x_inv = fp8
    want_dw = need_dw and x_t is not None and (cast is None or cast[2] is not None)
    if cast is not None:  # grad's codes already made
        g8, g_inv, g8_t = cast
    else:
        g8, g8_t, g_inv = fp8_cast(grad, "e5m2", meta, current, transpose=want_dw)
    dx = matmul_fp8(g8, "e5m2", g_inv, w_t, "e4m3", w_inv)[0] if need_dx else None
    dw = matmul_fp8(g8_t, "e5m2", g_inv, x_t, "e4m3", x_inv, out_dtype=dw_dtype)[0] if want_dw else None
    return dx, dw
