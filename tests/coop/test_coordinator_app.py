"""The coordinator in-process (FastAPI TestClient): auth, updates, rounds, persistence, resume."""
from __future__ import annotations

import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from coop.codec import get_codec
from coop.coordinator.app import create_app
from coop.coordinator.members import Members
from coop.coordinator.page import render_page
from coop.coordinator.service import Coordinator
from coop.coordinator.state import load_run
from coop.runconfig import RunConfig
from coop.wire import pack, unpack

TINY = {
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
    "data": {"default_chars": 60_000, "shards": 2},
    "inner": {"steps": 2, "batch_size": 4},
    "rounds": {"max_rounds": 3, "eval_batches": 2},
    "coordinator": {"min_workers": 2, "quorum_fraction": 1.0, "worker_timeout_s": 60, "heartbeat_s": 5},
}


def tiny(**sections) -> RunConfig:
    raw = {k: dict(v) for k, v in TINY.items()}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return RunConfig.model_validate(raw)


@pytest.fixture
def make(tmp_path):
    clients = []

    def make_client(config=None, token="tok", state_dir=None):
        coordinator = Coordinator(config if config is not None else tiny(), state_dir or tmp_path / "state", token)
        client = TestClient(create_app(coordinator))
        client.__enter__()  # runs the lifespan (the round ticker)
        clients.append(client)
        return coordinator, client

    yield make_client
    for client in clients:
        client.__exit__(None, None, None)


def join(client, token="tok", name="w"):
    response = client.post("/v1/join", json={"name": name}, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    info = response.json()
    return info, {"Authorization": f"Bearer {info['worker_token']}"}


def wait_saved(client, auth, round_number):
    """The checkpoint is written beside the next round (coop.coordinator.persist): the status says when."""
    deadline = time.monotonic() + 10
    while client.get("/v1/status", headers=auth).json()["checkpoint"]["resumes_at"] != round_number:
        assert time.monotonic() < deadline, f"the checkpoint resuming at round {round_number} was never written"
        time.sleep(0.02)


def update_body(coordinator, round_number, value=0.01, tokens=32, codec="fp32"):
    update = {k: np.full(v.shape, value, np.float32) for k, v in coordinator.weights.items()}
    encoded = get_codec(codec).encode(update)
    return pack(encoded.tensors, {**encoded.metadata, "round": round_number, "tokens": tokens, "loss": 2.5})


def test_info_is_open_and_says_coordinator(make):
    _, client = make()
    info = client.get("/v1/info").json()
    assert info["kind"] == "coordinator" and info["auth"] is True and info["round"] == 0


def test_join_needs_the_run_token_and_gives_worker_tokens(make):
    coordinator, client = make()
    assert client.post("/v1/join", json={}).status_code == 401
    assert client.post("/v1/join", json={}, headers={"Authorization": "Bearer nope"}).status_code == 401
    info, auth = join(client)
    assert info["worker_id"] == "w0" and info["model"]["vocab_size"] == coordinator.data.vocab_size
    assert info["inner"]["block_size"] == 16 and info["inner_steps"] == 2
    other, _ = join(client)
    assert other["shard"]["index"] != info["shard"]["index"]  # shards spread over workers
    assert client.post("/v1/heartbeat", headers=auth).json()["round"] == 0
    assert client.post("/v1/join", json={"name": "x" * 100}, headers={"Authorization": "Bearer tok"}).status_code == 422


def test_weights_etag_and_shard(make):
    coordinator, client = make()
    _, auth = join(client)
    response = client.get("/v1/weights", headers=auth)
    assert response.headers["etag"] == '"r0"'
    tensors, meta = unpack(response.content)
    assert meta["round"] == 0 and all(np.array_equal(tensors[k], v) for k, v in coordinator.weights.items())
    assert client.get("/v1/weights", headers={**auth, "If-None-Match": '"r0"'}).status_code == 304
    assert client.get("/v1/weights").status_code == 401  # a run token is set: no anonymous downloads
    tokens, meta = unpack(client.get("/v1/shard", headers=auth).content)
    assert tokens["tokens"].dtype == np.uint16 and meta["index"] == 0 and len(tokens["tokens"]) == meta["tokens"]


def test_a_round_closes_applies_the_outer_step_and_persists(make, tmp_path):
    coordinator, client = make()
    (_, a), (_, b) = join(client), join(client)
    before = {k: v.copy() for k, v in coordinator.weights.items()}
    assert client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, 0.01, 32), headers=a).status_code == 200
    assert coordinator.machine.number == 0  # min_workers 2: still open
    assert client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, 0.03, 96), headers=b).status_code == 200
    assert client.get("/v1/rounds/0/wait", params={"timeout_s": 5}, headers=a).json()["closed"]
    mean = (0.01 * 32 + 0.03 * 96) / 128  # weighted by tokens
    k = next(iter(before))
    np.testing.assert_allclose(coordinator.weights[k], before[k] - 0.7 * (mean + 0.9 * mean), rtol=1e-5, atol=1e-7)
    wait_saved(client, a, 1)
    saved = load_run(tmp_path / "state")
    assert saved.round == 1 and np.array_equal(saved.weights[k], coordinator.weights[k])
    assert saved.outer_state["step_count"] == 1 and saved.history[-1]["contributors"] == 2
    assert saved.history[-1]["train_loss"] == pytest.approx(2.5)
    assert {w["id"] for w in saved.members["workers"]} == {"w0", "w1"}
    status = client.get("/v1/status", headers=a).json()
    assert status["round"] == 1 and status["totals"]["updates_accepted"] == 2
    page = client.get("/")
    assert page.status_code == 200 and "<svg" in page.text
    assert "coop_round 1.0" in client.get("/metrics").text


