"""The fused classifier: cross-entropy of x @ weight^T without keeping the logits (F.linear_cross_entropy).

A language model's head makes logits (N, V) that dwarf everything else in a step (16384 x 50304 bf16
is 1.65 GB for gpt2_124m). Unfused, they are kept from the forward for the cross-entropy backward,
which then writes a second (N, V) buffer. Here the forward does the backward's work while the
logits exist: one kernel turns them, in place, into d(loss)/dlogits (the mean's 1 / rows kept
applied there), two matmuls turn that into dx and dweight, and the (N, V) buffer goes. The backward
only scales dx and dweight by the loss's gradient, and hands them over as they are where that is the
1 of loss.backward(). Peak memory: one (N, V) buffer; nothing of size N x V outlives the forward.
"""
from __future__ import annotations

from ..autocast import weight_cast
from ..autograd import Function
from ..dtypes import bfloat16, float32, float64


class LinearCrossEntropy(Function):
    """x (N, C), weight (V, C), targets (N,) int64 -> loss (): the cross-entropy of logits x @ weight^T,
    summed over the rows or averaged over the rows kept (target != ignore_index). No bias.

    need_dx / need_dweight: which gradients to make in the forward (the caller knows which inputs
    require grad); with neither, only the losses are computed. compute_dtype (autocast's bf16, or
    None): x is of it already and weight is a float32 master weight, cast here for the GEMMs, whose
    gradient comes out of its GEMM in float32 (as Linear's).

    fp8 (an engine.fp8.Fp8State, bf16 x only): the logits' GEMM in FP8 (x and weight in E4M3, scaled as
    F.linear's), and dx's on the gradient's E5M2 codes, which the cross-entropy kernel writes beside the
    bf16 gradient with a fixed scale (|softmax - onehot| <= 1), so there the mean's 1 / rows kept waits
    for the backward's scale; dweight stays a bf16 GEMM."""

    new_grads = True  # backward's dx and dweight are new arrays (a tied embedding adds to dweight in place)

    def forward(self, x, weight, targets, ignore_index: int = -100, reduction: str = "mean",
                compute_dtype=None, need_dx: bool = False, need_dweight: bool = False, fp8=None):
        be = self.be
        weight_dtype = be.dtype_of(weight)
        if compute_dtype is not None and weight_dtype is not compute_dtype:
            weight = weight_cast(be, weight, compute_dtype)  # (V, C): the model's one cast of its weights, or now
        use_fp8 = fp8 is not None and not fp8.unavailable and be.dtype_of(x) is bfloat16
        res = self._logits_fp8(fp8, x, weight, need_dx) if use_fp8 else None
        logits, w_t, w_inv = res if res is not None else (be.matmul(x, weight, transpose_b=True), None, None)  # (N, V)
        self.dx = self.dweight = None
        # rows kept, counted on the device (no host sync); float32 (float64 for float64 inputs) as the loss,
        # never bf16 (whose 8 bits would round a count past 256)
        count_dtype = float64 if be.dtype_of(logits) is float64 else float32
        kept = None if reduction == "sum" else \
            be.sum(be.astype(be.binary("ne", targets, ignore_index), count_dtype), (0,), False)
        self.kept = self.mean_applied = None
        if need_dx or need_dweight:
            codes = None
            if w_t is not None:  # logits (N, V) -> dlogits in place, and its E5M2 codes (N, V)
                losses, codes, codes_inv = be.cross_entropy_with_grad_fp8_(logits, targets, ignore_index)
            else:  # logits (N, V) -> dlogits in place, d(loss)/dlogits: divided by the rows kept for the mean
                # (none kept: loss 0/0 = NaN as in PyTorch, but gradients 0, not 0 * inf)
                self.mean_applied = kept is not None
                inv = be.binary("div", 1.0, be.binary("maximum", kept, 1.0)) if kept is not None else None
                losses = be.cross_entropy_with_grad_(logits, targets, ignore_index, inv)
            dlogits = logits
            if need_dx:  # (N, V) @ (V, C) -> (N, C)
                dx = be.matmul_fp8(codes, "e5m2", codes_inv, w_t, "e4m3", w_inv) if codes is not None else None
                self.dx = dx[0] if dx is not None else be.matmul(dlogits, weight)
            if need_dweight:
                self.dweight = be.weight_grad(dlogits, x, weight_dtype)  # (V, N) @ (N, C) -> (V, C)
            del dlogits
        else:
            losses, _ = be.cross_entropy(logits, targets, ignore_index)  # (N,), lse (N,) unused
        del logits  # the (N, V) buffer goes back to the allocator here
        total = be.sum(losses, (0,), False)  # (N,) -> ()
        if kept is None:
            return total
        if not self.mean_applied:
            self.kept = kept
        return be.binary("div", total, kept)

    def _logits_fp8(self, state, x, weight, need_dx):
        """(logits (N, V) bf16 through the FP8 GEMM, the E4M3 transposed weight (C, V) for dx or None, its
        inverse scale), or None where the backend has no FP8 GEMM for it."""
        be = self.be
        x_meta, x_current = state.meta(be, "x", x)
        w_meta, w_current = state.meta(be, "w", weight)
        x8, _, x_inv = be.fp8_cast(x, "e4m3", x_meta, x_current)  # (N, C)
        w8, w_t, w_inv = be.fp8_cast(weight, "e4m3", w_meta, w_current, transpose=need_dx)  # (V, C), (C, V)
        res = be.matmul_fp8(x8, "e4m3", x_inv, w8, "e4m3", w_inv, fast_accum=True)
        if res is None:
            state.fall_back(weight.shape)
            return None
        return res[0], w_t, w_inv

    def backward(self, g, into=None):
        be = self.be
        if self.unit_grad_once and self.kept is None:  # g is loss.backward()'s 1: dx and dweight are final
            dx, dweight, self.dx, self.dweight = self.dx, self.dweight, None, None
            return dx, dweight, None
        factor = g  # () the factor dx and dweight still need: g, or g / rows kept for an FP8 mean
        if self.kept is not None:  # no row kept: loss 0/0 = NaN as in PyTorch, but gradients 0, not 0 * inf
            factor = be.binary("div", g, be.binary("maximum", self.kept, 1.0))
        dx = be.scale(self.dx, factor) if self.dx is not None else None  # (N, C)
        dweight = be.scale(self.dweight, factor) if self.dweight is not None else None  # (V, C)
        return dx, dweight, None
