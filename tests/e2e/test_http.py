"""HTTP mode end to end: a real coordinator process, real worker processes (or light clients in
threads that send real encoded updates), on 127.0.0.1, killed and restarted for real."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from coop.codec import get_codec
from coop.coordinator.evaluation import restore_reports
from coop.coordinator.state import load_run
from coop.wire import pack, unpack

from conftest import Coordinator, Worker, run_config
from page_check import check_chart, check_server_metrics, parse_charts, parse_metrics, value

pytestmark = pytest.mark.e2e


class Client:
    """A light worker: joins, downloads weights, sends hand-made updates."""

    def __init__(self, coordinator: Coordinator, name: str = "client"):
        self.url = coordinator.url
        self.http = httpx.Client(base_url=self.url, timeout=60)
        response = self.http.post("/v1/join", json={"name": name}, headers=coordinator.headers())
        assert response.status_code == 200, response.text
        self.info = response.json()
        self.token = self.info["worker_token"]
        self.auth = {"Authorization": f"Bearer {self.token}"}

    def weights(self) -> tuple[int, dict[str, np.ndarray]]:
        response = self.http.get("/v1/weights", headers=self.auth)
        assert response.status_code == 200, response.text
        tensors, meta = unpack(response.content)
        assert meta["round"] == int(response.headers["X-Coop-Round"])
        return meta["round"], tensors

    def body(self, update: dict[str, np.ndarray], round_number: int, tokens: int = 100, codec: str = "fp32",
             **meta) -> bytes:
        encoded = get_codec(codec).encode(update)
        return pack(encoded.tensors, {**encoded.metadata, "round": round_number, "tokens": tokens, "loss": 1.0, **meta})

    def put(self, round_number: int, body: bytes, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.token}", "Content-Type": "application/octet-stream"}
        return self.http.put(f"/v1/rounds/{round_number}/update", content=body, headers=headers)

    def wait(self, round_number: int) -> dict:
        response = self.http.get(f"/v1/rounds/{round_number}/wait", params={"timeout_s": 30}, headers=self.auth)
        assert response.status_code == 200, response.text
        return response.json()


def val_losses(status: dict) -> list[float]:
    return [h["val_loss"] for h in status["history"] if h.get("val_loss") is not None]


def done_and_evaluated(coordinator, workers, timeout: float = 90) -> dict:
    """The status once the run is done and every worker reported the val loss of every weights
    (the final model's come once the run is done)."""
    return coordinator.wait_status(lambda s: s["done"] and all(len(h.get("val_reports", {})) == len(workers)
                                                               for h in s["history"]),
                                   timeout, "the run and every worker's val loss of every weights",
                                   [w.log for w in workers])


def closed_rounds(status: dict) -> list[int]:
    return [h["round"] for h in status["history"] if h.get("round") is not None]


def test_two_workers_train_and_the_global_loss_falls(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, run_config(rounds={"max_rounds": 8}, coordinator={"min_workers": 2})))
    workers = [procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(2)]
    # the val losses are the workers' reports
    status = done_and_evaluated(coordinator, workers)
    assert closed_rounds(status) == list(range(8))
    assert all(h["contributors"] == 2 for h in status["history"] if h.get("round") is not None)
    losses = val_losses(status)
    assert len(losses) == 9  # before round 0, then after each round
    assert status["val_loss"]["round"] == 8 and status["val_loss"]["loss"] == losses[-1]
    assert losses[-1] < losses[0] - 0.5, losses
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "done: 8 rounds contributed" in worker.output()
    page = httpx.get(coordinator.url + "/")  # no token needed for the page and the metrics
    assert page.status_code == 200 and "<svg" in page.text and "worker1" not in page.text  # figures only
    full = httpx.get(coordinator.url + "/", headers=coordinator.headers()).text
    assert "worker0" in full and "worker1" in full and ">deadline<" not in full  # done: no open round
    charts = parse_charts(full)
    assert [c.kind for c in charts] == ["loss", "bytes", "seconds", "count"]
    for chart in charts:  # the ticks a person reads off a real run
        check_chart(chart)
    assert charts[0].x.lo == 0 and charts[0].x.hi == 8  # the loss from the initial weights to the final ones
    metrics = httpx.get(coordinator.url + "/metrics").text
    assert "coop_round 8.0" in metrics and 'coop_updates_total{result="accepted"} 16.0' in metrics
    assert float(re.search(r"^coop_val_loss (\S+)$", metrics, re.M).group(1)) == pytest.approx(losses[-1])
    assert 'coop_eval_reports_total{result="accepted"} 18.0' in metrics  # 9 weights x 2 workers
    samples = parse_metrics(metrics)
    check_server_metrics(samples)
    assert value(samples, "coop_received_bytes_total") == status["totals"]["bytes_in"]


