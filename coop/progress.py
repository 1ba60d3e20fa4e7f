"""Progress of a long run: points done (steps of `coop train`, rounds of a worker), a message,
tokens/s and the ETA.

On a terminal it is one line drawn by tqdm, cut to the terminal's width (read again at every
redraw, so it never wraps): `round 3/100 |██        | ETA 05:02, step 14/50  3,456 tok/s  ...`,
the count and the ETA first so that a narrow terminal cuts the message, not them. Between two
points, `step()` (a replica's per-step hook, coop.replica) moves the line within the point: the
inner steps of the round and their tokens/s, so a worker whose round takes minutes shows it
moving. Written to a file or a pipe (a log, `docker logs`), it is plain lines: one per point,
`[3/100] message  3,456 tok/s  ETA 5m02s`, and within a point one at most every `interval_s`.
"""
from __future__ import annotations

import sys
import time

from tqdm import tqdm


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


# the count and the ETA before the message: tqdm cuts the line at the terminal's width from the right
BAR_FORMAT = "{desc} |{bar:10}| ETA {remaining}{postfix}"


class Progress:
    """A tqdm line on a terminal; plain lines when the output is a file or a pipe.

    total: points of the run (steps, rounds); start: points already done (a resumed run, a worker
    joining at round r); unit: what a point is called on the line; steps_per_point: inner steps
    of one point, for `step()` (0: the line moves only at `update()`)."""

    def __init__(self, total: int, start: int = 0, quiet: bool = False, stream=None, unit: str = "step",
                 steps_per_point: int = 0, interval_s: float = 30.0):
        self.total, self.done0, self.done = total, start, start
        self.quiet, self.unit, self.steps_per_point, self.interval_s = quiet, unit, steps_per_point, interval_s
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = self.t_last = self.t_line = time.perf_counter()
        self.tokens_since = 0
        self.message = ""
        self.inner_steps, self.inner_tokens, self.t_inner = 0, 0, self.t0  # since the last point
        self.bar = None
        if self.tty and not quiet:
            self.bar = tqdm(total=total, initial=start, file=self.stream, dynamic_ncols=True, bar_format=BAR_FORMAT,
                            desc=self._count(start), mininterval=0.25, miniters=0, smoothing=0.1, leave=True)

    def _count(self, done: int) -> str:
        return f"{self.unit} {done}/{self.total}"

    def update(self, done: int, message: str, tokens: int = 0) -> None:
        """Point `done` is finished: `message` (loss, bytes, ...) and the tokens since the last update."""
        now = time.perf_counter()
        self.tokens_since += tokens
        rate = self.tokens_since / max(now - self.t_last, 1e-9)
        self.t_last, self.tokens_since = now, 0
        self.done, self.message = done, message
        self.inner_steps, self.inner_tokens, self.t_inner = 0, 0, now
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.set_description_str(self._count(done), refresh=False)
            self.bar.set_postfix_str(f"{message}  {rate:,.0f} tok/s", refresh=False)
            self._move_to(done, force=True)
            if done >= self.total:  # the last point: the line stays as it is (another run may draw its own)
                self.close()
            return
        per_item = (now - self.t0) / max(done - self.done0, 1)
        eta = per_item * (self.total - done)
        self.t_line = now
        self._line(f"[{done}/{self.total}] {message}  {rate:,.0f} tok/s  ETA {format_duration(eta)}")

    def step(self, tokens: int = 0) -> None:
        """One inner step within the current point (a replica's step hook): the line shows the
        steps and tokens/s of the point so far; the ETA moves by the fraction of the point done."""
        self.inner_steps += 1
        self.inner_tokens += tokens
        if self.quiet:
            return
        now = time.perf_counter()
        rate = self.inner_tokens / max(now - self.t_inner, 1e-9)
        of = f"/{self.steps_per_point}" if self.steps_per_point else ""
        inner = f"{self.unit} {self.done}: step {self.inner_steps}{of}  {rate:,.0f} tok/s"
        if self.bar is not None:
            last = f"  | last {self.message}" if self.message else ""
            self.bar.set_postfix_str(inner.split(": ", 1)[1] + last, refresh=False)
            fraction = min(self.inner_steps / self.steps_per_point, 0.99) if self.steps_per_point else 0.0
            self._move_to(self.done + fraction)
        elif now - self.t_line >= self.interval_s:
            self.t_line = now
            self._line(f"[{self.done}/{self.total}] {inner}")

    def _move_to(self, n: float, force: bool = False) -> None:
        if n >= self.bar.n:
            self.bar.update(n - self.bar.n)  # through update(): tqdm's rate (and so the ETA) follows
        else:  # a worker sent back to an earlier round
            self.bar.n = n
        if force:
            self.bar.refresh()

    def _line(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        """A line that stays (an evaluation result), printed above the progress line."""
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.clear()
            self._line(message)
            self.bar.refresh()
        else:
            self._line(message)

    def close(self) -> None:
        """Leave the last progress line on the terminal and end it."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
