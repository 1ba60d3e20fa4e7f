"""coop.spool: a round's updates on disk. Spooled, every robust rule gives bit for bit what it gives
in memory; the files hold exactly the vectors, read back from any range; they leave nothing on disk
once the round is reset; a memory budget decides what stays in RAM; and a coordinator round that
goes through the disk gives what the round in RAM gives."""
from __future__ import annotations

import os

import numpy as np
import pytest

from coop import robust
from coop.diloco import RULES, Aggregator
from coop.spool import Spool

SHAPES = {"wte": (300, 64), "ln.w": (64,), "proj": (64, 97)}   # 25_472 coordinates: chunks of 4096 do not divide it


def updates(n, seed=0):
    rng = np.random.default_rng(seed)
    common = {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}  # what the replicas agree on
    out = [{name: (c + rng.standard_normal(c.shape)).astype(np.float32) for name, c in common.items()} for _ in range(n)]
    out[1] = {name: -3 * a for name, a in out[1].items()}  # one that points away: filtered_mean leaves it out
    return out


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_gives_the_same_bits_spooled_as_in_memory(tmp_path, rule, monkeypatch):
    monkeypatch.setattr(robust, "CHUNK", 4096)  # several chunks, the last one short
    monkeypatch.setattr(robust, "NATIVE_CHUNK", 4096)  # the same for the native kernels (coop.robust)
    results = []
    for spool in (None, Spool(tmp_path / "spool")):
        aggregator = Aggregator(SHAPES, rule=rule, spool=spool)
        for i, update in enumerate(updates(6)):
            aggregator.add(update, weight=1.0 + i)
        results.append((aggregator.result(), aggregator.left_out, aggregator.clip_bound))
    (in_memory, left_in_memory, bound_in_memory), (spooled, left_spooled, bound_spooled) = results
    assert left_spooled == left_in_memory and bound_spooled == bound_in_memory
    if rule == "filtered_mean":
        assert left_spooled == [1]
    for name in SHAPES:
        np.testing.assert_array_equal(spooled[name], in_memory[name], err_msg=f"{rule}: {name}")


def test_a_spooled_vector_holds_the_tensors_in_order_and_reads_any_range(tmp_path):
    spool = Spool(tmp_path)
    tensors = [np.arange(10, dtype=np.float32).reshape(2, 5), np.float64(7.5) * np.ones(3), np.array([], np.float32)]
    vector = spool.write(tensors)
    whole = np.concatenate([np.asarray(t, np.float32).reshape(-1) for t in tensors])
    assert vector.size == 13
    np.testing.assert_array_equal(vector.load(), whole)
    np.testing.assert_array_equal(vector[3:11], whole[3:11])
    out = np.empty(4, np.float32)
    np.testing.assert_array_equal(vector.read_into(9, out), whole[9:13])
    with pytest.raises(ValueError, match="read of 4 float32 at 10"):
        vector.read_into(10, out)
    with pytest.raises(ValueError):
        vector.read_into(0, np.empty(4, np.float64))
    with pytest.raises(IndexError):
        vector[::2]


def test_the_files_have_no_name_and_their_space_comes_back_at_the_reset(tmp_path):
    spool_dir = tmp_path / "spool"
    aggregator = Aggregator(SHAPES, rule="median", spool=Spool(spool_dir))
    for update in updates(4):
        aggregator.add(update)
    assert os.listdir(spool_dir) == []  # unnamed (O_TMPFILE): a crash leaves nothing behind
    fds = [values._file.fileno() for values, _ in aggregator._kept]
    assert all(os.fstat(fd).st_size == 4 * 25_472 for fd in fds)
    aggregator.result()
    aggregator.reset()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed: the space is free


def test_a_write_that_fails_leaves_no_file_open(tmp_path, monkeypatch):
    spool = Spool(tmp_path)
    opened = []
    real = os.write

    def full_disk(fd, data):
        opened.append(fd)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        spool.write([np.ones(10, np.float32)])
    monkeypatch.setattr(os, "write", real)
    with pytest.raises(OSError):
        os.fstat(opened[0])