@pytest.mark.parametrize("fragments", [1, 2])
def test_overlapping_workers_train_while_the_round_closes_and_lose_nothing(tmp_path, procs, fragments):
    # [outer] overlap_steps: each worker starts the next round as soon as its update is accepted and
    # applies the merge when it comes down; every round still has both updates, the loss falls
    config = run_config(model={"n_layer": 2}, inner={"steps": 4}, outer={"overlap_steps": 1, "fragments": fragments},
                        rounds={"max_rounds": 8}, coordinator={"min_workers": 2})
    coordinator = procs(Coordinator(tmp_path, config))
    # worker1 on an emulated link (coop.throttle): 20 Mbit/s each way, 5 ms latency
    workers = [procs(Worker(tmp_path, coordinator, "worker0")),
               procs(Worker(tmp_path, coordinator, "worker1", "--limit-rate", "20Mbit", "--latency", "5ms"))]
    status = done_and_evaluated(coordinator, workers)
    assert closed_rounds(status) == list(range(8))
    assert all(h["contributors"] == 2 for h in status["history"] if h.get("round") is not None)
    losses = val_losses(status)
    assert len(losses) == 9 and losses[-1] < losses[0] - 0.3, losses
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        # every step trained went into an update: none after the last round (which nothing follows)
        assert re.search(r"done: 8 rounds contributed \(0 refused as stale\), [\d,]+ tokens, last", worker.output())
        assert "; after the first round, in inner steps" in worker.output()  # the steady state, apart
        assert "overlap up to 1 steps, from the eager outer step" in worker.output()  # coop.eager


def test_workers_on_the_compressed_downlink_follow_the_coordinators_view(tmp_path, procs):
    config = run_config(compression={"codec": "int8", "downlink": "codec", "snapshot_every": 3},
                        rounds={"max_rounds": 8}, coordinator={"min_workers": 2})
    coordinator = procs(Coordinator(tmp_path, config))
    workers = [procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(2)]
    status = done_and_evaluated(coordinator, workers)
    assert all(h["contributors"] == 2 for h in status["history"] if h.get("round") is not None)
    losses = val_losses(status)
    assert len(losses) == 9 and losses[-1] < losses[0] - 0.5, losses
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "done: 8 rounds contributed (0 refused as stale)" in worker.output()
    metrics = httpx.get(coordinator.url + "/metrics").text
    sent = {m.group(1): float(m.group(2)) for m in re.finditer(r'^coop_sent_bytes_total{what="(\w+)"} (\S+)$', metrics, re.M)}
    assert sent.get("delta", 0) > 0, metrics  # rounds 1, 2, 4, 5, 7 went down as int8 changes
    per_delta, per_weights = sent["delta"] / 10, sent["weights"] / 8  # 2 workers: 5 changes, 4 full (join + 3, 6, 8)
    assert per_delta * 2 < per_weights, (per_delta, per_weights)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to make one worker slower for real")