def test_bad_updates_are_refused_and_change_nothing(make):
    coordinator, client = make(tiny(coordinator={"min_workers": 1}))
    _, auth = join(client)
    _, other = join(client)
    weights = {k: v.copy() for k, v in coordinator.weights.items()}
    limit = coordinator.max_update_bytes
    good = update_body(coordinator, 0)
    cases = {
        401: [("/v1/rounds/0/update", good, {"Authorization": "Bearer w0.bad"})],
        400: [("/v1/rounds/0/update", b"garbage", auth), ("/v1/rounds/0/update", good[:-3], auth)],
        413: [("/v1/rounds/0/update", b"x" * (limit + 1), auth)],
        422: [("/v1/rounds/0/update", update_body(coordinator, 0, codec="int8"), auth),
              ("/v1/rounds/0/update", update_body(coordinator, 0, tokens=10**9), auth)],
        409: [("/v1/rounds/1/update", good, auth)],
    }
    for status, requests in cases.items():
        for path, body, headers in requests:
            response = client.put(path, content=body, headers=headers)
            assert response.status_code == status, (status, response.text)
            assert coordinator.machine.round.reports == {} and coordinator.aggregator.count == 0
    assert all(np.array_equal(weights[k], v) for k, v in coordinator.weights.items())
    assert client.put("/v1/rounds/0/update", content=good, headers=auth).status_code == 200
    assert client.post("/v1/leave", headers=other).json()["left"]
    assert client.post("/v1/heartbeat", headers=other).status_code == 401  # its token is dead


def test_resume_from_the_state_directory(make, tmp_path):
    coordinator, client = make()
    info, a = join(client)
    _, b = join(client)
    client.put("/v1/rounds/0/update", content=update_body(coordinator, 0), headers=a)
    client.put("/v1/rounds/0/update", content=update_body(coordinator, 0), headers=b)
    assert client.get("/v1/rounds/0/wait", params={"timeout_s": 5}, headers=a).json()["closed"]
    weights = {k: v.copy() for k, v in coordinator.weights.items()}
    momentum = {k: v.copy() for k, v in coordinator.outer.momentum_buffer.items()}
    wait_saved(client, a, 1)

    resumed, client2 = make(None, state_dir=tmp_path / "state")  # None: the config saved with the run
    assert resumed.machine.number == 1 and resumed.outer.step_count == 1
    assert all(np.array_equal(weights[k], v) for k, v in resumed.weights.items())
    assert all(np.array_equal(momentum[k], v) for k, v in resumed.outer.momentum_buffer.items())
    assert len(resumed.history) == 2  # the initial record and round 0
    assert client2.post("/v1/heartbeat", headers=a).json()["round"] == 1  # worker tokens survive a restart
    with pytest.raises(ValueError, match="another model"):
        Coordinator(tiny(model={"n_layer": 2}), tmp_path / "state", "tok")


