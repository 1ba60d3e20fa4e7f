"""The CPU backend: the primitive op set, over numpy arrays.

This module is the reference definition of the primitive op set. Every backend (this one and
`engine.backends.cuda`) implements exactly these functions with the same signatures and meaning;
autograd and everything above it only ever call these. Arrays are the backend's raw arrays
(`np.ndarray` here), never Tensors. "scalar" means a Python int/float.

Conventions:
- Binary ops take two arrays of the same dtype (broadcasting like numpy), or an array and a scalar
  on either side; the result keeps the array's dtype (comparisons give bool).
- Functions that end in `_` update their first argument(s) in place; nothing else does.
- Axis arguments are normalised (non-negative, sorted tuple) by the caller.
"""
from __future__ import annotations

import numpy as np

from ..dtypes import DType, bool_, float32, from_numpy as _dtype_of_numpy
from . import philox as _philox

Array = np.ndarray
name = "cpu"
_U64 = 0xFFFFFFFFFFFFFFFF


def _keep_freed_arrays_in_the_heap() -> None:
    """Ask glibc to serve large arrays from the heap and keep freed memory there.

    By default every array over ~128 KB is a fresh mmap, so each op's output page-faults its
    memory in again: a third of a small GPT's training step went to that. With these settings a
    freed activation's memory is reused by the next one, as a caching allocator would.
    Set ENGINE_NO_MALLOC_TUNING=1 to leave malloc alone."""
    import ctypes
    import os
    import sys

    if not sys.platform.startswith("linux") or os.environ.get("ENGINE_NO_MALLOC_TUNING"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)  # glibc's maximum on 64-bit
        libc.mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        pass


_keep_freed_arrays_in_the_heap()

_np = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
       "int32": np.int32, "uint8": np.uint8, "bool": np.bool_}


# ---- transfer, creation, dtypes ---------------------------------------------------------------

def from_numpy(a: np.ndarray, device_index=None) -> Array:
    """A backend array holding a copy of `a` (numpy in, array out)."""
    return np.array(a, copy=True)


def to_numpy(x: Array) -> np.ndarray:
    return x


def dtype_of(x: Array) -> DType:
    return _dtype_of_numpy(x.dtype)


def full(shape: tuple, value, dtype: DType, device_index=None) -> Array:
    return np.full(shape, value, dtype=_np[dtype.name])


def arange(start, stop, step, dtype: DType, device_index=None) -> Array:
    return np.arange(start, stop, step, dtype=_np[dtype.name])


def astype(x: Array, dtype: DType) -> Array:
    return x.astype(_np[dtype.name], copy=False)


def copy_(dst: Array, src: Array) -> None:
    """dst[...] = src (same shape)."""
    np.copyto(dst, src)


def contiguous(x: Array) -> Array:
    """x itself if C-contiguous and writeable, else a C-contiguous copy (0-d stays 0-d)."""
    return x if x.flags.c_contiguous and x.flags.writeable else np.array(x, order="C")


def dropout_mask(shape: tuple, p: float, seed: int, dtype: DType, device_index=None) -> Array:
    """Inverted-dropout multiplier: 0 with probability p, else 1/(1-p); reproducible from `seed`."""
    keep = np.random.default_rng(seed).random(shape, dtype=np.float32) >= p
    return keep.astype(_np[dtype.name]) * np.asarray(1.0 / (1.0 - p), dtype=_np[dtype.name])


# ---- elementwise ------------------------------------------------------------------------------

_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}


def binary(op: str, a, b) -> Array:
    """op(a, b) elementwise with broadcasting; a or b may be a scalar (not both)."""
    dtype = a.dtype if isinstance(a, (np.ndarray, np.generic)) else b.dtype
    out = np.asarray(_BINARY[op](a, b))  # 0-d results stay arrays, not numpy scalars
    if out.dtype != dtype and out.dtype != np.bool_:
        out = out.astype(dtype)
    return out


def _gelu(x: Array) -> Array:
    # tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    c = np.asarray(0.7978845608028654, dtype=x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "abs": np.abs, "sqrt": np.sqrt,
    "tanh": np.tanh, "sign": np.sign,
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),  # overflow-free logistic
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
}


def unary(op: str, x: Array) -> Array:
    return np.asarray(_UNARY[op](x))


def relu_backward(x: Array, grad: Array) -> Array:
    return grad * (x > 0)


def gelu_backward(x: Array, grad: Array) -> Array:
    # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2),  t = tanh(c (x + a x^3)); in place, few passes
    c, a = 0.7978845608028654, 0.044715
    x2 = x * x
    t = x2 * a
    t += 1.0
    t *= x
    t *= c
    np.tanh(t, out=t)
    d = x2  # reuse: 0.5 x c (1 + 3 a x^2)
    d *= 3.0 * a * c * 0.5
    d += 0.5 * c
    d *= x
    d *= 1.0 - t * t
    t += 1.0
    t *= 0.5
    d += t
    d *= grad
    return d


