"""The upload port (coop.coordinator.ingest): real sockets on 127.0.0.1 against a coordinator whose
event loop runs in the TestClient's thread; what it accepts it counts exactly as the API's route
does, and what it refuses changes nothing."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from test_coordinator_app import join, tiny, update_body

from coop.coordinator.app import create_app
from coop.coordinator.client import CoordinatorClient
from coop.coordinator.ingest import UploadPort
from coop.coordinator.service import Coordinator
from coop.coordinator.transport import HttpTransport
from coop.gossip.server import ServerThread

TOKEN = "tok"


@pytest.fixture
def serve(tmp_path):
    clients = []

    def start(config=None, name="state", upload=True):
        coordinator = Coordinator(config if config is not None else tiny(), tmp_path / name, TOKEN)
        client = TestClient(create_app(coordinator, UploadPort("127.0.0.1", 0) if upload else None))
        client.__enter__()
        clients.append(client)
        return coordinator, client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def put(port: int, round_number: int, body: bytes, auth: dict, **headers) -> httpx.Response:
    return httpx.put(f"http://127.0.0.1:{port}/v1/rounds/{round_number}/update", content=body,
                     headers={**auth, **headers}, timeout=30)


def update_head(auth: dict, size: int, *lines: bytes) -> bytes:
    """The request line and headers of an upload of `size` bytes for round 0, as a client sends them."""
    fields = [b"Authorization: " + auth["Authorization"].encode(), *lines, b"Content-Length: %d" % size]
    return b"\r\n".join([b"PUT /v1/rounds/0/update HTTP/1.1", *fields]) + b"\r\n\r\n"


def raw(port: int, head: bytes, body: bytes = b"", close_after: bool = False, timeout: float = 10) -> tuple[int, bytes]:
    """Send bytes as they are; the status and the answer's body."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head + body)
        if close_after:
            s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def closed_round(client, auth, round_number):
    assert client.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 10}, headers=auth).json()["closed"]


def test_the_join_names_the_port_and_updates_through_it_merge_as_through_the_api(serve):
    via_port, port_client = serve(name="a")
    via_api, api_client = serve(name="b", upload=False)
    port = None
    for coordinator, client, through_port in ((via_port, port_client, True), (via_api, api_client, False)):
        (info, a), (_, b) = join(client), join(client)
        if through_port:
            port = info["upload_port"]
            assert port > 0
            for auth, value, tokens in ((a, 0.01, 32), (b, 0.03, 96)):
                response = put(port, 0, update_body(coordinator, 0, value, tokens), auth)
                assert response.status_code == 200, response.text
                assert response.json()["accepted"] and response.headers["connection"] == "close"
        else:
            assert "upload_port" not in info
            for auth, value, tokens in ((a, 0.01, 32), (b, 0.03, 96)):
                assert client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, value, tokens),
                                  headers=auth).status_code == 200
        closed_round(client, a, 0)
    for name in via_port.weights:
        np.testing.assert_array_equal(via_port.weights[name], via_api.weights[name])
    assert via_port.totals["updates_accepted"] == 2 and via_port.totals["bytes_in"] == via_api.totals["bytes_in"]
    status = port_client.get("/v1/status", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert {w["uploads_via"] for w in status["workers"]} == {"upload port"}  # the operator sees which way
    assert {w.uploads_via for w in via_api.members.workers.values()} == {"api"}


def test_a_spooled_upload_counts_the_same(serve):
    coordinator, client = serve(tiny(coordinator={"ram_for_updates_mb": 0, "aggregation": "median"}))
    (info, a), (_, b) = join(client), join(client)
    before = {k: v.copy() for k, v in coordinator.weights.items()}
    for auth in (a, b):
        assert put(info["upload_port"], 0, update_body(coordinator, 0, 0.02), auth).status_code == 200
    closed_round(client, a, 0)
    k = next(iter(before))
    np.testing.assert_allclose(coordinator.weights[k], before[k] - 0.7 * 1.9 * 0.02, rtol=1e-5, atol=1e-7)


def test_bad_requests_are_refused_with_the_apis_answers_and_change_nothing(serve):
    coordinator, client = serve(tiny(coordinator={"min_workers": 1}))
    info, auth = join(client)
    port, good = info["upload_port"], update_body(coordinator, 0)
    weights = {k: v.copy() for k, v in coordinator.weights.items()}
    bearer = auth["Authorization"].encode()
    assert put(port, 0, good, {"Authorization": "Bearer w0.nope"}).status_code == 401
    assert put(port, 0, good, {}).status_code == 401
    assert put(port, 0, b"garbage", auth).status_code == 400
    assert put(port, 0, good[:-3], auth).status_code == 400
    assert put(port, 0, b"x" * (coordinator.max_update_bytes + 1), auth).status_code == 413
    assert put(port, 0, update_body(coordinator, 0, codec="int8"), auth).status_code == 422
    stale = put(port, 5, good, auth)  # the body is read, so the worker gets the reason
    assert stale.status_code == 409 and stale.json()["reason"] and stale.json()["current_round"] == 0
    assert httpx.get(f"http://127.0.0.1:{port}/v1/rounds/0/update", headers=auth).status_code == 405
    assert httpx.put(f"http://127.0.0.1:{port}/v1/status", content=b"{}", headers=auth).status_code == 404
    chunked = put(port, 0, iter([good]), auth)  # an iterator without a length: httpx sends it chunked
    assert chunked.status_code == 411
    assert raw(port, b"NOT HTTP\r\n\r\n")[0] == 400
    assert raw(port, b"PUT /v1/rounds/0/update HTTP/1.1\r\nbroken header\r\n\r\n")[0] == 400
    assert raw(port, b"PUT /v1/rounds/0/update HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n")[0] == 431
    assert raw(port, b"PUT /v1/rounds/0/update HTTP/1.1\r\nAuthorization: " + bearer
               + b"\r\nContent-Length: -4\r\n\r\n")[0] == 400
    # the body ends before its Content-Length: nothing counted, and the worker may upload again
    head = update_head(auth, len(good))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + good[:1000])
    deadline = time.monotonic() + 10
    while coordinator.uploading:
        assert time.monotonic() < deadline, "an aborted upload was never let go"
        time.sleep(0.02)
    assert coordinator.totals["updates_accepted"] == 0 and coordinator.budget.used == 0
    for name, value in weights.items():
        np.testing.assert_array_equal(coordinator.weights[name], value)
    assert put(port, 0, good, auth).status_code == 200  # and the same worker's next upload is counted


