"""A round's updates kept on disk once RAM runs short, so that the coordinator's memory is O(model)
plus a fixed budget for any number of workers.

The robust rules need every update of the round at its close (a coordinate-wise median looks at
all N values of a coordinate at once): N x model bytes. Held in RAM, 8 workers of a 124M model
take 4 GB and 100 workers take 50 GB. Spooled, each update is one flat float32 vector in an unnamed
file of the spool directory; the close reads the N rows of one chunk of coordinates at a time
(`read_into`, `os.preadv` straight into the chunk's stack, the same one copy `np.stack` makes), and
the page cache keeps in RAM what fits there, at memory speed, without it counting against the
process. A memory map would count: its pages are resident in the process once touched.

`MemoryBudget` decides which: uploads and kept updates stay in RAM while they fit the budget (by
default half the memory available when the coordinator starts: a run that fits in RAM never
touches the disk), the rest goes through the spool.

The files are opened with O_TMPFILE (`tempfile.TemporaryFile`): they have no name, so a crash
leaves nothing behind, and closing one (at the round's reset, or when a refused update is dropped)
gives its space back.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import numpy as np

_WRITE_CHUNK = 16 << 20  # bytes per write(): a tensor converted to float32 is never copied whole


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        view = view[os.write(fd, view):]


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    while view.nbytes:
        n = os.preadv(fd, [view], offset)
        if n <= 0:
            raise OSError(f"the spool file ended {view.nbytes} bytes early (was it truncated?)")
        view, offset = view[n:], offset + n


class SpooledVector:
    """One flat float32 vector in a file of its own. `size` elements; `read_into` fills a buffer
    from any range; `load` reads it whole (for the rules that need whole vectors). By default the
    file holds the vector from byte 0; `segments` (vector start, file offset in bytes, count) say
    where its pieces lie otherwise (an fp32 upload's tensors in its body, in the model's order)."""

    def __init__(self, file, size: int, segments: list[tuple[int, int, int]] | None = None):
        self._file = file
        self.size = size
        self.dtype = np.dtype(np.float32)
        self.segments = segments if segments is not None else [(0, 0, size)]

    def read_into(self, start: int, out: np.ndarray) -> np.ndarray:
        """out[:] = vector[start : start + out.size]; `out` is a contiguous float32 array."""
        if not (out.dtype == np.float32 and out.flags.c_contiguous) or start < 0 or start + out.size > self.size:
            raise ValueError(f"read of {out.size} float32 at {start} from a spooled vector of {self.size}")
        stop = start + out.size
        for first, offset, count in self.segments:  # the pieces of the file [start, stop) covers
            lo, hi = max(start, first), min(stop, first + count)
            if lo < hi:
                _pread_into(self._file.fileno(), memoryview(out[lo - start : hi - start]).cast("B"),
                            offset + 4 * (lo - first))
        return out

    def __getitem__(self, item: slice) -> np.ndarray:
        start, stop, step = item.indices(self.size)
        if step != 1:
            raise IndexError("a spooled vector is read in contiguous ranges only")
        return self.read_into(start, np.empty(max(0, stop - start), dtype=np.float32))

    def load(self) -> np.ndarray:
        return self[:]

    def close(self) -> None:
        self._file.close()


class SpooledBody:
    """An upload's body, written to an unnamed file as it arrives (`write`), read back whole by
    the thread that decodes it (`read`). A coordinator receives any number of uploads at once
    this way, each costing a file, not its size in memory; only the decodes are bounded."""

    def __init__(self, file):
        self._file = file
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.size += memoryview(data).nbytes
        _write_all(self._file.fileno(), data)

    def read(self) -> bytearray:
        return self.read_range(0, self.size)

    def read_range(self, start: int, stop: int) -> bytearray:
        """Bytes [start, stop) of the body."""
        if not 0 <= start <= stop <= self.size:
            raise ValueError(f"bytes {start}:{stop} of a spooled body of {self.size}")
        data = bytearray(stop - start)
        _pread_into(self._file.fileno(), memoryview(data), start)
        return data

    def read_into(self, offset: int, out: np.ndarray) -> np.ndarray:
        """out's bytes from the body's bytes at `offset` (out: a contiguous array)."""
        if offset < 0 or offset + out.nbytes > self.size:
            raise ValueError(f"{out.nbytes} bytes at {offset} of a spooled body of {self.size}")
        _pread_into(self._file.fileno(), memoryview(out).cast("B"), offset)
        return out

    def as_vector(self, segments: list[tuple[int, int, int]], size: int) -> SpooledVector:
        """The body's file, as a flat float32 vector of `size` elements in these `segments` (see
        SpooledVector). The file now belongs to the vector: closing the body no longer closes it."""
        vector = SpooledVector(self._file, size, segments)
        self._file = None
        return vector

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class Spool:
    """Where a coordinator spools the uploads it receives and the round's updates its robust
    aggregators keep (`directory`, created if missing, 0700)."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def body(self) -> SpooledBody:
        """A new, empty spooled body (see SpooledBody)."""
        return SpooledBody(tempfile.TemporaryFile(dir=self.directory, prefix="upload-"))

    def write(self, tensors: Iterable[np.ndarray]) -> SpooledVector:
        """The tensors, in order, as one flat float32 vector on disk. Safe to call from several
        threads at once (each vector is a file of its own). Raises OSError (disk full, ...) with
        nothing left behind."""
        file = tempfile.TemporaryFile(dir=self.directory, prefix="update-")
        try:
            size = 0
            for tensor in tensors:
                flat = np.asarray(tensor).reshape(-1)
                step = _WRITE_CHUNK // 4
                for start in range(0, flat.size, step):
                    _write_all(file.fileno(), np.ascontiguousarray(flat[start : start + step], dtype=np.float32))
                size += flat.size
            return SpooledVector(file, size)
        except BaseException:
            file.close()
            raise


class MemoryBudget:
    """Bytes of uploads and kept updates that may be in RAM at once (None: no limit). `reserve`
    says whether n more fit (and counts them); `release` gives them back. Thread-safe: uploads
    are decoded in several threads at once."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        with self._lock:
            if self.limit is not None and self.used + n > self.limit:
                return False
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


def available_memory() -> int | None:
    """Bytes of memory available to new allocations now (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
