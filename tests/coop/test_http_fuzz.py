"""The HTTP APIs against their own OpenAPI schemas: every status and content type a route answers is
documented, generated requests (hypothesis) never get a 5xx, and a refused request changes nothing."""
from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coop.coordinator.app import create_app
from coop.coordinator.service import Coordinator
from coop.gossip.server import create_app as create_peer_app

from test_coordinator_app import join, tiny, update_body


class SchemaCheck:
    """Matches a request to its OpenAPI operation and checks the answer against it."""

    def __init__(self, schema: dict):
        self.operations = []
        for template, item in schema["paths"].items():
            pattern = re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$")
            for method, operation in item.items():
                self.operations.append((pattern, method.upper(), template, operation))

    def check(self, method: str, path: str, response) -> None:
        path = response.request.url.path  # what the server saw (the client normalises "//" and the like)
        if path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/openapi.json"):  # the schema's own pages
            return
        matches = [(t, op) for pattern, m, t, op in self.operations if pattern.match(path) and m == method]
        if not matches:  # no such route (404) or not this method (405): starlette's own answers
            assert response.status_code in (404, 405), (method, path, response.status_code, response.text[:200])
            return
        template, operation = matches[0]
        documented = operation["responses"]
        status = str(response.status_code)
        assert status in documented, f"{method} {template} answered {status} ({response.text[:200]!r}), " \
                                     f"documented: {sorted(documented)}"
        content = documented[status].get("content")
        if content and response.content:
            media = response.headers.get("content-type", "").split(";")[0].strip()
            assert media in content, f"{method} {template} {status}: {media} not in {sorted(content)}"


@pytest.fixture
def served(tmp_path):
    coordinator = Coordinator(tiny(coordinator={"joins_per_minute": 10_000}), tmp_path / "state", "tok")
    with TestClient(create_app(coordinator), raise_server_exceptions=False) as client:
        yield coordinator, client, SchemaCheck(client.get("/openapi.json").json())


def snapshot(coordinator: Coordinator) -> tuple:
    """What a refused request must not change."""
    return (coordinator.machine.number, tuple(sorted(coordinator.machine.round.reports)),
            coordinator.totals["updates_accepted"], len(coordinator.members.workers),
            sum(w.left for w in coordinator.members.workers.values()), coordinator.weights_body)


def test_every_route_answers_only_what_its_schema_documents(served):
    coordinator, client, schema = served
    info, auth = join(client)
    run = {"Authorization": "Bearer tok"}
    calls = [
        ("GET", "/v1/info", {}, None), ("GET", "/", {}, None), ("GET", "/metrics", {}, None),
        ("GET", "/v1/status", {}, None), ("GET", "/v1/status", run, None),
        ("POST", "/v1/join", {}, b"{}"), ("POST", "/v1/join", run, b"{bad"), ("POST", "/v1/join", run, b'{"x": 1}'),
        ("GET", "/v1/weights", auth, None), ("GET", "/v1/weights", {**auth, "If-None-Match": '"r0"'}, None),
        ("GET", "/v1/weights", {"Authorization": "Bearer w0.wrong"}, None),
        ("GET", "/v1/shard", auth, None), ("GET", "/v1/shard", {}, None),
        ("PUT", "/v1/rounds/0/update", {}, b"x"), ("PUT", "/v1/rounds/0/update", auth, b"garbage"),
        ("PUT", "/v1/rounds/0/update", auth, b"\x00" * (coordinator.max_update_bytes + 1)),
        ("PUT", "/v1/rounds/5/update", auth, b"x"), ("PUT", "/v1/rounds/x/update", auth, b"x"),
        ("PUT", "/v1/rounds/0/update", auth, update_body(coordinator, 0, codec="int8")),
        ("PUT", "/v1/rounds/0/update", auth, update_body(coordinator, 0)),
        ("GET", "/v1/rounds/0/wait?timeout_s=0", auth, None), ("GET", "/v1/rounds/0/wait?timeout_s=-1", auth, None),
        ("POST", "/v1/heartbeat", auth, b""), ("POST", "/v1/heartbeat", {}, b""),
        ("POST", "/v1/leave", {}, None), ("POST", "/v1/leave", auth, None),
        ("DELETE", "/v1/info", {}, None), ("GET", "/nothing", {}, None),
    ]
    seen = set()
    for method, path, headers, body in calls:
        response = client.request(method, path, headers=headers, content=body)
        assert response.status_code < 500, (method, path, response.text)
        schema.check(method, path, response)
        seen.add(response.status_code)
    assert {200, 304, 400, 401, 409, 413, 422} <= seen
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")


def test_the_peer_app_documents_its_statuses():
    class Node:  # only what building the app and its schema touches
        token = None

    schema = TestClient(create_peer_app(Node())).get("/openapi.json").json()
    gossip = schema["paths"]["/v1/gossip/{round_index}"]["post"]["responses"]
    assert {"200", "400", "401", "403", "408", "409", "413", "422", "503"} <= set(gossip)
    for path in ("/v1/state", "/v1/data"):
        assert "application/octet-stream" in schema["paths"][path]["get"]["responses"]["200"]["content"]


METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
SEGMENT = st.one_of(st.integers(-3, 10**12).map(str), st.text("abc%./-_~", max_size=8))
PATHS = st.one_of(
    st.sampled_from(["/v1/info", "/v1/join", "/v1/weights", "/v1/shard", "/v1/heartbeat", "/v1/leave",
                     "/v1/status", "/metrics", "/", "/docs", "/openapi.json"]),
    SEGMENT.map(lambda r: f"/v1/rounds/{r}/update"),
    st.tuples(SEGMENT, st.text("0123456789.-e", max_size=6)).map(lambda t: f"/v1/rounds/{t[0]}/wait?timeout_s={t[1]}"),
    # a path starting "//" is refused by the test client itself (a network-path reference): never sent
    st.text("/abcv1", max_size=20).map(lambda p: "/" + p.lstrip("/")),
)
BODIES = st.one_of(st.none(), st.binary(max_size=300), st.sampled_from([b"{}", b'{"name": "x"}', b"[" * 5000, b"\x00" * 8]),
                   st.integers(0, 2**64 - 1).map(lambda n: n.to_bytes(8, "little") + b"{}"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(method=METHODS, path=PATHS, body=BODIES, auth=st.sampled_from(["none", "run", "worker", "garbage", "empty"]),
       content_type=st.sampled_from([None, "application/json", "application/octet-stream", "text/plain"]))
def test_generated_requests_never_get_a_5xx_and_refusals_change_nothing(served, method, path, body, auth, content_type):
    coordinator, client, schema = served
    if not coordinator.members.workers:
        join(client)
    record = next(iter(w for w in coordinator.members.workers.values() if not w.left), None)
    headers = {}
    if auth == "run":
        headers["Authorization"] = "Bearer tok"
    elif auth == "worker" and record is not None:
        headers["Authorization"] = f"Bearer {record.id}.{'x' * 43}"  # a right id, a wrong secret
    elif auth == "garbage":
        headers["Authorization"] = "Basic abc"
    elif auth == "empty":
        headers["Authorization"] = "Bearer "
    if content_type:
        headers["Content-Type"] = content_type
    before = snapshot(coordinator)
    response = client.request(method, path, headers=headers, content=body)
    assert response.status_code < 500, (method, path, response.status_code, response.text[:300])
    schema.check(method, path, response)
    if response.status_code >= 400:
        assert snapshot(coordinator) == before, (method, path, response.status_code)
