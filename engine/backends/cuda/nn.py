"""Neural-network primitives of the CUDA backend: layer norm (with the residual add), softmax,
cross-entropy (with its in-place gradient), embedding."""
from __future__ import annotations

from ...dtypes import bfloat16, float32, int64
from ..._native import native
from .arrays import _CODE, CudaArray, _check_float32, _empty, _same_device
from .creation import arange, astype
from .elementwise import binary


def layer_norm(x: CudaArray, weight, bias, eps: float):
    """x (..., C) -> out (..., C), mean (...,), rstd (...,); weight, bias (C,) or None."""
    _check_float32("layer_norm", weight, bias)
    if x.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: layer_norm supports float32 and bfloat16 inputs, got {x.dtype.name}")
    C = x.shape[-1]
    N = x.size // C if C else 0
    out = _empty(x.shape, x.dtype, x.device)  # bf16 in, bf16 out; statistics and weights in float32
    mean = _empty(x.shape[:-1], float32, x.device)
    rstd = _empty(x.shape[:-1], float32, x.device)
    native.layernorm_forward_dt(x.device, _CODE[x.dtype], out.ptr, mean.ptr, rstd.ptr, x.ptr,
                            weight.ptr if weight is not None else 0, bias.ptr if bias is not None else 0, N, C,
                            float(eps))
    return out, mean, rstd


def add_layer_norm(x: CudaArray, residual: CudaArray, weight, bias, eps: float, residual_bias=None):
    """s = x + residual, or x + (residual + residual_bias (C,)), (..., C) and layer_norm(s) -> s, out,
    mean, rstd, in one kernel (the sum rounded to x's dtype once, before the statistics); inputs of two
    dtypes or shapes take the adds and the layer norm."""
    _check_float32("layer_norm", weight, bias, residual_bias)
    if x.dtype in (float32, bfloat16) and residual.dtype is x.dtype and residual.shape == x.shape:
        C = x.shape[-1]
        N = x.size // C if C else 0
        s, out = _empty(x.shape, x.dtype, x.device), _empty(x.shape, x.dtype, x.device)
        mean, rstd = _empty(x.shape[:-1], float32, x.device), _empty(x.shape[:-1], float32, x.device)
        native.layernorm_add_forward_dt(x.device, _CODE[x.dtype], out.ptr, s.ptr, mean.ptr, rstd.ptr, x.ptr, residual.ptr,
                                    residual_bias.ptr if residual_bias is not None else 0,
                                    weight.ptr if weight is not None else 0, bias.ptr if bias is not None else 0, N, C,
                                    float(eps))
        return s, out, mean, rstd
    if residual_bias is not None:
        residual = binary("add", residual, astype(residual_bias, residual.dtype))
    s = binary("add", x, residual)
    return (s,) + layer_norm(s, weight, bias, eps)


def layer_norm_backward(grad: CudaArray, x: CudaArray, weight, mean: CudaArray, rstd: CudaArray,
                        need_weight_grads: bool = True, residual_grad=None):
    """grad (..., C) -> dx (..., C), dweight (C,) or None, dbias (C,) or None. With residual_grad (..., C),
    dx + residual_grad (x is a residual stream that also went on unnormalised), added inside the kernel."""
    return _layer_norm_backward(grad, x, weight, mean, rstd, need_weight_grads, residual_grad, False)[:3]


def add_layer_norm_backward(grad: CudaArray, grad_s, s: CudaArray, weight, mean: CudaArray, rstd: CudaArray,
                            need_weight_grads: bool, need_residual_bias_grad: bool = False):
    """add_layer_norm's backward: grad (..., C) of out, grad_s (..., C) of s or None -> ds (..., C),
    dweight (C,), dbias (C,), dresidual_bias (C,) float32 (the column sums of ds, summed in the layer
    norm's kernel; None unless asked)."""
    return _layer_norm_backward(grad, s, weight, mean, rstd, need_weight_grads, grad_s, need_residual_bias_grad)


