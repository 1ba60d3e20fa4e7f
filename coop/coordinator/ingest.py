"""The upload port: pseudo-gradients received by threads, straight into their buffers.

uvicorn reads every request on its one event loop, in pieces of at most 64 KiB, each passed through
several Python calls (protocol, queue, ASGI message, our copy): ~450 MB/s for all uploads together
on a 16-core machine, whatever its cores, while 8 workers of a 124M model send 4 GB a round. This
listener takes only `PUT /v1/rounds/{r}/update`, on a port of its own (`coop-coordinator serve
--upload-port`, by default the API's port + 1): a thread per connection reads the body with
`socket.recv_into` into the buffer it ends in (4 MiB a call, the GIL free while the kernel copies),
so uploads arrive side by side, at memory speed. It serves `GET /v1/weights` too, the same way
round: each download sent by its own thread straight from the served buffer, where uvicorn's one
loop would write all of them (8 x 498 MB a round) on one core.

What an upload means is decided where it always is, on the event loop: the thread asks it to
authenticate the token, to admit the upload (one per worker, a round still open, the size within
the limit, RAM or the spool), and to decode and count the body (Coordinator.submit_update). The
answers are those of the API's route, JSON {"detail": ...} with the same statuses. A worker that
cannot reach this port sends its updates to the API's route instead (coop.coordinator.transport).

The HTTP spoken here is the little an upload and a download need: HTTP/1.1 and 1.0, a
Content-Length body (no chunked encoding: 411), `Expect: 100-continue` honoured after admission,
one request a connection (`Connection: close`), TLS when the API serves it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from coop.memory import uninitialised
from coop.spool import SpooledBody

from .members import WorkerRecord, bearer_token
from .served import weights_answer
from .service import Coordinator, spool_full
from .updates import RequestError

log = logging.getLogger("coop.coordinator")
RECV = 4 << 20  # bytes asked of one recv_into: Python's share of the time vanishes beside the copy
HEAD_LIMIT = 16 << 10  # request line and headers
SPOOL_PIECE = 8 << 20  # bytes gathered before one write to a spool file
UPDATE_PATH = re.compile(r"/v1/rounds/(-?\d{1,12})/update")


class _Closed(Exception):
    """The client went away (or was too slow): nothing more can be said to it."""


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    early: bytes  # body bytes that came with the head


@dataclass
class UploadPort:
    """Where the listener should be: `port` 0 lets the system choose."""
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None

    def listen(self, coordinator: Coordinator) -> UploadListener | None:
        """On the running event loop: the listener, started; None (said in the log) when the port is taken."""
        limits = coordinator.config.coordinator
        listener = UploadListener(coordinator, asyncio.get_running_loop(), self.host, self.port, self.ssl_context,
                                  max_connections=limits.max_connections)
        try:
            listener.start()
        except OSError as error:
            log.warning("cannot listen for uploads on %s:%d (%s); updates go through the API's port, which takes "
                        "about 450 MB/s in all (--upload-port to choose another)", self.host, self.port, error)
            return None
        log.info("updates taken on port %d too (threads straight into their buffers)", listener.port)
        return listener


class UploadListener:
    """Accepts connections on `port` in a thread; each connection gets a thread of its own (at
    most `max_connections`, beyond: 503). start() binds (OSError if it cannot), stop() closes."""

    def __init__(self, coordinator: Coordinator, loop: asyncio.AbstractEventLoop, host: str, port: int,
                 ssl_context: ssl.SSLContext | None = None, max_connections: int = 64):
        self.c, self.loop = coordinator, loop
        self.host, self.port = host, port
        self.ssl_context = ssl_context
        self.slots = threading.BoundedSemaphore(max_connections)
        self.limits = coordinator.config.coordinator
        self._socket: socket.socket | None = None
        self._stopped = threading.Event()

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server = socket.socket(family, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.host, self.port))
            server.listen(128)
        except OSError:
            server.close()
            raise
        self.port = server.getsockname()[1]
        self._socket = server
        threading.Thread(target=self._accept_forever, name="coop-upload-accept", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self._socket is not None:
            try:
                self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept
            except OSError:
                pass
            self._socket.close()

    def _accept_forever(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return  # stopped
            if not self.slots.acquire(blocking=False):
                threading.Thread(target=self._refuse_full, args=(conn,), daemon=True).start()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="coop-upload", daemon=True).start()

    def _refuse_full(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5.0)
            _respond(conn, 503, {"detail": "too many transfers at once; try again shortly"}, {"Retry-After": "5"})
        except OSError:
            pass
        finally:
            conn.close()

    # -- one connection, one upload ---------------------------------------------------------------------
    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.ssl_context is not None:
                conn.settimeout(self.limits.header_timeout_s)
                conn = self.ssl_context.wrap_socket(conn, server_side=True)
            request = _read_head(conn, time.monotonic() + self.limits.header_timeout_s)
            try:
                if request.path.split("?", 1)[0] == "/v1/weights" and request.method == "GET":
                    self._download(conn, request)
                    return
                answer = self._upload(conn, request)
            except RequestError as error:
                extra = dict(error.extra)
                headers = extra.pop("headers", None) or {}
                _respond(conn, error.status, {"detail": error.message, **extra}, headers)
            else:
                _respond(conn, 200, answer)
        except _Closed:
            pass
        except OSError as error:  # a reset, a TLS handshake that failed: the client's problem
            log.debug("upload connection dropped: %s", error)
        except Exception:
            log.exception("upload connection failed")
        finally:
            _close(conn)
            self.slots.release()

    def _upload(self, conn: socket.socket, request: _Request) -> dict[str, Any]:
        match = UPDATE_PATH.fullmatch(request.path.split("?", 1)[0])
        if match is None:
            raise RequestError(404, f"this port takes only PUT /v1/rounds/{{r}}/update and GET /v1/weights, not "
                                    f"{request.path[:80]!r}; everything else is served on the API's port")
        if request.method != "PUT":
            raise RequestError(405, f"{request.method[:16]} is not allowed here; PUT the update", headers={"Allow": "PUT"})
        size = _content_length(request.headers, self.c.max_update_bytes)
        round_number = int(match.group(1))
        try:
            record, in_ram = self._on_loop(_admit(self.c, bearer_token(request.headers), round_number, size))
        except RequestError as error:
            if error.status == 409:  # a stale round: read the body, so that the worker gets the reason
                _discard(conn, size - len(request.early), time.monotonic() + self.limits.body_timeout_s)
            raise
        try:
            if request.headers.get("expect", "").lower() == "100-continue":
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = self._receive(conn, request.early, size, in_ram, time.monotonic() + self.limits.body_timeout_s)
        except BaseException as error:
            self._on_loop(_abandon(self.c, record, size, in_ram, error))  # released before the answer goes out
            if isinstance(error, socket.timeout):
                raise RequestError(408, f"the body did not arrive within {self.limits.body_timeout_s:g} s "
                                        "([coordinator] body_timeout_s); send it faster or raise the limit") from None
            if isinstance(error, _Closed):
                log.warning("upload from %s for round %d aborted by the client", record.id, round_number)
            raise
        return self._on_loop(_submit(self.c, record, round_number, body))

    def _download(self, conn: socket.socket, request: _Request) -> None:
        """GET /v1/weights: the answer decided on the event loop (coop.coordinator.served), the body
        sent from the served buffer by this thread (the GIL free while the kernel copies it)."""
        since = parse_qs(urlsplit(request.path).query).get("since", [""])[0]
        status, headers, body = self._on_loop(_weights(self.c, bearer_token(request.headers),
                                                       request.headers.get("if-none-match"), since))
        _send(conn, status, {"Content-Type": "application/octet-stream", **headers}, body,
              time.monotonic() + self.limits.body_timeout_s)

    def _receive(self, conn: socket.socket, early: bytes, size: int, in_ram: bool,
                 deadline: float) -> bytearray | SpooledBody:
        """The body (`early`: its first bytes, read with the head) by `deadline`, into one buffer of
        its size (in RAM) or through a spool file."""
        if in_ram:
            body = uninitialised(size)
            filled = _copy_early(body, early)
            while filled < size:
                filled += _recv_into(conn, body[filled : filled + RECV], deadline)
            return body
        spooled = self.c.spool.body()
        try:
            piece = bytearray(SPOOL_PIECE)
            view, pending, left = memoryview(piece), _copy_early(memoryview(piece), early), size - len(early)
            while True:
                while pending < len(piece) and left > 0:
                    n = _recv_into(conn, view[pending : pending + min(RECV, left)], deadline)
                    pending, left = pending + n, left - n
                try:
                    spooled.write(view[:pending])
                except OSError as error:
                    raise spool_full(error) from None
                pending = 0
                if left == 0:
                    return spooled
        except BaseException:
            spooled.close()
            raise

    def _on_loop(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()


# -- on the event loop: the coordinator's state is touched only there --------------------------------
async def _weights(c: Coordinator, token: str | None, if_none_match: str | None, since: str):
    return weights_answer(c, token, if_none_match, since)


def claim_upload(c: Coordinator, record: WorkerRecord) -> None:
    """At most one upload per worker at a time, here or through the API: a second one is refused at
    once (409), so that one token cannot take every upload slot. The caller lets go of it
    (`c.uploading.discard`) when the body is counted, refused or dropped."""
    if record.id in c.uploading:
        c.reject(record, "busy")
        raise RequestError(409, f"worker {record.id} already has an upload in flight; one at a time", reason="busy")
    c.uploading.add(record.id)


async def _admit(c: Coordinator, token: str | None, round_number: int, size: int) -> tuple[WorkerRecord, bool]:
    """The worker, and whether its body fits in RAM; the same refusals as the API's route, in its order."""
    record = c.authenticate(token)
    claim_upload(c, record)
    try:
        c.precheck_update(record, round_number)
    except RequestError:
        c.uploading.discard(record.id)
        raise
    return record, c.budget.reserve(size)


