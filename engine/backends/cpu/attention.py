"""Attention primitives of the CPU backend, the reference the fused CUDA kernels are checked
against: scores materialised, dropout masks from the same Philox stream as the kernels'. bf16 q, k,
v: scores, softmax and products in float32, out (and the gradients) rounded to bf16, lse float32."""
from __future__ import annotations

import numpy as np

from .. import philox as _philox
from .bf16 import any_bf16, narrow, widen
from .creation import Array
from .matmul import matmul


_U64 = 0xFFFFFFFFFFFFFFFF


def _causal_hidden(T: int, S: int) -> Array:
    """(T, S) bool, True where query i may NOT see key j: j > i + S - T (aligned bottom-right, so
    T new queries after S - T cached keys see the whole cache)."""
    return np.arange(S)[None, :] > np.arange(T)[:, None] + (S - T)


def attention_dropout_mask(shape: tuple, p: float, seed: int, device_index=None) -> Array:
    """Z (B*H, T, S) float32 of fused attention's dropout with drop probability p: 0 where dropped,
    1/(1-p) where kept. Philox (engine/backends/philox.py): the very mask the CUDA kernels apply
    for this seed outside a graph capture."""
    BH, T, S = shape
    return _philox.attention_dropout_mask(int(seed) & _U64, BH, T, S, p)


def _check_dropout_p(op: str, dropout_p: float) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: dropout_p must be in [0, 1), got {dropout_p}")


def _attention_z(rng: Array, shape: tuple, dropout_p: float, dtype) -> Array:
    """Z (..., T, S) of the dropout drawn under the key in rng (1,) uint64: leading axes are the heads."""
    *lead, T, S = shape
    BH = int(np.prod(lead, dtype=np.int64))
    return _philox.attention_dropout_mask(int(rng[0]), BH, T, S, dropout_p).reshape(shape).astype(dtype, copy=False)


def attention(q: Array, k: Array, v: Array, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0):
    """softmax(q k^T scale) v, fused: q (..., T, D), k (..., S, D), v (..., S, Dv) -> out (..., T, Dv),
    lse (..., T), rng: lse is the log-sum-exp of each query's scaled scores (what the backward needs
    instead of the T x S probabilities; -inf for a query that sees no key, whose output is 0).
    With dropout_p > 0 the probabilities are multiplied by the mask Z (attention_dropout_mask, the
    leading axes flattened to B*H) after the softmax (lse stays the undropped one), and rng is the
    (1,) uint64 key the backward needs; without dropout rng is None.
    This reference materialises the scores; the CUDA kernel never does."""
    _check_dropout_p("attention", dropout_p)
    if any_bf16(q, k, v):
        out, lse, rng = attention(widen(q), widen(k), widen(v), causal, scale, dropout_p, seed)
        return narrow(out, q.dtype), lse, rng
    s = matmul(q, k, transpose_b=True) * np.asarray(scale, dtype=q.dtype)  # (..., T, S)
    if causal:
        s = np.where(_causal_hidden(q.shape[-2], k.shape[-2]), -np.inf, s)
    m = s.max(axis=-1, keepdims=True) if s.shape[-1] else np.full(s.shape[:-1] + (1,), -np.inf, s.dtype)
    m = np.where(np.isfinite(m), m, 0).astype(s.dtype)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(denom > 0, e / denom, 0).astype(s.dtype)
        lse = (m + np.log(denom))[..., 0].astype(s.dtype)
    rng = None
    if dropout_p > 0.0:
        rng = np.array([int(seed) & _U64], dtype=np.uint64)  # outside a capture the key is the seed
        p = p * _attention_z(rng, p.shape, dropout_p, p.dtype)
    return matmul(p, v), lse, rng


