"""The fused classifier: cross-entropy of x @ weight^T without keeping the logits (F.linear_cross_entropy).

A language model's head makes logits (N, V) that dwarf everything else in a step (16384 x 50304 bf16
is 1.65 GB for gpt2_124m). Unfused, they are kept from the forward for the cross-entropy backward,
which then writes a second (N, V) buffer. Here the forward does the backward's work while the
logits exist: one kernel turns them, in place, into d(sum of losses)/dlogits, two matmuls turn that
into dx and dweight, and the (N, V) buffer goes. The backward only scales dx and dweight by the
loss's gradient. Peak memory: one (N, V) buffer; nothing of size N x V outlives the forward.
"""
from __future__ import annotations

from ..autocast import weight_cast
from ..autograd import Function


class LinearCrossEntropy(Function):
    """x (N, C), weight (V, C), targets (N,) int64 -> loss (): the cross-entropy of logits x @ weight^T,
    summed over the rows or averaged over the rows kept (target != ignore_index). No bias.

    need_dx / need_dweight: which gradients to make in the forward (the caller knows which inputs
    require grad); with neither, only the losses are computed. compute_dtype (autocast's bf16, or
    None): x is of it already and weight is a float32 master weight, cast here for the GEMMs, whose
    gradient comes out of its GEMM in float32 (as Linear's)."""

    def forward(self, x, weight, targets, ignore_index: int = -100, reduction: str = "mean",
                compute_dtype=None, need_dx: bool = False, need_dweight: bool = False):
        be = self.be
        weight_dtype = be.dtype_of(weight)
        if compute_dtype is not None and weight_dtype is not compute_dtype:
            weight = weight_cast(be, weight, compute_dtype)  # (V, C): the model's one cast of its weights, or now
        logits = be.matmul(x, weight, transpose_b=True)  # (N, C) @ (C, V) -> (N, V)
        self.dx = self.dweight = None
        if need_dx or need_dweight:
            losses = be.cross_entropy_with_grad_(logits, targets, ignore_index)  # logits (N, V) -> dlogits, in place
            dlogits = logits
            if need_dx:
                self.dx = be.matmul(dlogits, weight)  # (N, V) @ (V, C) -> (N, C)
            if need_dweight:
                self.dweight = be.weight_grad(dlogits, x, weight_dtype)  # (V, N) @ (N, C) -> (V, C)
            del dlogits
        else:
            losses, _ = be.cross_entropy(logits, targets, ignore_index)  # (N,), lse (N,) unused
        del logits  # the (N, V) buffer goes back to the allocator here
        total = be.sum(losses, (0,), False)  # (N,) -> ()
        if reduction == "sum":
            self.kept = None
            return total
        # rows kept, counted on the device (no host sync); float32 (float64 for float64 inputs), as the loss
        self.kept = be.sum(be.astype(be.binary("ne", targets, ignore_index), be.dtype_of(losses)), (0,), False)
        return be.binary("div", total, self.kept)

    def backward(self, g):
        be = self.be
        factor = g  # () d(loss)/d(sum of losses): g for "sum", g / rows kept for "mean"
        if self.kept is not None:  # no row kept: loss 0/0 = NaN as in PyTorch, but gradients 0, not 0 * inf
            factor = be.binary("div", g, be.binary("maximum", self.kept, 1.0))
        dx = be.scale(self.dx, factor) if self.dx is not None else None  # (N, C)
        dweight = be.scale(self.dweight, factor) if self.dweight is not None else None  # (V, C)
        return dx, dweight, None
