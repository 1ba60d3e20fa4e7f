"""engine.nn.functional (import as F): the functional forms of the layers, as in PyTorch."""
from __future__ import annotations

import math

import numpy as np

from .. import dtypes
from ..autocast import autocast
from ..autocast import cast_for as _autocast_dtype
from ..autograd import is_grad_enabled
from ..ops import elementwise as E
from ..ops import nn as N
from ..ops.attention import Attention as _Attention, AttentionQKV as _AttentionQKV
from ..ops.attention import ProjectedSelfAttention as _ProjectedSelfAttention
from ..ops.classifier import LinearCrossEntropy as _LinearCrossEntropy
from ..ops.matmul import Linear as _Linear
from ..ops.mlp import MLP as _MLP
from ..random import next_seed
from ..methods.arithmetic import where
from ..tensor import Tensor, install_methods, tensor


def _autocast_operands(x: Tensor, weight: Tensor, bias: Tensor | None = None):
    """Under autocast: x in bf16, and float32 master weights left as they are, with compute_dtype bf16
    (the op casts them for its GEMM and writes their gradients in float32 itself, with no cast kernel
    in the backward); weights of another dtype (a model converted to bf16) cast plainly, compute_dtype
    None. Outside autocast nothing changes. -> (x, weight, bias, compute_dtype)."""
    dt = _autocast_dtype(x)
    if dt is None:
        return x, weight, bias, None
    x = x.type(dt)
    if weight.dtype is not dtypes.float32 or (bias is not None and bias.dtype is not dtypes.float32):
        return x, weight.type(dt), (bias.type(dt) if bias is not None else None), None
    return x, weight, bias, dt


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None,
           fp8=None) -> Tensor:
    """x (..., in) @ weight (out, in)^T + bias (out,) -> (..., out), then `activation`: None or "gelu"
    (tanh GELU, the same as gelu(linear(x, weight, bias)) in one op; on the GPU bias and GELU are
    folded into the matmul). fp8: the layer's engine.fp8.Fp8State, which runs the forward and input
    gradient GEMMs in FP8 under bf16 autocast with float32 weights (engine.fp8); ignored otherwise."""
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear: input has {x.shape[-1]} features (shape {x.shape}), "
                         f"but the weight expects {weight.shape[-1]} (weight shape {weight.shape})")
    if activation not in (None, "gelu"):
        raise ValueError(f"linear: activation must be None or 'gelu', got {activation!r}")
    x, weight, bias, dt = _autocast_operands(x, weight, bias)
    args = (x, weight) if bias is None else (x, weight, bias)
    return _Linear.apply(*args, activation=activation, compute_dtype=dt,
                         fp8=fp8 if dt is dtypes.bfloat16 else None)


def mlp(x: Tensor, fc_weight: Tensor, fc_bias: Tensor | None, proj_weight: Tensor,
        proj_bias: Tensor | None = None) -> Tensor:
    """linear(gelu(linear(x, fc_weight, fc_bias)), proj_weight, proj_bias) as one op: x (..., I),
    fc_weight (H, I), proj_weight (O, H) -> (..., O). The same values and gradients; the op's backward
    takes the GELU's backward into the second layer's dx GEMM (on the GPU in bf16, cuBLASLt's DGELU
    epilogue), so the hidden layer's output gradient is never written out."""
    if x.shape[-1] != fc_weight.shape[-1] or proj_weight.shape[-1] != fc_weight.shape[0]:
        raise ValueError(f"mlp: x (..., I), fc_weight (H, I) and proj_weight (O, H) do not fit: x {x.shape}, "
                         f"fc_weight {fc_weight.shape}, proj_weight {proj_weight.shape}")
    x, fc_weight, fc_bias, dt = _autocast_operands(x, fc_weight, fc_bias)
    if dt is None and _autocast_dtype(x) is not None:  # weights of another dtype, cast plainly as F.linear
        proj_weight = proj_weight.type(x.dtype)
        proj_bias = proj_bias.type(x.dtype) if proj_bias is not None else None
    return _MLP.apply(x, fc_weight, fc_bias, proj_weight, proj_bias, compute_dtype=dt)


def relu(x: Tensor) -> Tensor:
    return E.Relu.apply(x)


