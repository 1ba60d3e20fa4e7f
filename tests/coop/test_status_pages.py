"""The status pages, /metrics and /docs of both servers (coordinator and peer), in process: what `/`
shows with and without the token (and the log-in that sets its cookie), the metrics as Prometheus
parses them, and API docs that load nothing from outside."""
from __future__ import annotations

import math
import re

import pytest
from fastapi.testclient import TestClient
from page_check import check_chart, check_server_metrics, parse_charts, parse_metrics, value

from coop.coordinator.app import create_app
from coop.coordinator.service import Coordinator
from coop.gossip.peer import PeerNode
from coop.gossip.server import create_app as create_peer_app
from coop.pageaccess import COOKIE
from coop.runconfig import RunConfig

from test_coordinator_app import join, tiny, update_body

TOKEN = "tok"
RUN = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def coordinator(tmp_path, request):
    token = getattr(request, "param", TOKEN)
    c = Coordinator(tiny(coordinator={"min_workers": 1}, rounds={"max_rounds": 2}), tmp_path / "state", token)
    with TestClient(create_app(c)) as client:
        yield c, client


def run_a_round(c, client, round_number=0, name="alice-gpu", auth=None):
    auth = auth or join(client, name=name)[1]
    assert client.put(f"/v1/rounds/{round_number}/update", content=update_body(c, round_number), headers=auth).status_code == 200
    assert client.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 10}, headers=auth).json()["closed"]
    return auth


def test_without_the_token_the_page_shows_figures_only(coordinator):
    c, client = coordinator
    worker = run_a_round(c, client)
    anonymous = client.get("/").text
    assert "alice-gpu" not in anonymous and "<h2>Workers</h2>" not in anonymous and "w0" not in anonymous
    assert "active workers" in anonymous and "Recent rounds" in anonymous and "href='/login'" in anonymous
    assert len(parse_charts(anonymous)) == 4
    for headers in (RUN, worker):  # the run token, or a worker's, as for /v1/status
        full = client.get("/", headers=headers).text
        assert "alice-gpu" in full and "<h2>Workers</h2>" in full and "action='/logout'" in full
    assert "alice-gpu" not in client.get("/", headers={"Authorization": "Bearer nope"}).text
    assert "alice-gpu" not in client.get("/?token=tok").text  # never a token in the URL


def test_the_login_form_sets_a_cookie_that_is_not_the_token(coordinator):
    c, client = coordinator
    run_a_round(c, client)
    form = client.get("/login")
    assert form.status_code == 200 and "name='token'" in form.text and "http-equiv='refresh'" not in form.text
    wrong = client.post("/login", data={"token": "nope"}, follow_redirects=False)
    assert wrong.status_code == 401 and "wrong token" in wrong.text and COOKIE not in wrong.headers.get("set-cookie", "")
    for body in (b"", b"tok", b"token=a&token=b", b"token=" + b"x" * 5000):
        assert client.post("/login", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"},
                           follow_redirects=False).status_code == 400, body[:20]
    right = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert right.status_code == 303 and right.headers["location"] == "/"
    cookie = right.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Max-Age=" in cookie
    assert "Secure" not in cookie  # plain http here; over https it is Secure
    value_ = client.cookies.get(COOKIE)
    assert value_ and TOKEN not in value_ and len(value_) == 64
    assert "alice-gpu" in client.get("/").text  # the client sends the cookie now
    client.cookies.clear()
    assert "alice-gpu" not in client.get("/", headers={"Cookie": f"{COOKIE}={'0' * 64}"}).text  # a made-up cookie
    assert "alice-gpu" in client.get("/", headers={"Cookie": f"{COOKIE}={value_}"}).text
    out = client.post("/logout", follow_redirects=False)
    assert out.status_code == 303 and out.headers["set-cookie"].startswith(f'{COOKIE}=""')


@pytest.mark.parametrize("coordinator", [None], indirect=True)
def test_without_a_run_token_everyone_sees_everything(coordinator):
    c, client = coordinator
    run_a_round(c, client)
    page = client.get("/").text
    assert "alice-gpu" in page and "/login" not in page and "/logout" not in page
    assert client.post("/login", data={"token": "x"}, follow_redirects=False).status_code == 303


