"""engine.distributed without a GPU: the store (for real, on 127.0.0.1), the "cpu" backend's
collectives between 3 real processes, and the error paths: a timeout, a bad token, a rank killed
for real, the store's host gone. The "nccl" backend's tests are in tests/cuda/test_distributed_nccl.py."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import engine
import engine.distributed as dist
from engine.distributed import DistributedError, DistributedTimeoutError, RankDiedError, TCPStore

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def store():
    s = TCPStore("127.0.0.1", 0, "secret", is_server=True, timeout=10.0)
    yield s
    s.close()


def client(store: TCPStore, **kwargs) -> TCPStore:
    return TCPStore("127.0.0.1", store.port, "secret", **kwargs)


def test_store_set_get_add_delete(store):
    c = client(store)
    c.set("a", b"\x00\x01binary")
    assert store.get("a") == b"\x00\x01binary"
    assert c.add("n", 2) == 2 and store.add("n", 3) == 5
    c.delete("a")
    with pytest.raises(DistributedTimeoutError, match="waited 0.2 s for 'a'"):
        c.get("a", timeout=0.2)
    c.close()


def test_store_get_waits_for_a_later_set(store):
    c = client(store)
    threading.Timer(0.2, lambda: store.set("late", b"x")).start()
    started = time.monotonic()
    assert c.get("late", timeout=5.0) == b"x"
    assert time.monotonic() - started >= 0.15
    c.close()


def test_store_refuses_a_wrong_token(store):
    with pytest.raises(DistributedError, match="bad token"):
        TCPStore("127.0.0.1", store.port, "not-the-token")


def test_store_client_without_server_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    with pytest.raises(DistributedError, match="cannot reach the store"):
        TCPStore("127.0.0.1", port, "t", connect_timeout=0.3)


def test_a_registered_client_that_disconnects_is_dead_and_wakes_waiters(store):
    waiter = client(store)
    waiter.register(0)
    doomed = client(store)
    doomed.register(1)
    errors = []

    def wait():
        try:
            waiter.get("never-set", timeout=30.0)
        except DistributedError as error:
            errors.append(error)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    started = time.monotonic()
    doomed._sock.close()  # as if the process died: no leave()
    thread.join(10)
    assert errors and isinstance(errors[0], RankDiedError), errors
    assert time.monotonic() - started < 5, "a dead rank must wake the waiters at once, not at the timeout"
    assert errors[0].dead.keys() == {1} and "rank 1" in str(errors[0])
    assert store.dead_ranks().keys() == {1}


def test_a_rank_that_leaves_cleanly_is_not_dead(store):
    c = client(store)
    c.register(3)
    c.leave()
    c.close()
    time.sleep(0.2)
    assert store.dead_ranks() == {}


def test_losing_the_store_host_is_a_clear_error():
    host = TCPStore("127.0.0.1", 0, "t", is_server=True)
    c = TCPStore("127.0.0.1", host.port, "t")
    c.set("k", b"v")
    host.close()
    with pytest.raises(DistributedError, match="lost the store|cannot reach"):
        for _ in range(50):  # the server's handler thread may take a moment to drop the connection
            c.get("k", timeout=0.1)
            time.sleep(0.05)


def run_ranks(script: str, world: int, *extra: str, timeout: float = 120.0, tmp_path=None) -> list:
    store = TCPStore("127.0.0.1", 0, "tok", is_server=True)
    try:
        outs = [str(tmp_path / f"rank{r}.json") for r in range(world)]
        procs = [subprocess.Popen([sys.executable, os.path.join(HERE, script), str(r), str(world), str(store.port),
                                   "tok", outs[r], *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(world)]
        results = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, out, err, outs[r]) for r, (p, (out, err)) in enumerate(zip(procs, results))]
    finally:
        store.close()


def test_cpu_collectives_between_three_processes(tmp_path):
    ranks = run_ranks("dist_rank.py", 3, tmp_path=tmp_path)
    for code, _, err, _ in ranks:
        assert code == 0, err
    results = [json.load(open(path)) for *_, path in ranks]
    xs = np.array([r["x"] for r in results], dtype=np.float32)
    expected_sum = xs[0] + xs[1] + xs[2]  # rank order, in float32: what every rank computes
    for r in results:
        assert r["world"] == 3 and r["backend"] == "cpu"
        np.testing.assert_array_equal(np.array(r["sum"], dtype=np.float32), expected_sum)
        np.testing.assert_allclose(r["avg"], expected_sum / 3, rtol=1e-6)
        np.testing.assert_array_equal(r["max"], xs.max(axis=0))
        np.testing.assert_array_equal(r["min"], xs.min(axis=0))
        assert r["int_sum"] == [0, 6, 12, 18, 24]
        assert r["broadcast"] == [[2.0] * 3] * 2
    for key in ("sum", "avg"):  # bit-identical on every rank: replicas stay equal
        assert results[0][key] == results[1][key] == results[2][key]


def test_world_size_one_group_in_process(store):
    group = dist.init_process_group("cpu", 0, 1, client(store))
    try:
        t = engine.tensor([1.0, 2.0])
        dist.all_reduce(t, "avg")
        assert t.tolist() == [1.0, 2.0]
        with pytest.raises(DistributedError, match="already initialised"):
            dist.init_process_group("cpu", 0, 1, store)
        with pytest.raises(ValueError, match="op must be one of"):
            dist.all_reduce(t, "mean")
        with pytest.raises(TypeError, match="engine Tensor"):
            dist.all_reduce(np.zeros(2))
        assert group.rank == 0 and dist.is_initialized()
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized() and dist.get_world_size() == 1
    with pytest.raises(DistributedError, match="init_process_group"):
        dist.all_reduce(engine.tensor([1.0]))


def test_bad_backend_and_rank_are_refused(store):
    with pytest.raises(ValueError, match="backend must be one of"):
        dist.init_process_group("gloo", 0, 1, store)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        dist.init_process_group("cpu", 2, 2, store)
    assert not dist.is_initialized()


def test_nccl_availability_is_reported():
    assert isinstance(dist.is_nccl_available(), bool)
    if not dist.is_nccl_available():
        assert dist.nccl_unavailable_reason()
        with pytest.raises(DistributedError, match="nccl"):
            dist.init_process_group("nccl", 0, 1, TCPStore("127.0.0.1", 0, "t", is_server=True))
        assert not dist.is_initialized()


def test_collective_times_out_when_a_rank_never_calls(tmp_path):
    host = TCPStore("127.0.0.1", 0, "tok", is_server=True)
    try:
        # rank 1 joins and then waits, never calling the collective: rank 0's all_reduce times out
        idle = subprocess.Popen([sys.executable, "-c", (
            "import time, engine.distributed as d; s = d.TCPStore('127.0.0.1', %d, 'tok'); "
            "d.init_process_group('cpu', 1, 2, s); time.sleep(30)") % host.port])
        dist.init_process_group("cpu", 0, 2, TCPStore("127.0.0.1", host.port, "tok"), timeout=1.0)
        started = time.monotonic()
        with pytest.raises(DistributedTimeoutError, match="waited 1 s"):
            dist.all_reduce(engine.tensor([1.0]))
        assert time.monotonic() - started < 10
    finally:
        dist.destroy_process_group()
        idle.kill()
        idle.wait()
        host.close()
