"""Neural-network primitives of the CPU backend: layer norm (with the residual add), softmax,
cross-entropy (with its in-place gradient), embedding.

bf16 inputs as the CUDA kernels take them: statistics in float32, outputs of the input's dtype
rounded once, and what those kernels write in float32 stays float32 here: layer norm's mean, rstd
and weight gradients, cross-entropy's losses and log-sum-exps, the embedding's weight gradient."""
from __future__ import annotations

import numpy as np

from .bf16 import any_bf16, narrow, widen
from .creation import Array, astype, dtype_of


def layer_norm(x: Array, weight, bias, eps: float):
    """x (..., C) -> out (..., C), mean (...,), rstd (...,); weight, bias (C,) or None."""
    if any_bf16(x, weight, bias):
        out, mean, rstd = layer_norm(widen(x), widen(weight), widen(bias), eps)
        return narrow(out, x.dtype), mean, rstd
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    var = np.mean(xc * xc, axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + np.asarray(eps, dtype=x.dtype))
    out = xc * rstd
    if weight is not None:
        out *= weight
    if bias is not None:
        out += bias
    return out, mean[..., 0], rstd[..., 0]


def add_layer_norm(x: Array, residual: Array, weight, bias, eps: float, residual_bias=None):
    """s = x + residual, or x + (residual + residual_bias (C,)), (..., C) and layer_norm(s): -> s, out,
    mean, rstd (bf16: s summed in float32 and rounded once before the statistics, as the CUDA kernel does)."""
    if any_bf16(x, residual, residual_bias):
        r = widen(residual) if residual_bias is None else widen(residual) + widen(residual_bias)
        s = narrow(widen(x) + r, x.dtype)
    else:
        s = x + residual if residual_bias is None else x + (residual + residual_bias)
    return (s,) + layer_norm(s, weight, bias, eps)


def layer_norm_backward(grad: Array, x: Array, weight, mean: Array, rstd: Array, need_weight_grads: bool = True,
                        residual_grad=None):
    """grad (..., C) -> dx (..., C), dweight (C,) or None, dbias (C,) or None; with residual_grad (..., C),
    dx + residual_grad (the gradient of the residual stream that x is, as the CUDA backend fuses it).
    bf16 x: dx of x's dtype, dweight and dbias float32."""
    if any_bf16(grad, x, weight, residual_grad):
        dx, dweight, dbias = layer_norm_backward(widen(grad), widen(x), widen(weight), mean, rstd, need_weight_grads,
                                                 widen(residual_grad))
        return narrow(dx, x.dtype), dweight, dbias
    C = x.shape[-1]
    xhat = (x - mean[..., None]) * rstd[..., None]
    gw = grad * weight if weight is not None else grad
    # dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
    dx = (gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True)) * rstd[..., None]
    dweight = dbias = None
    if need_weight_grads:
        flat_g = grad.reshape(-1, C)
        dweight = (flat_g * xhat.reshape(-1, C)).sum(axis=0) if weight is not None else None
        dbias = flat_g.sum(axis=0)
    if residual_grad is not None:
        dx = dx + residual_grad
    return dx, dweight, dbias


def add_layer_norm_backward(grad: Array, grad_s, s: Array, weight, mean: Array, rstd: Array, need_weight_grads: bool,
                            need_residual_bias_grad: bool = False):
    """add_layer_norm's backward: grad (..., C) of out, grad_s (..., C) of s or None -> ds (..., C),
    dweight (C,), dbias (C,), dresidual_bias (C,) (the column sums of ds, float32 for bf16 and summed
    before ds is rounded, as the CUDA kernel sums them; None unless asked)."""
    if not need_residual_bias_grad:
        return layer_norm_backward(grad, s, weight, mean, rstd, need_weight_grads, grad_s) + (None,)
    C = s.shape[-1]
    if any_bf16(grad, s, weight, grad_s):
        ds, dweight, dbias = layer_norm_backward(widen(grad), widen(s), widen(weight), mean, rstd, need_weight_grads,
                                                 widen(grad_s))
        dres_bias = ds.reshape(-1, C).sum(axis=0, dtype=np.float32)
        return narrow(ds, s.dtype), dweight, dbias, dres_bias
    ds, dweight, dbias = layer_norm_backward(grad, s, weight, mean, rstd, need_weight_grads, grad_s)
    return ds, dweight, dbias, ds.reshape(-1, C).sum(axis=0)


def softmax(x: Array) -> Array:
    """Softmax over the last axis."""
    if any_bf16(x):
        return narrow(softmax(widen(x)), x.dtype)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(out: Array, grad: Array) -> Array:
    if any_bf16(out, grad):
        return narrow(softmax_backward(widen(out), widen(grad)), out.dtype)
    return out * (grad - (grad * out).sum(axis=-1, keepdims=True))