def test_a_body_slower_than_the_timeout_is_refused_with_408(serve):
    coordinator, client = serve(tiny(coordinator={"min_workers": 1, "body_timeout_s": 0.5}))
    info, auth = join(client)
    good = update_body(coordinator, 0)
    head = update_head(auth, len(good))
    status, answer = raw(info["upload_port"], head, good[:100])
    assert status == 408 and b"body_timeout_s" in answer
    assert coordinator.totals["updates_accepted"] == 0 and not coordinator.uploading


def test_expect_100_continue_is_answered_after_admission(serve):
    coordinator, client = serve(tiny(coordinator={"min_workers": 1}))
    info, auth = join(client)
    good = update_body(coordinator, 0)
    head = update_head(auth, len(good), b"Expect: 100-continue")
    with socket.create_connection(("127.0.0.1", info["upload_port"]), timeout=10) as s:
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(good)
        assert s.recv(100).startswith(b"HTTP/1.1 200 OK")
    refused = raw(info["upload_port"], head.replace(auth["Authorization"].encode(), b"Bearer w0.nope"))
    assert refused[0] == 401  # before any body was sent


def test_one_upload_at_a_time_per_worker(serve):
    coordinator, client = serve(tiny(coordinator={"min_workers": 1}))
    info, auth = join(client)
    good = update_body(coordinator, 0)
    head = update_head(auth, len(good))
    first = socket.create_connection(("127.0.0.1", info["upload_port"]), timeout=10)
    first.sendall(head + good[:10])  # in flight
    deadline = time.monotonic() + 10
    while not coordinator.uploading:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = put(info["upload_port"], 0, good, auth)
    assert second.status_code == 409 and second.json()["reason"] == "busy"
    first.sendall(good[10:])
    assert first.recv(100).startswith(b"HTTP/1.1 200 OK")
    first.close()


def free_port() -> int:
    with socket.socket() as s:  # nobody listens on it once closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def real_server(tmp_path):
    """A coordinator served by uvicorn in a thread (round 0 stays open), and the API's port."""
    coordinator = Coordinator(tiny(coordinator={"min_workers": 3}), tmp_path / "state", TOKEN)
    port = free_port()
    server = ServerThread(create_app(coordinator, UploadPort("127.0.0.1", 0)), "127.0.0.1", port)
    server.start()
    yield coordinator, port
    server.stop()


def joined(coordinator, port: int, dead_port: int | None, weights: bool) -> tuple[CoordinatorClient, HttpTransport, list]:
    """A worker's client, joined, its transport and what it said; with `dead_port`, as if a firewall
    stood in front of the upload port."""
    worker = CoordinatorClient(f"http://127.0.0.1:{port}", retry_for_s=5, timeout_s=10)
    info = worker.request("POST", "/v1/join", token=TOKEN, json={}).json()
    worker.token = info["worker_token"]
    worker.use_upload_port(info["upload_port"], weights=weights and info["weights_on_upload_port"])
    assert worker.upload_url == f"http://127.0.0.1:{info['upload_port']}"
    if dead_port is not None:
        worker.upload_url = f"http://127.0.0.1:{dead_port}"
    said = []
    return worker, HttpTransport(worker, {k: v.shape for k, v in coordinator.weights.items()}, said.append), said


