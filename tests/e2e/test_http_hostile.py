"""A hostile client or coordinator against real processes on 127.0.0.1: slow-loris uploads, huge and
slow headers, nested JSON, a join flood, and a coordinator that answers a path-traversing data_id."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest

from coop.codec import get_codec
from coop.wire import pack, unpack

from conftest import REPO, Coordinator, child_env, run_config, wait_until

pytestmark = pytest.mark.e2e


class Trickler(threading.Thread):
    """A client that declares a body and sends it one byte every 0.2 s, keeping what comes back."""

    def __init__(self, port: int, path: str, token: str | None, declared: int = 10_000_000):
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port))
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/octet-stream\r\n"
                          f"Content-Length: {declared}\r\n\r\n".encode())
        self.sock.settimeout(0.2)
        self.reply, self.closed_at, self.stop = b"", None, threading.Event()
        self.started_at = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.sock.send(b"x")
            except OSError:
                break
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not data:
                break
            self.reply += data
        self.closed_at = time.monotonic()
        self.sock.close()

    def status(self) -> int | None:
        return int(self.reply.split()[1]) if self.reply.startswith(b"HTTP/1.1 ") else None


def join(coordinator: Coordinator, name: str) -> tuple[dict, dict]:
    response = httpx.post(coordinator.url + "/v1/join", json={"name": name}, headers=coordinator.headers(), timeout=10)
    assert response.status_code == 200, response.text
    info = response.json()
    return info, {"Authorization": f"Bearer {info['worker_token']}"}


def honest_update(coordinator: Coordinator, auth: dict, round_number: int = 0) -> bytes:
    weights, _ = unpack(httpx.get(coordinator.url + "/v1/weights", headers=auth, timeout=10).content)
    encoded = get_codec("fp32").encode({k: np.full(v.shape, 0.01, np.float32) for k, v in weights.items()})
    return pack(encoded.tensors, {**encoded.metadata, "round": round_number, "tokens": 100, "loss": 2.0})


def test_slow_loris_uploads_do_not_delay_an_honest_worker(tmp_path, procs):
    config = run_config(coordinator={"min_workers": 3, "quorum_fraction": 1.0, "concurrent_uploads": 2,
                                     "body_timeout_s": 3.0, "max_deadline_s": 60.0, "min_deadline_s": 30.0})
    coordinator = procs(Coordinator(tmp_path, config))
    info, hostile = join(coordinator, "hostile")
    _, honest = join(coordinator, "honest")
    body = honest_update(coordinator, honest)
    token, declared = hostile["Authorization"].split()[1], info["max_update_bytes"]  # a body within the limit
    first = Trickler(coordinator.port, "/v1/rounds/0/update", token, declared)
    first.start()
    time.sleep(0.5)  # the first trickler holds its upload (and one slot) from now on
    second = Trickler(coordinator.port, "/v1/rounds/0/update", token, declared)
    anonymous = Trickler(coordinator.port, "/v1/rounds/0/update", None, declared)
    for trickler in (second, anonymous):
        trickler.start()
    wait_until(lambda: second.status() and anonymous.status(), 2, "the second and the anonymous trickler's answers")
    wait_until(lambda: second.closed_at and anonymous.closed_at, 2, "the coordinator closing their connections")
    assert second.status() == 409 and b"already has an upload in flight" in second.reply
    assert anonymous.status() == 401
    assert second.closed_at - second.started_at < 1.0 and anonymous.closed_at - anonymous.started_at < 1.0

    t0 = time.monotonic()
    response = httpx.put(coordinator.url + "/v1/rounds/0/update", content=body, timeout=10,
                         headers={**honest, "Content-Type": "application/octet-stream"})
    honest_s = time.monotonic() - t0
    print(f"honest upload with three tricklers: {honest_s * 1000:.0f} ms")
    assert response.status_code == 200, response.text
    assert honest_s < 1.0, honest_s

    first.join(6)  # cut off after body_timeout_s with a 408
    assert first.status() == 408, first.reply[:300]
    assert 2.5 < first.closed_at - first.started_at < 5.0
    metrics = httpx.get(coordinator.url + "/metrics").text
    assert 'coop_updates_total{result="busy"} 1.0' in metrics and 'coop_updates_total{result="timeout"} 1.0' in metrics


def test_huge_and_slow_request_heads_are_refused(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, run_config(coordinator={"header_timeout_s": 1.0})))
    response = httpx.get(coordinator.url + "/v1/info", headers={"X-Big": "a" * 20_000}, timeout=10)
    assert response.status_code == 431
    assert httpx.get(coordinator.url + "/v1/info", headers={"X-Ok": "a" * 8_000}, timeout=10).status_code == 200
    for head in (b"", b"GET /v1/info HTTP/1.1\r\nHost: x\r\n"):  # nothing at all, or a head never finished
        sock = socket.create_connection(("127.0.0.1", coordinator.port))
        sock.sendall(head)
        sock.settimeout(5)
        t0 = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server
        assert time.monotonic() - t0 < 3.0
        sock.close()


def test_nested_json_in_an_update_gets_400_from_a_real_server(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, run_config()))
    _, auth = join(coordinator, "nester")
    header = b"[" * 100_000
    meta = json.dumps({"__metadata__": {"json": "[" * 20_000 + "]" * 20_000}}).encode()
    for body in (len(header).to_bytes(8, "little") + header, len(meta).to_bytes(8, "little") + meta):
        response = httpx.put(coordinator.url + "/v1/rounds/0/update", content=body, headers=auth, timeout=10)
        assert response.status_code == 400, response.text
        assert "levels deep" in response.json()["detail"]
    status = coordinator.status()
    assert status["totals"]["updates_rejected"] == 2 and status["reports"] == []
    assert "RecursionError" not in coordinator.output() and "Traceback" not in coordinator.output()


def test_a_join_flood_is_capped_rate_limited_and_pruned(tmp_path, procs):
    config = run_config(coordinator={"max_workers": 10, "joins_per_minute": 20})
    coordinator = procs(Coordinator(tmp_path, config))
    with httpx.Client(base_url=coordinator.url, timeout=10) as http:
        answers = [http.post("/v1/join", json={"name": f"f{i}"}, headers=coordinator.headers()) for i in range(60)]
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 10 and codes.count(503) == 10 and codes.count(429) == 40, codes
    assert all(int(a.headers["Retry-After"]) >= 1 for a in answers if a.status_code in (429, 503))
    members = coordinator.state_dir / "members.json"

    def recorded() -> int:
        return len(json.loads(members.read_text())["workers"])

    wait_until(lambda: recorded() == 10, 5, "members.json to hold the 10 joined workers")
    # none of them uploads or heartbeats: after worker_timeout_s (2 s) they are forgotten
    wait_until(lambda: recorded() == 0, 10, "members.json to be pruned", [coordinator.log])
    assert len(members.read_text()) < 2000


class HostileCoordinator(BaseHTTPRequestHandler):
    """Answers like a coordinator, with a data_id that climbs out of the worker's cache dir."""

    def do_GET(self):
        if self.path == "/v1/info":
            return self.reply({"kind": "coordinator", "version": "0", "api": "v1", "auth": False, "round": 0,
                               "phase": "open", "done": False})
        self.reply({"detail": "no"}, 404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/join":
            return self.reply({"worker_id": "w0", "worker_token": "w0.x", "round": 0, "done": False,
                               "data_id": "/../../outside/x", "shard": {"index": 2, "count": 8, "tokens": 10},
                               "heartbeat_s": 1, "max_rounds": 1})
        self.reply({"left": True})

    def reply(self, body, status=200):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_the_worker_refuses_a_data_id_that_leaves_its_cache_dir(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostileCoordinator)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = tmp_path / "a" / "b" / "cache"
    try:
        done = subprocess.run([sys.executable, "-m", "coop.worker_cli", "join", f"http://127.0.0.1:{server.server_port}",
                               "--cache-dir", str(cache), "--retry-for", "5"], env=child_env(), cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "data_id unfit for a file name" in done.stderr + done.stdout
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written == [], written