def where(cond: Array, a, b) -> Array:
    """cond ? a : b with broadcasting; a or b may be a scalar."""
    dtype = a.dtype if isinstance(a, (np.ndarray, np.generic)) else b.dtype
    return np.asarray(np.where(cond, a, b)).astype(dtype, copy=False)


# ---- reductions -------------------------------------------------------------------------------

def sum(x: Array, axes: tuple, keepdim: bool) -> Array:
    return np.asarray(np.sum(x, axis=axes, keepdims=keepdim, dtype=x.dtype))


def max(x: Array, axes: tuple, keepdim: bool) -> Array:
    return np.asarray(np.max(x, axis=axes, keepdims=keepdim))


def argmax(x: Array, axis: int) -> Array:
    return np.argmax(x, axis=axis).astype(np.int64)


# ---- movement ---------------------------------------------------------------------------------

def reshape(x: Array, shape: tuple) -> Array:
    return x.reshape(shape)


def permute(x: Array, dims: tuple) -> Array:
    return x.transpose(dims)


def broadcast_to(x: Array, shape: tuple) -> Array:
    return np.broadcast_to(x, shape)


def getitem(x: Array, index: tuple) -> Array:
    """Basic indexing: a tuple of ints, slices, None and Ellipsis."""
    return x[index]


def getitem_backward(grad: Array, index: tuple, shape: tuple) -> Array:
    """The gradient of x[index] w.r.t. x: zeros of `shape` with `grad` written at `index`."""
    out = np.zeros(shape, dtype=grad.dtype)
    out[index] = grad
    return out


def concat(xs: list, axis: int) -> Array:
    return np.concatenate(xs, axis=axis)


# ---- matmul -----------------------------------------------------------------------------------

