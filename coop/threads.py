"""One pool of threads for the numerical work of a round (numpy's kernels release the GIL).

A coordinator's close and a worker's encoding are made of independent pieces (tensors, chunks of
coordinates): `parallel_map` spreads them over every core. Small work stays on the calling thread,
where a hand-off would cost more than it saves.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

SERIAL_BELOW = 1 << 18  # elements: less than this in all is done on the calling thread
_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="coop-numeric")
        return _pool


def parallel_map(fn: Callable[[T], R], items: Iterable[T], size: int | None = None) -> list[R]:
    """[fn(item) for item in items], in order, on the pool's threads when there are several items
    and `size` (the elements the work covers; None: unknown, use the pool) is not small. A task
    must not itself wait on the pool (it would deadlock once every thread waits)."""
    items = list(items)
    if len(items) < 2 or (size is not None and size < SERIAL_BELOW) or threading.current_thread().name.startswith(
            "coop-numeric"):
        return [fn(item) for item in items]
    return list(pool().map(fn, items))