def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU, tanh approximation (GPT-2's); approximate='none' is not offered."""
    if approximate != "tanh":
        raise ValueError("gelu: only approximate='tanh' is implemented")
    return E.Gelu.apply(x)


def sigmoid(x: Tensor) -> Tensor:
    return E.Sigmoid.apply(x)


def tanh(x: Tensor) -> Tensor:
    return E.Tanh.apply(x)


def _along_last(fn, x: Tensor, dim: int) -> Tensor:
    """Apply a last-axis op along `dim` by moving `dim` last and back."""
    dim = dim % x.ndim
    if dim == x.ndim - 1:
        return fn.apply(x)
    return fn.apply(x.transpose(dim, -1)).transpose(dim, -1)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    return _along_last(N.Softmax, x, dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    return _along_last(N.LogSoftmax, x, dim)


def layer_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the last dim (fused forward and backward). x (..., C) -> (..., C)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(normalized_shape) != 1 or x.shape[-1] != normalized_shape[0]:
        raise ValueError(f"layer_norm: normalises over the last dim only; got normalized_shape {normalized_shape} "
                         f"for input shape {x.shape}")
    args = [x] + [t for t in (weight, bias) if t is not None]
    if weight is None and bias is not None:
        raise ValueError("layer_norm: a bias without a weight is not supported")
    return N.LayerNorm.apply(*args, eps=eps) if len(args) > 1 else N.LayerNorm.apply(x, None, None, eps=eps)


def add_layer_norm(x: Tensor, residual: Tensor, normalized_shape, weight: Tensor | None = None,
                   bias: Tensor | None = None, eps: float = 1e-5,
                   residual_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(s, layer_norm(s)) with s = x + residual (+ residual_bias), in one op: the residual stream of a
    pre-LN transformer and the next sublayer's input (one pass on the GPU instead of an add and a layer
    norm, and in the backward the stream's gradient is added inside the layer-norm kernel).
    x, residual (..., C); residual_bias (C,): the bias of the linear layer that made residual, run
    without it, whose gradient the layer norm's backward then sums with no pass of its own."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(normalized_shape) != 1 or x.shape[-1] != normalized_shape[0]:
        raise ValueError(f"add_layer_norm: normalises over the last dim only; got normalized_shape "
                         f"{normalized_shape} for input shape {x.shape}")
    if x.shape != residual.shape:
        raise ValueError(f"add_layer_norm: x {x.shape} and residual {residual.shape} must have one shape")
    if weight is None and bias is not None:
        raise ValueError("add_layer_norm: a bias without a weight is not supported")
    if residual_bias is not None and tuple(residual_bias.shape) != (x.shape[-1],):
        raise ValueError(f"add_layer_norm: residual_bias must have shape ({x.shape[-1]},), got {residual_bias.shape}")
    return N.AddLayerNorm.apply(x, residual, weight, bias, residual_bias, eps=eps)


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy, fused. logits (N, V) or (..., V); targets (N,) or (...) int64.

    Rows whose target is `ignore_index` contribute nothing; 'mean' divides by the rows kept."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {logits.shape} need targets of shape {logits.shape[:-1]}, "
                         f"got {targets.shape}")
    if targets.dtype != dtypes.int64:
        raise TypeError(f"cross_entropy: targets must be int64 class indices, got {targets.dtype}")
    V = logits.shape[-1]
    _check_targets_in_range("cross_entropy", targets, V, ignore_index)
    losses = N.CrossEntropy.apply(logits.reshape(-1, V), targets.reshape(-1), ignore_index=ignore_index)
    if reduction == "none":
        return losses.reshape(targets.shape)
    if reduction == "sum":
        return losses.sum()
    if reduction != "mean":
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    kept = (targets.reshape(-1) != ignore_index).type(losses.dtype).sum()  # stays on the device: no host sync
    return losses.sum() / kept


def _check_targets_in_range(op: str, targets: Tensor, V: int, ignore_index: int) -> None:
    """On the CPU, raise for a target outside 0..V-1 (on the GPU that would need a host sync: the
    kernels give a NaN loss instead)."""
    if targets.device.type == "cpu":
        t = targets.numpy()
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        if bad.any():
            raise IndexError(f"{op}: target {int(t[bad][0])} is out of range for {V} classes")


def linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -100,
                         reduction: str = "mean", fp8=None) -> Tensor:
    """cross_entropy(linear(x, weight), targets, ...) as one op that never keeps the logits: a language
    model's classifier. x (..., C), weight (V, C), targets (...) int64 -> loss () float32.

    No bias (GPT's head has none): use linear + cross_entropy for one, or for reduction 'none'.
    reduction 'mean' divides by the rows kept (target != ignore_index), 'sum' does not. The forward
    also computes the gradients of x and weight (those that require grad) and drops the (N, V)
    logits, so peak memory is the logits once and nothing of size N x V is kept for the backward.
    Under autocast x and weight run in bf16 (a float32 weight's gradient comes out in float32, as in
    F.linear); the loss and the softmax statistics stay float32. fp8 (the head's engine.fp8.Fp8State,
    under bf16 autocast with a float32 weight): the logits' GEMM and dx's in FP8, as F.linear's."""
    if weight.ndim != 2 or x.shape[-1] != weight.shape[-1]:
        raise ValueError(f"linear_cross_entropy: x (..., C) and weight (V, C) do not fit: x {x.shape}, "
                         f"weight {weight.shape}")
    if x.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: x {x.shape} needs targets of shape {x.shape[:-1]}, "
                         f"got {targets.shape}")
    if targets.dtype != dtypes.int64:
        raise TypeError(f"linear_cross_entropy: targets must be int64 class indices, got {targets.dtype}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r} "
                         "(per-row losses: F.cross_entropy(F.linear(x, weight), targets, reduction='none'))")
    _check_targets_in_range("linear_cross_entropy", targets, weight.shape[0], ignore_index)
    x, weight, _, dt = _autocast_operands(x, weight)
    grad = is_grad_enabled()
    return _LinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), weight, targets.reshape(-1),
                                     ignore_index=int(ignore_index), reduction=reduction, compute_dtype=dt,
                                     need_dx=grad and x.requires_grad, need_dweight=grad and weight.requires_grad,
                                     fp8=fp8 if dt is dtypes.bfloat16 else None)


