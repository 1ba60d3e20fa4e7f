"""engine.cuda: is a GPU usable, and the GPU's memory and stream (the `torch.cuda` counterparts).

Importing this never fails: without a CUDA build of `engine._C`, a driver or a GPU,
`is_available()` is False and `unavailable_reason()` says why.
"""
from __future__ import annotations

import glob
import os

_C = None
_import_error = ""


def _preload_cublaslt() -> bool:
    """Load libcublasLt from the `nvidia-cublas` wheel (nvidia/cu13/lib) so that `engine._C`,
    linked against it, imports even where its RPATH does not point at that wheel."""
    import ctypes

    try:
        import nvidia.cu13 as cu13  # namespace package of the nvidia-cublas wheel
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
    global _C, _import_error
    try:
        from . import _C as ext
    except ImportError as first:
        if "cublas" in str(first).lower() and _preload_cublaslt():
            try:
                from . import _C as ext
            except ImportError as second:
                _import_error = f"engine._C failed to import: {second}"
                return
        else:
            _import_error = (f"engine._C failed to import ({first}); build it with `pip install -e .`"
                             if "No module named" not in str(first) and "cannot import name" not in str(first)
                             else "engine._C is not built (run `pip install -e .` in the repository)")
            return
    _C = ext


_load()


def build_info() -> dict:
    """What engine._C was built with: version, compiler, cuda_built and cuda_reason, cuBLASLt path."""
    if _C is None:
        return {"version": None, "compiler": None, "cuda_built": False, "cuda_reason": _import_error,
                "cublaslt_path": ""}
    return dict(_C.build_info())


def is_built() -> bool:
    """True when engine._C has its CUDA backend compiled in (whether or not a GPU is present)."""
    return _C is not None and bool(_C.build_info()["cuda_built"])


def unavailable_reason() -> str:
    """'' when a GPU is usable; otherwise what is missing: the build, the driver or the device."""
    if _C is None:
        return _import_error
    info = _C.build_info()
    if not info["cuda_built"]:
        return f"engine was built without CUDA: {info['cuda_reason']}"
    return _C.cuda_status()


_available = None


def is_available() -> bool:
    global _available
    if _available is None:
        _available = _C is not None and bool(_C.cuda_available())
    return _available


def device_count() -> int:
    return int(_C.device_count()) if _C is not None else 0


# ---- current device ----------------------------------------------------------------------------

_current = 0


def _index(device=None) -> int:
    """The device index of None (the current device), an int, 'cuda', 'cuda:1' or a Device."""
    if device is None:
        return _current
    if isinstance(device, int):
        idx = device
    else:
        typ = getattr(device, "type", None)
        if typ is not None:
            if typ != "cuda":
                raise ValueError(f"expected a CUDA device, got {device}")
            idx = device.index or 0
        else:
            s = str(device)
            kind, _, num = s.partition(":")
            if kind != "cuda" or (num and not num.isdigit()):
                raise ValueError(f"expected a CUDA device like 'cuda' or 'cuda:1', got {device!r}")
            idx = int(num) if num else 0
    n = device_count()
    if idx < 0 or (n > 0 and idx >= n):
        raise RuntimeError(f"CUDA device cuda:{idx} does not exist: device_count() is {n}")
    return idx


def _require(device=None) -> int:
    if not is_available():
        raise RuntimeError(f"CUDA is not available: {unavailable_reason()}")
    return _index(device)


def current_device() -> int:
    return _current


def set_device(device) -> None:
    """Make `device` the one that `cuda` (no index) and the functions here default to."""
    global _current
    _current = _require(device)


def get_device_name(device=None) -> str:
    return _C.device_properties(_require(device))["name"]


def get_device_properties(device=None) -> dict:
    """name, major, minor (compute capability), total_memory, multi_processor_count, l2_cache_size."""
    return dict(_C.device_properties(_require(device)))


def get_device_capability(device=None) -> tuple:
    p = get_device_properties(device)
    return p["major"], p["minor"]


# ---- stream and memory --------------------------------------------------------------------------

def synchronize(device=None) -> None:
    """Wait until all of engine's queued work on the device has finished."""
    if is_available():
        _C.synchronize(_index(device))


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by live engine arrays (allocator blocks) on the device."""
    return int(_C.mem_stats(_index(device))["allocated"]) if is_available() else 0


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return int(_C.mem_stats(_index(device))["peak"]) if is_available() else 0


def memory_reserved(device=None) -> int:
    """Bytes taken from the driver: live blocks plus the allocator's cache."""
    return int(_C.mem_stats(_index(device))["reserved"]) if is_available() else 0


def reset_peak_memory_stats(device=None) -> None:
    if is_available():
        _C.reset_peak(_index(device))


def empty_cache() -> None:
    """Give the allocator's cached (unused) blocks back to the driver on every device."""
    if is_available():
        for i in range(device_count()):
            _C.empty_cache(i)


# ---- random numbers -----------------------------------------------------------------------------
# The device RNG is counter based (Philox): a (seed, offset) pair per device, the offset advanced
# by each use, so no RNG state lives on the GPU and results do not depend on launch order.

_seeds: dict = {}
_DEFAULT_SEED = 0x2545F4914F6CDD1D & 0x7FFFFFFFFFFFFFFF


def manual_seed(seed: int, device=None) -> None:
    """Seed the device's random numbers (dropout masks and on-device random tensors)."""
    _seeds[_current if device is None else _index(device)] = [int(seed), 0]


def manual_seed_all(seed: int) -> None:
    for i in range(max(device_count(), 1)):
        _seeds[i] = [int(seed), 0]


def initial_seed(device=None) -> int:
    return _seeds.get(_current if device is None else _index(device), [_DEFAULT_SEED, 0])[0]


def _philox_state(device_index: int, count: int) -> tuple:
    """(seed, offset) for a draw of `count` random numbers; advances the device's offset."""
    state = _seeds.setdefault(device_index, [_DEFAULT_SEED, 0])
    seed, offset = state
    state[1] = offset + ((count + 3) // 4) * 4
    return seed, offset


# ---- matmul precision ---------------------------------------------------------------------------

def set_allow_tf32(allow: bool) -> None:
    """float32 matmuls on TF32 tensor cores (default True, like torch.backends.cuda.matmul.allow_tf32
    set to True): ~10 mantissa bits in the products, float32 accumulation."""
    if _C is not None and hasattr(_C, "set_allow_tf32"):
        _C.set_allow_tf32(bool(allow))


def allow_tf32() -> bool:
    return bool(_C.allow_tf32()) if _C is not None and hasattr(_C, "allow_tf32") else False


# ---- CUDA graphs ----------------------------------------------------------------------------------
# engine.cuda.graphs is engine/graphs.py (CapturedStep, graph_step, compile_block), imported on
# first use: it needs engine.tensor, which imports this module.

_GRAPH_NAMES = ("CapturedStep", "graph_step", "CompiledBlock", "compile_block", "GraphCaptureWarning")


def __getattr__(name):
    if name == "graphs" or name in _GRAPH_NAMES:
        from . import graphs

        return graphs if name == "graphs" else getattr(graphs, name)
    raise AttributeError(f"module 'engine.cuda' has no attribute {name!r}")


def is_current_stream_capturing(device=None) -> bool:
    """True while engine's stream on the device is being recorded into a CUDA graph."""
    return bool(is_available() and hasattr(_C, "capturing") and _C.capturing(_index(device)))
