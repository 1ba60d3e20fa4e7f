"""The peer API (coop.gossip.server + PeerNode handlers) in process, through FastAPI's TestClient:
tokens, size limits, and every kind of bad update refused with a clear 4xx and no state change."""
import numpy as np
import pytest
from fastapi.testclient import TestClient

from coop.codec import get_codec
from coop.gossip.identity import Identity, card_bytes
from coop.gossip.payload import pack_update, parse_state, sign_tensors
from coop.gossip.peer import PeerNode
from coop.gossip.protocol import Heartbeat, LeaveRequest, signed_bytes
from coop.gossip.server import create_app
from coop.runconfig import RunConfig
from coop.wire import pack

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARTNER_URL = "http://127.0.0.1:9"
PARTNER, OTHER, STRANGER = Identity.generate(), Identity.generate(), Identity.generate()


def card(identity, url=PARTNER_URL):
    return {"peer_id": identity.peer_id, "url": url, "public_key": identity.public_key,
            "card": identity.sign("member", card_bytes(identity.peer_id, url, identity.public_key))}


def signed_pack(identity, tensors, metadata):
    return pack(tensors, sign_tensors(identity, "update", tensors, metadata))


@pytest.fixture
def node():
    config = RunConfig.model_validate({"rounds": {"max_rounds": 3}, "inner": {"steps": 1},
                                       "data": {"default_chars": 20000},
                                       "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}})
    peer = PeerNode(token=TOKEN, advertise="http://127.0.0.1:1", quiet=True)
    peer.setup_new_swarm(config)
    return peer


@pytest.fixture
def client(node):
    return TestClient(create_app(node))


def _join(client, identity=PARTNER):
    r = client.post("/v1/join", json=card(identity), headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def _delta(node, value=0.01):
    return {n: np.full(s.shape, value, np.float32) for n, s in node.spec.items()}


def _update(node, identity=PARTNER, round_index=0, delta=None, weights="same", codec="fp32", swarm=None):
    weights = node.global_weights if weights == "same" else weights
    return pack_update(swarm or node.swarm, identity, round_index, 256, 3.0, get_codec(codec),
                       _delta(node) if delta is None else delta, weights)


def _post(client, body, round_index=0, headers=AUTH):
    return client.post(f"/v1/gossip/{round_index}", content=body, headers=headers)


def test_info_and_status_need_no_token(client, node):
    info = client.get("/v1/info").json()
    assert info["kind"] == "peer" and info["swarm"] == node.swarm and info["ready"]
    status = client.get("/v1/status").json()
    assert status["peer_id"] == node.peer_id and [m["peer_id"] for m in status["members"]] == [node.peer_id]


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
    assert {m["peer_id"] for m in reply["members"]} == {node.peer_id, PARTNER.peer_id}
    assert RunConfig.model_validate(reply["config"]) == node.config
    body = client.get("/v1/state", headers=AUTH).content
    round_index, weights, outer, _ = parse_state(body, node.spec, max_bytes=1 << 24, public_key=node.identity.public_key)
    assert round_index == 0 and outer["step_count"] == 0
    for name, array in node.global_weights.items():
        np.testing.assert_array_equal(weights[name], array)
    node.phase = "training"
    assert _join(client, OTHER)["active_from"] == 1  # mid-round: in groups from the next round


def test_good_update_is_filed(client, node):
    _join(client)
    r = _post(client, _update(node))
    assert r.status_code == 200, r.text
    assert r.json() == {"accepted": True, "round": 0, "receiver_round": 0}
    assert node.inbox.senders(0) == {PARTNER.peer_id} and node.updates_accepted == 1
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
    nan_body = signed_pack(PARTNER, {"delta/" + n: a for n, a in nan_delta.items()} | {"global/" + n: a for n, a in node.global_weights.items()},
                    {"swarm": node.swarm, "peer_id": PARTNER.peer_id, "round": 0, "tokens": 1, "loss": 1.0,
                     "codec": {"codec": "fp32", "options": {}, "shapes": {n: list(s.shape) for n, s in spec.items()}}})
    inf_weights = {n: a.copy() for n, a in node.global_weights.items()}
    inf_weights[name].reshape(-1)[0] = np.inf
    missing = dict(_delta(node))
    missing.pop(name)
    cases = [
        (b"not safetensors at all", 0, 400, "safetensors"),
        (_update(node)[:-5], 0, 400, "truncated"),
        (_update(node, delta=missing), 0, 422, "shapes"),
        (signed_pack(PARTNER, {"delta/x": np.zeros(2, np.float32)}, {"swarm": node.swarm, "peer_id": PARTNER.peer_id, "round": 0, "tokens": 1,
               "codec": {"codec": "fp32", "options": {}, "shapes": {"x": [2]}}}), 0, 422, "shapes"),
        (nan_body, 0, 422, "non-finite"),
        (_update(node, weights=inf_weights), 0, 422, "non-finite"),
        (_update(node, weights=None), 0, 422, "global"),
        (_update(node, identity=STRANGER), 0, 403, "join"),
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
    # a round too far ahead and a closed round are turned away on timing alone: late, not refused
    assert node.updates_late == 2
    assert node.updates_refused == len(cases) - 1
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


def _heartbeat(node, members, identity=PARTNER, **changes):
    beat = Heartbeat.model_validate({"swarm": node.swarm, "peer_id": identity.peer_id, "url": PARTNER_URL, "round": 0,
                                     "members": members, "signature": "0" * 128})
    beat = beat.model_copy(update={"signature": identity.sign("heartbeat", signed_bytes(beat))})
    return dict(beat.model_dump(), **changes)


def test_heartbeat_and_leave(client, node):
    reply = _join(client)
    members = reply["members"] + [dict(card(OTHER, "http://127.0.0.1:4"), active_from=1, round=0)]
    beat = _heartbeat(node, members)
    r = client.post("/v1/heartbeat", json=beat, headers=AUTH)
    assert r.status_code == 200, r.text
    assert {m["peer_id"] for m in r.json()["members"]} == {node.peer_id, PARTNER.peer_id, OTHER.peer_id}
    assert client.post("/v1/heartbeat", json=dict(beat, swarm="x"), headers=AUTH).status_code == 403
    assert client.post("/v1/heartbeat", json=dict(beat, url="ftp://x"), headers=AUTH).status_code == 422
    leave = LeaveRequest(swarm=node.swarm, peer_id=OTHER.peer_id, signature="0" * 128)
    forged = dict(leave.model_dump(), signature=PARTNER.sign("leaverequest", signed_bytes(leave)))
    assert client.post("/v1/leave", json=forged, headers=AUTH).status_code == 403  # only a peer itself may leave
    genuine = dict(leave.model_dump(), signature=OTHER.sign("leaverequest", signed_bytes(leave)))
    assert client.post("/v1/leave", json=genuine, headers=AUTH).status_code == 200
    assert set(node.membership.members) == {node.peer_id, PARTNER.peer_id}


def test_signed_membership_records(client, node):
    reply = _join(client)
    # a heartbeat signed by another key than its sender's, or changed after signing
    beat = _heartbeat(node, reply["members"])
    assert client.post("/v1/heartbeat", json=dict(beat, round=5), headers=AUTH).status_code == 403
    wrong_key = _heartbeat(node, reply["members"], identity=OTHER)
    wrong_key.update(peer_id=PARTNER.peer_id, url=PARTNER_URL)
    assert client.post("/v1/heartbeat", json=wrong_key, headers=AUTH).status_code == 403
    # a member card that is not its peer's: refused when the message is parsed (422)
    forged = dict(card(OTHER), peer_id=PARTNER.peer_id)
    assert client.post("/v1/join", json=forged, headers=AUTH).status_code == 422
    moved = dict(card(PARTNER), url="http://127.0.0.1:666")  # a card with another url than the one signed
    assert client.post("/v1/join", json=moved, headers=AUTH).status_code == 422
    members = reply["members"] + [dict(card(OTHER, "http://127.0.0.1:4"), url="http://evil:1", active_from=0, round=0)]
    assert client.post("/v1/heartbeat", json=_heartbeat(node, reply["members"]) | {"members": members},
                       headers=AUTH).status_code == 422
    assert set(node.membership.members) == {node.peer_id, PARTNER.peer_id}
    assert node.membership.members[PARTNER.peer_id].url == PARTNER_URL


def test_refusals_are_logged_at_most_once_a_second():
    from coop.gossip.node import RefusalLog

    lines = []
    log = RefusalLog(lines.append, interval_s=60)
    for i in range(5):
        log.note(f"refused an update ({400 + i})")
    assert lines == ["refused an update (400)"]
    log.last -= 60  # a minute later: the next line says how many were held back
    log.note("turned away an update (409)")
    assert lines[-1] == "turned away an update (409) (and 4 more since the last such line)"
