"""The one module that loads the native extension `engine._C` (csrc/): everything else reaches
native code through the CUDA backend (engine/backends/cuda/), which imports `native` from here,
except the CPU kernels of the coordinator's close (csrc/cpu/: median_dots, weighted_sum_into, in
every build, the CPU-only one too), which coop.robust reaches through this module's `native`.

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


def _wheel_roots(package: str) -> list[str]:
    """The directories of an nvidia wheel's namespace package (nvidia.cu13, nvidia.nccl), or []."""
    try:
        module = importlib.import_module(package)  # optional: only where the wheel is installed
    except Exception:
        return []
    return list(getattr(module, "__path__", []))


def _preload(package: str, pattern: str) -> bool:
    """Load the first library matching `pattern` from the wheel `package` (its lib/ folder)."""
    for root in _wheel_roots(package):
        for lib in sorted(glob.glob(os.path.join(root, "lib", pattern))):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


def _preload_cublaslt() -> bool:
    """Load libcublasLt from the `nvidia-cublas` wheel (nvidia/cu13/lib) so that `engine._C`,
    linked against it, imports even where its RPATH does not point at that wheel."""
    return _preload("nvidia.cu13", "libcublasLt.so*")


def _preload_nccl() -> bool:
    """Load libnccl from the `nvidia-nccl-cu13` wheel (nvidia/nccl/lib, or nvidia/cu13/lib), the
    same way, for a build of `engine._C` with the NCCL process group."""
    return _preload("nvidia.nccl", "libnccl.so*") or _preload("nvidia.cu13", "libnccl.so*")


def _preload_for(error: ImportError) -> bool:
    """Preload what the failed import names (cuBLASLt, NCCL); True when something was loaded."""
    text = str(error).lower()
    loaded = False
    if "cublas" in text:
        loaded = _preload_cublaslt() or loaded
    if "nccl" in text:
        loaded = _preload_nccl() or loaded
    return loaded


def _load():
    global native, import_error
    # the extension may be absent or fail to load (cuBLASLt / NCCL not found): each library the
    # loader names is preloaded from its wheel and the import tried again, else the error recorded
    for attempt in range(3):
        try:
            native = importlib.import_module("._C", __package__)
            return
        except ImportError as error:
            if attempt < 2 and _preload_for(error):
                continue
            if attempt:
                import_error = f"engine._C failed to import: {error}"
            elif "No module named" in str(error) or "cannot import name" in str(error):
                import_error = "engine._C is not built (run `pip install -e .` in the repository)"
            else:
                import_error = f"engine._C failed to import ({error}); build it with `pip install -e .`"
            return


_load()
