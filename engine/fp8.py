"""FP8 linear layers, opt-in: `engine.fp8.enable(model)`, then train under bf16 autocast as before.

A linear layer with FP8 on runs its GEMMs in FP8 on the tensor cores (twice bf16's rate on Hopper):
the forward y = x W^T with x and W in E4M3, the input gradient dx = dy W with dy in E5M2 (the range
gradients need) and W in E4M3, and the weight gradient dW = dy^T x on transposed copies of dy and x
(Hopper's FP8 GEMM takes both operands K-major; the casts write them in the same pass), written in
float32 for the master weight; float32 accumulation, bf16 out, bias and GELU in the GEMM's epilogue as
in bf16. In a layer with a bias the gradient's codes and their transpose come from the bias-gradient
kernel (after the GELU backward in the MLP's first layer), in the pass that reads dy anyway. A GPT's
head (F.linear_cross_entropy) runs its logits and dx in FP8, the cross-entropy kernel writing the
gradient's E5M2 codes at a fixed scale (|softmax - onehot| <= 1), and its dW in bf16. The float32 master weights, the optimizer and the loss
are those of bf16 autocast.

Each tensor has its own scale (per-tensor scaling): q = fp8(x * scale), scale = fp8_max / the largest
|x| of that tensor's last 16 casts (delayed scaling, the recipe of Transformer Engine and of the
fastest GPT-2 training runs), so no cast waits for a reduction of its own input; the first cast of a
layer measures its input first. The scales live on the GPU and the casts update them, so a captured
CUDA graph replays FP8 as it is. A layer's scaling state is not saved with the model: a loaded model
starts from fresh scales.

Only under autocast with float32 master weights; elsewhere a layer with FP8 on computes as without it,
as does one whose GEMM cuBLASLt cannot run in FP8 (a GPU before Hopper: then bf16, with a warning the
first time). On the CPU the
same arithmetic runs in numpy (engine/backends/cpu/fp8.py), the reference the GPU is tested against.
FP8 pays where the GEMMs are large (GPT-2 124M, width 768: 27.99 ms a step against bf16's 31.79 on an
H200); at width 384 the casts cost more than the GEMMs save (docs/performance.md).
"""
from __future__ import annotations

import warnings


class Fp8State:
    """One linear layer's FP8 scaling: a meta (the scale and the amax history) for each of its tensors,
    "x" (the input), "w" (the weight) and "grad" (the output's gradient), per device."""

    ROLES = ("x", "w", "grad")

    def __init__(self):
        self._metas = {}  # (role, device) -> the backend's meta array
        self.unavailable = False  # set when the backend had no FP8 GEMM for this layer: bf16 from then on

    def fall_back(self, shape) -> None:
        """The backend ran no FP8 GEMM for this layer (a GPU without FP8 tensor cores, a shape cuBLASLt
        refuses): say so once, and compute in bf16 from now on."""
        self.unavailable = True
        warnings.warn(f"engine.fp8: no FP8 GEMM for a linear layer of weight shape {tuple(shape)} on this "
                      "device (FP8 needs Hopper or later, and cuBLASLt's FP8 GEMMs take widths that are "
                      "multiples of 16); it runs in bf16", RuntimeWarning, stacklevel=2)

    def meta(self, be, role: str, like) -> tuple:
        """(meta, current) for `role` on like's device: current is True for a meta just made (its first
        cast scales by the tensor's own amax)."""
        if role not in self.ROLES:
            raise ValueError(f"Fp8State: role must be one of {self.ROLES}, got {role!r}")
        key = (role, getattr(like, "device", "cpu"))
        meta = self._metas.get(key)
        if meta is None:
            self._metas[key] = meta = be.fp8_meta(like)
            return meta, True
        return meta, False

    def reset(self) -> None:
        """Forget the scales (the next casts start afresh) and try FP8 again."""
        self._metas.clear()
        self.unavailable = False

    def __deepcopy__(self, memo):  # a copied model (a replica) gets scales of its own
        return Fp8State()

    def __repr__(self) -> str:
        return f"Fp8State({len(self._metas)} scales)"


def _linears(model):
    from .nn.layers import Linear
    return [m for m in model.modules() if isinstance(m, Linear)]


def enable(model, enabled: bool = True) -> int:
    """Turn FP8 on (or off, enabled=False) for every linear layer of `model`; returns how many there are."""
    layers = _linears(model)
    for layer in layers:
        layer.fp8 = Fp8State() if enabled else None
    return len(layers)


def is_enabled(model) -> bool:
    """Whether any linear layer of `model` has FP8 on."""
    return any(layer.fp8 is not None for layer in _linears(model))