def test_a_slower_worker_trains_what_fits_before_the_deadline_and_is_not_starved(tmp_path, procs):
    # the slow worker shares its core with two busy processes (a third of a core: ~3x slower);
    # the fast one and the coordinator have the other core. With a quorum of one, the fast one
    # alone closes every round at the deadline: a worker that always trained K steps would be
    # refused as stale every round (issue: "0 rounds contributed")
    fast_core, slow_core = sorted(os.sched_getaffinity(0))[:2]
    config = run_config(inner={"steps": 60}, rounds={"max_rounds": 16, "eval_every": 0},
                        coordinator={"min_workers": 1, "quorum_fraction": 0.5, "deadline_factor": 1.5,
                                     "min_deadline_s": 0.3, "max_deadline_s": 0.6, "worker_timeout_s": 30.0})
    coordinator = procs(Coordinator(tmp_path, config))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {slow_core})
        os.sched_setaffinity(coordinator.popen.pid, {fast_core})
        slow = procs(Worker(tmp_path, coordinator, "slow"))  # first: it starts up slowly too
        os.sched_setaffinity(slow.popen.pid, {slow_core})
        coordinator.wait_status(lambda s: s["workers"], 60, "the slow worker to join", [slow.log])
        # held while the fast one starts: alone, on a fast machine, it would close all 16 rounds first
        # (its own report closes a round nobody else is in)
        slow.popen.send_signal(signal.SIGSTOP)
        try:
            fast = procs(Worker(tmp_path, coordinator, "fast"))
            os.sched_setaffinity(fast.popen.pid, {fast_core})
            coordinator.wait_status(lambda s: len(s["workers"]) == 2, 60, "the fast worker to join", [fast.log])
        finally:
            slow.popen.send_signal(signal.SIGCONT)
        status = coordinator.wait_status(lambda s: s["done"], 180, "16 rounds", [fast.log, slow.log])
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    rounds = [h for h in status["history"] if h.get("round") is not None]
    slow_id = next(w["id"] for w in status["workers"] if w["name"] == "slow")
    fast_id = next(w["id"] for w in status["workers"] if w["name"] == "fast")
    together = [h for h in rounds if fast_id in h["workers"]]  # the rounds once both were in
    assert len(together) >= 8, rounds
    # the round in which the fast one joined closed at a deadline the slow one could not know of when
    # it began it (alone, it was waited for); training all K steps of it, it can miss the next one
    # too. From its first round with a deadline on, it stops its steps in time for it
    # (coop.coordinator.transport: steps_end_by): seen on two cores, every round from there; the
    # issue's bar is 90%. Without the budget it contributes none of them.
    first = next((i for i, h in enumerate(together) if slow_id in h["workers"]), len(together))
    assert first <= 3, (first, slow.output()[-3000:])
    settled = together[first:]
    slow_rounds = sum(slow_id in h["workers"] for h in settled)
    assert slow_rounds >= 0.9 * len(settled), (slow_rounds, len(settled), slow.output()[-3000:])
    assert slow.wait(30) == 0, slow.output()
    assert "training the steps that fit before it" in slow.output()
    slow_record = next(w for w in status["workers"] if w["id"] == slow_id)
    full_round = config["inner"]["steps"] * config["inner"]["batch_size"] * config["model"]["block_size"]
    # fewer tokens than a full round: the steps that fit. (Not compared with the fast one's: on the
    # 16-core GPU machine it shares its core with the coordinator and trims its rounds too.)
    assert slow_record["tokens"] / max(1, slow_record["rounds"]) < full_round


def test_streaming_workers_merge_a_fragment_a_round_and_the_loss_falls(tmp_path, procs):
    config = run_config(model={"n_layer": 2}, inner={"steps": 4}, outer={"fragments": 2, "decay": True},
                        rounds={"max_rounds": 8}, coordinator={"min_workers": 2})
    coordinator = procs(Coordinator(tmp_path, config))
    workers = [procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(2)]
    status = coordinator.wait_status(lambda s: s["done"], 90, "8 rounds", [w.log for w in workers])
    rounds = [h for h in status["history"] if h.get("round") is not None]
    assert [h["fragment"] for h in rounds] == [0, 1] * 4
    assert all(h["contributors"] == 2 for h in rounds)  # every fragment-only update accepted
    assert rounds[-1]["outer_lr"] < rounds[0]["outer_lr"]  # the cosine decay
    losses = val_losses(status)
    assert losses[-1] < losses[0] - 0.3, losses
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()
        assert "done: 8 rounds contributed" in worker.output()


def test_a_worker_killed_mid_round_does_not_stop_the_run(tmp_path, procs):
    # A round closes early only when every active worker reported: a survivor that is merely slow (2
    # busy cores) is neither cut off by the deadline nor taken for dead, and the killed worker is
    # dropped after worker_timeout_s. Rounds after the kill: at most two close before it is dropped,
    # so the run is long enough for the last rounds to be the two survivors'.
    config = run_config(rounds={"max_rounds": 14}, inner={"steps": 20},
                        coordinator={"min_deadline_s": 4.0, "max_deadline_s": 6.0, "worker_timeout_s": 4.0})
    coordinator = procs(Coordinator(tmp_path, config))
    workers = [procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(4)]
    logs = [w.log for w in workers]
    # all four have joined (so each is inside its training loop) and round 2 is under way
    coordinator.wait_status(lambda s: s["round"] >= 2 and s["active_workers"] == 4 and len(s["reports"]) < 4, 60,
                            "round 2 in progress with all four workers", logs)
    workers[0].kill(signal.SIGKILL)
    workers[3].kill(signal.SIGINT)  # Ctrl-C: leaves the run cleanly
    assert workers[3].popen.returncode == 130 and "interrupted; leaving the run" in workers[3].output()
    status = coordinator.wait_status(lambda s: s["done"], 90, "the run to finish without worker0", logs)
    assert closed_rounds(status) == list(range(14))
    killed = next(w for w in status["workers"] if w["name"] == "worker0")
    # worker3's record is forgotten if it left before any update of its counted (a loaded machine)
    interrupted = next((w for w in status["workers"] if w["name"] == "worker3"), {"left": True})
    last = status["history"][-1]
    assert last["contributors"] == 2 and killed["id"] not in last["workers"]
    assert not killed["active"] and not killed["left"] and interrupted["left"]
    for worker in workers[1:3]:
        assert worker.wait(30) == 0, worker.output()


