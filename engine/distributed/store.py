"""TCPStore: the small key-value store on 127.0.0.1 through which the ranks of a process group
find each other (NCCL's unique id), exchange the CPU backend's tensors, and learn that a rank died.

One process hosts it (the launcher, or rank 0: `is_server=True`); every rank connects with the
run's token. Frames are binary, no pickle:

    request   op u8 | key length u32 | key | value length u64 | value | number f64
    reply     status u8 | payload length u64 | payload

`number` is GET's timeout in seconds (negative: no timeout) and ADD's increment. Liveness: a rank
announces itself once (`register(rank)`); when its connection closes without `leave()` (it was
killed, it crashed), the store marks it dead and every waiting and later `get` of a missing key
fails at once with RankDiedError naming it, instead of waiting for a timeout.
"""
from __future__ import annotations

import hmac
import socket
import socketserver
import struct
import threading
import time

from .errors import DistributedError, DistributedTimeoutError, RankDiedError

_HELLO, _SET, _GET, _ADD, _DELETE, _REGISTER, _LEAVE, _DEAD = range(1, 9)
_OK, _TIMEOUT, _DIED, _BAD = range(4)
_REQUEST_HEAD = struct.Struct("<BI")  # op, key length
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_REPLY_HEAD = struct.Struct("<BQ")  # status, payload length
MAX_KEY = 1024
MAX_VALUE = 1 << 34  # 16 GiB: a data shard goes through here once


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the connection closed")
        got += k
    return bytes(buf)


def _send_frame(sock: socket.socket, op: int, key: bytes, value: bytes, number: float) -> None:
    sock.sendall(_REQUEST_HEAD.pack(op, len(key)) + key + _U64.pack(len(value)))
    if value:
        sock.sendall(value)
    sock.sendall(_F64.pack(number))


def _recv_frame(sock: socket.socket) -> tuple[int, bytes, bytes, float]:
    op, key_len = _REQUEST_HEAD.unpack(_recv_exact(sock, _REQUEST_HEAD.size))
    if key_len > MAX_KEY:
        raise ValueError(f"key of {key_len} bytes (at most {MAX_KEY})")
    key = _recv_exact(sock, key_len)
    (value_len,) = _U64.unpack(_recv_exact(sock, _U64.size))
    if value_len > MAX_VALUE:
        raise ValueError(f"value of {value_len} bytes (at most {MAX_VALUE})")
    value = _recv_exact(sock, value_len) if value_len else b""
    (number,) = _F64.unpack(_recv_exact(sock, _F64.size))
    return op, key, value, number


