"""Backends implement one primitive op set (see `cpu/`, its reference definition).

`backend_for(device)` returns the module that runs ops for a device; autograd and everything above
it call only the functions these modules share."""
from __future__ import annotations

from . import cpu, cuda
from .cuda import runtime as cuda_runtime


def backend_for(device):
    if device.type == "cpu":
        return cpu
    if not cuda_runtime.is_available():
        raise RuntimeError(
            f"device {device} was asked for but CUDA is not available: "
            f"{cuda_runtime.unavailable_reason()}. Use device='cpu', or run on a machine with an NVIDIA GPU "
            "and a CUDA build of engine (python -m engine shows what was built)."
        )
    return cuda