def test_no_state_and_no_config_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="holds no run"):
        Coordinator(None, tmp_path / "empty")


def test_members_tokens_are_digests_and_checked_in_constant_time():
    members = Members(shard_count=3)
    record, token = members.join("a", "cpu", now=0.0, round_number=0)
    assert token.startswith("w0.") and token.split(".", 1)[1] not in str(members.to_json())
    assert members.authenticate(token) is record
    assert members.authenticate("w0.wrong") is None and members.authenticate("w7.x") is None
    assert members.authenticate("nodot") is None
    restored = Members.from_json(members.to_json(), now=5.0)
    assert restored.authenticate(token).id == "w0"
    assert [members.join(str(i), "cpu", 0.0, 0)[0].shard for i in range(3)] == [1, 2, 0]


def test_restored_members_are_unconfirmed_until_heard_from():
    # a coordinator restarted on its state: a round must not wait for workers that died with the
    # old process, yet a live worker's token still works and makes it active again at once
    members = Members(shard_count=2)
    (alive, alive_token), (dead, _) = (members.join(name, "cpu", now=100.0, round_number=3) for name in "ab")
    restored = Members.from_json(members.to_json(), now=130.0)
    assert restored.active(130.0, timeout_s=60.0) == set()  # nobody confirmed yet
    assert restored.prune(130.0, timeout_s=60.0) == []  # records kept within a timeout of their last contact
    restored.authenticate(alive_token).seen(131.0)
    assert restored.active(131.0, timeout_s=60.0) == {alive.id}
    assert restored.workers[dead.id].public(131.0, 60.0)["active"] is False


def test_a_worker_refused_as_stale_twice_in_a_row_is_flagged_until_it_counts_again(tmp_path):
    coordinator = Coordinator(tiny(), tmp_path / "state", None)
    record, _ = coordinator.members.join("slow", "cpu", now=coordinator.clock(), round_number=0)
    coordinator.reject(record, "stale")
    assert record.stale_in_a_row == 1 and "late in a row" not in render_page(coordinator.status())
    coordinator.reject(record, "invalid")  # another kind of refusal does not count as lateness
    coordinator.reject(record, "stale")
    assert record.stale_in_a_row == 2
    assert "2 late in a row" in render_page(coordinator.status())
    assert next(w for w in coordinator.status()["workers"] if w["id"] == record.id)["stale_in_a_row"] == 2


def test_streaming_rounds_take_one_fragment_each_and_step_only_it(make):
    from coop.streaming import fragments
    config = tiny(model={"n_layer": 2}, inner={"steps": 4}, outer={"fragments": 2})
    coordinator, client = make(config)
    info, a = join(client)
    _, b = join(client)
    assert info["fragments"] == 2 and info["inner_steps"] == 4
    parts = fragments(coordinator.weights, 2)
    for round_number in range(2):
        part = parts[round_number]
        assert client.post("/v1/heartbeat", json={}, headers=a).json()["fragment"] == round_number
        before = {k: v.copy() for k, v in coordinator.weights.items()}
        whole = update_body(coordinator, round_number)
        refused = client.put(f"/v1/rounds/{round_number}/update", content=whole, headers=a)
        assert refused.status_code == 422, refused.text  # the whole model is not this round's fragment
        update = {k: np.full(coordinator.weights[k].shape, 0.01, np.float32) for k in part}
        encoded = get_codec("fp32").encode(update)
        body = pack(encoded.tensors, {**encoded.metadata, "round": round_number, "tokens": 32, "loss": 2.5})
        for headers in (a, b):
            assert client.put(f"/v1/rounds/{round_number}/update", content=body, headers=headers).status_code == 200
        assert client.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 5}, headers=a).json()["closed"]
        for k, w in coordinator.weights.items():
            if k in part:
                assert not np.array_equal(w, before[k]), k
            else:
                np.testing.assert_array_equal(w, before[k], err_msg=k)
    assert [h.get("fragment") for h in coordinator.history[1:]] == [0, 1]
    with pytest.raises(ValueError, match="must divide inner.steps"):
        tiny(model={"n_layer": 2}, inner={"steps": 3}, outer={"fragments": 2})
    with pytest.raises(ValueError, match="more than the model's 1 layers"):
        tiny(outer={"fragments": 2})