class _State:
    """The store's data and who is alive, under one condition variable."""

    def __init__(self, token: bytes):
        self.token = token
        self.data: dict[bytes, bytes] = {}
        self.dead: dict[int, str] = {}  # rank -> how it was seen to die
        self.cond = threading.Condition()

    def died(self, rank: int, how: str) -> None:
        with self.cond:
            self.dead.setdefault(rank, how)
            self.cond.notify_all()

    def dead_text(self) -> bytes:
        return ";".join(f"{r}:{how}" for r, how in sorted(self.dead.items())).encode()


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        state: _State = self.server.state  # type: ignore[attr-defined]
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(sock)  # type: ignore[attr-defined]
        rank, left = None, False
        try:
            op, key, _, _ = _recv_frame(sock)
            if op != _HELLO or not hmac.compare_digest(key, state.token):
                self._reply(_BAD, b"bad token: this store belongs to another run")
                return
            self._reply(_OK, b"")
            while True:
                op, key, value, number = _recv_frame(sock)
                if op == _REGISTER:
                    rank = int(key)
                elif op == _LEAVE:
                    left = True
                self._reply(*self._serve(state, op, key, value, number))
        except (ConnectionError, OSError, ValueError, struct.error):
            pass  # the client went away (or spoke nonsense): its connection ends here
        finally:
            self.server.connections.discard(sock)  # type: ignore[attr-defined]
            if rank is not None and not left:
                state.died(rank, "its connection to the store closed without leaving (killed or crashed)")

    def _reply(self, status: int, payload: bytes) -> None:
        self.request.sendall(_REPLY_HEAD.pack(status, len(payload)) + payload)

    @staticmethod
    def _serve(state: _State, op: int, key: bytes, value: bytes, number: float) -> tuple[int, bytes]:
        with state.cond:
            if op == _SET:
                state.data[key] = value
                state.cond.notify_all()
                return _OK, b""
            if op == _GET:
                deadline = None if number < 0 else time.monotonic() + number
                while key not in state.data:
                    if state.dead:
                        return _DIED, state.dead_text()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return _TIMEOUT, b""
                    state.cond.wait(left if left is not None else 1.0)
                return _OK, state.data[key]
            if op == _ADD:
                total = int(state.data.get(key, b"0")) + int(number)
                state.data[key] = str(total).encode()
                state.cond.notify_all()
                return _OK, state.data[key]
            if op == _DELETE:
                state.data.pop(key, None)
                return _OK, b""
            if op in (_REGISTER, _LEAVE):
                return _OK, b""
            if op == _DEAD:
                return _OK, state.dead_text()
        return _BAD, f"unknown store op {op}".encode()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self.connections: set = set()  # open client sockets: closed with the store, as if its host died

    def close_connections(self) -> None:
        for sock in list(self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _parse_dead(text: bytes) -> dict[int, str]:
    out = {}
    for part in text.decode().split(";"):
        if part:
            rank, _, how = part.partition(":")
            out[int(rank)] = how
    return out


class TCPStore:
    """A client of the store at host:port (and, with is_server, the store itself, served from a
    daemon thread of this process). Thread-safe: one request at a time per client; a watchdog
    thread should use its own client (`clone()`)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str = "", *, is_server: bool = False,
                 timeout: float = 300.0, connect_timeout: float = 60.0):
        self.host, self.token, self.timeout = host, token, float(timeout)
        self._server = None
        if is_server:
            self._server = _Server((host, port), _Handler)
            self._server.state = _State(token.encode())  # type: ignore[attr-defined]
            threading.Thread(target=self._server.serve_forever, name="engine-store", daemon=True).start()
            port = self._server.server_address[1]
        if not port:
            raise ValueError("TCPStore: a client needs the store's port (port=0 only with is_server=True)")
        self.port = int(port)
        self._lock = threading.Lock()
        self._sock = self._connect(connect_timeout)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def clone(self) -> "TCPStore":
        """Another client of the same store (for another thread)."""
        return TCPStore(self.host, self.port, self.token, timeout=self.timeout)

    def _connect(self, connect_timeout: float) -> socket.socket:
        deadline = time.monotonic() + connect_timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=10.0)
                break
            except OSError as error:  # not up yet (its host is starting): retried until the deadline
                if time.monotonic() > deadline:
                    raise DistributedError(f"cannot reach the store at {self.address} within {connect_timeout:g} s "
                                           f"({error}); is the launcher (or rank 0) running?") from None
                time.sleep(delay)
                delay = min(2 * delay, 1.0)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send_frame(sock, _HELLO, self.token.encode(), b"", 0.0)
        status, payload = self._read_reply(sock)
        if status != _OK:
            sock.close()
            raise DistributedError(f"the store at {self.address} refused this client: {payload.decode()}")
        return sock

    def _read_reply(self, sock: socket.socket) -> tuple[int, bytes]:
        try:
            status, n = _REPLY_HEAD.unpack(_recv_exact(sock, _REPLY_HEAD.size))
            return status, _recv_exact(sock, n) if n else b""
        except (ConnectionError, OSError) as error:
            raise DistributedError(f"lost the store at {self.address} ({error}): the process hosting it "
                                   "(the launcher or rank 0) ended or died") from None

    def _request(self, op: int, key: str, value: bytes = b"", number: float = 0.0) -> tuple[int, bytes]:
        with self._lock:
            if self._sock is None:
                raise DistributedError(f"the store client of {self.address} was closed")
            try:
                _send_frame(self._sock, op, key.encode(), value, number)
            except OSError as error:
                raise DistributedError(f"lost the store at {self.address} ({error}): the process hosting it "
                                       "(the launcher or rank 0) ended or died") from None
            return self._read_reply(self._sock)

    # -- the operations --

    def set(self, key: str, value: bytes) -> None:
        self._request(_SET, key, bytes(value))

    def get(self, key: str, timeout: float | None = -1.0) -> bytes:
        """The value of `key`, waiting until some rank sets it: for `timeout` seconds (default the
        store's; None waits for as long as every rank is alive). Raises RankDiedError when a rank
        died first, DistributedTimeoutError past the timeout."""
        wait = self.timeout if timeout == -1.0 else timeout
        status, payload = self._request(_GET, key, b"", -1.0 if wait is None else float(wait))
        if status == _OK:
            return payload
        if status == _DIED:
            raise RankDiedError(_parse_dead(payload), f"waiting for {key!r}")
        if status == _TIMEOUT:
            raise DistributedTimeoutError(f"waited {wait:g} s for {key!r} in the store at {self.address}: a rank "
                                          "did not get there (stuck, or not started); raise the timeout if it is slow")
        raise DistributedError(f"store get {key!r}: {payload.decode()}")

    def add(self, key: str, amount: int = 1) -> int:
        """Add `amount` to the integer at `key` (0 when absent) and return the new value."""
        return int(self._request(_ADD, key, b"", float(amount))[1])

    def delete(self, key: str) -> None:
        self._request(_DELETE, key)

    def register(self, rank: int) -> None:
        """This client's connection stands for `rank`: if it closes without leave(), the rank is dead."""
        self._request(_REGISTER, str(int(rank)))

    def leave(self) -> None:
        """A clean exit of the registered rank (destroy_process_group)."""
        self._request(_LEAVE, "")

    def dead_ranks(self) -> dict[int, str]:
        """Ranks seen to die, with how."""
        return _parse_dead(self._request(_DEAD, "")[1])

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.close_connections()
            self._server = None