def test_a_finished_run_shows_no_deadline_and_readable_charts(coordinator):
    c, client = coordinator
    assert ">deadline<" in client.get("/", headers=RUN).text
    auth = run_a_round(c, client, 0)
    run_a_round(c, client, 1, auth=auth)
    page = client.get("/", headers=RUN).text
    assert c.machine.done and "done" in page and ">deadline<" not in page and ">open for<" not in page
    charts = parse_charts(page)
    assert [ch.kind for ch in charts] == ["loss", "bytes", "seconds", "count"]
    for chart in charts:
        check_chart(chart)


def test_coordinator_metrics_follow_prometheus_naming(coordinator):
    c, client = coordinator
    assert math.isnan(value(parse_metrics(client.get("/metrics").text), "coop_val_loss"))
    auth = run_a_round(c, client)
    weights, shard = len(client.get("/v1/weights", headers=auth).content), len(client.get("/v1/shard", headers=auth).content)
    assert client.post("/v1/rounds/1/eval", json={"loss": 2.337, "tokens": 64}, headers=auth).status_code == 200
    samples = parse_metrics(client.get("/metrics").text)
    status = client.get("/v1/status", headers=RUN).json()
    assert value(samples, "coop_val_loss") == status["val_loss"]["loss"] == 2.337
    assert value(samples, "coop_round") == status["round"] == 1
    assert value(samples, "coop_received_bytes_total") == status["totals"]["bytes_in"] > 0
    assert value(samples, "coop_sent_bytes_total", what="weights") == weights
    assert value(samples, "coop_sent_bytes_total", what="shard") == shard
    assert weights + shard == status["totals"]["bytes_out"]
    assert value(samples, "coop_updates_total", result="accepted") == 1
    assert value(samples, "coop_round_duration_seconds_count") == 1
    check_server_metrics(samples)
    assert not any(name.startswith("coop_bytes_") for name in samples)  # the old names, gone


@pytest.fixture
def peer():
    config = RunConfig.model_validate({"rounds": {"max_rounds": 3}, "inner": {"steps": 1},
                                       "data": {"default_chars": 20000},
                                       "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}})
    node = PeerNode(token=TOKEN, advertise="http://127.0.0.1:9876", quiet=True)
    node.setup_new_swarm(config)
    return node


def test_a_peer_serves_its_page_and_metrics(peer):
    client = TestClient(create_peer_app(peer))
    anonymous = client.get("/").text
    assert peer.peer_id not in anonymous and "127.0.0.1:9876" not in anonymous and "<h2>Members</h2>" not in anonymous
    assert "consensus distance" in anonymous and "members" in anonymous
    full = client.get("/", headers=RUN).text
    assert peer.peer_id in full and "127.0.0.1:9876" in full and "<h2>Members</h2>" in full
    assert client.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
    assert peer.peer_id in client.get("/").text
    samples = parse_metrics(client.get("/metrics").text)
    check_server_metrics(samples)
    assert value(samples, "coop_round") == 0 and value(samples, "coop_members") == 1
    phases = samples["coop_peer_phase"]
    assert value(samples, "coop_peer_phase", phase=peer.phase) == 1 and sum(phases.values()) == 1 and len(phases) == 6
    assert math.isnan(value(samples, "coop_train_loss")) and math.isnan(value(samples, "coop_consensus_distance"))
    assert value(samples, "coop_updates_total", result="refused") == 0
    assert value(samples, "coop_updates_total", result="late") == 0


def _local_assets(page: str) -> list[str]:
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    assert urls and all(u.startswith("/") and not u.startswith("//") for u in urls), urls
    return urls


@pytest.mark.parametrize("server", ["coordinator", "peer"])
def test_the_api_docs_load_nothing_from_outside_and_declare_the_bearer_token(server, tmp_path, peer):
    if server == "coordinator":
        app = create_app(Coordinator(tiny(), tmp_path / "state", TOKEN))
        protected = "/v1/status"
    else:
        app = create_peer_app(peer)
        protected = "/v1/state"
    client = TestClient(app)
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assert "cdn" not in html.lower() and "googleapis" not in html
        for url in _local_assets(html):
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 1000, url
            kind = {"js": "javascript", "css": "text/css", "png": "image/png"}[url.rsplit(".", 1)[1]]
            assert kind in asset.headers["content-type"], (url, asset.headers["content-type"])
    assert client.get("/static/docs/../../etc/passwd").status_code == 404
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {**schema["components"]["securitySchemes"]["bearer"],
                                                                 "type": "http", "scheme": "bearer"}
    method = "get"
    assert schema["paths"][protected][method]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/v1/info"]["get"]  # open
    assert {"bearer": []} in schema["paths"]["/"]["get"]["security"]  # optional: more with it