def matmul(a: Array, b: Array, transpose_a: bool = False, transpose_b: bool = False) -> Array:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast; the flags transpose the last two dims."""
    if a.ndim > 2 or b.ndim > 2:
        # numpy's batched matmul only reaches BLAS for contiguous matrices; permuted views
        # (attention heads) otherwise take a loop some 30x slower than the copy costs
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if transpose_a:
        a = np.swapaxes(a, -1, -2)
    if transpose_b:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def linear(x: Array, w: Array, b, activation: str | None):
    """x (N, I) @ w (O, I)^T + b (O,) -> out (N, O), then the activation ("gelu" or None).
    Returns (out, pre): pre is the pre-activation (what the backward needs), None without one."""
    pre = matmul(x, w, transpose_b=True)
    if b is not None:
        pre += b
    if activation is None:
        return pre, None
    if activation != "gelu":
        raise ValueError(f"linear: unknown activation {activation!r} (only 'gelu')")
    return _gelu(pre), pre


def linear_backward(grad: Array, x: Array, w: Array, pre, activation: str | None, need: tuple,
                    param_dtype: DType | None = None):
    """grad (N, O) of linear's out -> dx (N, I), dw (O, I), db (O,); None where `need` (x, w, b) is False.
    dw and db in param_dtype (None: x's), as the CUDA backend."""
    if activation is not None:
        grad = gelu_backward(pre, grad)
    pdt = param_dtype if param_dtype is not None else dtype_of(x)
    dx = matmul(grad, w) if need[0] else None
    dw = weight_grad(grad, x, pdt) if need[1] else None
    db = astype(grad.sum(axis=0, dtype=grad.dtype), pdt) if need[2] else None
    return dx, dw, db


def weight_grad(grad: Array, x: Array, dtype: DType) -> Array:
    """dw (O, I) = grad (N, O)^T @ x (N, I), in `dtype` (the CUDA backend writes float32 for bf16 x)."""
    return astype(matmul(grad, x, transpose_a=True), dtype)


# ---- normalisation, softmax, losses -----------------------------------------------------------

def layer_norm(x: Array, weight, bias, eps: float):
    """x (..., C) -> out (..., C), mean (...,), rstd (...,); weight, bias (C,) or None."""
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


def add_layer_norm(x: Array, residual: Array, weight, bias, eps: float):
    """s = x + residual (..., C) and layer_norm(s): -> s, out, mean, rstd."""
    s = x + residual
    return (s,) + layer_norm(s, weight, bias, eps)


def layer_norm_backward(grad: Array, x: Array, weight, mean: Array, rstd: Array, need_weight_grads: bool = True,
                        residual_grad=None):
    """grad (..., C) -> dx (..., C), dweight (C,) or None, dbias (C,) or None; with residual_grad (..., C),
    dx + residual_grad (the gradient of the residual stream that x is, as the CUDA backend fuses it)."""
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


def softmax(x: Array) -> Array:
    """Softmax over the last axis."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_backward(out: Array, grad: Array) -> Array:
    return out * (grad - (grad * out).sum(axis=-1, keepdims=True))


def log_softmax(x: Array) -> Array:
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def log_softmax_backward(out: Array, grad: Array) -> Array:
    return grad - np.exp(out) * grad.sum(axis=-1, keepdims=True)


def cross_entropy(logits: Array, targets: Array, ignore_index: int):
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored), lse (N,) logsumexp per row."""
    m = logits.max(axis=-1)
    lse = m + np.log(np.exp(logits - m[:, None]).sum(axis=-1))
    valid = targets != ignore_index
    safe = np.where(valid, targets, 0)
    picked = np.take_along_axis(logits, safe[:, None], axis=1)[:, 0]
    losses = np.where(valid, lse - picked, 0).astype(logits.dtype)
    return losses, lse


def cross_entropy_backward(logits: Array, targets: Array, lse: Array, grad: Array, ignore_index: int) -> Array:
    """grad (N,) of each row's loss -> dlogits (N, V) = (softmax - onehot) * grad (0 where ignored)."""
    valid = targets != ignore_index
    g = np.where(valid, grad, 0).astype(logits.dtype)
    dlogits = np.exp(logits - lse[:, None])
    dlogits[np.arange(len(targets)), np.where(valid, targets, 0)] -= 1.0
    dlogits *= g[:, None]
    return dlogits


def cross_entropy_with_grad_(logits: Array, targets: Array, ignore_index: int) -> Array:
    """logits (N, V), targets (N,) int64 -> losses (N,) (0 where ignored); the logits are overwritten in
    place by softmax - onehot(target), the gradient of sum(losses) (0 on ignored rows). The fused
    classifier's step: its (N, V) buffer holds the logits, then their gradient, never both."""
    losses, lse = cross_entropy(logits, targets, ignore_index)
    valid = targets != ignore_index
    logits -= lse[:, None]
    np.exp(logits, out=logits)
    logits[np.flatnonzero(valid), targets[valid]] -= 1.0
    logits[~valid] = 0.0
    return losses


def scale(x: Array, factor: Array) -> Array:
    """x * factor, factor a 0-d array (on the device: no host sync); x's dtype out."""
    return x * factor.astype(x.dtype)


# ---- attention ----------------------------------------------------------------------------------

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
                           scale: float, dropout_p: float = 0.0, rng: Array | None = None) -> Array:
    """grad (B, T, C) of attention_qkv's out -> dqkv (B, T, 3C)."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    D = C // n_head
    heads = qkv.reshape(B, T, 3, n_head, D).transpose(2, 0, 3, 1, 4)
    g = grad.reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
    o = out.reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
    dq, dk, dv = attention_backward(g, heads[0], heads[1], heads[2], o, lse, causal, scale, dropout_p, rng)
    return np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, C3)


def embedding(weight: Array, idx: Array) -> Array:
    """weight (V, C), idx (...) int64 -> (..., C)."""
    return weight[idx]


def embedding_backward(grad: Array, idx: Array, num_embeddings: int) -> Array:
    """grad (..., C) -> dweight (V, C), rows scatter-added (a token seen twice gets both gradients)."""
    C = grad.shape[-1]
    out = np.zeros((num_embeddings, C), dtype=grad.dtype)
    np.add.at(out, idx.reshape(-1), grad.reshape(-1, C))
    return out


# ---- optimizers (in place, over lists of arrays) ------------------------------------------------

def adamw_(params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, *, lr: float, beta1: float,
           beta2: float, eps: float, weight_decay: float, step: int) -> None:
    """One AdamW step over all parameters (decoupled weight decay, bias-corrected moments)."""
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    step_size = lr / bc1
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        if weight_decay:
            p *= 1.0 - lr * weight_decay
        m *= beta1
        m += (1.0 - beta1) * g
        v *= beta2
        v += (1.0 - beta2) * (g * g)
        denom = np.sqrt(v / bc2)
        denom += eps
        p -= step_size * (m / denom)


def sgd_(params: list, grads: list, momentum_buffers: list, *, lr: float, momentum: float,
         dampening: float, nesterov: bool, weight_decay: float, first_step: bool) -> None:
    """One SGD step (PyTorch semantics: the buffer starts as the first gradient)."""
    for i, (p, g) in enumerate(zip(params, grads)):
        if weight_decay:
            g = g + weight_decay * p
        if momentum:
            buf = momentum_buffers[i]
            if first_step:
                np.copyto(buf, g)
            else:
                buf *= momentum
                buf += (1.0 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p -= lr * g


def sum_of_squares(xs: list) -> Array:
    """sum over all arrays of sum(x^2), as a 0-d float32 array (stays on the device)."""
    total = np.zeros((), dtype=np.float32)
    for x in xs:
        flat = x.reshape(-1).astype(np.float32, copy=False)
        total += np.dot(flat, flat)
    return total


def scale_(xs: list, factor: Array) -> None:
    """x *= factor for every array, factor a 0-d array on the same device."""
    for x in xs:
        x *= factor.astype(x.dtype)
