"""Neural-network ops with fused forward and backward: layer norm, softmax, cross-entropy,
embedding, dropout."""
from __future__ import annotations

from ..autograd import Function


class LayerNorm(Function):
    """x (..., C), weight (C,), bias (C,) -> (..., C), normalised over the last axis."""

    def forward(self, x, weight=None, bias=None, eps: float = 1e-5):
        self.x, self.weight = x, weight
        self.has_weight, self.has_bias = weight is not None, bias is not None
        out, self.mean, self.rstd = self.be.layer_norm(x, weight, bias, eps)
        return out

    def backward(self, g):
        need_w = any(self.needs_input_grad[1:])
        dx, dw, db = self.be.layer_norm_backward(g, self.x, self.weight, self.mean, self.rstd, need_w)
        grads = [dx]
        if self.has_weight:
            grads.append(dw)
        if self.has_bias:
            grads.append(db)
        return tuple(grads)


class AddLayerNorm(Function):
    """x, residual (..., C), weight (C,), bias (C,), residual_bias (C,) -> (s, layer_norm(s)) with
    s = x + residual (+ residual_bias): the residual stream of a pre-LN transformer and the next
    sublayer's input, in one pass. residual_bias is the bias of the projection that made residual, left
    to this op: its gradient is the column sums of ds, which the layer-norm kernel sums as it writes ds
    instead of a pass of its own over ds. The backward adds the two gradients of s (the stream's, and
    the layer norm's) inside the layer-norm kernel."""

    def forward(self, x, residual, weight=None, bias=None, residual_bias=None, eps: float = 1e-5):
        self.weight = weight
        self.has_weight, self.has_bias = weight is not None, bias is not None
        self.residual_bias_dtype = None if residual_bias is None else self.be.dtype_of(residual_bias)
        self.s, out, self.mean, self.rstd = self.be.add_layer_norm(x, residual, weight, bias, eps, residual_bias)
        return self.s, out

    def backward(self, grads):
        g_s, g_out = grads  # either may be None: that output fed nothing
        n = 2 + self.has_weight + self.has_bias  # the tensors before residual_bias
        need_w = any(self.needs_input_grad[2:n])
        need_rb = self.residual_bias_dtype is not None and self.needs_input_grad[n]
        be = self.be
        if g_out is None:
            ds, dw, db = g_s, None, None
            drb = None
            if need_rb:  # the column sums of ds, in the bias's dtype
                flat = be.reshape(ds, (-1, ds.shape[-1]))
                if be.dtype_of(flat) is not self.residual_bias_dtype:
                    flat = be.astype(flat, self.residual_bias_dtype)
                drb = be.sum(flat, (0,), False)
        else:
            ds, dw, db, drb = be.add_layer_norm_backward(g_out, g_s, self.s, self.weight, self.mean, self.rstd, need_w,
                                                         need_rb)
        grads_in = [ds, ds]
        if self.has_weight:
            grads_in.append(dw)
        if self.has_bias:
            grads_in.append(db)
        if self.residual_bias_dtype is not None:
            if drb is not None and be.dtype_of(drb) is not self.residual_bias_dtype:
                drb = be.astype(drb, self.residual_bias_dtype)
            grads_in.append(drb)
        return tuple(grads_in)


class Softmax(Function):
    """Softmax over the last axis (other axes are moved there by the caller)."""

    def forward(self, x):
        self.out = self.be.softmax(x)
        return self.out

    def backward(self, g):
        return self.be.softmax_backward(self.out, g)


class LogSoftmax(Function):
    def forward(self, x):
        self.out = self.be.log_softmax(x)
        return self.out

    def backward(self, g):
        return self.be.log_softmax_backward(self.out, g)


class CrossEntropy(Function):
    """logits (N, V), targets (N,) -> per-row losses (N,), 0 where target == ignore_index.

    Fused: forward keeps only the row's logsumexp, backward rebuilds softmax - onehot from it."""

    def forward(self, logits, targets, ignore_index: int = -100):
        self.logits, self.targets, self.ignore_index = logits, targets, ignore_index
        losses, self.lse = self.be.cross_entropy(logits, targets, ignore_index)
        return losses

    def backward(self, g):
        return self.be.cross_entropy_backward(self.logits, self.targets, self.lse, g, self.ignore_index), None


class Embedding(Function):
    """weight (V, C), idx (...) -> (..., C); backward scatter-adds rows into dweight."""

    def forward(self, weight, idx):
        self.idx, self.num = idx, weight.shape[0]
        return self.be.embedding(weight, idx)

    grad_into = (0,)  # a tied weight's rows added to the head's gradient in place

    def backward(self, g, into=None):
        return self.be.embedding_backward(g, self.idx, self.num, (into or {}).get(0)), None


class EmbeddingPositions(Function):
    """weight (V, C), pos (P, C), idx (B, T) -> (B, T, C) = weight[idx] + pos[start:start + T] in out_dtype
    (None: weight's): a language model's token and position embeddings as one op."""

    def forward(self, weight, pos, idx, start: int, out_dtype=None):
        self.idx, self.num, self.num_pos, self.start = idx, weight.shape[0], pos.shape[0], start
        return self.be.embedding_positions(weight, pos, idx, start, out_dtype)

    grad_into = (0,)  # a tied weight's rows added to the head's gradient in place

    def backward(self, g, into=None):
        dweight, dpos = self.be.embedding_positions_backward(g, self.idx, self.num, self.num_pos, self.start,
                                                             (into or {}).get(0))
        return dweight, dpos, None


class Dropout(Function):
    """Inverted dropout: zero with probability p, scale the rest by 1/(1-p)."""

    def forward(self, x, p: float, seed: int):
        be = self.be
        self.mask = be.dropout_mask(tuple(x.shape), p, seed, be.dtype_of(x), self.device.index)
        return be.binary("mul", x, self.mask)

    def backward(self, g):
        return self.be.binary("mul", g, self.mask)
