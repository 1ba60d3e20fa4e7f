"""The worker's HTTP client against a real server on 127.0.0.1 that answers as scripted: it waits
as long as a 429 / 503's Retry-After says, gives up after retry_for_s with an error that says so,
and turns a 401 (also one hidden behind a reset upload) into a rejoin."""
from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from coop.coordinator.client import CoordinatorClient, NeedsRejoin, WorkerError


class Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next (status, headers) of the server's script for its path;
    "reset" closes the connection without an answer."""

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        script = self.server.script.setdefault(self.path, [])
        self.server.seen.append((self.command, self.path, time.monotonic()))
        status, headers = script.pop(0) if script else (200, {})
        if status == "reset":
            self.close_connection = True
            self.connection.close()
            return
        if length:
            self.rfile.read(length)
        body = b'{"detail": "scripted"}'
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    httpd.script, httpd.seen = {}, []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def client_of(server, retry_for_s=30.0):
    client = CoordinatorClient(f"http://127.0.0.1:{server.server_address[1]}", retry_for_s=retry_for_s, timeout_s=10.0)
    client.token = "w0.secret"
    return client


def test_a_429_is_retried_after_the_time_its_retry_after_says(server):
    server.script["/v1/join"] = [(429, {"Retry-After": "1"}), (200, {})]
    client = client_of(server)
    start = time.monotonic()
    assert client.request("POST", "/v1/join", json={}).status_code == 200
    first, second = (t for _, path, t in server.seen if path == "/v1/join")
    assert second - first >= 1.0  # never sooner than the server asked
    assert time.monotonic() - start < 5.0


def test_a_full_run_is_given_up_after_retry_for_with_a_clear_error(server):
    server.script["/v1/join"] = [(503, {"Retry-After": "0.2"})] * 50
    client = client_of(server, retry_for_s=0.5)
    with pytest.raises(WorkerError, match="gave up after") as error:
        client.request("POST", "/v1/join", json={})
    assert "503" in str(error.value)


def test_a_401_asks_for_a_rejoin(server):
    server.script["/v1/weights"] = [(401, {})]
    with pytest.raises(NeedsRejoin):
        client_of(server).request("GET", "/v1/weights")


def test_an_upload_reset_by_a_401_is_told_apart_by_a_heartbeat(server):
    # the coordinator answers a bad token before reading the body and closes the connection; the
    # client may only see the reset: a heartbeat (no body) then shows the 401, and it rejoins
    server.script["/v1/rounds/0/update"] = [("reset", {})]
    server.script["/v1/heartbeat"] = [(401, {})]
    with pytest.raises(NeedsRejoin):
        client_of(server).request("PUT", "/v1/rounds/0/update", content=b"x" * 1000)
    assert ("POST", "/v1/heartbeat") in [(m, p) for m, p, _ in server.seen]


def test_the_val_loss_is_reported_once_for_each_weights_asked_for_and_never_stops_the_worker(server):
    from coop.coordinator.transport import HttpTransport, ValCheck
    evaluated, said = [], []

    def evaluate(weights):
        evaluated.append(weights["w"][0])
        if weights["w"][0] == 4:
            raise RuntimeError("out of device memory")
        return 3.25, 64

    transport = HttpTransport(client_of(server), {"w": (1,)}, said.append,
                              val=ValCheck(every=2, max_rounds=5, evaluate=evaluate))
    server.script["/v1/rounds/2/eval"] = [(422, {})]  # refused: said, and the rounds go on
    for r in (0, 0, 1, 2, 3, 4, 5):  # 5 = max_rounds: the final weights, whatever eval_every says
        transport.weights = {"w": np.array([r], np.float32)}
        transport.report_val(r)
    assert evaluated == [0, 2, 4, 5]  # once each, only the weights of every 2nd round and the final ones
    posts = [path for method, path, _ in server.seen if method == "POST"]
    assert posts == ["/v1/rounds/0/eval", "/v1/rounds/2/eval", "/v1/rounds/5/eval"]  # not the failed evaluation
    assert any("refused" in s for s in said) and any("out of device memory" in s for s in said)
    transport.val.every = 0  # a run without evaluation sends nothing
    transport.report_val(6)
    assert evaluated == [0, 2, 4, 5]
