"""engine.cuda: is a GPU usable, and the GPU's memory and stream (the `torch.cuda` counterparts).

Importing this never fails: without a CUDA build of `engine._C`, a driver or a GPU,
`is_available()` is False and `unavailable_reason()` says why. The functions live in the CUDA
backend (engine/backends/cuda/runtime.py); CUDA graphs are engine/graphs/, also reachable as
`engine.cuda.graphs`.
"""
from __future__ import annotations

from . import graphs
from .backends.cuda.runtime import (Event, allow_tf32, build_info, current_device, device_count, empty_cache,
                                    get_device_capability, get_device_name, get_device_properties, initial_seed,
                                    is_available, is_built, is_current_stream_capturing, manual_seed,
                                    manual_seed_all, max_memory_allocated, memory_allocated, memory_reserved,
                                    reset_peak_memory_stats, set_allow_tf32, set_device, synchronize,
                                    unavailable_reason)
from .graphs import CapturedStep, CompiledBlock, GraphCaptureWarning, compile_block, graph_step

__all__ = ["Event", "allow_tf32", "build_info", "current_device", "device_count", "empty_cache", "get_device_capability",
           "get_device_name", "get_device_properties", "initial_seed", "is_available", "is_built",
           "is_current_stream_capturing", "manual_seed", "manual_seed_all", "max_memory_allocated",
           "memory_allocated", "memory_reserved", "reset_peak_memory_stats", "set_allow_tf32", "set_device",
           "synchronize", "unavailable_reason", "graphs", "CapturedStep", "CompiledBlock", "GraphCaptureWarning",
           "compile_block", "graph_step"]