def test_the_coordinator_budget_is_half_the_available_memory_unless_given(tmp_path):
    from coop.coordinator.service import Coordinator
    from coop.runconfig import parse_run_config
    from coop.spool import available_memory

    raw = {"model": {"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 8},
           "data": {"default_chars": 20_000, "shards": 2}, "rounds": {"eval_every": 0}}
    default = Coordinator(parse_run_config(raw), tmp_path / "a")
    assert default.aggregator.spool.directory == tmp_path / "a" / "spool"
    assert default.budget.limit == pytest.approx(available_memory() // 2, rel=0.2)
    raw["coordinator"] = {"ram_for_updates_mb": 5}
    assert Coordinator(parse_run_config(raw), tmp_path / "b").aggregator.budget.limit == 5_000_000
    raw["coordinator"] = {"aggregation": "mean"}
    assert Coordinator(parse_run_config(raw), tmp_path / "c").aggregator.spool is None  # streamed: nothing kept


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("spooled", [False, True])
def test_every_rule_computes_into_a_given_buffer_what_it_returns_otherwise(tmp_path, rule, spooled):
    aggregator = Aggregator(SHAPES, rule=rule, spool=Spool(tmp_path) if spooled else None)
    for i, update in enumerate(updates(5, seed=1)):
        aggregator.add(update, weight=2.0 + i)
    expected = aggregator.result()
    out = np.full(25_472, np.nan, np.float32)
    into = aggregator.result(out=out)
    for name in SHAPES:
        np.testing.assert_array_equal(into[name], expected[name])
        assert np.shares_memory(into[name], out)
    assert np.isfinite(out).all()  # every coordinate written
    with pytest.raises(ValueError, match="writable flat float32 array of 25472"):
        aggregator.result(out=np.empty(25_472, np.float64))


def test_the_updates_that_fit_the_budget_stay_in_ram_and_the_rest_is_spooled(tmp_path):
    from coop.spool import MemoryBudget, SpooledVector

    one = 4 * 25_472
    budget = MemoryBudget(2 * one + 100)
    aggregator = Aggregator(SHAPES, rule="filtered_mean", spool=Spool(tmp_path), budget=budget)
    reference = Aggregator(SHAPES, rule="filtered_mean")
    for round_number in range(2):  # the reset gives the budget back
        for i, update in enumerate(updates(5, seed=round_number)):
            aggregator.add(update, weight=1.0 + i)
            reference.add(update, weight=1.0 + i)
        kinds = [isinstance(values, SpooledVector) for values, _ in aggregator._kept]
        assert kinds == [False, False, True, True, True] and budget.used == 2 * one
        for name, value in aggregator.result().items():
            np.testing.assert_array_equal(value, reference.result()[name])
        aggregator.reset()
        reference.reset()
        assert budget.used == 0


def test_a_memory_budget_counts_reservations_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    from coop.spool import MemoryBudget

    budget = MemoryBudget(1000)
    with ThreadPoolExecutor(8) as pool:
        granted = list(pool.map(lambda _: budget.reserve(7), range(1000)))
    assert sum(granted) == 142 and budget.used == 994
    budget.release(994)
    assert budget.used == 0 and MemoryBudget(None).reserve(10**15)


@pytest.mark.parametrize("rule", ["filtered_mean", "mean"])
def test_coordinator_rounds_with_every_update_spooled_equal_the_rounds_in_ram(tmp_path, rule):
    """Two rounds (the streamed mean's sums go into the next round's weights buffer, which the
    close then serves: the second round's into another), bit for bit the same spooled as in RAM,
    and the weights served are those the coordinator holds."""
    from fastapi.testclient import TestClient

    from coop.coordinator.app import create_app
    from coop.coordinator.service import Coordinator
    from coop.runconfig import parse_run_config
    from coop.wire import pack, unpack

    weights = []
    for where, options in (("ram", {}), ("disk", {"ram_for_updates_mb": 0})):
        raw = {"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
               "data": {"default_chars": 60_000, "shards": 4}, "rounds": {"eval_every": 0},
               "coordinator": {"min_workers": 4, "quorum_fraction": 1.0, "aggregation": rule, **options}}
        coordinator = Coordinator(parse_run_config(raw), tmp_path / where, "tok")
        assert coordinator.budget.limit == 0 if where == "disk" else coordinator.budget.limit > 10**8
        with TestClient(create_app(coordinator)) as client:
            rng = np.random.default_rng(0)
            tokens = [client.post("/v1/join", json={"name": f"w{i}"}, headers={"Authorization": "Bearer tok"}
                                  ).json()["worker_token"] for i in range(4)]
            for round_number in range(2):
                common = {k: rng.standard_normal(v.shape) * 1e-2 for k, v in coordinator.weights.items()}
                for token in tokens:
                    update = {k: (c + 1e-3 * rng.standard_normal(c.shape)).astype(np.float32) for k, c in common.items()}
                    body = pack(update, {"codec": "fp32", "options": {}, "round": round_number, "tokens": 64,
                                         "shapes": {k: list(v.shape) for k, v in update.items()}})
                    response = client.put(f"/v1/rounds/{round_number}/update", content=body,
                                          headers={"Authorization": f"Bearer {token}"})
                    assert response.status_code == 200, response.text
                assert client.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 10},
                                  headers={"Authorization": f"Bearer {token}"}).json()["closed"]
                served, meta = unpack(client.get("/v1/weights", headers={"Authorization": f"Bearer {token}"}).content)
                assert meta["round"] == round_number + 1
                for name, array in coordinator.weights.items():
                    np.testing.assert_array_equal(served[name], array)
            weights.append({k: v.copy() for k, v in coordinator.weights.items()})
            assert coordinator.budget.used == 0  # every body's and kept update's reservation given back
    for name in weights[0]:
        np.testing.assert_array_equal(weights[1][name], weights[0][name])