# -- the val loss: the workers measure it, the coordinator records it ---------------------------------
def report(client, headers, round_number, loss, tokens):
    return client.post(f"/v1/rounds/{round_number}/eval", json={"loss": loss, "tokens": tokens}, headers=headers)


def close_round(coordinator, client, round_number, *workers):
    for headers in workers:
        body = update_body(coordinator, round_number)
        assert client.put(f"/v1/rounds/{round_number}/update", content=body, headers=headers).status_code == 200
    assert client.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 5}, headers=workers[0]).json()["closed"]


def wait_for_file(path, predicate, timeout=5.0):
    import json
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and predicate(json.loads(path.read_text())):
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never held what was expected")


def metric(client, name):
    line = next(l for l in client.get("/metrics").text.splitlines() if l.startswith(name + " "))
    return float(line.split()[1])


def test_the_val_slice_is_fixed_consecutive_val_tokens_for_workers_only(make, tmp_path):
    coordinator, client = make()
    info, auth = join(client)
    _, other = join(client)
    assert info["eval"] == {"every": 1, "batches": 2}
    assert client.get("/v1/val").status_code == 401
    body = client.get("/v1/val", headers=auth).content
    assert client.get("/v1/val", headers=other).content == body  # every worker evaluates the same windows
    tensors, meta = unpack(body)
    tokens, val = tensors["tokens"], coordinator.data.val.tokens
    assert len(tokens) == meta["tokens"] == min(len(val), 2 * 4 * 17)  # eval_batches x batch_size x (block_size + 1)
    np.testing.assert_array_equal(tokens, val[meta["start"]:meta["start"] + len(tokens)])
    assert meta["data_id"] == info["data_id"] and meta["eval_batches"] == 2
    assert Coordinator(None, tmp_path / "state").val.body() == body  # the same slice after a restart


def test_the_coordinator_records_the_token_weighted_mean_of_the_reports_late_ones_too(make, tmp_path):
    coordinator, client = make()
    (_, a), (_, b), (_, c) = join(client), join(client), join(client)
    assert "val_loss" not in coordinator.history[0]  # the coordinator did not evaluate at start-up
    assert client.get("/v1/status", headers=a).json()["val_loss"] is None
    assert np.isnan(metric(client, "coop_val_loss"))  # nothing measured yet
    reply = report(client, a, 0, 4.0, 32)
    assert reply.status_code == 200 and reply.json() == {"accepted": True, "round": 0, "val_loss": 4.0, "reports": 1}
    assert report(client, b, 0, 3.0, 96).json()["val_loss"] == pytest.approx((4.0 * 32 + 3.0 * 96) / 128)
    close_round(coordinator, client, 0, a, b, c)  # c is slow to evaluate: it reports round 0's weights later
    assert "val_loss" not in coordinator.history[1]  # nor at the close of a round
    assert report(client, a, 1, 2.0, 128).status_code == 200  # the weights of round 1: round 0's record
    status = client.get("/v1/status", headers=a).json()
    assert status["history"][1]["val_loss"] == 2.0 and status["val_loss"] == {"round": 1, "loss": 2.0, "reports": 1}
    assert report(client, c, 0, 5.0, 128).status_code == 200  # late: the initial record is updated
    initial = (4.0 * 32 + 3.0 * 96 + 5.0 * 128) / 256
    assert coordinator.history[0]["val_loss"] == pytest.approx(initial) and coordinator.history[0]["val_tokens"] == 256
    assert metric(client, "coop_val_loss") == 2.0  # the newest weights' loss, not the late report's
    page = client.get("/").text
    assert "2.0000 (weights of round 1, 1 reports)" in page  # the card; the charts and the table follow the history
    # the reports after the last checkpoint (round 0's record, the late one) are in evals.json
    wait_for_file(tmp_path / "state" / "evals.json", lambda e: len(e.get("0", {})) == 3 and "1" in e)
    resumed, client2 = make(None, state_dir=tmp_path / "state")
    assert resumed.history[0]["val_loss"] == pytest.approx(initial) and resumed.history[1]["val_loss"] == 2.0
    assert metric(client2, "coop_val_loss") == 2.0
    assert report(client2, c, 0, 1.0, 128).status_code == 409  # a worker's report counts once, restart or not
    assert report(client2, b, 1, 3.0, 128).json()["val_loss"] == pytest.approx(2.5)


