"""The DiLoCo round, written once for every mode.

    start = transport.begin()                              # the round and the weights to start from
    result = replica.run_round(start.weights, inner_steps)  # K inner steps -> the pseudo-gradient
    encoded = codec.encode(result.pseudo_gradient)         # one codec per sender, kept across rounds
    outcome = transport.exchange(Contribution(...))        # sent; the merge happens on the other side

A `Transport` is all the training side ever talks to (torchft's Manager plays this part): it
says which round to train and from which weights, and carries the encoded pseudo-gradient to
wherever the merge happens. Three implement it:

    coop.simulate.transport.InProcessTransport   N replicas in one process (`coop simulate`)
    coop.coordinator.transport.HttpTransport     a worker of the HTTP coordinator (`coop-worker join`)
    coop.gossip.transport.GossipTransport        a peer of a swarm (`coop swarm start`)

The merge itself (aggregation and the outer step) is coop.diloco's, whoever runs it. Keeping one
codec per sender across rounds is what lets top-k's error feedback carry its residual from one
round to the next.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .codec import Codec, Encoded
from .replica import Replica, RoundResult


@dataclass
class RoundStart:
    """What a replica trains from: the round's number and the (global) weights to start from.
    `inner_step`, when given, is where the replica's inner lr schedule stands at the round's
    start (the simulator keeps every replica on one schedule, whatever rounds it missed)."""

    round: int
    weights: dict[str, np.ndarray]
    inner_step: int | None = None
    # streaming DiLoCo (coop.streaming): the tensors the last merge changed (None: all of them)
    # and the fragment this round's merge takes (None: the whole model)
    merged: list[str] | None = None
    send: list[str] | None = None
    apply_after: int = 0  # overlap: the merge is applied this many inner steps into the round (with
    # `arrival`: at most this many, earlier if it arrives earlier)
    reset: bool = False  # the replica missed merges: start afresh from `weights` (all of them)
    # overlap over a real link: the start is still on its way (a Future of a RoundStart, or of None
    # when the run ended); the replica trains on beside it and applies it when it arrives
    arrival: Future | None = None
    steps: int | None = None  # inner steps of this round, when fewer than K fit before its deadline
    until: float | None = None  # time.perf_counter() by which the inner steps must end (the round's
    # deadline less the round end and upload): the steps stop there, however many were planned (at least one)
    idle: Callable[[], None] | None = None  # with `arrival`: the transport's work for the training thread
    # while it waits for the merge (coop.replica.Replica.run_round)
    beside: Callable[[], bool] | None = None  # work queued a piece after each inner step, until it returns False


@dataclass
class Contribution:
    """One replica's part of a round: its encoded pseudo-gradient and what the merge weighs it by."""

    round: int
    encoded: Encoded
    codec: Codec
    result: RoundResult

    @property
    def tokens(self) -> int:
        return self.result.tokens

    @property
    def loss(self) -> float:
        return self.result.mean_loss

    @property
    def nbytes(self) -> int:
        return self.encoded.nbytes

    def decoded(self) -> dict[str, np.ndarray]:
        """The pseudo-gradient as every receiver sees it (what the merge must average)."""
        return self.codec.decode(self.encoded.tensors, self.encoded.metadata)


class Transport(Protocol):
    def begin(self) -> RoundStart | None:
        """The next round to train, or None when this replica's run is over."""

    def exchange(self, round_index: int, contribution: Contribution | None) -> Any:
        """Deliver the contribution to the merge (None: the replica has nothing to send, its update
        diverged); returns the transport's outcome of the round (what its caller logs)."""


@dataclass
class RoundReport:
    round: int
    result: RoundResult
    contribution: Contribution | None  # None: not sent (see `refused`)
    outcome: Any  # the transport's, e.g. "accepted" / "stale" over HTTP, the merge's partners in gossip
    refused: str | None = None  # why the update was not sent (NaN/inf: the replica diverged)


class RoundLoop:
    """Drives a replica through rounds over a transport: begin -> K inner steps -> encode -> exchange."""

    def __init__(self, replica: Replica, codec: Codec, transport: Transport, inner_steps: int):
        if inner_steps < 1:
            raise ValueError(f"inner_steps must be at least 1, got {inner_steps}")
        self.replica, self.codec, self.transport, self.inner_steps = replica, codec, transport, inner_steps
        self.sent_round: int | None = None  # the round of the last pseudo-gradient made: its merge comes next

    def run_round(self) -> RoundReport | None:
        """One round; None when the transport says the run is over."""
        start = self.transport.begin()
        if start is None:
            return None
        if start.arrival is not None:  # overlap: train on while the last round's merge comes
            result = self.replica.run_round(None, self.inner_steps, arrival=start.arrival,
                                            apply_after=start.apply_after or self.inner_steps, idle=start.idle,
                                            beside=start.beside, merge_round=self.sent_round)
            arrived = start.arrival.result()
            if result is None or arrived is None:  # the run ended meanwhile: the transport says so next
                return self.run_round()
            return self._send(arrived, result)
        if start.inner_step is not None:
            self.replica.step = start.inner_step
        if start.reset:
            self.replica.reset_anchor()
        result = self.replica.run_round(start.weights, start.steps or self.inner_steps, merged=start.merged,
                                        send=start.send, apply_after=start.apply_after, until=start.until,
                                        merge_round=self.sent_round)
        return self._send(start, result)

    def _send(self, start: RoundStart, result: RoundResult) -> RoundReport:
        self.sent_round = start.round
        try:
            contribution = Contribution(start.round, self.codec.encode(result.pseudo_gradient), self.codec, result)
        except ValueError as error:  # NaN/inf: the replica diverged; its update must not count
            return RoundReport(start.round, result, None, self.transport.exchange(start.round, None), str(error))
        return RoundReport(start.round, result, contribution, self.transport.exchange(start.round, contribution))

    def rounds(self) -> Iterator[RoundReport]:
        """Every round until the transport ends the run."""
        while (report := self.run_round()) is not None:
            yield report
