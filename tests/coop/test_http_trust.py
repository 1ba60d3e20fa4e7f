"""Hardened HTTP surfaces, in-process: nested JSON, the worker's cache paths, the join cap, pruning
and rate limit, private state files, aborted uploads. (Real servers: tests/e2e/test_http_hostile.py.)"""
from __future__ import annotations

import json
import stat
import struct

import numpy as np
import pytest
from starlette.requests import ClientDisconnect

import coop.coordinator.app as app_module
from coop.coordinator.members import JoinRateLimiter, Members
from coop.coordinator.worker import WorkerError, shard_cache_path
from coop.wire import MAX_JSON_DEPTH, WireError, json_depth, pack, parse_json, unpack

from test_coordinator_app import join, make, tiny, update_body  # noqa: F401 (make: the fixture)


def nested_header_body(depth: int) -> bytes:
    header = b"[" * depth
    return struct.pack("<Q", len(header)) + header


def nested_metadata_body(depth: int) -> bytes:
    header = json.dumps({"__metadata__": {"json": "[" * depth + "]" * depth}}).encode()
    return struct.pack("<Q", len(header)) + header


# -- JSON with a depth limit ----------------------------------------------------------------------
@pytest.mark.parametrize("text, depth", [(b"1", 0), (b'"[[["', 0), (b"[]", 1), (b'{"a": [[1], {"b": "]]"}]}', 3),
                                          (rb'["\\", [2]]', 2), (rb'["\"[[", []]', 2), (b"", 0)])
def test_json_depth_skips_brackets_inside_strings(text, depth):
    assert json_depth(text) == depth


def test_deeply_nested_header_and_metadata_are_wire_errors_not_recursion_errors():
    for body in (nested_header_body(100_000), nested_metadata_body(100_000)):
        with pytest.raises(WireError, match="nests 100000 levels deep"):
            unpack(body)
    with pytest.raises(WireError, match="limit is 10"):
        parse_json(b"[" * 11 + b"]" * 11, 1000, max_depth=10)
    with pytest.raises(WireError, match="bytes, the limit is 4"):
        parse_json(b"[1,2]", 4)
    ok = pack({"a": np.ones(2, np.float32)}, {"deep": json.loads("[" * 40 + "]" * 40)})
    assert unpack(ok)[1]["deep"] is not None and MAX_JSON_DEPTH >= 42


def test_nested_update_bodies_get_400_and_change_nothing(make):
    coordinator, client = make()
    _, auth = join(client)
    for body in (nested_header_body(100_000), nested_metadata_body(50_000)):  # within the body limit
        response = client.put("/v1/rounds/0/update", content=body, headers=auth)
        assert response.status_code == 400, response.text
        assert "levels deep" in response.json()["detail"]
    assert coordinator.machine.round.reports == {} and coordinator.totals["updates_rejected"] == 2


# -- the worker's cache path -------------------------------------------------------------------------
@pytest.mark.parametrize("data_id", ["/../../outside/x", "../x", "a/b", "..", ".hidden", "a\\b", "", "x" * 200, 7, None,
                                     "a\x00b", "C:evil"])
def test_the_worker_refuses_names_that_would_leave_its_cache_dir(tmp_path, data_id):
    with pytest.raises(WorkerError):
        shard_cache_path(tmp_path, {"data_id": data_id, "shard": {"index": 0, "count": 2}})


@pytest.mark.parametrize("shard", [{"index": -1, "count": 2}, {"index": 2, "count": 2}, {"index": "0", "count": 2},
                                   {"index": True, "count": 2}, {"index": 0}, None])
def test_the_worker_refuses_bad_shard_numbers(tmp_path, shard):
    with pytest.raises(WorkerError):
        shard_cache_path(tmp_path, {"data_id": "abc", "shard": shard})


def test_a_good_cache_path_stays_in_the_cache_dir(tmp_path):
    path = shard_cache_path(tmp_path, {"data_id": "0123abcdef", "shard": {"index": 1, "count": 4}})
    assert path == tmp_path.resolve() / "shard-0123abcdef-1of4.safetensors"


# -- joins: cap, pruning, rate ---------------------------------------------------------------------------
def test_prune_forgets_gone_workers_that_never_contributed():
    members = Members(2)
    records = [members.join(f"w{i}", "cpu", now=0.0, round_number=0)[0] for i in range(4)]
    records[0].rounds = 3  # contributed: kept while there is room
    records[1].last_seen = 100.0  # still active at now=105
    records[2].last_seen = 100.0
    assert sorted(members.prune(105.0, timeout_s=10.0, keep={records[2].id})) == [records[3].id]
    assert set(members.workers) == {records[0].id, records[1].id, records[2].id}
    assert members.prune(105.0, timeout_s=10.0, room_for=2) == [records[0].id]  # the longest unseen, to make room