def test_a_restart_does_not_wait_for_workers_that_died_with_the_coordinator(tmp_path, procs):
    # both workers are known when the coordinator is killed, one of them dies with it: the restarted
    # coordinator must not hold its first round for the dead one's worker_timeout_s (60 s)
    config = run_config(rounds={"max_rounds": 40}, inner={"steps": 10},
                        coordinator={"min_workers": 1, "worker_timeout_s": 60, "min_deadline_s": 60,
                                     "max_deadline_s": 120})
    coordinator = procs(Coordinator(tmp_path, config))
    survivor, casualty = (procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(2))
    logs = [survivor.log, casualty.log]
    # both known to the state directory: each has had an update accepted in a round that closed since
    # (members.json is written at every close; a join is written within a tick, which a kill can beat)
    coordinator.wait_status(lambda s: (s["checkpoint"]["resumes_at"] or 0) >= 3 and len(s["workers"]) == 2
                            and all(w["rounds"] >= 2 for w in s["workers"]), 60, "round 3 saved", logs)
    coordinator.kill(signal.SIGKILL)
    casualty.kill(signal.SIGKILL)
    resumed_at = load_run(coordinator.state_dir).round
    coordinator.start()
    started = time.monotonic()
    coordinator.wait_status(lambda s: len(closed_rounds(s)) > resumed_at, 30, "a round closed after the restart", logs)
    assert time.monotonic() - started < 15  # not the 60 s of the dead worker's timeout (nor the deadline)
    status = coordinator.status()
    dead = next(w for w in status["workers"] if w["name"] == "worker1")
    assert not dead["active"] and dead["confirmed"] is False


def test_coordinator_killed_and_restarted_carries_on(tmp_path, procs):
    # 20 rounds of ~0.3 s: the run is still far from done when the test kills the coordinator at round 4
    config = run_config(rounds={"max_rounds": 20}, coordinator={"min_workers": 2}, inner={"steps": 10})
    coordinator = procs(Coordinator(tmp_path, config))
    workers = [procs(Worker(tmp_path, coordinator, f"worker{i}")) for i in range(2)]
    logs = [w.log for w in workers]
    # round 4's checkpoint is written beside round 4 (coop.coordinator.persist): kill once it is there
    coordinator.wait_status(lambda s: (s["checkpoint"]["resumes_at"] or 0) >= 4, 60, "round 4 saved", logs)
    coordinator.kill(signal.SIGKILL)
    saved = load_run(coordinator.state_dir)  # the state directory is readable right after a SIGKILL
    assert saved is not None and 4 <= saved.round < 20, "the coordinator must be killed mid-run"
    assert [h["round"] for h in saved.history if h["round"] is not None] == list(range(saved.round))
    weights_before = {k: v.copy() for k, v in saved.weights.items()}

    coordinator.start()  # same port, same state directory; the workers were retrying meanwhile
    status = coordinator.status()
    assert status["round"] >= saved.round  # resumed at the last completed round (workers may already push on)
    assert closed_rounds(status)[: saved.round] == list(range(saved.round))
    if status["round"] == saved.round:
        response = httpx.get(coordinator.url + "/v1/weights", headers=coordinator.headers())
        tensors, meta = unpack(response.content)
        if meta["round"] == saved.round:
            assert all(np.array_equal(tensors[k], weights_before[k]) for k in tensors)

    status = coordinator.wait_status(lambda s: s["done"], 90, "the run to finish after the restart", logs)
    assert closed_rounds(status) == list(range(20))
    # the val loss reports the state directory held (checkpoint and evals.json) are all still there
    restore_reports(saved.history, saved.evals)
    kept = {h["outer_steps"]: set(h["val_reports"]) for h in saved.history if h.get("val_reports")}
    assert kept, "workers report the val loss of round 0's weights at least before round 4"
    assert all(kept[h["outer_steps"]] <= set(h.get("val_reports", {})) for h in status["history"] if h["outer_steps"] in kept)
    # the same two workers carried on with their tokens: nobody had to join again
    assert sorted(w["id"] for w in status["workers"]) == ["w0", "w1"]
    after = [h for h in status["history"] if h.get("round") is not None and h["round"] >= saved.round]
    assert after and all(set(h["workers"]) == {"w0", "w1"} for h in after)
    assert "resumed" in coordinator.output()
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()


