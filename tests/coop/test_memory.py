"""coop.memory: freed heap memory goes back to the OS (glibc)."""
from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coop.memory import give_back_free_memory


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc")
def test_freed_mid_sized_arrays_are_given_back():
    np.ones(1 << 20, np.float32)  # a freed 4 MB mapping raises glibc's mmap threshold: the next ones are heap
    arrays = [np.ones(1 << 19, np.float32) for _ in range(200)]  # 400 MB of heap (2 MB each: below the threshold)
    last = arrays.pop()  # the top of the heap stays in use, so the free memory below it stays mapped
    del arrays
    held = resident_mb()
    assert give_back_free_memory()
    assert resident_mb() < held - 300, (held, resident_mb())
    assert last.sum() == 1 << 19  # what is in use is untouched


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="needs glibc")
def test_past_the_threshold_freed_buffers_leave_at_once():
    """large_allocations_off_the_heaps (a coordinator's setting): an 8 MB buffer, freed, is given
    back there and then, even after glibc would have raised its threshold past it."""
    script = """
import numpy as np
from coop.memory import large_allocations_off_the_heaps
from test_memory import resident_mb
assert large_allocations_off_the_heaps()
np.ones(8 << 20, np.uint8)  # freed: glibc's own rule would now keep buffers of this size in the heap
arrays = [np.ones(8 << 20, np.uint8) for _ in range(40)]  # 320 MB
last = arrays.pop()
held = resident_mb()
del arrays
print(held - resident_mb())
"""
    freed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).parent)
    assert float(freed.stdout) > 250, freed.stdout
