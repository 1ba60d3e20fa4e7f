"""The CUDA backend's attention primitives.

attention / attention_backward over (..., T, D) heads, attention_qkv / attention_qkv_backward
straight from a packed (B, T, 3C) projection, optional dropout inside the kernels
(attention_dropout_mask materialises its mask), and the composite path for what the fused kernels
do not take (csrc/cuda/attention/attention.cu, attention_mma.cu).
"""
from __future__ import annotations

import builtins
import math

import numpy as np

from ...dtypes import DType, bfloat16, float32, int64
from ..._native import native
from .arrays import _CODE, CudaArray, _device, _empty, _same_device
from .creation import astype, from_numpy, full
from .elementwise import binary, unary, where
from .matmul import matmul
from .movement import concat, getitem, permute, reshape
from .reduce import max, sum  # noqa: A004 - the primitives' names


def _attention_fusable(D: int, dtype: DType, *arrays) -> bool:
    """The fused kernel takes float32 / bfloat16, head dims D % 8 == 0 up to 128, 16-byte aligned data."""
    return (dtype in (float32, bfloat16) and 0 < D <= 128 and D % 8 == 0
            and builtins.all(a.ptr % 16 == 0 for a in arrays))


def _precise() -> bool:
    return not native.allow_tf32()  # float32 attention at ~float32 accuracy (3 TF32 products) when TF32 is off


def _fused_dropout(dtype: DType, dropout_p: float) -> bool:
    """Whether the fused kernel has this dropout: not in the precise float32 variant (TF32 off), which
    would double the kernel instantiations; the unfused path takes that case with the same mask."""
    return dropout_p == 0.0 or dtype is bfloat16 or not _precise()


def _check_dropout_p(op: str, dropout_p: float) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")


def _ptr(x: CudaArray | None) -> int:
    return 0 if x is None else x.ptr  # a null pointer for the kernels' optional buffers


def _rng_key(seed: int, device: int) -> CudaArray:
    """(1,) int64 holding the uint64 Philox key of attention dropout with this seed (mixed with the
    graph epoch while capturing), written on the device as a fused forward writes it."""
    rng = _empty((1,), int64, device)
    native.attention_rng_key(device, rng.ptr, int(seed) & 0xFFFFFFFFFFFFFFFF)
    return rng


def _dropout_z(rng: CudaArray, shape: tuple, dropout_p: float) -> CudaArray:
    """Z (..., T, S) float32 under the key in rng: the leading axes are the kernels' B*H heads."""
    z = _empty(tuple(shape), float32, rng.device)
    native.attention_dropout_mask(rng.device, z.ptr, math.prod(shape[:-2]), shape[-2], shape[-1], float(dropout_p), 0,
                              rng.ptr)
    return z


def attention_dropout_mask(shape: tuple, p: float, seed: int, device_index=None) -> CudaArray:
    """Z (B*H, T, S) float32 of fused attention's dropout with drop probability p: 0 where dropped,
    1/(1-p) where kept, drawn with the kernels' own rule under key = seed (as outside a graph
    capture), so it equals cpu.attention_dropout_mask for the same seed."""
    BH, T, S = shape
    out = _empty((BH, T, S), float32, _device(device_index))
    native.attention_dropout_mask(out.device, out.ptr, BH, T, S, float(p), int(seed) & 0xFFFFFFFFFFFFFFFF, 0)
    return out


_hidden_cache: dict = {}


def _causal_hidden(T: int, S: int, device: int) -> CudaArray:
    key = (T, S, device)
    m = _hidden_cache.get(key)
    if m is None:
        m = from_numpy(np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T), device)
        if len(_hidden_cache) > 64:
            _hidden_cache.clear()
        _hidden_cache[key] = m
    return m