def test_a_late_joiner_starts_from_the_current_weights(tmp_path, procs):
    config = run_config(rounds={"max_rounds": 10_000}, coordinator={"quorum_fraction": 1.0, "worker_timeout_s": 5.0})
    coordinator = procs(Coordinator(tmp_path, config))
    first = procs(Worker(tmp_path, coordinator, "early"))
    coordinator.wait_status(lambda s: s["round"] >= 4, 60, "round 4", [first.log])
    late = procs(Worker(tmp_path, coordinator, "late", "--max-rounds", "3"))
    assert late.wait(60) == 0, late.output()  # it leaves after 3 rounds; the run goes on
    status = coordinator.status()
    record = next(w for w in status["workers"] if w["name"] == "late")
    assert record["joined_round"] >= 4 and record["left"]
    # its first update was for the round it joined in (or the next, if it joined while that round
    # was being aggregated), and none was refused: it trained from the current global weights
    assert record["first_update_round"] in (record["joined_round"], record["joined_round"] + 1)
    assert record["rejected"] == 0 and record["rounds"] == 3
    assert f"at round {record['joined_round']}" in late.output()
    together = [h for h in status["history"] if h.get("round") is not None and record["id"] in h["workers"]]
    assert len(together) == 3 and all(h["contributors"] == 2 for h in together)
    assert first.alive()