async def _abandon(c: Coordinator, record: WorkerRecord, size: int, in_ram: bool, error: BaseException) -> None:
    c.uploading.discard(record.id)
    if in_ram:
        c.budget.release(size)
    reason = "timeout" if isinstance(error, socket.timeout) else "aborted" if isinstance(error, _Closed) else "invalid"
    c.reject(record, "unstored" if isinstance(error, RequestError) and error.status == 503 else reason)


async def count_upload(c: Coordinator, record: WorkerRecord, round_number: int, body: bytearray | SpooledBody,
                       via: str, upload_port: int | None = None) -> dict:
    """A body received by either way in (`via`: "upload port" or "api", with the port that is open),
    decoded and counted (upload_slots at a time), then its RAM or spool file let go."""
    try:
        async with c.upload_slots:
            answer = await c.submit_update(record, round_number, body)
    finally:
        if isinstance(body, SpooledBody):
            body.close()
        else:
            c.budget.release(len(body))
    if via == "api" and upload_port is not None and record.uploads_via != "api":  # said once, when it starts
        log.info("worker %s (%s) sends its updates to the API's port: it cannot reach the upload port %d "
                 "(open it for faster rounds)", record.id, record.name, upload_port)
    record.uploads_via = via
    return answer


async def _submit(c: Coordinator, record: WorkerRecord, round_number: int, body: bytearray | SpooledBody) -> dict:
    try:
        return await count_upload(c, record, round_number, body, "upload port")
    finally:
        c.uploading.discard(record.id)