def _layer_norm_backward(grad, x, weight, mean, rstd, need_weight_grads: bool, residual_grad, need_dx_sums: bool):
    """-> dx, dweight, dbias, the column sums of dx (float32 (C,), or None unless need_dx_sums)."""
    _check_float32("layer_norm_backward", weight)
    if grad.dtype is not x.dtype:
        grad = astype(grad, x.dtype)
    C = x.shape[-1]
    N = x.size // C if C else 0
    dx = _empty(x.shape, x.dtype, x.device)
    dweight = dbias = None
    if need_weight_grads:
        dweight = _empty((C,), float32, x.device) if weight is not None else None
        dbias = _empty((C,), float32, x.device)
    dx_sums = _empty((C,), float32, x.device) if need_dx_sums else None
    res = None
    if residual_grad is not None:  # (..., C) as x
        res = residual_grad if residual_grad.dtype is x.dtype else astype(residual_grad, x.dtype)
    native.layernorm_backward_dt(x.device, _CODE[x.dtype], dx.ptr, dweight.ptr if dweight is not None else 0,
                             dbias.ptr if dbias is not None else 0, grad.ptr, x.ptr,
                             weight.ptr if weight is not None else 0, mean.ptr, rstd.ptr, N, C,
                             res.ptr if res is not None else 0, dx_sums.ptr if dx_sums is not None else 0)
    return dx, dweight, dbias, dx_sums