def test_the_final_weights_val_loss_is_recorded_and_persisted_after_the_run(make, tmp_path):
    coordinator, client = make(tiny(rounds={"max_rounds": 2, "eval_every": 2}))
    (_, a), (_, b) = join(client), join(client)
    close_round(coordinator, client, 0, a, b)
    close_round(coordinator, client, 1, a, b)
    assert coordinator.machine.done
    assert report(client, a, 1, 3.0, 64).status_code == 422  # eval_every 2: the weights of round 1 are not asked for
    assert report(client, a, 2, 3.0, 64).status_code == 200  # the final weights (round 2 = max_rounds)
    assert coordinator.history[-1]["outer_steps"] == 2 and coordinator.history[-1]["val_loss"] == 3.0
    wait_for_file(tmp_path / "state" / "evals.json", lambda e: "2" in e)  # no round close will write it now
    resumed, _ = make(None, state_dir=tmp_path / "state")
    assert resumed.history[-1]["val_loss"] == 3.0 and resumed.status()["val_loss"]["round"] == 2


def test_bad_eval_reports_are_refused_with_a_4xx_and_change_nothing(make):
    import copy
    coordinator, client = make()
    _, auth = join(client)
    schema = client.get("/openapi.json").json()["paths"]["/v1/rounds/{round_number}/eval"]["post"]["responses"]
    before = copy.deepcopy(coordinator.history)
    nan = b'{"loss": NaN, "tokens": 64}'
    cases = [
        ("no worker token", 0, {"loss": 3.0, "tokens": 64}, {}, 401),
        ("the run token", 0, {"loss": 3.0, "tokens": 64}, {"Authorization": "Bearer tok"}, 401),
        ("NaN", 0, nan, auth, 422),
        ("infinity", 0, b'{"loss": Infinity, "tokens": 64}', auth, 422),
        ("negative", 0, {"loss": -0.5, "tokens": 64}, auth, 422),
        ("huge", 0, {"loss": 1e30, "tokens": 64}, auth, 422),
        ("a string", 0, {"loss": "3.0", "tokens": 64}, auth, 422),
        ("no tokens", 0, {"loss": 3.0}, auth, 422),
        ("zero tokens", 0, {"loss": 3.0, "tokens": 0}, auth, 422),
        ("more tokens than an evaluation has", 0, {"loss": 3.0, "tokens": 129}, auth, 422),
        ("tokens as a bool", 0, {"loss": 3.0, "tokens": True}, auth, 422),
        ("an extra field", 0, {"loss": 3.0, "tokens": 64, "weight": 100}, auth, 422),
        ("no body", 0, b"", auth, 422),
        ("not JSON", 0, b"{loss", auth, 422),
        ("weights not served yet", 2, {"loss": 3.0, "tokens": 64}, auth, 409),
        ("a negative round", -1, {"loss": 3.0, "tokens": 64}, auth, 422),
    ]
    for what, round_number, body, headers, expected in cases:
        path = f"/v1/rounds/{round_number}/eval"
        if isinstance(body, bytes):
            response = client.post(path, content=body, headers={**headers, "Content-Type": "application/json"})
        else:
            response = client.post(path, json=body, headers=headers)
        assert response.status_code == expected, (what, response.status_code, response.text)
        assert str(expected) in schema and response.json()["detail"], what
        assert coordinator.history == before, what
    assert np.isnan(metric(client, "coop_val_loss"))
    assert report(client, auth, 0, 3.0, 64).status_code == 200
    assert report(client, auth, 0, 3.0, 64).json()["reason"] == "duplicate"
    assert coordinator.history[0]["val_reports"] == {"w0": [3.0, 64]}
    never, client2 = make(tiny(rounds={"eval_every": 0}), state_dir=coordinator.state_dir.parent / "other")
    _, auth2 = join(client2)
    assert report(client2, auth2, 0, 3.0, 64).status_code == 422  # this run does not evaluate


