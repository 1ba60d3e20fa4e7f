"""Attention and transformer building blocks: MultiHeadAttention, a pre-LN TransformerBlock,
TransformerEncoder, positional encodings and TransformerLM."""
from __future__ import annotations

import math

import numpy as np

from ..factories import arange
from ..methods.shape import cat
from ..tensor import Tensor, tensor
from . import functional as F
from .layers import Dropout, Embedding, LayerNorm, Linear
from .module import Module, ModuleList

causal_mask = F.causal_mask


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer: k, v (B, H, S, D)."""

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else cat([self.k, k], dim=-2)
        self.v = v if self.v is None else cat([self.v, v], dim=-2)
        return self.k, self.v


def project_bias_deferred(linear: Linear, dropout: Dropout, x: Tensor) -> tuple[Tensor, Tensor | None]:
    """dropout(linear(x)) as (out, bias), out + bias being it: the layer's bias left to the caller's
    next op, F.add_layer_norm's residual_bias, so that on the GPU the bias's gradient is summed by the
    layer norm's backward rather than by a pass of its own over the gradient. bias is None where it
    cannot wait (then out has it): a layer without a bias, dropout at work after the layer, an FP8
    layer (whose bias-gradient pass also writes the gradient's FP8 codes), or a layer whose class
    has a forward of its own (which this would bypass)."""
    if not _bias_can_move(linear) or (dropout.training and dropout.p > 0):
        return dropout(linear(x)), None
    return F.linear(x, linear.weight, None), linear.bias


def _plain(linear: Linear) -> bool:
    """Whether a fused op may run this layer itself: not an FP8 layer (whose bias-gradient pass also
    writes the gradient's FP8 codes), and its class has no forward of its own (which the op would bypass)."""
    return linear.fp8 is None and type(linear).forward is Linear.forward


def _bias_can_move(linear: Linear) -> bool:
    """Whether a fused op may take this layer's weight and bias itself (_plain, with a bias)."""
    return linear.bias is not None and _plain(linear)


def add_deferred(x: Tensor, pending: tuple[Tensor, Tensor | None]) -> Tensor:
    """x + out (+ bias) for pending = (out, bias) of project_bias_deferred."""
    out, bias = pending
    return x + out if bias is None else x + out + bias


# The fused ops whose backward folds a gradient pass into another run from these widths (n_embd):
# F.projected_self_attention in MultiHeadAttention, F.mlp in MLP. On an H100 (20th session, same run)
# the two took 0.45 ms off gpt2_124m's step (width 768: 30.07 against 30.52 ms; the attention's part
# about 0.1, the MLP's 0.33). At shakespeare_char's shape (width 384; bench/fused_width_sweep.py, 24th
# session, three rounds) the attention's took 0.04 ms off the step in every round (4.201-4.237 against
# 4.252-4.264 ms) and the MLP's added 0.05 (4.307-4.312). Between 384 and 768 neither was measured.
FUSED_ATTENTION_MIN_WIDTH = 384
FUSED_MLP_MIN_WIDTH = 768


class MultiHeadAttention(Module):
    """Self-attention with one fused q/k/v projection.  x (B, T, C) -> (B, T, C).

    Dropout on the attention weights and on the output (GPT-2's attn and residual dropout)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, causal: bool = True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"MultiHeadAttention: n_embd {n_embd} must be divisible by n_head {n_head}")
        self.n_embd, self.n_head, self.causal = n_embd, n_head, causal
        self.c_attn = Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = dropout
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Tensor, cache: KVCache | None = None, attn_mask: Tensor | None = None) -> Tensor:
        return self.resid_dropout(self.c_proj(self.attend(x, cache, attn_mask)))

    def forward_bias_deferred(self, x: Tensor, cache: KVCache | None = None,
                              attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """forward(x) as (out, c_proj's bias or None), their sum being it (project_bias_deferred)."""
        return project_bias_deferred(self.c_proj, self.resid_dropout, self.attend(x, cache, attn_mask))

    def attend(self, x: Tensor, cache: KVCache | None = None, attn_mask: Tensor | None = None) -> Tensor:
        """The heads' attention, before the output projection.  x (B, T, C) -> (B, T, C)."""
        B, T, C = x.shape
        H, D = self.n_head, C // self.n_head
        dropout_p = self.attn_dropout if self.training else 0.0
        if cache is None and attn_mask is None and dropout_p < 1.0 and x.device.type == "cuda":
            # fused: (B, T, 3C) -> (B, T, C) in one op, heads read and written in place, attention
            # dropout inside the kernel. Not on the CPU, whose numpy reference of this op recomputes
            # the scores in the backward: there the split-heads path below is 25% faster per
            # training step (bench/cpu_step.py). With c_attn's bias in the op too, the attention's
            # backward gives that bias's gradient (F.projected_self_attention)
            if C >= FUSED_ATTENTION_MIN_WIDTH and _bias_can_move(self.c_attn):
                return F.projected_self_attention(x, self.c_attn.weight, self.c_attn.bias, H, is_causal=self.causal,
                                                  dropout_p=dropout_p)
            return F.self_attention(self.c_attn(x), H, is_causal=self.causal, dropout_p=dropout_p)
        qkv = self.c_attn(x).reshape(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # (3, B, H, T, D)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, S, D) with S = cached + T
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=self.causal,
                                           dropout_p=dropout_p)
        return y.permute(0, 2, 1, 3).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)


class MLP(Module):
    """(B, T, C) -> (B, T, 4C) -> GELU -> (B, T, C), dropout on the output."""

    def __init__(self, n_embd: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.c_fc = Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.hidden(x)))

    def forward_bias_deferred(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """forward(x) as (out, c_proj's bias or None), their sum being it (project_bias_deferred). Both
        layers in one op (F.mlp, whose backward runs the GELU's in c_proj's dx GEMM) where they are plain."""
        fc, proj = self.c_fc, self.c_proj
        if not (fc.in_features >= FUSED_MLP_MIN_WIDTH and _plain(fc) and _plain(proj)):
            return project_bias_deferred(proj, self.dropout, self.hidden(x))
        if _bias_can_move(proj) and not (self.dropout.training and self.dropout.p > 0):
            return F.mlp(x, fc.weight, fc.bias, proj.weight), proj.bias
        return self.dropout(F.mlp(x, fc.weight, fc.bias, proj.weight, proj.bias)), None

    def hidden(self, x: Tensor) -> Tensor:
        """gelu(c_fc(x)), (B, T, C) -> (B, T, 4C): one op, on the GPU in bf16 the GELU in the matmul's epilogue."""
        fc = self.c_fc
        return F.linear(x, fc.weight, fc.bias, activation="gelu", fp8=fc.fp8)


class TransformerBlock(Module):
    """Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x)).  (B, T, C) -> (B, T, C)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True, causal: bool = True):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = MultiHeadAttention(n_embd, n_head, dropout, bias, causal)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: Tensor, cache: KVCache | None = None, attn_mask: Tensor | None = None) -> Tensor:
        return add_deferred(*self.pending_forward(x, None, cache, attn_mask))

    def pending_forward(self, x: Tensor, pending: tuple | None = None, cache: KVCache | None = None,
                        attn_mask: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, Tensor | None]]:
        """The block with its last residual add left to its successor: (stream, (mlp output, its
        bias or None)), whose sum is forward(x + pending's sum). `pending`, the previous block's, is
        added to x in ln_1's op (F.add_layer_norm), so a stack of blocks has no residual add of its
        own; the projections' biases ride along into the layer norms' ops (project_bias_deferred)."""
        if pending is None:
            h = self.ln_1(x)
        else:
            x, h = self.ln_1.add_forward(x, *pending)  # x + pending, ln_1 of it
        x, h = self.ln_2.add_forward(x, *self.attn.forward_bias_deferred(h, cache, attn_mask))  # x + attn(...)
        return x, self.mlp.forward_bias_deferred(h)


def run_blocks(blocks, x: Tensor, final_norm: LayerNorm | None, caches: list | None = None,
               attn_mask: Tensor | None = None) -> Tensor:
    """x through `blocks` then `final_norm` (if any), each residual add in the next layer norm's op."""
    pending = None
    for i, block in enumerate(blocks):
        x, pending = block.pending_forward(x, pending, None if caches is None else caches[i], attn_mask)
    if pending is None:
        return final_norm(x) if final_norm is not None else x
    if final_norm is None:
        return add_deferred(x, pending)
    return final_norm.add_forward(x, *pending)[1]


class TransformerEncoder(Module):
    """A stack of TransformerBlocks with an optional final LayerNorm."""

    def __init__(self, n_layer: int, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = True, final_norm: bool = True):
        super().__init__()
        self.h = ModuleList(TransformerBlock(n_embd, n_head, dropout, bias, causal) for _ in range(n_layer))
        self.ln_f = LayerNorm(n_embd, bias=bias) if final_norm else None

    def forward(self, x: Tensor, caches: list | None = None, attn_mask: Tensor | None = None) -> Tensor:
        return run_blocks(self.h, x, self.ln_f, caches, attn_mask)


def sinusoidal_table(n_positions: int, dim: int) -> np.ndarray:
    """(n_positions, dim): sin on even, cos on odd features, wavelengths up to 10000 * 2 pi."""
    pos = np.arange(n_positions)[:, None]
    freq = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)
    table = np.zeros((n_positions, dim), dtype=np.float32)
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq)[:, : dim // 2]
    return table


class SinusoidalPositionalEncoding(Module):
    """Fixed (not trained) position signal.  positions (T,) -> (T, C)."""

    def __init__(self, max_len: int, n_embd: int):
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", tensor(sinusoidal_table(max_len, n_embd)))

    def forward(self, positions: Tensor) -> Tensor:
        return F.embedding(positions, self.table)


class LearnedPositionalEmbedding(Embedding):
    """A trained table of position vectors.  positions (T,) -> (T, C)."""


class TransformerLM(Module):
    """Token embedding + positional encoding + causal encoder + linear head (untied).

    idx (B, T) -> logits (B, T, vocab_size); with targets, also the mean cross-entropy."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, positional: str = "learned"):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = Embedding(vocab_size, n_embd)
        if positional == "learned":
            self.pos = LearnedPositionalEmbedding(block_size, n_embd)
        elif positional == "sinusoidal":
            self.pos = SinusoidalPositionalEncoding(block_size, n_embd)
        else:
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        self.drop = Dropout(dropout)
        self.encoder = TransformerEncoder(n_layer, n_embd, n_head, dropout, causal=True)
        self.head = Linear(n_embd, vocab_size)

    def forward(self, idx: Tensor, targets: Tensor | None = None):
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.block_size}")
        x = self.drop(self.tok_emb(idx) + self.pos(arange(T, device=idx.device)))
        logits = self.head(self.encoder(x))
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss
