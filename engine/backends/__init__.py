"""Backends implement one primitive op set (see `cpu.py`, its reference definition).

`backend_for(device)` returns the module that runs ops for a device; autograd and everything above
it call only the functions these modules share."""
from __future__ import annotations

from . import cpu

_cuda = None


def backend_for(device):
    if device.type == "cpu":
        return cpu
    global _cuda
    if _cuda is None:
        from .. import cuda as cuda_api

        if not cuda_api.is_available():
            raise RuntimeError(
                f"device {device} was asked for but CUDA is not available: "
                f"{cuda_api.unavailable_reason()}. Use device='cpu', or run on a machine with an NVIDIA GPU "
                "and a CUDA build of engine (python -m engine shows what was built)."
            )
        from . import cuda as cuda_backend

        _cuda = cuda_backend
    return _cuda
