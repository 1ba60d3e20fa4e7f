"""`coop-worker join --cpu-ranks 2` against a real coordinator: one worker whose replica trains
data parallel on two real rank processes (the "cpu" process group standing in for two GPUs).
Its updates count both ranks' tokens; a rank killed for real ends that worker with a clear error
and the coordinator carries on with the others."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
from conftest import Coordinator, Worker, run_config, wait_until

K, B, T = 4, 8, 32  # TINY_RUN's inner steps, batch size, block size


@pytest.mark.parametrize("overlap", [0, 1])
def test_a_two_rank_worker_trains_and_counts_both_ranks_tokens(tmp_path, procs, overlap):
    # with overlap, the eager step moves rank 0's weights before the steps beside the merge: the
    # other rank is sent them (a command its loop must take there, or the pair would hang)
    config = run_config(rounds={"max_rounds": 3, "eval_every": 0}, outer={"overlap_steps": overlap})
    coordinator = procs(Coordinator(tmp_path, config))
    worker = procs(Worker(tmp_path, coordinator, "pair", "--cpu-ranks", "2"))
    status = coordinator.wait_status(lambda s: s["done"], 180, "the run to finish", [worker.log])
    assert worker.wait(60) == 0, worker.output()[-3000:]
    assert "started 2 ranks on the CPU" in worker.output() and "done: 3 rounds contributed" in worker.output()
    assert ("from the eager outer step" in worker.output()) == bool(overlap)
    record = next(w for w in status["workers"] if w["name"] == "pair")
    assert record["device"] == "cpu x2"
    rounds = [h for h in status["history"] if h.get("round") is not None]
    assert [h["tokens"] for h in rounds] == [2 * K * B * T] * 3, rounds


def test_a_killed_rank_ends_its_worker_and_the_run_goes_on(tmp_path, procs):
    # Enough rounds that neither worker can finish the run before the other joins: the pair (two
    # rank processes) starts first, and the solo worker only once the pair is in.
    config = run_config(rounds={"max_rounds": 60, "eval_every": 0}, inner={"steps": 20},
                        coordinator={"min_deadline_s": 4.0, "max_deadline_s": 6.0, "worker_timeout_s": 4.0})
    coordinator = procs(Coordinator(tmp_path, config))
    pair = procs(Worker(tmp_path, coordinator, "pair", "--cpu-ranks", "2"))
    coordinator.wait_status(lambda s: any(w["name"] == "pair" for w in s["workers"]), 120,
                            "the pair to join", [pair.log])
    solo = procs(Worker(tmp_path, coordinator, "solo"))
    coordinator.wait_status(lambda s: s["active_workers"] == 2 and any(
        h.get("contributors") == 2 for h in s["history"]), 120,
                            "round 2 with both workers", [pair.log, solo.log])
    pids = wait_until(lambda: re.search(r"pids (\d+), (\d+)", pair.output()), 10, "the ranks' pids", [pair.log])
    os.kill(int(pids.group(2)), signal.SIGKILL)  # rank 1 of the pair
    killed = time.monotonic()
    code = pair.wait(90)
    assert time.monotonic() - killed < 60
    assert code == 1, pair.output()[-3000:]
    assert "rank 1 was killed by SIGKILL" in pair.output()
    status = coordinator.wait_status(lambda s: s["done"], 180, "the run to finish without the pair", [solo.log])
    assert solo.wait(60) == 0, solo.output()[-3000:]
    # it left (rank 0 went through the worker's leave path): inactive, or forgotten if none of its updates counted
    record = next((w for w in status["workers"] if w["name"] == "pair"), {"active": False})
    assert not record["active"], record
    assert status["history"][-1]["contributors"] == 1


SWARM_CONFIG = """
seed = 3
[model]
n_layer = 1
n_head = 2
n_embd = 32
block_size = 32
[data]
default_chars = 60000
[inner]
steps = 4
batch_size = 8
[rounds]
max_rounds = 3
eval_every = 3
eval_batches = 2
[gossip]
group_size = 2
heartbeat_s = 0.5
"""


def test_a_two_rank_peer_trains_its_swarm_and_a_plain_peer_joins_it(tmp_path):
    from p2p_helpers import PeerProcess, wait_until as wait_peers  # (the p2p tests' peer processes)
    (tmp_path / "run.toml").write_text(SWARM_CONFIG)
    first = PeerProcess("pair", ["start", "--config", str(tmp_path / "run.toml"), "--wait-peers", "2",
                                 "--cpu-ranks", "2", "--linger", "60"], tmp_path, "tok")
    try:
        wait_peers(first.status, 120, "the two-rank peer to serve", [first])
        second = PeerProcess("solo", ["join", first.url, "--linger", "60"], tmp_path, "tok")
        try:
            done = wait_peers(lambda: (s := first.status()) and s["phase"] == "done" and s, 240,
                              "the swarm to finish its 3 rounds", [first, second])
            assert done["round"] == 3 and done["val_loss"] is not None, done
            assert "started 2 ranks on the CPU" in first.log_path.read_text()
        finally:
            second.stop()
    finally:
        first.stop()
