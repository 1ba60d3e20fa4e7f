"""Giving freed memory back to the operating system.

numpy's mid-sized arrays (the 128 KB - 32 MB temporaries of a round's chunked work, a model's
initialisation) come from glibc's heaps, one per thread that allocates; freed, they stay mapped to
the process for reuse. After a coordinator starts, 650 MB of a 124M model's 1.3 GB resident were
such free memory (traced live: 475 MB). `malloc_trim(0)` returns what the heaps hold free; the
coordinator calls it once set up and after each round's close, so what it holds between rounds is
what it uses. Elsewhere (no glibc) it does nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util

_trim = None


def give_back_free_memory() -> bool:
    """Return the heaps' free memory to the OS (glibc's malloc_trim). False where unavailable."""
    global _trim
    if _trim is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _trim = libc.malloc_trim
            _trim.argtypes, _trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):
            _trim = False
    return bool(_trim) and bool(_trim(0))


def uninitialised(size: int) -> memoryview:
    """A writable buffer of `size` bytes whose pages are not touched until written: a body about to
    be received into. bytearray(size) would zero it first, with the GIL held (0.2 s for 500 MB)."""
    import numpy as np

    return memoryview(np.empty(size, dtype=np.uint8))


def large_allocations_off_the_heaps(threshold: int = 4 << 20) -> bool:
    """Serve every allocation of `threshold` bytes or more by its own mapping, returned to the OS
    when freed (glibc's M_MMAP_THRESHOLD, fixed). By default glibc raises that threshold up to 32
    MB as large blocks are freed, so a coordinator's 8-16 MB buffers (a connection's spool piece,
    a spooled check's chunk), once freed, stay in the heap of each thread that used them: 0.2x a
    124M model's size at the close's peak. The 1-2 MB stacks of the robust rules' chunks stay
    below it, reused from the heaps without page faults. False where unavailable."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(-3, threshold))  # M_MMAP_THRESHOLD
