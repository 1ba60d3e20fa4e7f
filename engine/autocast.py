"""bf16 mixed precision: `engine.autocast("cuda", dtype=engine.bfloat16)`, as torch.autocast.

Inside the context, on CUDA tensors: linear layers, matmul-heavy attention and embedding outputs
run in bfloat16 (cuBLASLt bf16 with float32 accumulation), so activations (and their gradients)
are bf16 in memory; layer norm, softmax and cross-entropy read bf16 and keep their statistics in
float32; the loss is float32. Parameters stay float32 (the master weights), and the optimizer and
its state never see bf16: a linear layer casts its weight for the GEMM itself and writes the weight
and bias gradients in float32 straight from the GEMM and the bias-gradient kernel; other uses cast
the parameter to bf16, and the cast's backward turns the bf16 gradient back into float32. Outside
the context nothing changes.

`engine.autocast("cpu")` does the same to CPU tensors (as torch.autocast("cpu", dtype=bfloat16)):
the CPU backend computes bf16 ops in float32 and rounds where the CUDA kernels round, so a CPU run
under autocast shows what bf16 does to a model without a GPU. It is slower than float32 there (every
bf16 op converts its operands), so `coop train` keeps float32 on the CPU by default. The two device
types are switched on and off independently, as in torch.
"""
from __future__ import annotations

import contextlib
import threading

from . import dtypes

_state = threading.local()
_DEVICE_TYPES = ("cuda", "cpu")


def _device_type(device_type) -> str:
    name = str(device_type).split(":")[0]
    if name not in _DEVICE_TYPES:
        raise ValueError(f"autocast: device_type must be 'cuda' or 'cpu', got {device_type!r}")
    return name


def get_autocast_dtype(device_type: str = "cuda"):
    """The dtype autocast runs `device_type` ops in now, or None when it is off."""
    return getattr(_state, _device_type(device_type), None)


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    return get_autocast_dtype(device_type) is not None


class autocast(contextlib.ContextDecorator):
    """Context manager and decorator: run the ops of `device_type` ("cuda" or "cpu") in bf16 with float32
    master weights.

    autocast(device_type, dtype=engine.bfloat16, enabled=True); nesting with enabled=False switches it off."""

    def __init__(self, device_type: str = "cuda", dtype=dtypes.bfloat16, enabled: bool = True):
        self.device_type = _device_type(device_type)
        dtype = dtypes.as_dtype(dtype)
        if enabled and dtype is not dtypes.bfloat16:
            raise ValueError(f"autocast: dtype must be engine.bfloat16, got {dtype}")
        self.dtype = dtype if enabled else None

    def __enter__(self):
        self.prev = getattr(_state, self.device_type, None)
        setattr(_state, self.device_type, self.dtype)
        return self

    def __exit__(self, *exc):
        setattr(_state, self.device_type, self.prev)
        return False


def cast_for(tensor):
    """The autocast dtype for an op on `tensor` (a floating tensor whose device type has autocast on), else None."""
    dt = getattr(_state, tensor.device.type, None)
    if dt is None or not tensor.dtype.is_floating_point:
        return None
    return dt


# ---- one cast of the weights per forward -------------------------------------------------------
# A linear layer under autocast casts its float32 weight (and bias) where it is used: one small
# kernel per parameter. cast_weights casts them all at the start of a model's forward, one launch
# per device, and the ops of that forward take their copies from here. The copies live only as long
# as the scope: a weight changed after it (an optimizer step, an outer step, a load) is cast afresh
# by the next forward, and nothing else can see a stale copy.
_casts = threading.local()  # .arrays: {id(float32 array): (that array, its cast)} while a scope is open


@contextlib.contextmanager
def cast_weights(params):
    """Within the scope, the float32 parameters among `params` (Tensors), of a device type autocast is
    on for, cast once to the autocast dtype; ops get them with `weight_cast`. Without autocast on, or
    nested inside another scope (whose casts stay in use), it does nothing."""
    if getattr(_casts, "arrays", None) is not None:
        yield
        return
    by_backend: dict = {}
    for p in params:
        dt = cast_for(p)
        if dt is not None and p.dtype is dtypes.float32:
            by_backend.setdefault((p._backend, dt), {})[id(p.data)] = p.data  # a tied weight once
    arrays: dict = {}
    for (backend, dt), group in by_backend.items():
        xs = list(group.values())
        for x, y in zip(xs, backend.astype_many(xs, dt)):
            arrays[id(x)] = (x, y)
    _casts.arrays = arrays
    try:
        yield
    finally:
        _casts.arrays = None


def weight_cast(backend, array, dtype):
    """`array` (a parameter's data) in `dtype`: its copy from the open cast_weights scope when there is
    one, else cast now."""
    hit = (getattr(_casts, "arrays", None) or {}).get(id(array))
    if hit is not None and hit[0] is array and backend.dtype_of(hit[1]) is dtype:
        return hit[1]
    return backend.astype(array, dtype)