def test_a_worker_uses_the_port_and_falls_back_to_the_api_when_it_cannot_reach_it(real_server):
    coordinator, port = real_server
    for dead_port in (None, free_port()):
        worker, transport, said = joined(coordinator, port, dead_port, weights=False)
        assert transport.upload(0, update_body(coordinator, 0)) == "accepted"
        if dead_port is None:
            assert worker.upload_url is not None and not said
        else:  # tried again next time (a coordinator restarting looks the same once), then given up
            assert worker.upload_url is not None and "its API port takes this one" in said[0]
            assert transport.upload(0, update_body(coordinator, 0)) == "accepted"  # the API: a duplicate
            assert worker.upload_url is None and "updates go to its API port from now on" in said[1]
        worker.close()
    assert coordinator.totals["updates_accepted"] == 2


def test_the_port_serves_the_weights_as_the_api_does(serve):
    """GET /v1/weights on the upload port: the API's bytes and headers, 304 for the round held, the
    compressed downlink's change, 401 without a token, and counted as sent, as the API counts it."""
    coordinator, client = serve(tiny(compression={"codec": "int8", "downlink": "codec", "snapshot_every": 4},
                                     coordinator={"min_workers": 1}))
    info, auth = join(client)
    assert info["weights_on_upload_port"] is True
    url = f"http://127.0.0.1:{info['upload_port']}/v1/weights"
    for _ in range(2):  # round 0 (the full weights), then round 1: its change since round 0
        api = client.get("/v1/weights", headers=auth, params={"since": coordinator.machine.number - 1})
        sent = coordinator.totals["bytes_out"]
        port = httpx.get(url, headers=auth, params={"since": coordinator.machine.number - 1}, timeout=30)
        assert port.status_code == 200 and port.content == api.content
        assert coordinator.totals["bytes_out"] == sent + len(api.content)
        for header in ("etag", "x-coop-round", "x-coop-since", "content-type"):
            assert port.headers.get(header) == api.headers.get(header), header
        held = httpx.get(url, headers={**auth, "If-None-Match": api.headers["etag"]}, timeout=30)
        assert held.status_code == 304 and held.content == b""
        round_number = coordinator.machine.number
        update = update_body(coordinator, round_number, codec="int8")
        assert put(info["upload_port"], round_number, update, auth).status_code == 200
        closed_round(client, auth, round_number)
    assert "x-coop-since" in port.headers  # the second was the change
    assert httpx.get(url, timeout=30).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer nobody.secret"}, timeout=30).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).content == \
        client.get("/v1/weights", headers={"Authorization": f"Bearer {TOKEN}"}).content  # the run's token too
    assert httpx.post(url, headers=auth, timeout=30).status_code == 404


def test_a_worker_downloads_from_the_port_and_falls_back_to_the_api(real_server):
    coordinator, port = real_server
    for dead_port in (None, free_port()):
        worker, transport, said = joined(coordinator, port, dead_port, weights=True)
        sent = coordinator.totals["bytes_out"]
        assert transport.fetch_weights() == 0
        for name, array in coordinator.weights.items():
            np.testing.assert_array_equal(transport.weights[name], array)
        assert coordinator.totals["bytes_out"] > sent
        if dead_port is None:
            assert not said and worker.upload_url is not None
        else:
            assert "its API port takes this one" in said[0]
            transport.weights = None  # a second download, refused by the dead port again: given up
            assert transport.fetch_weights() == 0
            assert worker.upload_url is None and not worker.weights_via_upload_port
            assert "updates and downloads go to its API port from now on" in said[1]
        worker.close()


def test_uploads_arrive_side_by_side(serve):
    coordinator, client = serve(tiny(coordinator={"min_workers": 4}))
    joined = [join(client) for _ in range(4)]
    port, body = joined[0][0]["upload_port"], update_body(coordinator, 0)
    answers = []
    threads = [threading.Thread(target=lambda auth=auth: answers.append(put(port, 0, body, auth).status_code))
               for _, auth in joined]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == [200] * 4
    closed_round(client, joined[0][1], 0)
    assert coordinator.machine.number == 1


def test_the_cli_puts_the_port_beside_the_apis():
    from coop.coordinator.cli import _upload_port, build_parser

    def port_of(*argv):
        upload = _upload_port(build_parser().parse_args(["serve", "--state-dir", "s", *argv]))
        return None if upload is None else upload.port

    assert port_of() == 8001 and port_of("--port", "9000") == 9001
    assert port_of("--upload-port", "7000") == 7000 and port_of("--upload-port", "0") is None
    assert port_of("--port", "0") == 0  # the API on any free port: the uploads too
