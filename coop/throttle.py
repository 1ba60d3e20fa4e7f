"""Bandwidth and latency emulation for coop's own HTTP transfers (`--limit-rate`, `--latency`).

A worker or a peer given `--limit-rate 100Mbit --latency 50ms` sends and receives through a
`ThrottledTransport`: each direction has a token bucket of that rate (a link is full duplex),
and every request waits `latency` before it leaves and again before its response is read, so a
round trip costs twice the latency, as a one-way delay on each side of a real link does. Only the
process's own transfers are slowed: benchmarks and tests show behaviour on internet links without
touching the machine's network set-up (no tc, no root).

    rate:    "100Mbit", "1Gbit", "500kbps" (bits/s) or "10MB", "250kB/s" (bytes/s); decimal units
    latency: "50ms", "0.2s", "200us"
"""
from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(bit/s|bit|bps|B/s|B)\s*$")  # b: bits, B: bytes
_LATENCY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)?\s*$", re.IGNORECASE)
_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SLICE = 16 << 10  # bytes released at a time: smooth at 1 Mbit/s, cheap at 10 Gbit/s


def parse_rate(text: str) -> float:
    """'100Mbit' -> bytes per second (12_500_000.0). 'bit', 'bit/s' and 'bps' are bits, 'B' and 'B/s' bytes."""
    match = _RATE.match(text)
    if not match:
        raise ValueError(f"--limit-rate {text!r}: expected a rate such as 100Mbit, 1Gbit, 500kbit or 10MB")
    value, prefix, unit = float(match.group(1)), match.group(2).lower(), match.group(3)
    per_second = value * _PREFIX[prefix] / (1 if unit.startswith("B") else 8)
    if per_second <= 0:
        raise ValueError(f"--limit-rate {text!r}: must be more than 0")
    return per_second


def parse_latency(text: str) -> float:
    """'50ms' -> 0.05 seconds (a bare number is seconds)."""
    match = _LATENCY.match(text)
    if not match:
        raise ValueError(f"--latency {text!r}: expected a delay such as 50ms, 0.2s or 200us")
    value, unit = float(match.group(1)), (match.group(2) or "s").lower()
    return value * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


class TokenBucket:
    """`rate` bytes per second, at most `burst` bytes ahead; `take` blocks until the bytes may go.
    Thread-safe: a process's concurrent transfers share the link."""

    def __init__(self, rate: float, burst: float | None = None):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(_SLICE, rate / 20))  # ~50 ms of traffic
        self._tokens, self._at = self.burst, time.monotonic()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> None:
        with self._lock:  # reserve now, sleep outside the lock: later callers queue behind
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= nbytes
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


@dataclass(frozen=True)
class LinkLimits:
    rate: float | None = None  # bytes per second each way; None: unlimited
    latency: float = 0.0  # seconds, added before a request and before its response

    @classmethod
    def parse(cls, rate: str | None, latency: str | None) -> LinkLimits | None:
        """From the command line's strings; None when neither is given."""
        if not rate and not latency:
            return None
        return cls(parse_rate(rate) if rate else None, parse_latency(latency) if latency else 0.0)

    def describe(self) -> str:
        parts = [f"{self.rate * 8 / 1e6:g} Mbit/s each way"] if self.rate else []
        if self.latency:
            parts.append(f"{self.latency * 1e3:g} ms latency")
        return ", ".join(parts)


def _paced(chunks, bucket: TokenBucket | None) -> Iterator[bytes]:
    for chunk in chunks:
        if bucket is None:
            yield chunk
            continue
        view = memoryview(chunk)
        for start in range(0, len(view), _SLICE):
            piece = view[start:start + _SLICE]
            bucket.take(len(piece))
            yield bytes(piece)


class _PacedStream(httpx.SyncByteStream):
    def __init__(self, inner, bucket: TokenBucket | None):
        self.inner, self.bucket = inner, bucket

    def __iter__(self) -> Iterator[bytes]:
        yield from _paced(self.inner, self.bucket)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class Link:
    """One process's emulated link: the limits and the two buckets every transfer shares."""

    def __init__(self, limits: LinkLimits):
        self.limits = limits
        self.up = TokenBucket(limits.rate) if limits.rate else None
        self.down = TokenBucket(limits.rate) if limits.rate else None

    def transport(self) -> ThrottledTransport:
        """A transport for one httpx.Client (which closes it), pacing through this link's buckets."""
        return ThrottledTransport(self)


class ThrottledTransport(httpx.BaseTransport):
    """An httpx transport that paces bodies both ways through a link's buckets and adds its latency."""

    def __init__(self, link: Link | LinkLimits, inner: httpx.BaseTransport | None = None):
        self.link = link if isinstance(link, Link) else Link(link)
        self.inner = inner if inner is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        latency = self.link.limits.latency
        if latency:
            time.sleep(latency)
        if self.link.up is not None:
            request.stream = _PacedStream(request.stream, self.link.up)
        response = self.inner.handle_request(request)
        if latency:
            time.sleep(latency)
        if self.link.down is not None:
            response.stream = _PacedStream(response.stream, self.link.down)
        return response

    def close(self) -> None:
        self.inner.close()