def embedding(idx: Tensor, weight: Tensor) -> Tensor:
    """idx (...) int64 into weight (V, C) -> (..., C)."""
    if idx.dtype != dtypes.int64:
        raise TypeError(f"embedding: indices must be int64, got {idx.dtype}")
    _check_indices("embedding", idx, weight.shape[0])
    out = N.Embedding.apply(weight, idx)
    dt = _autocast_dtype(out)
    return out.type(dt) if dt is not None else out


def _check_indices(op: str, idx: Tensor, num: int) -> None:
    """An index outside 0..num-1 raises here for CPU indices (on the GPU it gives a NaN row: no host sync)."""
    if idx.device.type == "cpu" and idx.numel():
        i = idx.numpy()
        lo, hi = int(i.min()), int(i.max())
        if lo < 0 or hi >= num:
            raise IndexError(f"{op}: index {hi if hi >= num else lo} is out of range for {num} embeddings "
                             f"(valid: 0..{num - 1})")


def embedding_with_positions(idx: Tensor, weight: Tensor, pos_weight: Tensor, start: int = 0) -> Tensor:
    """embedding(idx, weight) + embedding(arange(start, start + T), pos_weight) as one op: idx (B, T)
    int64, weight (V, C), pos_weight (P, C) -> (B, T, C), a language model's input. Under autocast the
    float32 sum is rounded to bf16 once (on the GPU one kernel where two lookups, two casts and an add
    ran)."""
    if idx.dtype != dtypes.int64 or idx.ndim != 2:
        raise TypeError(f"embedding_with_positions: idx must be (B, T) int64, got {idx.dtype} of shape {idx.shape}")
    if weight.ndim != 2 or pos_weight.ndim != 2 or weight.shape[1] != pos_weight.shape[1]:
        raise ValueError(f"embedding_with_positions: weight (V, C) and pos_weight (P, C) do not fit: "
                         f"{weight.shape}, {pos_weight.shape}")
    T = idx.shape[1]
    if start < 0 or start + T > pos_weight.shape[0]:
        raise ValueError(f"embedding_with_positions: positions {start}..{start + T - 1} are out of range for "
                         f"{pos_weight.shape[0]} positions")
    _check_indices("embedding_with_positions", idx, weight.shape[0])
    dt = _autocast_dtype(weight)
    return N.EmbeddingPositions.apply(weight, pos_weight, idx, start=int(start), out_dtype=dt)


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Inverted dropout from the engine's seeded generator (engine.manual_seed)."""
    if not 0.0 <= p < 1.0:
        if p == 1.0 and training:
            return x * 0.0
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    return N.Dropout.apply(x, p=p, seed=next_seed())


_mask_cache: dict = {}


