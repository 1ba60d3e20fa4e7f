"""The HTTP transport: a worker's rounds against the coordinator (coop.round.Transport).

    begin:    download the global weights of the open round r (304 when ours are current),
              and make sure r is still open for updates (not being aggregated, run not done)
    exchange: upload the encoded pseudo-gradient for round r, then long-poll until r closes
              (re-uploading it if a restarted coordinator lost it)

The coordinator aggregates and takes the outer step (coop.coordinator.service); the next
round's `begin` downloads the result. Streaming (P fragments): round r sends fragment r mod P
and loads the fragment the last round merged, when our update was in that merge; a worker that
missed a round starts afresh from the whole download.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from ..round import Contribution, RoundStart
from ..wire import WireError, pack, unpack, upload_chunks
from .client import CoordinatorClient, WorkerError


@dataclass
class Delivery:
    """What became of a round's update: "accepted", or the coordinator's reason for a 409
    ("stale", "aggregating", "done", ...), or "diverged" when nothing was sent."""

    outcome: str
    nbytes: int = 0
    done: bool = False  # the run ended with this round


class HttpTransport:
    def __init__(self, client: CoordinatorClient, shapes: dict[str, tuple[int, ...]], say: Callable[[str], None],
                 parts: list[list[str]] | None = None):
        self.client, self.shapes, self.say = client, shapes, say
        self.parts = parts or [list(shapes)]
        self.weights: dict[str, np.ndarray] | None = None
        self.weights_round: int | None = None
        self.accepted_round: int | None = None  # the last round whose update the coordinator took

    # -- begin -------------------------------------------------------------------------------------
    def begin(self) -> RoundStart | None:
        """The open round and its weights; None when the run is done."""
        while True:
            round_number = self.fetch_weights()
            info = self.client.request("POST", "/v1/heartbeat", json={}).json()
            if info["done"]:
                self.say(f"the run is done at round {info['round']}")
                return None
            if info["round"] != round_number:  # moved on between the two requests
                continue
            if info.get("phase", "open") != "open":  # being aggregated: an update now would be refused
                self.wait_round_end(round_number, None)
                continue
            if len(self.parts) == 1:
                return RoundStart(round_number, self.weights)
            p, continuing = len(self.parts), self.accepted_round == round_number - 1
            return RoundStart(round_number, self.weights, merged=self.parts[(round_number - 1) % p] if continuing else None,
                              send=self.parts[round_number % p], reset=not continuing)

    def fetch_weights(self) -> int:
        """Download the global weights (unless ours are already the open round's). Returns the round."""
        headers = {"If-None-Match": f'"r{self.weights_round}"'} if self.weights is not None else {}
        response = self.client.request("GET", "/v1/weights", headers=headers, ok=(200, 304))
        round_number = int(response.headers["X-Coop-Round"])
        if response.status_code == 304:
            return round_number
        body = response.content
        self.client.bytes_down += len(body)
        try:
            tensors, meta = unpack(body)
        except WireError as error:
            raise WorkerError(f"the coordinator sent malformed weights: {error}") from None
        if {n: tuple(a.shape) for n, a in tensors.items()} != self.shapes or meta.get("round") != round_number:
            raise WorkerError("the coordinator's weights do not match the model it described at join")
        self.weights, self.weights_round = tensors, round_number
        return round_number

    # -- exchange ----------------------------------------------------------------------------------
    def exchange(self, round_index: int, contribution: Contribution | None) -> Delivery:
        if contribution is None:  # the replica diverged: nothing to send; the next round starts afresh
            return Delivery("diverged")
        body = self.pack(contribution)
        outcome = self.upload(round_index, body)
        if outcome == "accepted":
            self.accepted_round = round_index
            end = self.wait_round_end(round_index, body)
            return Delivery("accepted", len(body), bool(end["done"]))
        if outcome == "aggregating":
            self.wait_round_end(round_index, None)
        return Delivery(outcome, len(body), outcome == "done")

    def pack(self, contribution: Contribution) -> bytes:
        result = contribution.result
        meta = dict(contribution.encoded.metadata, round=contribution.round, tokens=int(result.tokens),
                    loss=result.mean_loss, train_seconds=result.seconds, worker=self.client.token.split(".")[0])
        if not np.isfinite(meta["loss"]):
            meta["loss"] = None
        return pack(contribution.encoded.tensors, meta)

    def upload(self, round_number: int, body: bytes) -> str:
        """PUT the update; returns "accepted", or the coordinator's 409 reason."""
        response = self.client.request(
            "PUT", f"/v1/rounds/{round_number}/update", ok=(200, 409), body_factory=lambda: upload_chunks(body),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(body))})
        if response.status_code == 200:
            self.client.bytes_up += len(body)
            return "accepted"
        reason = response.json().get("reason", "closed")
        if reason == "duplicate":  # counted before a retry: fine
            self.client.bytes_up += len(body)
            return "accepted"
        return reason

    def wait_round_end(self, round_number: int, body: bytes | None) -> dict[str, Any]:
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
