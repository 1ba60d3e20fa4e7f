"""coop.memory: freed heap memory goes back to the OS (glibc)."""
from __future__ import annotations

import platform

import numpy as np
import pytest

from coop.memory import give_back_free_memory


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc")
def test_freed_mid_sized_arrays_are_given_back():
    np.ones(1 << 20, np.float32)  # a freed 4 MB mapping raises glibc's mmap threshold: the next ones are heap
    arrays = [np.ones(1 << 20, np.float32) for _ in range(100)]  # 400 MB of heap
    last = arrays.pop()  # the top of the heap stays in use, so the free memory below it stays mapped
    del arrays
    held = resident_mb()
    assert give_back_free_memory()
    assert resident_mb() < held - 300, (held, resident_mb())
    assert last.sum() == 1 << 20  # what is in use is untouched