def test_bad_requests_get_the_right_4xx_and_change_nothing(tmp_path, procs):
    coordinator = procs(Coordinator(tmp_path, run_config(coordinator={"min_workers": 2, "quorum_fraction": 1.0,
                                                                      "worker_timeout_s": 60, "heartbeat_s": 5})))
    url = coordinator.url
    assert httpx.post(url + "/v1/join", json={}).status_code == 401  # no token
    assert httpx.post(url + "/v1/join", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url + "/v1/status").status_code == 401
    a, b = Client(coordinator, "a"), Client(coordinator, "b")
    round_number, weights = a.weights()
    assert round_number == 0
    zeros = {k: np.zeros_like(v) for k, v in weights.items()}

    def snapshot():
        status = coordinator.status()
        body = httpx.get(url + "/v1/weights", headers=a.auth).content
        return (status["round"], status["phase"], tuple(status["reports"]), status["totals"]["updates_accepted"],
                hashlib.sha256(body).hexdigest())

    before = snapshot()
    good = a.body({k: v + 0.01 for k, v in zeros.items()}, 0)
    limit = a.info["max_update_bytes"]

    nan = {k: v.copy() for k, v in zeros.items()}
    first = next(iter(nan))
    nan[first].reshape(-1)[0] = np.nan
    nan_body = pack(nan, {"codec": "fp32", "options": {}, "shapes": {k: list(v.shape) for k, v in nan.items()},
                          "round": 0, "tokens": 100})
    wrong_shape = dict(zeros)
    wrong_shape[first] = np.zeros((3, 3), np.float32)
    missing = dict(zeros)
    del missing[first]
    float64 = {k: v.astype(np.float64) for k, v in zeros.items()}
    float64_body = pack(float64, {"codec": "fp32", "options": {}, "shapes": {k: list(v.shape) for k, v in zeros.items()},
                                  "round": 0, "tokens": 100})
    cases = [
        ("wrong worker token", a.put(0, good, token="w0.not-the-secret"), 401),
        ("no such worker", a.put(0, good, token="w99.x"), 401),
        ("run token is not a worker token", a.put(0, good, token=coordinator.token), 401),
        ("malformed body", a.put(0, b"this is not safetensors at all"), 400),
        ("truncated body", a.put(0, good[: len(good) // 2]), 400),
        ("wrong shapes", a.put(0, a.body(wrong_shape, 0)), 422),
        ("missing tensor", a.put(0, a.body(missing, 0)), 422),
        ("wrong dtype", a.put(0, float64_body), 422),
        ("wrong codec", a.put(0, a.body(zeros, 0, codec="int8")), 422),
        ("NaN values", a.put(0, nan_body), 422),
        ("too many tokens claimed", a.put(0, a.body(zeros, 0, tokens=10**9)), 422),
        ("metadata round differs from the URL", a.put(0, a.body(zeros, 3)), 400),
        ("oversize body", a.put(0, b"\0" * (limit + 1)), 413),
        ("a round that is not open yet", a.put(5, good), 409),
    ]
    for what, response, expected in cases:
        assert response.status_code == expected, f"{what}: {response.status_code} {response.text}"
        assert response.json()["detail"], what  # a message that says what went wrong
        assert snapshot() == before, f"{what} changed the coordinator's state"

    accepted = a.put(0, good)
    assert accepted.status_code == 200 and accepted.json()["accepted"]
    duplicate = a.put(0, good)
    assert duplicate.status_code == 409 and duplicate.json()["reason"] == "duplicate"
    assert coordinator.status()["reports"] == [a.info["worker_id"]]
    assert b.put(0, b.body(zeros, 0)).status_code == 200  # both reported: round 0 closes
    assert a.wait(0)["closed"]
    after_close = snapshot()
    assert after_close[0] == 1 and after_close[4] != before[4]
    stale = a.put(0, good)
    assert stale.status_code == 409 and stale.json()["reason"] == "closed" and stale.json()["current_round"] == 1
    assert snapshot() == after_close
    status = coordinator.status()
    assert status["totals"]["updates_accepted"] == 2
    assert status["totals"]["updates_rejected"] == len(cases) - 3 + 2  # the 401s are not counted as updates
    # the accepted update moved the weights by exactly the token-weighted mean (outer Nesterov, step 1)
    _, new = a.weights()
    mean = 0.01 * 100 / 200
    k = next(iter(new))
    expected = weights[k] - 0.7 * (mean + 0.9 * mean)
    np.testing.assert_allclose(new[k], expected, rtol=1e-5, atol=1e-6)


def test_the_coordinator_never_runs_the_model_on_a_rounds_path(tmp_path, procs):
    # eval_batches 3000: ~5 s of numpy forward passes for this model, which the coordinator once
    # spent at start-up and in every round's close while the workers waited. The light clients
    # evaluate nothing: the coordinator's history must show no val loss, and its closes stay fast.
    config = run_config(rounds={"max_rounds": 3, "eval_every": 1, "eval_batches": 3000},
                        coordinator={"min_workers": 2, "quorum_fraction": 1.0, "worker_timeout_s": 60, "heartbeat_s": 5})
    coordinator = procs(Coordinator(tmp_path, config))
    a, b = Client(coordinator, "a"), Client(coordinator, "b")
    for r in range(3):
        _, weights = a.weights()
        update = {k: np.full_like(v, 1e-3) for k, v in weights.items()}
        assert a.put(r, a.body(update, r)).status_code == 200
        sent = time.monotonic()
        assert b.put(r, b.body(update, r)).status_code == 200
        assert a.wait(r)["closed"]
        assert time.monotonic() - sent < 2.0, f"round {r} took {time.monotonic() - sent:.1f} s to close"
    status = coordinator.status()
    assert status["done"] and len(status["history"]) == 4
    assert all("val_loss" not in h for h in status["history"]) and status["val_loss"] is None
    val = a.http.get("/v1/val", headers=a.auth)
    assert val.status_code == 200 and len(val.content) < 2 * status["data"]["val_tokens"] + 4096
    # what the history gets instead: the workers' reports (here the final weights', round 3)
    reply = a.http.post("/v1/rounds/3/eval", json={"loss": 3.5, "tokens": 1000}, headers=a.auth)
    assert reply.status_code == 200, reply.text
    assert coordinator.status()["history"][-1]["val_loss"] == 3.5
    assert "coop_val_loss 3.5" in httpx.get(coordinator.url + "/metrics").text


def test_bad_eval_reports_get_a_4xx_and_change_nothing(tmp_path, procs):
    config = run_config(rounds={"max_rounds": 8, "eval_every": 2},
                        coordinator={"min_workers": 2, "quorum_fraction": 1.0, "worker_timeout_s": 60, "heartbeat_s": 5})
    coordinator = procs(Coordinator(tmp_path, config))
    a, b = Client(coordinator, "a"), Client(coordinator, "b")
    _, weights = a.weights()
    update = {k: np.zeros_like(v) for k, v in weights.items()}
    for client in (a, b):
        assert client.put(0, client.body(update, 0)).status_code == 200
    assert a.wait(0)["closed"]  # round 1 is open: the weights of rounds 0 and 1 exist
    most = 4 * 8 * 32  # eval_batches x batch_size x block_size

    def snapshot():
        metrics = httpx.get(coordinator.url + "/metrics").text
        return (coordinator.status()["history"], re.search(r"^coop_val_loss .*$", metrics, re.M).group(0))

    def post(round_number, body, token=None):
        headers = {"Authorization": f"Bearer {token or a.token}", "Content-Type": "application/json"}
        content = body if isinstance(body, bytes) else json.dumps(body)
        return a.http.post(f"/v1/rounds/{round_number}/eval", content=content, headers=headers)

    before = snapshot()
    assert before[1] == "coop_val_loss NaN"
    cases = [
        ("no worker token", post(0, {"loss": 3.0, "tokens": 100}, token="w0.wrong"), 401),
        ("NaN", post(0, b'{"loss": NaN, "tokens": 100}'), 422),
        ("negative", post(0, {"loss": -1.0, "tokens": 100}), 422),
        ("huge", post(0, {"loss": 1e12, "tokens": 100}), 422),
        ("no tokens", post(0, {"loss": 3.0}), 422),
        ("more tokens than an evaluation has", post(0, {"loss": 3.0, "tokens": most + 1}), 422),
        ("weights not served yet", post(4, {"loss": 3.0, "tokens": 100}), 409),
        ("weights not evaluated in this run (eval_every 2)", post(1, {"loss": 3.0, "tokens": 100}), 422),
        ("not JSON", post(0, b"loss=3"), 422),
    ]
    for what, response, expected in cases:
        assert response.status_code == expected, f"{what}: {response.status_code} {response.text}"
        assert response.json()["detail"], what
        assert snapshot() == before, f"{what} changed the coordinator's state"
    assert post(0, {"loss": 3.0, "tokens": most}).status_code == 200
    duplicate = post(0, {"loss": 1.0, "tokens": most})
    assert duplicate.status_code == 409 and duplicate.json()["reason"] == "duplicate"
    assert coordinator.status()["history"][0]["val_loss"] == 3.0


def test_sixteen_concurrent_workers_lose_no_update(tmp_path, procs):
    rounds = 3
    config = run_config(outer={"lr": 1.0, "momentum": 0.0, "nesterov": False},
                        rounds={"max_rounds": rounds, "eval_every": 0},
                        coordinator={"min_workers": 16, "quorum_fraction": 1.0, "worker_timeout_s": 60,
                                     "heartbeat_s": 5, "concurrent_uploads": 4,
                                     "aggregation": "mean"})  # the plain mean (the default is robust)
    coordinator = procs(Coordinator(tmp_path, config))
    clients = [Client(coordinator, f"c{i}") for i in range(16)]
    _, initial = clients[0].weights()
    errors: list[BaseException] = []

    def work(i: int, client: Client) -> None:
        try:
            for r in range(rounds):
                round_number, weights = client.weights()
                assert round_number == r
                update = {k: np.full_like(v, (i + 1) * 1e-3) for k, v in weights.items()}
                response = client.put(r, client.body(update, r, tokens=(i + 1) * 10))
                assert response.status_code == 200, response.text
                assert client.wait(r)["closed"]
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    status = coordinator.status()
    assert status["done"] and status["totals"]["updates_accepted"] == 16 * rounds
    tokens = [(i + 1) * 10 for i in range(16)]
    for h in status["history"]:
        if h.get("round") is not None:
            assert h["contributors"] == 16 and h["tokens"] == sum(tokens)
    # plain averaging: every round moves every weight by the token-weighted mean of the 16 updates
    mean = sum((i + 1) * 1e-3 * t for i, t in enumerate(tokens)) / sum(tokens)
    _, final = clients[0].weights()
    for k, v in final.items():
        np.testing.assert_allclose(v, initial[k] - rounds * mean, rtol=1e-5, atol=2e-6)
