"""bf16 mixed precision: `engine.autocast("cuda", dtype=engine.bfloat16)`, as torch.autocast.

Inside the context, on CUDA tensors: linear layers, matmul-heavy attention and embedding outputs
run in bfloat16 (cuBLASLt bf16 with float32 accumulation), so activations (and their gradients)
are bf16 in memory; layer norm, softmax and cross-entropy read bf16 and keep their statistics in
float32; the loss is float32. Parameters stay float32 (the master weights), and the optimizer and
its state never see bf16: a linear layer casts its weight for the GEMM itself and writes the weight
and bias gradients in float32 straight from the GEMM and the bias-gradient kernel; other uses cast
the parameter to bf16, and the cast's backward turns the bf16 gradient back into float32. Outside
the context (and on the CPU) nothing changes.
"""
from __future__ import annotations

import contextlib
import threading

from . import dtypes

_state = threading.local()


def get_autocast_dtype(device_type: str = "cuda"):
    """The dtype autocast runs `device_type` ops in now, or None when it is off."""
    if device_type != "cuda":
        return None
    return getattr(_state, "cuda_dtype", None)


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    return get_autocast_dtype(device_type) is not None


class autocast(contextlib.ContextDecorator):
    """Context manager and decorator: run CUDA ops in bf16 with float32 master weights.

    autocast("cuda", dtype=engine.bfloat16, enabled=True); nesting with enabled=False switches it off."""

    def __init__(self, device_type: str = "cuda", dtype=dtypes.bfloat16, enabled: bool = True):
        device_type = str(device_type).split(":")[0]
        dtype = dtypes.as_dtype(dtype)
        if device_type != "cuda":
            raise ValueError(f"autocast: device_type must be 'cuda', got {device_type!r} "
                             "(the CPU backend has no bfloat16 arithmetic; run float32 there)")
        if enabled and dtype is not dtypes.bfloat16:
            raise ValueError(f"autocast: dtype must be engine.bfloat16, got {dtype}")
        self.dtype = dtype if enabled else None

    def __enter__(self):
        self.prev = getattr(_state, "cuda_dtype", None)
        _state.cuda_dtype = self.dtype
        return self

    def __exit__(self, *exc):
        _state.cuda_dtype = self.prev
        return False


def cast_for(tensor):
    """The autocast dtype for an op on `tensor` (a floating CUDA tensor while autocast is on), else None."""
    dt = getattr(_state, "cuda_dtype", None)
    if dt is None or tensor.device.type != "cuda" or not tensor.dtype.is_floating_point:
        return None
    return dt