def log_softmax(x: Array) -> Array:
    if any_bf16(x):
        return narrow(log_softmax(widen(x)), x.dtype)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_softmax_backward(out: Array, grad: Array) -> Array:
    if any_bf16(out, grad):
        return narrow(log_softmax_backward(widen(out), widen(grad)), out.dtype)
    return grad - np.exp(out) * grad.sum(axis=-1, keepdims=True)


def cross_entropy(logits: Array, targets: Array, ignore_index: int):
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored), lse (N,) logsumexp per row;
    both float32 for bf16 logits."""
    logits = widen(logits)
    m = logits.max(axis=-1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=-1))
    valid = targets != ignore_index
    safe = np.where(valid, targets, 0)
    picked = np.take_along_axis(logits, safe[:, None], axis=1)[:, 0]
    losses = np.where(valid, lse - picked, 0).astype(logits.dtype)
    return losses, lse


def cross_entropy_backward(logits: Array, targets: Array, lse: Array, grad: Array, ignore_index: int) -> Array:
    """grad (N,) of each row's loss -> dlogits (N, V) = (softmax - onehot) * grad (0 where ignored), of
    the logits' dtype."""
    if any_bf16(logits, grad):
        return narrow(cross_entropy_backward(widen(logits), targets, lse, widen(grad), ignore_index), logits.dtype)
    valid = targets != ignore_index
    g = np.where(valid, grad, 0).astype(logits.dtype)
    dlogits = np.exp(logits - lse[:, None])
    dlogits[np.arange(len(targets)), np.where(valid, targets, 0)] -= 1.0
    dlogits *= g[:, None]
    return dlogits


def cross_entropy_with_grad_(logits: Array, targets: Array, ignore_index: int,
                             grad_scale: Array | None = None) -> Array:
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored); the logits are overwritten in
    place by softmax - onehot(target), the gradient of sum(losses) (0 on ignored rows), times grad_scale
    (a 0-d array) where given. The fused classifier's step: its (N, V) buffer holds the logits,
    then their gradient, never both. bf16 logits: computed in float32, the gradient rounded into the
    bf16 buffer; the losses float32."""
    if any_bf16(logits):
        wide = widen(logits)
        losses = cross_entropy_with_grad_(wide, targets, ignore_index, grad_scale)
        np.copyto(logits, wide, casting="same_kind")
        return losses
    losses, lse = cross_entropy(logits, targets, ignore_index)
    valid = targets != ignore_index
    logits -= lse[:, None]
    np.exp(logits, out=logits)
    logits[np.flatnonzero(valid), targets[valid]] -= 1.0
    logits[~valid] = 0.0
    if grad_scale is not None:
        logits *= np.asarray(grad_scale).astype(logits.dtype)
    return losses


def embedding(weight: Array, idx: Array) -> Array:
    """weight (V, C), idx (...) int64 -> (..., C)."""
    return weight[idx]


def embedding_backward(grad: Array, idx: Array, num_embeddings: int, into: Array | None = None) -> Array:
    """grad (..., C) -> dweight (V, C), rows scatter-added (a token seen twice gets both gradients);
    float32 for a bf16 grad (the float32 master weight's gradient under autocast), as on the GPU. into:
    a gradient to add the rows to in place instead and return, where it is of that dtype and (V, C)
    (else a new one is made, and the caller adds)."""
    grad = widen(grad)
    C = grad.shape[-1]
    fits = into is not None and into.dtype == grad.dtype and into.shape == (num_embeddings, C)
    out = into if fits else np.zeros((num_embeddings, C), dtype=grad.dtype)
    np.add.at(out, idx.reshape(-1), grad.reshape(-1, C))
    return out


def embedding_positions(weight: Array, pos: Array, idx: Array, start: int, out_dtype=None) -> Array:
    """weight (V, C), pos (P, C), idx (B, T) int64 -> (B, T, C) = weight[idx] + pos[start:start + T], of
    out_dtype (None: weight's; bf16 rounds the sum once, as the GPU kernel does)."""
    out = weight[idx] + pos[start:start + idx.shape[-1]]
    return out if out_dtype is None or out_dtype is dtype_of(out) else astype(out, out_dtype)


def embedding_positions_backward(grad: Array, idx: Array, num_embeddings: int, num_positions: int,
                                 start: int, into: Array | None = None) -> tuple[Array, Array]:
    """grad (B, T, C) -> dweight (V, C) (rows scatter-added; into: a gradient to add them to in place, as
    embedding_backward's), dpos (P, C) (the batch's sum in rows start..start+T-1, zeros elsewhere);
    float32 for a bf16 grad."""
    grad = widen(grad)
    T, C = idx.shape[-1], grad.shape[-1]
    dpos = np.zeros((num_positions, C), dtype=grad.dtype)
    dpos[start:start + T] = grad.reshape(-1, T, C).sum(axis=0)
    return embedding_backward(grad, idx, num_embeddings, into), dpos
