"""uvicorn with bounded time and size for what a client sends before the app sees it, shared by
the coordinator and the peer server.

uvicorn bounds connections (`limit_concurrency`: a 503 beyond it) and idle keep-alive
connections (`timeout_keep_alive`), but not the request head: with httptools a client may send
headers without end, or trickle them a byte at a time, or open a connection and send nothing, and
hold the connection for ever. `BoundedHttpToolsProtocol` refuses a head over `MAX_HEADER_BYTES`
with a 431 and closes a connection whose head is not complete within `header_timeout_s`. (The
pure-Python h11 stack has a size limit of its own, `h11_max_incomplete_event_size`, and is used
only where httptools is missing.) Request bodies are bounded in time by the apps themselves.
"""
from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

import uvicorn

MAX_HEADER_BYTES = 16 * 1024  # request line + headers; ours are a few hundred bytes
HEADER_TIMEOUT_S = 10.0  # from a connection's first byte (or from its opening) to its complete head
MAX_CONNECTIONS = 512  # open connections and in-flight requests; beyond: 503
KEEP_ALIVE_S = 30  # an idle keep-alive connection is closed after this long

FAST = bool(importlib.util.find_spec("uvloop") and importlib.util.find_spec("httptools"))

if FAST:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with a limit on the request head's size and time."""

        max_header_bytes = MAX_HEADER_BYTES
        header_timeout_s = HEADER_TIMEOUT_S

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes, self._head_too_large = 0, False
            self._head_timer: asyncio.TimerHandle | None = None
            self._start_head_timer()  # a connection that never sends a byte is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def _start_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            timer = getattr(self, "_head_timer", None)
            if timer is not None:
                timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

        def _count_head(self, nbytes: int) -> None:
            self._head_bytes += nbytes
            if self._head_bytes > self.max_header_bytes:
                self._head_too_large = True
                raise ValueError("request head too large")  # stops the parser; send_400_response answers

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._start_head_timer()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._cancel_head_timer()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._head_too_large:
                return super().send_400_response(msg)
            text = f"request line and headers exceed {self.max_header_bytes} bytes"
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                                 b"charset=utf-8\r\ncontent-length: " + str(len(text)).encode() +
                                 b"\r\nconnection: close\r\n\r\n" + text.encode())
            self.transport.close()


def server_config(app: Any, host: str, port: int, *, max_connections: int = MAX_CONNECTIONS,
                  keep_alive_s: int = KEEP_ALIVE_S, header_timeout_s: float = HEADER_TIMEOUT_S,
                  **options: Any) -> uvicorn.Config:
    """A uvicorn.Config with the fast stack where it is installed (uvloop + httptools, several
    times faster on large bodies) and the limits above."""
    if FAST:
        protocol = type("CoopHttpProtocol", (BoundedHttpToolsProtocol,), {"header_timeout_s": header_timeout_s})
        stack: dict[str, Any] = {"loop": "uvloop", "http": protocol}
    else:
        stack = {"loop": "auto", "http": "h11", "h11_max_incomplete_event_size": MAX_HEADER_BYTES}
    # log_config None: uvicorn's own loggers go to the root logger that the command configured (one
    # log format for coop and uvicorn, the level from --log-level)
    options.setdefault("log_config", None)
    return uvicorn.Config(app, host=host, port=port, limit_concurrency=max_connections,
                          timeout_keep_alive=keep_alive_s, **stack, **options)
