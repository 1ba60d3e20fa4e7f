"""glibc malloc tuning for the CPU backend: large arrays from a heap that keeps freed memory."""
from __future__ import annotations

import ctypes
import os
import sys


def keep_freed_arrays_in_the_heap() -> None:
    """Ask glibc to serve large arrays from the heap and keep freed memory there.

    By default every array over ~128 KB is a fresh mmap, so each op's output page-faults its
    memory in again: a third of a small GPT's training step went to that. With these settings a
    freed activation's memory is reused by the next one, as a caching allocator would.
    Set ENGINE_NO_MALLOC_TUNING=1 to leave malloc alone."""
    if not sys.platform.startswith("linux") or os.environ.get("ENGINE_NO_MALLOC_TUNING"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)  # glibc's maximum on 64-bit
        libc.mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        pass
