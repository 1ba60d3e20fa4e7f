"""A one-line progress display for long runs: step, a message, tokens/s and ETA."""
from __future__ import annotations

import sys
import time


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Rewrites one line on a terminal; prints plain lines when the output is a file or pipe."""

    def __init__(self, total: int, start: int = 0, quiet: bool = False, stream=None):
        self.total, self.done0 = total, start
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = self.t_last = time.perf_counter()
        self.tokens_since = 0

    def update(self, done: int, message: str, tokens: int = 0) -> None:
        now = time.perf_counter()
        self.tokens_since += tokens
        rate = self.tokens_since / max(now - self.t_last, 1e-9)
        self.t_last, self.tokens_since = now, 0
        per_item = (now - self.t0) / max(done - self.done0, 1)
        eta = per_item * (self.total - done)
        line = f"[{done}/{self.total}] {message}  {rate:,.0f} tok/s  ETA {format_duration(eta)}"
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        """A line that stays (an evaluation result), printed above the progress line."""
        if self.quiet:
            return
        self.stream.write(("\r\033[K" if self.tty else "") + message + "\n")
        self.stream.flush()
