"""The CUDA runtime as the backend sees it: whether engine._C is built and a GPU usable, the devices
and the current one, the stream (synchronize), the caching allocator's statistics, the device
RNG's seeds, TF32 matmuls. engine.cuda is the public face of this module (the `torch.cuda`
counterparts); without a CUDA build, a driver or a GPU every query here still answers."""
from __future__ import annotations

from ..._native import import_error, native


def build_info() -> dict:
    """What engine._C was built with: version, compiler, cuda_built and cuda_reason, cuBLASLt path."""
    if native is None:
        return {"version": None, "compiler": None, "cuda_built": False, "cuda_reason": import_error,
                "cublaslt_path": ""}
    return dict(native.build_info())


def is_built() -> bool:
    """True when engine._C has its CUDA backend compiled in (whether or not a GPU is present)."""
    return native is not None and bool(native.build_info()["cuda_built"])


def unavailable_reason() -> str:
    """'' when a GPU is usable; otherwise what is missing: the build, the driver or the device."""
    if native is None:
        return import_error
    info = native.build_info()
    if not info["cuda_built"]:
        return f"engine was built without CUDA: {info['cuda_reason']}"
    return native.cuda_status()


_available = None


def is_available() -> bool:
    global _available
    if _available is None:
        _available = native is not None and bool(native.cuda_available())
    return _available


def device_count() -> int:
    return int(native.device_count()) if native is not None else 0


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
    return native.device_properties(_require(device))["name"]


def get_device_properties(device=None) -> dict:
    """name, major, minor (compute capability), total_memory, multi_processor_count, l2_cache_size."""
    return dict(native.device_properties(_require(device)))


def get_device_capability(device=None) -> tuple:
    p = get_device_properties(device)
    return p["major"], p["minor"]


def synchronize(device=None) -> None:
    """Wait until all of engine's queued work on the device has finished."""
    if is_available():
        native.synchronize(_index(device))


class Event:
    """A point in a device's stream (torch.cuda.Event without timing): `record()` marks what has been
    queued so far, `query()` says whether it has all run, `synchronize()` waits for it (other Python
    threads run meanwhile). Needs a usable GPU."""

    def __init__(self, device=None):
        index = _require(device)
        self._event = native.StreamEvent(index)

    def record(self) -> Event:
        self._event.record()
        return self

    def query(self) -> bool:
        return bool(self._event.query())

    def synchronize(self) -> None:
        self._event.synchronize()


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by live engine arrays (allocator blocks) on the device."""
    return int(native.mem_stats(_index(device))["allocated"]) if is_available() else 0


def max_memory_allocated(device=None) -> int:
    """Peak of memory_allocated() since the start or the last reset_peak_memory_stats()."""
    return int(native.mem_stats(_index(device))["peak"]) if is_available() else 0


def memory_reserved(device=None) -> int:
    """Bytes taken from the driver: live blocks plus the allocator's cache."""
    return int(native.mem_stats(_index(device))["reserved"]) if is_available() else 0


def reset_peak_memory_stats(device=None) -> None:
    if is_available():
        native.reset_peak(_index(device))


def empty_cache() -> None:
    """Give the allocator's cached (unused) blocks back to the driver on every device."""
    if is_available():
        for i in range(device_count()):
            native.empty_cache(i)


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


def set_allow_tf32(allow: bool) -> None:
    """float32 matmuls on TF32 tensor cores (default True, like torch.backends.cuda.matmul.allow_tf32
    set to True): ~10 mantissa bits in the products, float32 accumulation."""
    if native is not None and hasattr(native, "set_allow_tf32"):
        native.set_allow_tf32(bool(allow))


def allow_tf32() -> bool:
    return bool(native.allow_tf32()) if native is not None and hasattr(native, "allow_tf32") else False


def is_current_stream_capturing(device=None) -> bool:
    """True while engine's stream on the device is being recorded into a CUDA graph."""
    return bool(is_available() and hasattr(native, "capturing") and native.capturing(_index(device)))
