"""The timing loop of the micro-benchmarks (bench/attention.py, bench/layer_norm.py)."""
from __future__ import annotations

import time


def seconds_per_call(fn, iters: int, warmup: int, sync) -> float:
    """Mean wall seconds of fn() over `iters` calls after `warmup`, the device synchronised (`sync`) around them."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters
