"""A pseudo-terminal of a given width for tests of what a command draws, and a reading of its output.

`run_in_terminal(argv, columns)` runs a real process with stdin/stdout/stderr on a pty whose
window is `columns` wide (as a terminal of that size tells it) and returns all it wrote.
`progress_draws(output)` are the progress lines drawn in it: every piece between carriage
returns and newlines that holds an ETA, with the ANSI control sequences taken out.
"""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
import unicodedata

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def set_window(fd: int, columns: int, rows: int = 24) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


def drain(master: int, until, timeout: float) -> bytes:
    """Read the master side until `until()` is true and nothing more comes, or `timeout` passes."""
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed (the process ended)
                break
            if not data:
                break
            chunks.append(data)
        elif until():
            break
    return b"".join(chunks)


def run_in_terminal(argv: list[str], columns: int, timeout: float, env: dict | None = None,
                    cwd=None) -> tuple[int, str]:
    """(exit status, everything written) of `argv` run on a pty `columns` wide."""
    master, slave = pty.openpty()
    set_window(slave, columns)
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, close_fds=True)
    os.close(slave)
    try:
        output = drain(master, lambda: process.poll() is not None, timeout)
        status = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return status, output.decode("utf-8", errors="replace")


def width(text: str) -> int:
    """Columns `text` takes on a terminal (wide characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def progress_draws(output: str) -> list[str]:
    """The progress lines drawn (pieces with an ETA), control sequences removed, trailing padding kept."""
    pieces = re.split(r"[\r\n]", ANSI.sub("", output))
    return [piece for piece in pieces if "ETA" in piece]
