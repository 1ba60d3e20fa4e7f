"""CUDA graph capture as the backend offers it: graphs, their private memory pools, the allocator's
count of cudaMallocs, and whether a device's stream is being captured. engine/graphs/ builds
CapturedStep and compile_block on these."""
from __future__ import annotations

from ..._native import native


def graphs_built() -> bool:
    """Whether this build of engine._C has CUDA graph support."""
    return hasattr(native, "CudaGraph")


def graph_pool(device_index: int):
    """A private memory pool for graphs on the device (engine._C.GraphPool: activate, deactivate, stats)."""
    return native.GraphPool(device_index)


def cuda_graph(device_index: int, pool):
    """An empty CUDA graph whose capture allocates from `pool` (engine._C.CudaGraph: begin, end, abort,
    replay)."""
    return native.CudaGraph(device_index, pool)


def alloc_count(device_index: int) -> int:
    """How many blocks the caching allocator has taken from the driver on the device so far."""
    return native.alloc_count(device_index)


def capturing(device_index: int) -> bool:
    """True while the device's stream is being recorded into a CUDA graph."""
    return native.capturing(device_index)
