"""The HTTP transport: a worker's rounds against the coordinator (coop.round.Transport).

    begin:    download the global weights of the open round r (304 when ours are current),
              and make sure r is still open for updates (not being aggregated, run not done)
    exchange: upload the encoded pseudo-gradient for round r, evaluate round r's weights while the
              others finish (every eval_every rounds), then long-poll until r closes
              (re-uploading it if a restarted coordinator lost it)

The coordinator aggregates and takes the outer step (coop.coordinator.service); the next
round's `begin` downloads the result. Streaming (P fragments): round r sends fragment r mod P
and loads the fragment the last round merged, when our update was in that merge; a worker that
missed a round starts afresh from the whole download.

The val loss of the global weights is the workers' to measure (the coordinator never runs the
model): each reports its loss of the weights of round r (POST /v1/rounds/{r}/eval) right after
its upload, when it would otherwise wait, and the final weights' once the run is done.

With overlap ([outer] overlap_steps), exchange hands the update to a background thread and
returns at once ("queued"): the upload, the long-poll and the next download run there while the
replica trains the next round (except after the run's last round, which nothing follows); the
evaluation of round r's weights is queued a window at a time between those inner steps (on the
device it runs in their shadow), and its loss read when the replica would wait for r's merge
anyway. The update's fate (accepted, stale, ...) arrives in `Delivery.settled`.
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from ..codec import decode
from ..replica import RoundResult
from ..round import Contribution, RoundStart
from ..streaming import round_start
from ..wire import WireError, pack_view, unpack, upload_chunks
from .client import CoordinatorClient, WorkerError
from .evaluation import eval_due

log = logging.getLogger("coop.worker")

# a worker that the others can close a round without plans its steps and its upload into this share of
# the time to the deadline, and into less (down to MIN_BUDGET_SHARE) after missing one
BUDGET_SHARE, MIN_BUDGET_SHARE = 0.85, 0.5
# what another server on the upload port's number answers (ours never does to a well-formed update)
NOT_THE_UPLOAD_PORT = (404, 405, 411)
UPLOAD_PORT_TRIES = 2  # failures in a row before the upload port is given up for the API's route


@dataclass
class Delivery:
    """What became of a round's update: "accepted", or the coordinator's reason for a 409
    ("stale", "aggregating", "done", ...), or "diverged" when nothing was sent."""

    outcome: str  # or "queued": sent in the background (overlap), what became of it is `settled`'s
    nbytes: int = 0
    done: bool = False  # the run ended with this round
    settled: Future | None = None  # of the Delivery once the background upload has an answer


@dataclass
class ValCheck:
    """When and how this worker measures the val loss of the global weights (from the join reply)."""

    every: int  # [rounds] eval_every: the weights of every `every`th round (0: never), and the final ones
    max_rounds: int
    evaluate: Callable[[dict[str, np.ndarray]], tuple[float, int]]  # weights -> (mean loss, tokens evaluated)
    # with overlap: weights -> (an evaluation still to run: .step() queues a window, .result() the loss; tokens)
    start: Callable[[dict[str, np.ndarray]], tuple[Any, int]] | None = None
    done: set[int] = field(default_factory=set)  # rounds whose weights this worker evaluated (once each)


class HttpTransport:
    def __init__(self, client: CoordinatorClient, shapes: dict[str, tuple[int, ...]], say: Callable[[str], None],
                 parts: list[list[str]] | None = None, val: ValCheck | None = None, overlap_steps: int = 0,
                 round_steps: int | None = None, last_round: int | None = None):
        self.client, self.shapes, self.say = client, shapes, say
        # the run's last round (max_rounds - 1): its update is sent and waited for, never trained
        # beside, since no round follows it (the steps would be thrown away); None: not known
        self.last_round = last_round
        # nobody starved: when the others can close the round without us at its deadline, train only
        # the steps that fit before it (token weighting counts them), from our measured step and
        # upload times; round_steps None: always the full round
        self.round_steps = round_steps
        self.step_seconds: float | None = None  # of one inner step, the last round's
        # the time.perf_counter() the steps of the round being trained must end by (None: nobody closes
        # it without us)
        self.budget_until: float | None = None
        self.budget_share = BUDGET_SHARE  # the share of the time to the deadline that the steps and the upload may take
        self.uploads: list[float] = []  # seconds from the steps' end to the upload's end, the last few
        self.fitting = False  # said that we train fewer steps
        self.parts = parts or [list(shapes)]
        self.val = val
        # overlap ([outer] overlap_steps): once an update is accepted the next round's inner steps
        # start at once (up to overlap_steps of them); the wait for the round's close and the
        # download run here, in the background
        self.overlap_steps = overlap_steps
        self.pending: Future | None = None  # of the next RoundStart (None: the run ended)
        # (round, its weights, its evaluation queued beside the inner steps or None, tokens) to evaluate
        self.eval_due: tuple[int, dict[str, np.ndarray], Any, int] | None = None
        self.background = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="coop-overlap")
                           if overlap_steps else None)
        self.weights: dict[str, np.ndarray] | None = None
        self.weights_round: int | None = None
        self.accepted_round: int | None = None  # the last round whose update the coordinator took
        # seconds the training thread spent on each part of a round outside its inner steps (what
        # the background does beside them is not counted): the worker's summary shows them
        self.spent = {"download": 0.0, "upload": 0.0, "eval": 0.0, "wait": 0.0}
        self._training_thread = threading.current_thread()

    @contextlib.contextmanager
    def timed(self, part: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            if threading.current_thread() is self._training_thread:
                self.spent[part] += time.perf_counter() - started

    # -- begin -------------------------------------------------------------------------------------
    def begin(self) -> RoundStart | None:
        """The open round and its weights; None when the run is done. With overlap, right after an
        accepted update: a start still on its way (`arrival`), for the replica to train beside."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            queued = self.eval_due[2] if self.eval_due is not None else None
            return RoundStart(-1, None, arrival=pending, apply_after=self.overlap_steps, idle=self.deferred_eval,
                              beside=queued.step if queued is not None else None)
        return self.start_now()

    def deferred_eval(self) -> None:
        """With overlap: the val loss of the last round's weights, from the training thread, when it
        has to wait for a merge anyway (else before the next upload, or once the run is done)."""
        if self.eval_due is not None:
            (round_number, weights, queued, tokens), self.eval_due = self.eval_due, None
            with self.timed("eval"):
                if queued is None:
                    self.report_val(round_number, weights)
                else:
                    self.report_val(round_number, measured=lambda: (queued.result(), tokens))

    def queue_val(self, round_number: int, weights: dict[str, np.ndarray]) -> tuple:
        """With overlap: round r's val loss to measure, its evaluation started (the weights loaded on
        the device, its windows left to queue beside the next round's steps) when it is due."""
        val = self.val
        if val is None or val.start is None or round_number in val.done or \
                not eval_due(round_number, val.every, val.max_rounds):
            return round_number, weights, None, 0
        try:
            return (round_number, weights, *val.start(weights))
        except Exception as error:  # e.g. out of device memory: the rounds go on
            val.done.add(round_number)
            self.say(f"round {round_number}: could not evaluate the global weights ({type(error).__name__}: {error})")
            return round_number, weights, None, 0

    def start_now(self, evaluate: bool = True) -> RoundStart | None:
        """Download the open round's weights and check it is open; None when the run is done (after
        the final weights' val loss, when `evaluate`: from the training thread only, it runs the model)."""
        while True:
            with self.timed("download"):
                round_number = self.fetch_weights()
                info = self.client.request("POST", "/v1/heartbeat", json={}).json()
            if info["done"]:
                if evaluate:
                    self.deferred_eval()
                if info["round"] == round_number and evaluate:  # the final weights: the history wants their loss
                    self.report_val(round_number)
                self.say(f"the run is done at round {info['round']}")
                return None
            if info["round"] != round_number:  # moved on between the two requests
                continue
            if info.get("phase", "open") != "open":  # being aggregated: an update now would be refused
                self.wait_round_end(round_number, None)
                continue
            deadline_in_s = info.get("deadline_in_s")
            self.budget_until = self.steps_end_by(deadline_in_s)
            return round_start(round_number, self.weights, self.parts, self.accepted_round == round_number - 1,
                               steps=self.steps_that_fit(deadline_in_s), until=self.budget_until)

    def steps_that_fit(self, deadline_in_s: float | None) -> int | None:
        """The inner steps to take this round: all (None) unless the round can close without us at
        its deadline, then as many as fit before it with the upload and a margin (at least 1)."""
        k = self.round_steps
        if k is None or deadline_in_s is None or self.step_seconds is None:
            return None
        fit = int((self.budget_share * deadline_in_s - self.upload_seconds) / self.step_seconds)
        if fit >= k:
            return None
        if not self.fitting:
            self.say(f"the others close rounds without this worker at the deadline: training the steps that fit "
                     f"before it ({max(1, fit)} of {k} now; its update counts by its tokens)")
            self.fitting = True
        return max(1, fit)

    def steps_end_by(self, deadline_in_s: float | None) -> float | None:
        """The time.perf_counter() by which this round's inner steps must end for the update to make
        the deadline (with the upload and the same margin), when the others can close the round
        without us; None: no deadline binds us. A hard stop beside the planned steps: it holds in the
        first rounds too, before our step time is known, and when a step slows down."""
        if self.round_steps is None or deadline_in_s is None:
            return None
        return time.perf_counter() + self.budget_share * deadline_in_s - self.upload_seconds

    @property
    def upload_seconds(self) -> float:
        """What the next round's end and upload are planned to take: the longest of the last three
        (one sample of a loaded machine's jitter is no plan)."""
        return max(self.uploads, default=0.0)

    def timed_upload(self, result: RoundResult) -> None:
        """After an upload: the seconds from the round's steps' end (the pseudo-gradient, its encoding
        and packing are the upload's to plan for)."""
        self.uploads = [*self.uploads[-2:], time.perf_counter() - (result.finished_at or time.perf_counter())]

    def learn_from(self, outcome: str) -> None:
        """After an upload in a round whose deadline bound us: missed (the round closed or was being
        aggregated when it came), leave more of the time as margin from now on; made, give a little
        back. A loaded machine's jitter then costs a round or two, not one round in six."""
        if self.budget_until is None:
            return
        if outcome in ("closed", "aggregating"):
            self.budget_share = max(MIN_BUDGET_SHARE, self.budget_share - 0.1)
        elif outcome == "accepted":
            self.budget_share = min(BUDGET_SHARE, self.budget_share + 0.01)

    def fetch_weights(self) -> int:
        """Download the global weights (unless ours are already the open round's). Returns the round."""
        held = self.weights is not None
        headers = {"If-None-Match": f'"r{self.weights_round}"'} if held else {}
        params = {"since": self.weights_round} if held else None  # a compressed downlink sends the change
        get = dict(headers=headers, params=params, ok=(200, 304))
        response = self.on_upload_port("GET", "/v1/weights", **get) if self.client.weights_via_upload_port else None
        if response is None:
            response = self.client.request("GET", "/v1/weights", **get)
        round_number = int(response.headers["X-Coop-Round"])
        if response.status_code == 304:
            return round_number
        body = response.content
        self.client.bytes_down += len(body)
        try:
            tensors, meta = unpack(body, copy=False)  # read-only views of the body: only ever read
            if "X-Coop-Since" in response.headers:  # the change from the round we hold: apply it
                tensors = self.apply_delta(tensors, meta, int(response.headers["X-Coop-Since"]))
        except WireError as error:
            raise WorkerError(f"the coordinator sent malformed weights: {error}") from None
        if {n: tuple(a.shape) for n, a in tensors.items()} != self.shapes or meta.get("round") != round_number:
            raise WorkerError("the coordinator's weights do not match the model it described at join")
        self.weights, self.weights_round = tensors, round_number
        return round_number

    def apply_delta(self, tensors: dict[str, np.ndarray], meta: dict, since: int) -> dict[str, np.ndarray]:
        """Our weights plus the coordinator's encoded change since round `since` (coop.coordinator.downlink):
        the same float32 additions the coordinator made to its view, so both hold the same numbers."""
        if since != self.weights_round or meta.get("since") != since:
            raise WireError(f"a change since round {since} for weights of round {self.weights_round}")
        part = self.parts[since % len(self.parts)]  # what round `since`'s merge changed (all without streaming)
        change = decode(tensors, meta, {n: self.shapes[n] for n in part})
        return {n: w + change[n] if n in change else w for n, w in self.weights.items()}

    # -- exchange ----------------------------------------------------------------------------------
    def exchange(self, round_index: int, contribution: Contribution | None) -> Delivery:
        if contribution is None:  # the replica diverged: nothing to send; the next round starts afresh
            return Delivery("diverged")
        result = contribution.result
        if result.losses:
            self.step_seconds = result.seconds / len(result.losses)
        body = self.pack(contribution)
        if self.overlap_steps:
            self.deferred_eval()  # the last one's, if no wait came to run it
        if self.overlap_steps and (self.last_round is None or round_index < self.last_round):
            # the upload, the round's close and its merge's download in the background
            self.eval_due = self.queue_val(round_index, self.weights)  # beside the next steps, read at the wait
            settled: Future = Future()
            self.pending = self.background.submit(self._deliver_then_next, round_index, body, settled, result)
            return Delivery("queued", len(body), settled=settled)
        with self.timed("upload"):
            outcome = self.upload(round_index, body)
        self.timed_upload(result)
        self.learn_from(outcome)
        if outcome == "accepted":
            self.accepted_round = round_index
            with self.timed("eval"):
                self.report_val(round_index)  # while the others finish the round
            with self.timed("wait"):
                end = self.wait_round_end(round_index, body)
            if end["done"]:  # the worker stops here: the final weights' val loss first
                self.report_final()
            return Delivery("accepted", len(body), bool(end["done"]))
        if outcome == "aggregating":
            self.wait_round_end(round_index, None)
        return Delivery(outcome, len(body), outcome == "done")

    def _deliver_then_next(self, round_index: int, body: memoryview, settled: Future,
                           result: RoundResult) -> RoundStart | None:
        """In the background: upload round r's update (its answer to `settled`), wait for r to close,
        then the next round's start; None when the run is done (the training thread's next begin()
        evaluates the final weights and ends)."""
        try:
            outcome = self.upload(round_index, body)
            self.timed_upload(result)
        except BaseException as error:
            settled.set_exception(error)
            raise
        if outcome == "accepted":
            self.accepted_round = round_index
        settled.set_result(Delivery(outcome, len(body), outcome == "done"))
        if outcome == "accepted" and self.wait_round_end(round_index, body)["done"]:
            return None
        if outcome == "aggregating":
            self.wait_round_end(round_index, None)
        if outcome == "done":
            return None
        return self.start_now(evaluate=False)  # a refused update: round_start says to start afresh

    def pack(self, contribution: Contribution) -> memoryview:
        result = contribution.result
        meta = dict(contribution.encoded.metadata, round=contribution.round, tokens=int(result.tokens),
                    loss=result.mean_loss, train_seconds=result.seconds, worker=self.client.token.split(".")[0])
        if not np.isfinite(meta["loss"]):
            meta["loss"] = None
        return pack_view(contribution.encoded.tensors, meta)  # only ever sent, in slices

    def upload(self, round_number: int, body: bytes | memoryview) -> str:
        """PUT the update (to the upload port when there is one); returns "accepted", or the coordinator's 409 reason."""
        path = f"/v1/rounds/{round_number}/update"
        put = dict(ok=(200, 409), body_factory=lambda: upload_chunks(body),
                   headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(body))})
        response = self.on_upload_port("PUT", path, **put)
        if response is None:
            response = self.client.request("PUT", path, **put)
        if response.status_code == 200:
            self.client.bytes_up += len(body)
            return "accepted"
        reason = response.json().get("reason", "closed")
        if reason == "duplicate":  # counted before a retry: fine
            self.client.bytes_up += len(body)
            return "accepted"
        return reason

    def on_upload_port(self, method: str, path: str, **kwargs) -> httpx.Response | None:
        """The request on the coordinator's upload port (its threads take updates and serve the
        weights), or None when there is none or it failed: then it goes to the API's port, this
        time, or from UPLOAD_PORT_TRIES failures in a row on."""
        if self.client.upload_url is None:
            return None
        try:
            response = self.client.request(method, self.client.upload_url + path, retry=False, **kwargs)
        except WorkerError as error:  # a firewall, a proxy in front of the API only: the API's route will do
            if error.status is not None and error.status < 500 and error.status not in NOT_THE_UPLOAD_PORT:
                raise  # the request itself was refused (an update too large, ...): the API would refuse it too
            # once may be a restart of the coordinator (the API's route then waits for it): tried again
            # next time; UPLOAD_PORT_TRIES times in a row, it is not to be reached from here
            self.client.upload_port_failures += 1
            given_up = self.client.upload_port_failures >= UPLOAD_PORT_TRIES
            what = "updates and downloads go" if self.client.weights_via_upload_port else "updates go"
            self.say(f"the coordinator's upload port {self.client.upload_url} failed ({error}); " +
                     (f"{what} to its API port from now on" if given_up else "its API port takes this one"))
            if given_up:
                self.client.upload_url, self.client.weights_via_upload_port = None, False
            return None
        self.client.upload_port_failures = 0
        return response

    def report_val(self, round_number: int, weights: dict[str, np.ndarray] | None = None,
                   measured: Callable[[], tuple[float, int]] | None = None) -> None:
        """Evaluate the weights of round r (those downloaded, or `weights`; or read the evaluation
        `measured` already queued) on this worker's device and report the loss, when the run asks
        for it and this worker has not yet. The val loss is a measurement, not training: whatever
        goes wrong with it is said and the rounds go on."""
        val = self.val
        if val is None or round_number in val.done or not eval_due(round_number, val.every, val.max_rounds):
            return
        val.done.add(round_number)
        try:
            if measured is None:
                loss, tokens = val.evaluate(self.weights if weights is None else weights)
            else:
                loss, tokens = measured()
        except Exception as error:  # e.g. out of device memory: the next round must still run
            self.say(f"round {round_number}: could not evaluate the global weights ({type(error).__name__}: {error})")
            return
        if not math.isfinite(loss):
            self.say(f"round {round_number}: the global weights' val loss is {loss}; not reported")
            return
        try:  # 409: reported already (a retry that got through) or the coordinator moved back after a restart
            self.client.request("POST", f"/v1/rounds/{round_number}/eval", json={"loss": loss, "tokens": tokens},
                                ok=(200, 409))
        except WorkerError as error:
            self.say(f"round {round_number}: the val loss report was refused: {error}")
            return
        log.info("round %d: val loss of the global weights %.4f", round_number, loss)

    def report_final(self) -> None:
        """The run is done: download the final weights, evaluate them and report (once)."""
        val = self.val
        if val is None or not val.every or val.max_rounds in val.done:
            return
        try:
            round_number = self.fetch_weights()
        except WorkerError as error:  # the run is over and trained: a missing measurement must not fail it
            self.say(f"could not download the final weights to evaluate them: {error}")
            return
        self.report_val(round_number)

    def wait_round_end(self, round_number: int, body: bytes | memoryview | None) -> dict[str, Any]:
        """Long-poll until round r closes. If the coordinator restarted and lost our update while
        the round is still open, upload it again."""
        while True:
            info = self.client.request("GET", f"/v1/rounds/{round_number}/wait", params={"timeout_s": 25},
                                       timeout=httpx.Timeout(60.0, connect=10.0)).json()
            if info["closed"] or info["done"] or info["round"] != round_number:
                return info
            if info.get("reported") is False and info["phase"] == "open" and body is not None:
                self.say(f"round {round_number}: the coordinator does not have our update (restarted?); sending it again")
                if self.upload(round_number, body) != "accepted":
                    return info
