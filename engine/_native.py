"""The one module that loads the native extension `engine._C` (csrc/): everything else reaches
native code through the CUDA backend (engine/backends/cuda/), which imports `native` from here.

Importing this never fails: where `engine._C` is missing or cannot load, `native` is None and
`import_error` says why (engine.cuda.unavailable_reason() reports it).
"""
from __future__ import annotations

import ctypes
import glob
import importlib
import os

native = None  # the extension module engine._C once loaded, None where it is not available
import_error = ""  # why it is not, for build_info() and unavailable_reason()


def _preload_cublaslt() -> bool:
    """Load libcublasLt from the `nvidia-cublas` wheel (nvidia/cu13/lib) so that `engine._C`,
    linked against it, imports even where its RPATH does not point at that wheel."""
    try:
        import nvidia.cu13 as cu13  # optional: the namespace package of the nvidia-cublas wheel
    except Exception:
        return False
    for root in list(cu13.__path__):
        for lib in sorted(glob.glob(os.path.join(root, "lib", "libcublasLt.so*"))):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


def _load():
    global native, import_error
    try:  # the extension may be absent or fail to load (cuBLASLt not found): then retried, or recorded
        ext = importlib.import_module("._C", __package__)
    except ImportError as first:
        if "cublas" in str(first).lower() and _preload_cublaslt():
            try:  # again, with libcublasLt now loaded
                ext = importlib.import_module("._C", __package__)
            except ImportError as second:
                import_error = f"engine._C failed to import: {second}"
                return
        else:
            import_error = (f"engine._C failed to import ({first}); build it with `pip install -e .`"
                            if "No module named" not in str(first) and "cannot import name" not in str(first)
                            else "engine._C is not built (run `pip install -e .` in the repository)")
            return
    native = ext


_load()