def _attention_composite(q, k, v, causal, scale, dropout_p=0.0, seed=0):
    """The unfused path (head dims the kernel does not take; dropout with TF32 off): float32 scores
    in memory. Dropout multiplies the probabilities by the kernels' mask (_dropout_z)."""
    dt = q.dtype
    q, k, v = astype(q, float32), astype(k, float32), astype(v, float32)
    s = binary("mul", matmul(q, k, transpose_b=True), float(scale))
    if causal:
        s = where(_causal_hidden(q.shape[-2], k.shape[-2], q.device), float("-inf"), s)
    m = max(s, (s.ndim - 1,), True)
    denom = sum(unary("exp", binary("sub", s, m)), (s.ndim - 1,), True)
    lse = binary("add", m, unary("log", denom))
    p = unary("exp", binary("sub", s, lse))
    rng = None
    if dropout_p > 0.0:
        rng = _rng_key(seed, q.device)
        p = binary("mul", p, _dropout_z(rng, p.shape, dropout_p))
    return astype(matmul(p, v), dt), reshape(lse, lse.shape[:-1]), rng


def _attention_composite_backward(grad, q, k, v, out, lse, causal, scale, dropout_p=0.0, rng=None):
    dt = q.dtype
    q, k, v, grad, out = (astype(x, float32) for x in (q, k, v, grad, out))
    s = binary("mul", matmul(q, k, transpose_b=True), float(scale))
    p = unary("exp", binary("sub", s, reshape(lse, lse.shape + (1,))))
    if causal:
        p = where(_causal_hidden(q.shape[-2], k.shape[-2], q.device), 0.0, p)
    dp = matmul(grad, v, transpose_b=True)
    pz = p
    if dropout_p > 0.0:
        z = _dropout_z(rng, p.shape, dropout_p)
        pz, dp = binary("mul", p, z), binary("mul", dp, z)
    dv = matmul(pz, grad, transpose_a=True)
    delta = sum(binary("mul", grad, out), (grad.ndim - 1,), True)
    ds = binary("mul", binary("mul", p, binary("sub", dp, delta)), float(scale))
    return astype(matmul(ds, k), dt), astype(matmul(ds, q, transpose_a=True), dt), astype(dv, dt)


def _flat_heads(x: CudaArray) -> tuple:
    """(..., T, D) contiguous -> (batch count, layout strides (batch, head, time)) with one head."""
    T, D = x.shape[-2], x.shape[-1]
    return math.prod(x.shape[:-2]), [T * D, 0, D]


def attention(q: CudaArray, k: CudaArray, v: CudaArray, causal: bool, scale: float, dropout_p: float = 0.0,
              seed: int = 0):
    """q (..., T, D), k (..., S, D), v (..., S, D) -> out (..., T, D), lse (..., T) float32, rng.
    Flash-style kernel: the T x S scores never reach memory (csrc/cuda/attention/). With
    dropout_p > 0 rng is a (1,) int64 array holding the Philox key the kernel used (the seed, moved
    by the graph epoch while capturing), for the backward; without dropout it is None."""
    _check_dropout_p("attention", dropout_p)
    dev = _same_device("attention", q, k, v)
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if not (_attention_fusable(D, q.dtype, q, k, v) and k.dtype is q.dtype and v.dtype is q.dtype
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and v.shape[-1] == D
            and _fused_dropout(q.dtype, dropout_p)):
        return _attention_composite(q, k, v, causal, scale, dropout_p, seed)
    out = _empty(q.shape, q.dtype, dev)
    lse = _empty(q.shape[:-1], float32, dev)
    rng = _empty((1,), int64, dev) if dropout_p > 0.0 else None
    nb, lq = _flat_heads(q)
    _, lk = _flat_heads(k)
    native.attention_forward(dev, _CODE[q.dtype], out.ptr, lse.ptr, q.ptr, k.ptr, v.ptr, lq, lk, lk, lq, nb, 1, T, S, D,
                         bool(causal), float(scale), _precise(), float(dropout_p), int(seed) & 0xFFFFFFFFFFFFFFFF,
                         _ptr(rng))
    return out, lse, rng