# -- the little HTTP an upload needs ---------------------------------------------------------------
def _read_head(conn: socket.socket, deadline: float) -> _Request:
    data = bytearray()
    while (end := data.find(b"\r\n\r\n", 0, HEAD_LIMIT + 4)) < 0:
        if len(data) > HEAD_LIMIT:
            _respond(conn, 431, {"detail": f"request line and headers over {HEAD_LIMIT} bytes"})
            raise _Closed
        conn.settimeout(max(deadline - time.monotonic(), 1e-3))
        try:
            piece = conn.recv(65536)
        except (socket.timeout, ssl.SSLError, ConnectionError):
            raise _Closed from None
        if not piece:
            raise _Closed
        data += piece
    lines = bytes(data[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        _respond(conn, 400, {"detail": f"not an HTTP/1.x request line: {lines[0][:80]!r}"})
        raise _Closed
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            _respond(conn, 400, {"detail": f"malformed header line {line[:80]!r}"})
            raise _Closed
        headers[name.lower()] = value.strip()
    return _Request(parts[0], parts[1], headers, bytes(data[end + 4 :]))


def _content_length(headers: dict[str, str], limit: int) -> int:
    if "transfer-encoding" in headers:
        raise RequestError(411, "send the update with a Content-Length, not a chunked body")
    declared = headers.get("content-length")
    if declared is None:
        raise RequestError(411, "an update needs a Content-Length header")
    if not declared.isdigit():
        raise RequestError(400, f"Content-Length {declared[:30]!r} is not a number")
    size = int(declared)
    if size > limit:
        raise RequestError(413, f"body of {size} bytes exceeds the limit of {limit} bytes")
    return size


def _copy_early(view: memoryview, early: bytes) -> int:
    if len(early) > len(view):
        raise RequestError(400, f"the body is longer than its Content-Length {len(view)}")
    view[: len(early)] = early
    return len(early)


def _recv_into(conn: socket.socket, view: memoryview, deadline: float) -> int:
    conn.settimeout(max(deadline - time.monotonic(), 1e-3))  # socket.timeout past the deadline
    try:
        n = conn.recv_into(view)
    except (ConnectionError, ssl.SSLError):
        raise _Closed from None
    if n == 0:
        raise _Closed  # the body ended before its Content-Length
    return n


def _discard(conn: socket.socket, count: int, deadline: float) -> None:
    scratch = memoryview(bytearray(min(RECV, max(count, 1))))
    while count > 0:
        try:
            count -= _recv_into(conn, scratch[: min(count, len(scratch))], deadline)
        except socket.timeout:
            raise _Closed from None


def _respond(conn: socket.socket, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
    _send(conn, status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(payload).encode(),
          time.monotonic() + 10.0)


def _send(conn: socket.socket, status: int, headers: dict[str, str], body: bytes | memoryview, deadline: float) -> None:
    """One answer, then the connection is closed (a 304 has no body)."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() != "connection"]
    if status != 304:
        lines.append(f"Content-Length: {memoryview(body).nbytes}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    conn.settimeout(max(deadline - time.monotonic(), 1e-3))  # for the whole answer (socket.sendall's timeout)
    try:
        if memoryview(body).nbytes <= 1 << 16:
            conn.sendall(head + bytes(body))
        else:  # the served buffer itself, not a copy of it
            conn.sendall(head)
            conn.sendall(body)
    except OSError:
        raise _Closed from None


def _close(conn: socket.socket) -> None:
    """Close after the answer: what the client still sends (a refused body) is read briefly, so that
    it gets the answer rather than a reset."""
    try:
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and conn.recv(1 << 20):
            pass
    except OSError:
        pass
    finally:
        conn.close()