def causal_mask(T: int, S: int | None = None, device="cpu") -> Tensor:
    """Bool (T, S) mask, True where query i may NOT attend to key j (j > i + S - T).

    Aligned bottom-right, so T new queries after S - T cached keys see all of the cache."""
    S = T if S is None else S
    key = (T, S, str(device))
    mask = _mask_cache.get(key)
    if mask is None:
        i = np.arange(T)[:, None]
        j = np.arange(S)[None, :]
        mask = tensor(j > i + (S - T), dtype=dtypes.bool_, device=device)
        if len(_mask_cache) > 64:
            _mask_cache.clear()
        _mask_cache[key] = mask
    return mask


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v.  q (..., T, D), k (..., S, D), v (..., S, Dv) -> (..., T, Dv).

    attn_mask: bool (True = may attend, as in PyTorch) or additive float, broadcast to (..., T, S).
    dropout_p: inverted dropout on the attention weights (always applied, as in PyTorch: pass 0.0
    outside training); drawn inside the fused op, seeded from the engine's generator."""
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         "(need q (..., T, D), k (..., S, D), v (..., S, Dv))")
    T, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dt = _autocast_dtype(q)
    if dt is not None:
        q, k, v = q.type(dt), k.type(dt), v.type(dt)
    if (attn_mask is None and 0.0 <= dropout_p < 1.0 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            and v.shape[-1] == q.shape[-1] and q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point):
        # one fused op (flash-style on the GPU, dropout included): no (..., T, S) scores kept for the backward
        seed = next_seed() if dropout_p > 0.0 else 0
        return _Attention.apply(q, k, v, causal=bool(is_causal), scale=float(scale), dropout_p=float(dropout_p),
                                seed=seed)
    if q.dtype == dtypes.bfloat16:  # the unfused path keeps scores and softmax in float32
        if attn_mask is not None and attn_mask.dtype.is_floating_point:
            attn_mask = attn_mask.float()  # an additive bf16 mask joins the float32 scores
        with autocast(q.device.type, enabled=False):  # else the float32 inputs would be cast back to bf16
            out = scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask, dropout_p, is_causal, scale)
        return out.type(dtypes.bfloat16)
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if is_causal:
        scores = where(causal_mask(T, S, q.device), float("-inf"), scores)
    if attn_mask is not None:
        if attn_mask.dtype == dtypes.bool_:
            scores = where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    att = softmax(scores, -1)
    if dropout_p > 0.0:
        att = dropout(att, dropout_p, True)
    return att @ v


def self_attention(qkv: Tensor, n_head: int, is_causal: bool = True, scale: float | None = None,
                   dropout_p: float = 0.0) -> Tensor:
    """Multi-head self-attention straight from a packed projection (no mask beyond causal).

    qkv (B, T, 3C) = q | k | v, each (B, T, n_head, C / n_head) -> (B, T, C), heads side by side.
    The same as splitting the heads, calling scaled_dot_product_attention and merging them back, in
    one op: no permutes, and one (B, T, 3C) gradient in the backward. dropout_p: dropout on the
    attention weights inside the op (always applied: pass 0.0 outside training), in [0, 1)."""
    if qkv.ndim != 3 or qkv.shape[-1] % 3 or (qkv.shape[-1] // 3) % n_head:
        raise ValueError(f"self_attention: qkv must be (B, T, 3C) with C divisible by n_head={n_head}, "
                         f"got shape {qkv.shape}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"self_attention: dropout_p must be in [0, 1), got {dropout_p}")
    D = qkv.shape[-1] // 3 // n_head
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dt = _autocast_dtype(qkv)
    if dt is not None:
        qkv = qkv.type(dt)
    seed = next_seed() if dropout_p > 0.0 else 0
    return _AttentionQKV.apply(qkv, n_head=int(n_head), causal=bool(is_causal), scale=float(scale),
                               dropout_p=float(dropout_p), seed=seed)


def projected_self_attention(x: Tensor, weight: Tensor, bias: Tensor, n_head: int, is_causal: bool = True,
                             scale: float | None = None, dropout_p: float = 0.0) -> Tensor:
    """self_attention(linear(x, weight, bias), n_head, ...) as one op: x (B, T, I), weight (3C, I),
    bias (3C,) -> (B, T, C). The same values and gradients; on the GPU the bias's gradient comes from
    the attention's backward instead of a pass over the (B, T, 3C) gradient of its own (without
    dropout, T a multiple of 16)."""
    if x.ndim != 3 or x.shape[-1] != weight.shape[-1] or weight.ndim != 2 or bias.shape != (weight.shape[0],):
        raise ValueError(f"projected_self_attention: x (B, T, I), weight (3C, I) and bias (3C,) do not fit: "
                         f"x {x.shape}, weight {weight.shape}, bias {bias.shape}")
    if weight.shape[0] % 3 or (weight.shape[0] // 3) % n_head:
        raise ValueError(f"projected_self_attention: weight must be (3C, I) with C divisible by n_head={n_head}, "
                         f"got shape {weight.shape}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"projected_self_attention: dropout_p must be in [0, 1), got {dropout_p}")
    D = weight.shape[0] // 3 // n_head
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    x, weight, bias, dt = _autocast_operands(x, weight, bias)
    seed = next_seed() if dropout_p > 0.0 else 0
    return _ProjectedSelfAttention.apply(x, weight, bias, n_head=int(n_head), causal=bool(is_causal),
                                         scale=float(scale), dropout_p=float(dropout_p), seed=seed, compute_dtype=dt)


@install_methods
class SoftmaxMethods:
    """Tensor.softmax and Tensor.log_softmax, the functional forms above as methods."""

    def softmax(self, dim: int = -1):
        return softmax(self, dim)

    def log_softmax(self, dim: int = -1):
        return log_softmax(self, dim)