def attention_backward(grad: CudaArray, q: CudaArray, k: CudaArray, v: CudaArray, out: CudaArray, lse: CudaArray,
                       causal: bool, scale: float, dropout_p: float = 0.0, rng: CudaArray | None = None):
    """grad (..., T, D) -> dq, dk, dv (the probabilities rebuilt tile by tile from lse; the dropout
    mask redrawn from the forward's rng)."""
    _check_dropout_p("attention_backward", dropout_p)
    if dropout_p > 0.0 and rng is None:
        raise ValueError("attention_backward: dropout_p > 0 needs the rng that attention() returned")
    dev = _same_device("attention_backward", grad, q, k, v)
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if grad.dtype is not q.dtype:
        grad = astype(grad, q.dtype)
    if not (_attention_fusable(D, q.dtype, q, k, v, out, grad) and k.dtype is q.dtype and v.dtype is q.dtype
            and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and v.shape[-1] == D
            and _fused_dropout(q.dtype, dropout_p)):
        return _attention_composite_backward(grad, q, k, v, out, lse, causal, scale, dropout_p, rng)
    nb, lq = _flat_heads(q)
    _, lk = _flat_heads(k)
    if nb * T == 0 or nb * S == 0:
        return full(q.shape, 0.0, q.dtype, dev), full(k.shape, 0.0, k.dtype, dev), full(v.shape, 0.0, v.dtype, dev)
    dq, dk, dv = _empty(q.shape, q.dtype, dev), _empty(k.shape, k.dtype, dev), _empty(v.shape, v.dtype, dev)
    native.attention_backward(dev, _CODE[q.dtype], dq.ptr, dk.ptr, dv.ptr, grad.ptr, q.ptr, k.ptr, v.ptr, out.ptr,
                          lse.ptr, lq, lk, lk, lq, nb, 1, T, S, D, bool(causal), float(scale), _precise(),
                          float(dropout_p), _ptr(rng))
    return dq, dk, dv


def _qkv_layouts(B: int, T: int, C: int, D: int) -> tuple:
    """q, k, v inside a packed (B, T, 3C) array (offsets in elements, layouts), and out (B, T, C)'s layout."""
    lin = [T * 3 * C, D, 3 * C]
    return (0, C, 2 * C), lin, [T * C, D, C]


def attention_qkv(qkv: CudaArray, n_head: int, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0):
    """qkv (B, T, 3C) = q | k | v, each (B, T, H, D) -> out (B, T, C), lse (B, H, T), rng (as attention's;
    the dropout mask's head index is b * H + h): the kernel reads the heads in place and writes them
    side by side, so no permute is needed on either side."""
    _check_dropout_p("attention_qkv", dropout_p)
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    if not (_attention_fusable(D, qkv.dtype, qkv) and _fused_dropout(qkv.dtype, dropout_p)):
        heads = permute(reshape(qkv, (B, T, 3, n_head, D)), (2, 0, 3, 1, 4))  # (3, B, H, T, D)
        q, k, v = (getitem(heads, (i,)) for i in range(3))
        out, lse, rng = attention(q, k, v, causal, scale, dropout_p, seed)
        return reshape(permute(out, (0, 2, 1, 3)), (B, T, C)), lse, rng
    out = _empty((B, T, C), qkv.dtype, qkv.device)
    lse = _empty((B, n_head, T), float32, qkv.device)
    rng = _empty((1,), int64, qkv.device) if dropout_p > 0.0 else None
    (oq, ok, ov), lin, lo = _qkv_layouts(B, T, C, D)
    isz = qkv.dtype.itemsize
    native.attention_forward(qkv.device, _CODE[qkv.dtype], out.ptr, lse.ptr, qkv.ptr + oq * isz, qkv.ptr + ok * isz,
                         qkv.ptr + ov * isz, lin, lin, lin, lo, B, n_head, T, T, D, bool(causal), float(scale),
                         _precise(), float(dropout_p), int(seed) & 0xFFFFFFFFFFFFFFFF, _ptr(rng))
    return out, lse, rng


def attention_qkv_backward(grad: CudaArray, qkv: CudaArray, out: CudaArray, lse: CudaArray, n_head: int,
                           causal: bool, scale: float, dropout_p: float = 0.0, rng: CudaArray | None = None,
                           bias_grad: bool = False):
    """grad (B, T, C) -> dqkv (B, T, 3C), every element written once by the kernel (no zero fill).

    bias_grad: -> (dqkv, db), db (3C,) float32 the gradient of a bias added to qkv (its column sums),
    from the attention's own passes: dq's column sums as dq is written, dv's as the column sums of
    grad, dk's 0 (csrc/cuda/attention/attention.h says why); None where they do not hold or the fused
    kernel does not run (dropout, T not a multiple of 16): the caller sums dqkv then."""
    _check_dropout_p("attention_qkv_backward", dropout_p)
    if dropout_p > 0.0 and rng is None:
        raise ValueError("attention_qkv_backward: dropout_p > 0 needs the rng that attention_qkv() returned")
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    if grad.dtype is not qkv.dtype:
        grad = astype(grad, qkv.dtype)
    if not (_attention_fusable(D, qkv.dtype, qkv, grad, out) and _fused_dropout(qkv.dtype, dropout_p)):
        heads = permute(reshape(qkv, (B, T, 3, n_head, D)), (2, 0, 3, 1, 4))
        q, k, v = (getitem(heads, (i,)) for i in range(3))
        g = permute(reshape(grad, (B, T, n_head, D)), (0, 2, 1, 3))
        o = permute(reshape(out, (B, T, n_head, D)), (0, 2, 1, 3))
        dq, dk, dv = attention_backward(g, q, k, v, o, lse, causal, scale, dropout_p, rng)
        d = concat([reshape(x, (1,) + x.shape) for x in (dq, dk, dv)], 0)  # (3, B, H, T, D)
        dqkv = reshape(permute(d, (1, 3, 0, 2, 4)), (B, T, C3))
        return (dqkv, None) if bias_grad else dqkv
    dqkv = _empty((B, T, C3), qkv.dtype, qkv.device)
    fuse_db = bias_grad and dropout_p == 0.0 and T % 16 == 0 and B * T > 0
    db = _empty((C3,), float32, qkv.device) if fuse_db else None
    if B * T > 0:
        (oq, ok, ov), lin, lo = _qkv_layouts(B, T, C, D)
        isz = qkv.dtype.itemsize
        native.attention_backward(qkv.device, _CODE[qkv.dtype], dqkv.ptr + oq * isz, dqkv.ptr + ok * isz,
                                  dqkv.ptr + ov * isz, grad.ptr, qkv.ptr + oq * isz, qkv.ptr + ok * isz,
                                  qkv.ptr + ov * isz, out.ptr, lse.ptr, lin, lin, lin, lo, B, n_head, T, T, D,
                                  bool(causal), float(scale), _precise(), float(dropout_p), _ptr(rng), _ptr(db))
    return (dqkv, db) if bias_grad else dqkv


# ---- which fused kernels run (benchmarks and tests compare them) ---------------------------------

def attention_wgmma_built() -> bool:
    """Whether engine._C has the sm_90a (wgmma) attention kernels (ENGINE_CUDA_ARCHS with 90a)."""
    return bool(native.attention_wgmma_built())


def attention_wgmma_forward(enabled: bool) -> bool:
    """Use the wgmma forward kernel where it applies (else mma.sync); returns the previous setting."""
    return native.attention_wgmma_forward(enabled)


def attention_wgmma_backward(enabled: bool) -> bool:
    """Use the wgmma backward kernel where it applies (else mma.sync); returns the previous setting."""
    return native.attention_wgmma_backward(enabled)