def _bad_fp32_bodies(weights: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Malformed or hostile fp32 uploads for round 0, one of each kind the checks refuse."""
    import json
    import struct

    from coop.wire import pack

    good = {k: np.full(v.shape, 1e-3, np.float32) for k, v in weights.items()}
    shapes = {k: list(v.shape) for k, v in good.items()}
    meta = {"codec": "fp32", "options": {}, "shapes": shapes, "round": 0, "tokens": 64}
    first = next(iter(good))

    def body(tensors=good, **changes):
        return pack(tensors, {**meta, **changes})

    header = json.dumps({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return {
        "truncated": body()[:-12],
        "header longer than the body": struct.pack("<Q", 10**6) + b"{}",
        "not safetensors": b"\x00" * 64,
        "offsets past the data": struct.pack("<Q", len(header)) + header,
        "wrong round": body(round=3),
        "other codec": body(codec="int8"),
        "too many tokens": body(tokens=10**9),
        "loss not a number": body(loss="low"),
        "bad codec options": body(options={"ratio": 0.1}),
        "a tensor missing": body({k: v for k, v in good.items() if k != first}),
        "an extra tensor": body({**good, "extra": np.zeros(3, np.float32)}, shapes={**shapes, "extra": [3]}),
        "a wrong shape": body({**good, first: np.zeros((2, 2), np.float32)}, shapes={**shapes, first: [2, 2]}),
        "recorded shapes lie": body(shapes={**shapes, first: [1]}),
        "float16": body({**good, first: good[first].astype(np.float16)}),
        "NaN": body({**good, first: np.where(np.arange(good[first].size).reshape(good[first].shape) == 3, np.nan,
                                               good[first]).astype(np.float32)}),
        "huge values": body({**good, first: np.full(good[first].shape, 1e7, np.float32)}),
    }


def test_an_fp32_upload_checked_in_its_spool_file_is_refused_as_it_is_in_ram(tmp_path):
    """The same statuses and messages from the chunked check of a spooled fp32 body as from the
    whole body in memory, and nothing counted."""
    from fastapi.testclient import TestClient

    from coop.coordinator.app import create_app
    from coop.coordinator.service import Coordinator
    from coop.runconfig import parse_run_config

    answers = {}
    for where, options in (("ram", {}), ("disk", {"ram_for_updates_mb": 0})):
        raw = {"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16},
               "data": {"default_chars": 60_000, "shards": 2}, "rounds": {"eval_every": 0},
               "coordinator": {"min_workers": 2, **options}}
        coordinator = Coordinator(parse_run_config(raw), tmp_path / where, "tok")
        with TestClient(create_app(coordinator)) as client:
            info = client.post("/v1/join", json={"name": "w"}, headers={"Authorization": "Bearer tok"}).json()
            auth = {"Authorization": f"Bearer {info['worker_token']}"}
            for case, body in _bad_fp32_bodies(coordinator.weights).items():
                response = client.put("/v1/rounds/0/update", content=body, headers=auth)
                answers.setdefault(case, []).append((response.status_code, response.json().get("detail", "")))
            assert coordinator.aggregator.count == 0 and coordinator.machine.round.reports == {}
            assert coordinator.budget.used == 0
    for case, (in_ram, on_disk) in answers.items():
        assert in_ram[0] in (400, 413, 422), (case, in_ram)
        assert on_disk[0] == in_ram[0], (case, in_ram, on_disk)
        if case != "NaN":  # (in RAM it also counts them)
            assert on_disk[1] == in_ram[1], (case, in_ram, on_disk)


def test_a_vector_in_segments_of_a_body_reads_any_range_across_them(tmp_path):
    body = Spool(tmp_path).body()
    data = np.arange(20, dtype=np.float32)
    body.write(b"headerXY" + data.tobytes())  # the vector is [12:20] then [0:12] of the data
    vector = body.as_vector([(0, 8 + 4 * 12, 8), (8, 8, 12)], 20)
    body.close()  # the file is the vector's now
    expected = np.concatenate([data[12:], data[:12]])
    for start in range(20):
        for stop in range(start, 21):
            np.testing.assert_array_equal(vector[start:stop], expected[start:stop])
    vector.close()