def test_the_join_rate_limiter_is_a_token_bucket_per_address():
    limiter = JoinRateLimiter(per_minute=3)
    assert [limiter.retry_after("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.retry_after("a", 0.0)
    assert wait == pytest.approx(20.0)  # one join per 20 s
    assert limiter.retry_after("b", 0.0) == 0.0  # another address has its own bucket
    assert limiter.retry_after("a", 20.0) == 0.0
    small = JoinRateLimiter(per_minute=60, max_clients=10)
    for i in range(50):
        small.retry_after(str(i), 0.0)
    assert len(small.buckets) <= 10


def test_joins_are_capped_over_all_records_and_rate_limited(make):
    coordinator, client = make(tiny(coordinator={"max_workers": 3, "joins_per_minute": 5}))
    for i in range(3):
        join(client, name=f"w{i}")
    full = client.post("/v1/join", json={}, headers={"Authorization": "Bearer tok"})
    assert full.status_code == 503 and "Retry-After" in full.headers
    for record in coordinator.members.workers.values():
        record.left = True  # gone and never contributed: pruned to make room
    info, _ = join(client, name="w3")
    assert set(coordinator.members.workers) == {info["worker_id"]}
    limited = client.post("/v1/join", json={}, headers={"Authorization": "Bearer tok"})
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
    wrong = client.post("/v1/join", json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 429  # the rate limit is checked first: guessing tokens is limited too


def test_members_json_is_written_by_the_ticker_not_by_every_join(make, tmp_path):
    coordinator, client = make(tiny(coordinator={"joins_per_minute": 1000}))
    writes = []
    real = coordinator.flush_members

    def counting():
        if coordinator._members_dirty:
            writes.append(1)
        real()

    coordinator.flush_members = counting
    for i in range(20):
        join(client, name=f"w{i}")
    coordinator.flush_members = real
    coordinator.flush_members()
    saved = json.loads((tmp_path / "state" / "members.json").read_text())
    assert len(saved["workers"]) == 20 and len(writes) < 20


# -- private state -----------------------------------------------------------------------------------------
def test_state_files_are_private(make, tmp_path):
    coordinator, client = make()
    join(client)
    coordinator.flush_members()
    state = tmp_path / "state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "members.json" for p in files) and any(p.suffix == ".safetensors" for p in files)
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (p for p in state.rglob("*") if p.is_dir()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path


# -- aborted uploads ------------------------------------------------------------------------------------------
def test_an_aborted_upload_is_counted_as_rejected_with_one_log_line(make, caplog, monkeypatch):
    coordinator, client = make()
    info, auth = join(client)

    async def disconnected(request, limit, *where):  # what starlette raises when the client goes away midway
        raise ClientDisconnect()

    monkeypatch.setattr(app_module, "_read_body", disconnected)
    with caplog.at_level("WARNING", logger="coop.coordinator"):
        response = client.put("/v1/rounds/0/update", content=update_body(coordinator, 0), headers=auth)
    assert response.status_code == 400
    assert coordinator.totals["updates_rejected"] == 1 and coordinator.machine.round.reports == {}
    assert 'coop_updates_total{result="aborted"} 1.0' in client.get("/metrics").text
    lines = [r for r in caplog.records if "aborted" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert info["worker_id"] not in coordinator.uploading  # the worker may upload again


# -- a full spool disk ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["receiving", "keeping"])
def test_a_full_spool_disk_is_a_503_to_retry_and_changes_nothing(make, monkeypatch, where):
    from coop.spool import Spool, SpooledBody

    # everything through the spool; int8, whose decoded update is written there (an fp32 one stays in its body's file)
    coordinator, client = make(tiny(coordinator={"ram_for_updates_mb": 0}, compression={"codec": "int8"}))
    _, auth = join(client)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SpooledBody if where == "receiving" else Spool, "write", full)
    response = client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, codec="int8"), headers=auth)
    assert response.status_code == 503 and "No space left on device" in response.json()["detail"]
    assert response.headers["Retry-After"] == "10"  # the worker's client retries a 503
    assert coordinator.machine.round.reports == {} and coordinator.aggregator.count == 0
    monkeypatch.undo()
    assert client.put("/v1/rounds/0/update", content=update_body(coordinator, 0, codec="int8"),
                      headers=auth).status_code == 200


@pytest.mark.parametrize("budget_mb", [None, 0])
def test_a_body_without_content_length_is_read_in_ram_or_spooled(make, budget_mb):
    coordinator, client = make(tiny(coordinator={"ram_for_updates_mb": budget_mb}))
    _, auth = join(client)
    body = update_body(coordinator, 0)
    chunks = (body[i : i + 1000] for i in range(0, len(body), 1000))  # chunked transfer: no Content-Length
    response = client.put("/v1/rounds/0/update", content=chunks, headers=auth)
    assert response.status_code == 200, response.text
    # with no declared size it went through the spool, and an fp32 update stays in its body's file
    assert coordinator.budget.used == 0 and coordinator.aggregator.count == 1
    response = client.post("/v1/heartbeat", content=(part for part in (b"{", b"}")), headers=auth)  # JSON, chunked
    assert response.status_code == 200, response.text