# forward kernels at head dims 32, 64 and 128: consumer warpgroups x keys a tile of the warp-specialised
# ones, a block a work item or at most a block an SM walking them (dynamic: each block taking the next
# unclaimed item; turns: dynamic, the consumers taking turns at the tensor cores)
FORWARD_KERNELS = {"by shape": -1, "cp.async 2x64": 0, "ws 2x128": 1, "ws 3x128": 2, "ws 2x64": 3, "ws 3x64": 4,
                   "ws 2x128 dynamic": 9, "ws 3x128 dynamic": 10, "ws 2x64 dynamic": 11,
                   "ws 3x64 dynamic": 12, "ws 2x128 turns": 13, "ws 3x128 turns": 14, "ws 2x64 turns": 15,
                   "ws 3x64 turns": 16}


def attention_wgmma_forward_kernel(kernel: int) -> int:
    """Which Hopper forward kernel runs at head dims 32, 64 and 128 (a value of FORWARD_KERNELS: -1, the
    default, chooses by shape; 0 is the two warpgroups loading with cp.async, 1-16 the warp-specialised
    ones fed by TMA); returns the previous."""
    if kernel not in FORWARD_KERNELS.values():
        raise ValueError(f"attention_wgmma_forward_kernel: {kernel} is not one of {sorted(FORWARD_KERNELS.values())}")
    return native.attention_wgmma_forward_kernel(int(kernel))


# backward kernels at head dims 64 and 128: consumer warpgroups (of 64 keys each) of the warp-specialised
# ones, dQ added by atomics, by each consumer's bulk reductions of whole rows (head dim 64) or summed
# over the consumers in shared memory first (summed-dq: one bulk reduction a query tile), or split
# by columns between the two consumers (split-dq, head dim 128 only: each consumer's 64 columns over
# both consumers' keys, added by atomics or by bulk reductions of rows), or (q128 split-dq, head dim 64
# only) over query tiles of 128 split by rows between the two consumers (each consumer's 64 queries over
# both consumers' keys), a block a work item or at most a block an SM walking them (dynamic: each block
# taking the next unclaimed item); overlap: FlashAttention-3's order of a tile's steps (P computed while dP's
# product runs, dQ handed off while dK's runs); tma-dq: dQ by TMA tensor reductions of tiles staged where
# the consumer's next dS^T goes (head dim 64) or in 16 KB of its own (head dim 128)
BACKWARD_KERNELS = {"by shape": -1, "cp.async 1x64": 0, "ws 3x64": 1, "ws 2x64": 2, "ws 3x64 bulk-dq": 9,
                    "ws 2x64 bulk-dq": 10, "ws 2x64 dynamic": 18, "ws 3x64 bulk-dq dynamic": 25,
                    "ws 3x64 summed-dq": 41, "ws 2x64 summed-dq": 42, "ws 3x64 summed-dq dynamic": 57,
                    "ws 2x64 split-dq": 66, "ws 2x64 split-dq bulk": 74, "ws 2x64 split-dq dynamic": 82,
                    "ws 2x64 q128 split-dq": 130, "ws 2x64 q128 split-dq bulk": 138,
                    "ws 2x64 q128 split-dq dynamic": 146, "ws 3x64 summed-dq dynamic overlap": 313,
                    "ws 2x64 split-dq bulk overlap": 330, "ws 2x64 q128 split-dq overlap": 386,
                    "ws 2x64 q128 split-dq bulk overlap": 394, "ws 2x64 q128 split-dq dynamic overlap": 402,
                    "ws 2x64 split-dq bulk overlap tma-dq": 2378,
                    "ws 2x64 q128 split-dq dynamic overlap tma-dq": 2450}


def attention_wgmma_backward_kernel(kernel: int) -> int:
    """Which Hopper backward kernel runs at head dims 64 and 128 (a value of BACKWARD_KERNELS: -1, the
    default, chooses by shape; 0 is one warpgroup a block loading with cp.async, the others the
    warp-specialised ones fed by TMA); returns the previous."""
    if kernel not in BACKWARD_KERNELS.values():
        raise ValueError(f"attention_wgmma_backward_kernel: {kernel} is not one of "
                         f"{sorted(BACKWARD_KERNELS.values())}")
    return native.attention_wgmma_backward_kernel(int(kernel))
