"""The peer API (coop.gossip.server + PeerNode handlers) in process, through FastAPI's TestClient:
tokens, size limits, and every kind of bad update refused with a clear 4xx and no state change."""
import numpy as np
import pytest
from fastapi.testclient import TestClient

from coop.codec import get_codec
from coop.gossip.payload import pack_update, parse_state
from coop.gossip.peer import PeerNode
from coop.gossip.server import create_app
from coop.runconfig import RunConfig
from coop.wire import pack

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARTNER_URL = "http://127.0.0.1:9"


@pytest.fixture
def node():
    config = RunConfig.model_validate({"rounds": {"max_rounds": 3}, "inner": {"steps": 1},
                                       "data": {"default_chars": 20000},
                                       "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}})
    peer = PeerNode(token=TOKEN, advertise="http://127.0.0.1:1", quiet=True, peer_id="aaaa")
    peer.setup_new_swarm(config)
    return peer


@pytest.fixture
def client(node):
    return TestClient(create_app(node))


def _join(client, peer_id="bbbb"):
    r = client.post("/v1/join", json={"peer_id": peer_id, "url": PARTNER_URL}, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def _delta(node, value=0.01):
    return {n: np.full(s.shape, value, np.float32) for n, s in node.spec.items()}


def _update(node, peer_id="bbbb", round_index=0, delta=None, weights="same", codec="fp32", swarm=None):
    weights = node.global_weights if weights == "same" else weights
    return pack_update(swarm or node.swarm, peer_id, round_index, 256, 3.0, get_codec(codec),
                       _delta(node) if delta is None else delta, weights)


def _post(client, body, round_index=0, headers=AUTH):
    return client.post(f"/v1/gossip/{round_index}", content=body, headers=headers)


def test_info_and_status_need_no_token(client, node):
    info = client.get("/v1/info").json()
    assert info["kind"] == "peer" and info["swarm"] == node.swarm and info["ready"]
    status = client.get("/v1/status").json()
    assert status["peer_id"] == "aaaa" and [m["peer_id"] for m in status["members"]] == ["aaaa"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}])
def test_token_required(client, headers):
    for method, path in [("post", "/v1/join"), ("post", "/v1/heartbeat"), ("get", "/v1/state"), ("get", "/v1/data"),
                         ("post", "/v1/gossip/0"), ("post", "/v1/leave")]:
        r = getattr(client, method)(path, headers=headers)
        assert r.status_code == 401, (path, r.text)
        assert "token" in r.json()["detail"]


def test_join_gives_config_members_and_state(client, node):
    reply = _join(client)
    assert reply["swarm"] == node.swarm and reply["active_from"] == 0  # joined before round 0 started
    assert {m["peer_id"] for m in reply["members"]} == {"aaaa", "bbbb"}
    assert RunConfig.model_validate(reply["config"]) == node.config
    body = client.get("/v1/state", headers=AUTH).content
    round_index, weights, outer, _ = parse_state(body, node.spec, max_bytes=1 << 24)
    assert round_index == 0 and outer["step_count"] == 0
    for name, array in node.global_weights.items():
        np.testing.assert_array_equal(weights[name], array)
    node.phase = "training"
    assert _join(client, "cccc")["active_from"] == 1  # mid-round: in groups from the next round


def test_good_update_is_filed(client, node):
    _join(client)
    r = _post(client, _update(node))
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": True, "round": 0, "receiver_round": 0}
    assert node.inbox.senders(0) == {"bbbb"} and node.updates_accepted == 1
    r = _post(client, _update(node, codec="int8"))
    assert r.status_code == 409 and "already received" in r.json()["detail"]
    assert _post(client, _update(node, round_index=2), round_index=2).status_code == 200  # a partner ahead


def test_bad_updates_are_refused_and_change_nothing(client, node):
    _join(client)
    weights_before = {n: a.copy() for n, a in node.global_weights.items()}
    spec = node.spec
    name = min(spec)
    wrong_shape = dict(_delta(node), **{name: np.zeros((3, 3), np.float32)})
    nan_delta = _delta(node)
    nan_delta[name] = nan_delta[name].copy()
    nan_delta[name].reshape(-1)[0] = np.nan
    nan_body = pack({"delta/" + n: a for n, a in nan_delta.items()} | {"global/" + n: a for n, a in node.global_weights.items()},
                    {"swarm": node.swarm, "peer_id": "bbbb", "round": 0, "tokens": 1, "loss": 1.0,
                     "codec": {"codec": "fp32", "options": {}, "shapes": {n: list(s.shape) for n, s in spec.items()}}})
    inf_weights = {n: a.copy() for n, a in node.global_weights.items()}
    inf_weights[name].reshape(-1)[0] = np.inf
    missing = dict(_delta(node))
    missing.pop(name)
    cases = [
        (b"not safetensors at all", 0, 400, "safetensors"),
        (_update(node)[:-5], 0, 400, "truncated"),
        (_update(node, delta=missing), 0, 422, "shapes"),
        (pack({"delta/x": np.zeros(2, np.float32)}, {"swarm": node.swarm, "peer_id": "bbbb", "round": 0, "tokens": 1,
               "codec": {"codec": "fp32", "options": {}, "shapes": {"x": [2]}}}), 0, 422, "shapes"),
        (nan_body, 0, 422, "non-finite"),
        (_update(node, weights=inf_weights), 0, 422, "non-finite"),
        (_update(node, weights=None), 0, 422, "global"),
        (_update(node, peer_id="zzzz"), 0, 403, "join"),
        (_update(node, swarm="another"), 0, 403, "swarm"),
        (_update(node, round_index=1), 0, 422, "round"),
        (_update(node, round_index=7), 7, 409, "too far ahead"),
        (_update(node, delta=wrong_shape), 0, 422, "shape"),
    ]
    for body, round_index, status, words in cases:
        r = _post(client, body, round_index)
        assert r.status_code == status, (words, r.status_code, r.text)
        assert words in r.json()["detail"], (words, r.json())
    node.inbox.close(0)  # the peer moved on to round 1: round 0 is stale
    r = _post(client, _update(node), 0)
    assert r.status_code == 409 and r.json()["round"] == 1 and "closed" in r.json()["detail"]
    assert node.updates_accepted == 0 and node.inbox.count() == 0
    assert node.updates_refused == len(cases) + 1
    for n, a in weights_before.items():
        np.testing.assert_array_equal(node.global_weights[n], a)


def test_oversize_body_is_413(client, node):
    _join(client)
    limit = node.update_limit()
    r = _post(client, b"\0" * (limit + 1))
    assert r.status_code == 413 and str(limit) in r.json()["detail"]
    r = client.post("/v1/heartbeat", content=b"{" * (2 << 20), headers=AUTH)
    assert r.status_code == 413
    assert node.inbox.count() == 0


def test_heartbeat_and_leave(client, node):
    reply = _join(client)
    members = reply["members"]
    beat = {"swarm": node.swarm, "peer_id": "bbbb", "url": PARTNER_URL, "round": 0,
            "members": members + [{"peer_id": "dddd", "url": "http://127.0.0.1:4", "active_from": 1, "round": 0}]}
    r = client.post("/v1/heartbeat", json=beat, headers=AUTH)
    assert r.status_code == 200, r.text
    assert {m["peer_id"] for m in r.json()["members"]} == {"aaaa", "bbbb", "dddd"}
    assert client.post("/v1/heartbeat", json=dict(beat, swarm="x"), headers=AUTH).status_code == 403
    assert client.post("/v1/heartbeat", json=dict(beat, url="ftp://x"), headers=AUTH).status_code == 422
    assert client.post("/v1/leave", json={"swarm": node.swarm, "peer_id": "dddd"}, headers=AUTH).status_code == 200
    assert set(node.membership.members) == {"aaaa", "bbbb"}