def test_the_compressed_downlink_sends_the_change_and_keeps_workers_on_the_coordinators_view(make):
    from coop.codec import decode
    config = tiny(compression={"codec": "int8", "downlink": "codec", "snapshot_every": 4}, rounds={"max_rounds": 6})
    coordinator, client = make(config)
    (_, a), (_, b) = join(client), join(client)
    held, _ = unpack(client.get("/v1/weights", headers=a).content)  # the join's full download
    rng = np.random.default_rng(0)
    for r in range(5):
        for headers in (a, b):  # a different update each, so the outer step is not a constant
            update = {k: rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in coordinator.weights.items()}
            encoded = get_codec("int8").encode(update)
            body = pack(encoded.tensors, {**encoded.metadata, "round": r, "tokens": 32, "loss": 2.5})
            assert client.put(f"/v1/rounds/{r}/update", content=body, headers=headers).status_code == 200
        assert client.get(f"/v1/rounds/{r}/wait", params={"timeout_s": 5}, headers=a).json()["closed"]
        full = client.get("/v1/weights", headers=a)
        change = client.get("/v1/weights", params={"since": r}, headers=a)
        view, _ = unpack(full.content)
        if (r + 1) % 4 == 0:  # a snapshot round: the exact weights, for everyone
            assert "X-Coop-Since" not in change.headers
            for k in view:
                np.testing.assert_array_equal(view[k], coordinator.weights[k])
        else:
            # int8 is ~3.9x smaller than fp32; in this tiny model the header (~3.5 kB of metadata) weighs too
            assert change.headers["X-Coop-Since"] == str(r) and len(change.content) * 2 < len(full.content)
            tensors, meta = unpack(change.content)
            decoded = decode(tensors, meta, {k: v.shape for k, v in held.items()})
            for k in view:  # the worker's sum is the coordinator's view, bit for bit
                np.testing.assert_array_equal(held[k] + decoded[k], view[k], err_msg=k)
                step = np.abs(coordinator.weights[k] - held[k]).max()
                assert np.abs(view[k] - coordinator.weights[k]).max() <= step / 100 + 1e-7, k  # int8's bound
        held = view
        # an old or unknown `since` gets the full weights
        assert "X-Coop-Since" not in client.get("/v1/weights", params={"since": max(r - 1, 0) - 5},
                                                headers=a).headers


def test_the_weights_are_views_of_the_served_body_and_a_close_never_changes_a_served_body(make):
    coordinator, client = make()
    (_, a), (_, b) = join(client), join(client)
    served = client.get("/v1/weights", headers=a).content
    body = coordinator.weights_body
    assert bytes(body) == served
    k = next(iter(coordinator.weights))
    assert np.shares_memory(coordinator.weights[k], np.frombuffer(body, np.uint8))  # one copy of the model
    for auth, value in ((a, 0.01), (b, 0.03)):
        assert client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, value), headers=auth).status_code == 200
    assert client.get("/v1/rounds/0/wait", params={"timeout_s": 5}, headers=a).json()["closed"]
    assert bytes(body) == served  # a download still reading round 0's body gets round 0's weights
    tensors, meta = unpack(client.get("/v1/weights", headers=a).content)
    assert meta["round"] == 1 and np.array_equal(tensors[k], coordinator.weights[k])
    assert not np.array_equal(tensors[k], unpack(served)[0][k])
