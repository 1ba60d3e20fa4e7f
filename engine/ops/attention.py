"""Fused attention: softmax(q k^T scale) v as one op, forward and backward side by side.

The forward keeps only each query's log-sum-exp; the backward rebuilds the probabilities from it
(flash-attention style on the GPU: the T x S scores never reach memory). With dropout_p > 0 the
probabilities are multiplied by a dropout mask drawn inside the op (Philox, from `seed`); the
forward keeps the backend's `rng` (the key it drew with), so the backward redraws the same mask."""
from __future__ import annotations

from ..autograd import Function


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
