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

import numpy as np

T = TypeVar("T")
R = TypeVar("R")

SERIAL_BELOW = 1 << 18  # elements: less than this in all is done on the calling thread
PIECE = 1 << 22  # elements of a work item of `pieces`: a few MB, many of them for a large model
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


def pieces(arrays: Iterable, piece: int | None = None) -> list:
    """Flat views of the arrays (numpy; a copy only where one is not contiguous), in order, each cut
    into pieces of at most `piece` elements: work items that `parallel_map` spreads over the cores
    evenly, however the elements are shared among the arrays (GPT-2's embedding is 31% of it)."""
    piece, out = piece or PIECE, []
    for array in arrays:
        flat = array.reshape(-1)
        out += [flat[start : start + piece] for start in range(0, flat.size, piece)] if flat.size > piece else [flat]
    return out


def copy_all(targets: Iterable, sources: Iterable) -> None:
    """targets[i][...] = sources[i] for each pair of arrays of one size (numpy), in pieces on every
    core. The targets must be contiguous (views written in place: the pieces are views of them)."""
    targets, sources = list(targets), list(sources)
    for target, source in zip(targets, sources):
        if not target.flags.c_contiguous or target.size != source.size:
            raise ValueError(f"copy_all: a target of {target.size} elements (contiguous: {target.flags.c_contiguous}) "
                             f"for a source of {source.size}")
    pairs = list(zip(pieces(targets), pieces(sources)))
    parallel_map(lambda pair: np.copyto(pair[0], pair[1].reshape(pair[0].shape)), pairs, sum(t.size for t in targets))
