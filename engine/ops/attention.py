"""Fused attention: softmax(q k^T scale) v as one op, forward and backward side by side.

The forward keeps only each query's log-sum-exp; the backward rebuilds the probabilities from it
(flash-attention style on the GPU: the T x S scores never reach memory). With dropout_p > 0 the
probabilities are multiplied by a dropout mask drawn inside the op (Philox, from `seed`); the
forward keeps the backend's `rng` (the key it drew with), so the backward redraws the same mask."""
from __future__ import annotations

from ..autograd import Function
from .matmul import Linear


class Attention(Function):
    """q (..., T, D), k (..., S, D), v (..., S, D) -> (..., T, D); causal masks aligned bottom-right."""

    def forward(self, q, k, v, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0):
        self.q, self.k, self.v, self.causal, self.scale, self.dropout_p = q, k, v, causal, scale, dropout_p
        self.out, self.lse, self.rng = self.be.attention(q, k, v, causal, scale, dropout_p=dropout_p, seed=seed)
        return self.out

    def backward(self, g):
        return self.be.attention_backward(g, self.q, self.k, self.v, self.out, self.lse, self.causal, self.scale,
                                          dropout_p=self.dropout_p, rng=self.rng)


class AttentionQKV(Function):
    """Self-attention from a packed projection: qkv (B, T, 3C) -> (B, T, C) with n_head heads.

    Replaces reshape + permute + three slices + attention + permute back: the backward writes one
    (B, T, 3C) gradient directly instead of zero-filling three (B, T, 3C) buffers and adding them."""

    def forward(self, qkv, n_head: int, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0):
        self.qkv, self.n_head, self.causal, self.scale, self.dropout_p = qkv, n_head, causal, scale, dropout_p
        self.out, self.lse, self.rng = self.be.attention_qkv(qkv, n_head, causal, scale, dropout_p=dropout_p,
                                                             seed=seed)
        return self.out

    def backward(self, g):
        return self.be.attention_qkv_backward(g, self.qkv, self.out, self.lse, self.n_head, self.causal, self.scale,
                                              dropout_p=self.dropout_p, rng=self.rng)


class ProjectedSelfAttention(Function):
    """Self-attention from its packed projection: x (B, T, I), w (3C, I), b (3C,) -> (B, T, C), the same
    as AttentionQKV on Linear's qkv = x w^T + b (both run inside, as they would apart), for the bias's
    gradient: the attention's backward gives it (backend attention_qkv_backward's bias_grad: dq's
    column sums as dq is written, dv's as dout's, dk's 0), so the Linear's backward skips its pass over
    dqkv. Where the backend gives none (dropout, a shape the kernels do not take) the Linear sums it.
    compute_dtype: Linear's (autocast's bf16 over float32 master weights)."""

    def forward(self, x, w, b, n_head: int, causal: bool, scale: float, dropout_p: float = 0.0, seed: int = 0,
                compute_dtype=None):
        self.proj, self.attn = self.inner(Linear), self.inner(AttentionQKV)
        qkv = self.proj.forward(x, w, b, None, compute_dtype)
        return self.attn.forward(qkv, n_head, causal, scale, dropout_p, seed)

    def backward(self, g):
        a, need = self.attn, self.needs_input_grad
        res = self.be.attention_qkv_backward(g, a.qkv, a.out, a.lse, a.n_head, a.causal, a.scale,
                                             dropout_p=a.dropout_p, rng=a.rng, bias_grad=need[2])
        dqkv, db = res if need[2] else (res, None)  # (dqkv, db or None) when the bias's gradient is asked
        self.proj.parents = self.parents
        self.proj.needs_input_grad = (need[0], need[1], need[2] and db is None)
        dx, dw, db_proj = self.proj.backward(dqkv)
        if db is None:
            return dx, dw, db_proj
        want = self.proj.param_dtype or self.be.dtype_of(a.qkv)  # the bias's dtype
        return dx, dw, db if self.be.dtype_of(db) is want else self.be.astype(db, want)