def attention_backward(grad: Array, q: Array, k: Array, v: Array, out: Array, lse: Array, causal: bool,
                       scale: float, dropout_p: float = 0.0, rng: Array | None = None):
    """grad (..., T, Dv) of attention's out -> dq, dk, dv; the probabilities are rebuilt from lse.
    With dropout: dv = (P Z)^T grad, dP = (grad v^T) Z, dS = P (dP - rowsum(grad * out)), where Z is
    redrawn from the forward's rng."""
    _check_dropout_p("attention_backward", dropout_p)
    if dropout_p > 0.0 and rng is None:
        raise ValueError("attention_backward: dropout_p > 0 needs the rng that attention() returned")
    if any_bf16(grad, q, k, v, out):
        grads = attention_backward(widen(grad), widen(q), widen(k), widen(v), widen(out), widen(lse), causal, scale,
                                   dropout_p, rng)
        return tuple(narrow(g, q.dtype) for g in grads)
    dt = q.dtype
    s = matmul(q, k, transpose_b=True) * np.asarray(scale, dtype=dt)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - lse[..., None])
    hidden = ~np.isfinite(lse)[..., None]
    if causal:
        hidden = hidden | _causal_hidden(q.shape[-2], k.shape[-2])
    p = np.where(hidden, 0, p).astype(dt)
    grad = np.ascontiguousarray(grad)
    dp = matmul(grad, v, transpose_b=True)  # (..., T, S)
    pz = p
    if dropout_p > 0.0:
        z = _attention_z(rng, p.shape, dropout_p, dt)
        pz, dp = p * z, dp * z
    dv = matmul(pz, grad, transpose_a=True)  # (..., S, T) @ (..., T, Dv)
    delta = (grad * out).sum(axis=-1, keepdims=True)  # = rowsum(P dP): out is the dropped output
    ds = p * (dp - delta) * np.asarray(scale, dtype=dt)
    return matmul(ds, k), matmul(ds, q, transpose_a=True), dv


def attention_qkv(qkv: Array, n_head: int, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0):
    """Self-attention straight from a packed projection: qkv (B, T, 3C) holding q | k | v, each
    (B, T, H, D) -> out (B, T, C) (heads side by side, ready for the output projection), lse (B, H, T),
    rng (attention's; the dropout mask's head index is b * H + h)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    heads = qkv.reshape(B, T, 3, n_head, C // n_head).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, D)
    out, lse, rng = attention(heads[0], heads[1], heads[2], causal, scale, dropout_p, seed)
    return np.ascontiguousarray(out.transpose(0, 2, 1, 3)).reshape(B, T, C), lse, rng


def attention_qkv_backward(grad: Array, qkv: Array, out: Array, lse: Array, n_head: int, causal: bool,
                           scale: float, dropout_p: float = 0.0, rng: Array | None = None, bias_grad: bool = False):
    """grad (B, T, C) of attention_qkv's out -> dqkv (B, T, 3C). bias_grad: -> (dqkv, db), db (3C,) the
    gradient of a bias added to qkv (its column sums) by the identities the GPU kernels use, the
    reference for them: dq's column sums, 0 for the keys (a constant added to a query's scores changes
    no probability), grad's column sums for the values (each query's probabilities sum to 1); None
    with dropout, which breaks both."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    heads = qkv.reshape(B, T, 3, n_head, D).transpose(2, 0, 3, 1, 4)
    g = grad.reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
    o = out.reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
    dq, dk, dv = attention_backward(g, heads[0], heads[1], heads[2], o, lse, causal, scale, dropout_p, rng)
    dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, C3)
    if not bias_grad:
        return dqkv
    if dropout_p > 0.0:
        return dqkv, None
    db_q = dq.transpose(0, 2, 1, 3).reshape(B * T, C).sum(axis=0)  # (B, H, T, D) -> (B*T, C) -> (C,)
    db_v = grad.reshape(B * T, C).sum(axis=0)
    return dqkv, np.concatenate([db_q, np.zeros_like(db_q), db_v]).astype(dqkv.dtype)