def _softmax(x: CudaArray, log: bool) -> CudaArray:
    if x.dtype is bfloat16:  # statistics in float32
        return astype(_softmax(astype(x, float32), log), bfloat16)
    _check_float32("log_softmax" if log else "softmax", x)
    L = x.shape[-1] if x.ndim else 1
    out = _empty(x.shape, float32, x.device)
    native.softmax_forward(x.device, out.ptr, x.ptr, x.size // L if L else 0, L, log)
    return out


def _softmax_backward(out: CudaArray, grad: CudaArray, log: bool) -> CudaArray:
    if out.dtype is bfloat16:
        return astype(_softmax_backward(astype(out, float32), astype(grad, float32), log), bfloat16)
    _check_float32("softmax_backward", out, grad)
    L = out.shape[-1] if out.ndim else 1
    dx = _empty(out.shape, float32, out.device)
    native.softmax_backward(out.device, dx.ptr, out.ptr, grad.ptr, out.size // L if L else 0, L, log)
    return dx


def softmax(x: CudaArray) -> CudaArray:
    """Softmax over the last axis."""
    return _softmax(x, False)


def softmax_backward(out: CudaArray, grad: CudaArray) -> CudaArray:
    return _softmax_backward(out, grad, False)


def log_softmax(x: CudaArray) -> CudaArray:
    return _softmax(x, True)


def log_softmax_backward(out: CudaArray, grad: CudaArray) -> CudaArray:
    return _softmax_backward(out, grad, True)


def cross_entropy(logits: CudaArray, targets: CudaArray, ignore_index: int):
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored), lse (N,).
    An out-of-range target gives a NaN loss (checking would need a host sync)."""
    if logits.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: cross_entropy supports float32 and bfloat16 logits, got {logits.dtype.name}")
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    losses = _empty((N,), float32, logits.device)  # float32 losses and statistics, also for bf16 logits
    lse = _empty((N,), float32, logits.device)
    native.cross_entropy_forward_dt(logits.device, _CODE[logits.dtype], losses.ptr, lse.ptr, logits.ptr, targets.ptr, N, V,
                                int(ignore_index))
    return losses, lse


def cross_entropy_backward(logits: CudaArray, targets: CudaArray, lse: CudaArray, grad: CudaArray,
                           ignore_index: int) -> CudaArray:
    """grad (N,) -> dlogits (N, V) = (softmax - onehot) * grad (0 where ignored)."""
    _check_float32("cross_entropy_backward", grad)
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    N, V = logits.shape
    d = _empty((N, V), logits.dtype, logits.device)  # the logits' dtype (bf16 under autocast)
    native.cross_entropy_backward_dt(logits.device, _CODE[logits.dtype], d.ptr, logits.ptr, targets.ptr, lse.ptr,
                                 grad.ptr, N, V, int(ignore_index))
    return d


def cross_entropy_with_grad_(logits: CudaArray, targets: CudaArray, ignore_index: int,
                             grad_scale: CudaArray | None = None) -> CudaArray:
    """logits (N, V), targets (N,) int64 -> losses (N,) float32 (0 where ignored); the logits are
    overwritten in place by softmax - onehot(target), the gradient of sum(losses) (0 on ignored rows),
    times grad_scale (a 0-d float32 array on the device, read there: no host sync) where given. One
    kernel (the fused classifier's). An out-of-range target gives a NaN loss."""
    if logits.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: cross_entropy_with_grad_ supports float32 and bfloat16 logits, "
                        f"got {logits.dtype.name}")
    if targets.dtype is not int64:
        targets = astype(targets, int64)
    if grad_scale is not None:
        _same_device("cross_entropy_with_grad_", logits, grad_scale)
        if grad_scale.dtype is not float32:
            grad_scale = astype(grad_scale, float32)
    N, V = logits.shape
    losses = _empty((N,), float32, logits.device)
    native.cross_entropy_with_grad_dt(logits.device, _CODE[logits.dtype], losses.ptr, logits.ptr, targets.ptr, N, V,
                                      int(ignore_index), 0, grad_scale.ptr if grad_scale is not None else 0)
    return losses


def embedding(weight: CudaArray, idx: CudaArray) -> CudaArray:
    """weight (V, C), idx (...) int64 -> (..., C). An out-of-range index gives a NaN row."""
    _same_device("embedding", weight, idx)
    if idx.dtype is not int64:
        idx = astype(idx, int64)
    V, C = weight.shape
    out = _empty(idx.shape + (C,), weight.dtype, weight.device)
    native.embedding_forward(weight.device, _CODE[weight.dtype], out.ptr, weight.ptr, idx.ptr, idx.size, V, C)
    return out


def embedding_backward(grad: CudaArray, idx: CudaArray, num_embeddings: int,
                       into: CudaArray | None = None) -> CudaArray:
    """grad (..., C) float32 or bf16 -> dweight (V, C) float32, rows scatter-added; into: a gradient to add
    the rows to in place instead and return (no zeroed buffer, no add after), where it is float32 (V, C)
    (else a new one is made, and the caller adds)."""
    idx, out, added = _rows_target("embedding_backward", grad, idx, num_embeddings, into)
    native.embedding_backward(grad.device, _CODE[grad.dtype], out.ptr, grad.ptr, idx.ptr, idx.size, num_embeddings,
                              grad.shape[-1], added)
    return out


def embedding_positions(weight: CudaArray, pos: CudaArray, idx: CudaArray, start: int, out_dtype=None) -> CudaArray:
    """weight (V, C), pos (P, C), idx (B, T) int64 -> (B, T, C) = weight[idx] + pos[start:start + T], of
    out_dtype (None: weight's). float32 tables into float32 or bf16: one kernel (the sum rounded once);
    other dtypes: the two lookups and the add."""
    _same_device("embedding_positions", weight, pos, idx)
    if idx.dtype is not int64:
        idx = astype(idx, int64)
    out_dtype = weight.dtype if out_dtype is None else out_dtype
    (B, T), (V, C) = idx.shape, weight.shape
    if weight.dtype is not float32 or pos.dtype is not float32 or out_dtype not in (float32, bfloat16):
        rows = embedding(pos, arange(start, start + T, 1, int64, weight.device))  # (T, C)
        out = binary("add", embedding(weight, idx), rows)
        return out if out.dtype is out_dtype else astype(out, out_dtype)
    out = _empty((B, T, C), out_dtype, weight.device)
    native.embedding_positions_forward(weight.device, _CODE[out_dtype], out.ptr, weight.ptr, pos.ptr, idx.ptr, B * T,
                                       V, C, T, int(start))
    return out


def embedding_positions_backward(grad: CudaArray, idx: CudaArray, num_embeddings: int, num_positions: int,
                                 start: int, into: CudaArray | None = None) -> tuple[CudaArray, CudaArray]:
    """grad (B, T, C) float32 or bf16 -> dweight (V, C) (rows scatter-added; into: a gradient to add them
    to in place, as embedding_backward's), dpos (P, C) (the batch's sum in rows start..start+T-1, zeros
    elsewhere); float32, read from a bf16 grad without a cast."""
    idx, dweight, added = _rows_target("embedding_positions_backward", grad, idx, num_embeddings, into)
    (B, T), C = idx.shape, grad.shape[-1]
    dpos = _empty((num_positions, C), float32, grad.device)
    native.embedding_positions_backward(grad.device, _CODE[grad.dtype], dweight.ptr, dpos.ptr, grad.ptr, idx.ptr,
                                        B * T, num_embeddings, num_positions, C, T, int(start), added)
    return dweight, dpos


def _rows_target(op: str, grad: CudaArray, idx: CudaArray, V: int,
                 into: CudaArray | None) -> tuple[CudaArray, CudaArray, bool]:
    """What both embedding backwards check and make: idx as int64, the float32 (V, C) gradient the rows
    are added to (`into` where it is one, else a new one, which the native call zeroes first), and whether
    it is `into`."""
    if grad.dtype not in (float32, bfloat16):
        raise TypeError(f"cuda backend: {op} supports float32 and bfloat16 gradients, got {grad.dtype.name}")
    if idx.dtype is not int64:
        idx = astype(idx, int64)
    C = grad.shape[-1]
    if into is not None and into.dtype is float32 and into.shape == (V, C):
        return idx, into, True
    return idx, _empty((V, C), float32, grad.device), False
