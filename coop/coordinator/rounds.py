"""The round state machine, with no I/O, no numpy and no clock of its own (time is passed in).

    OPEN ──(every active worker reported, or quorum reported and deadline passed)──> AGGREGATING
    AGGREGATING ──(outer step applied and state persisted)──> CLOSED
    CLOSED ──(next round opens, or max_rounds reached: DONE)

Round r is the round whose starting weights are the global weights after r outer steps. While
round r is OPEN, each worker may report once for it; a report for any other round, or a second
one, is refused (the HTTP layer answers 409 and the worker resynchronises). The coordinator
(`coop.coordinator.service`) drives the transitions and does the numerical work in between.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    OPEN = "open"  # accepting updates for this round
    AGGREGATING = "aggregating"  # closed to updates; outer step and persistence in progress
    CLOSED = "closed"  # done; the next round opens at once (or the run is DONE)
    DONE = "done"  # max_rounds completed; nothing more to train


@dataclass
class Report:
    """One accepted update, without its tensors (those went straight into the aggregator)."""

    worker_id: str
    tokens: int
    loss: float | None
    seconds: float  # from the round's opening (or the worker's start, if later) to the report
    nbytes: int


@dataclass
class RoundState:
    number: int
    opened_at: float
    deadline_s: float
    phase: Phase = Phase.OPEN
    reports: dict[str, Report] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.reports.values())


class StaleRound(Exception):
    """A report that cannot be counted now (409). `current` is the open round's number; `reason`
    tells the worker what to do: "closed" or "ahead" (download the current weights), "aggregating"
    (wait for the round to end), "duplicate" (already counted: nothing to do), "done"."""

    def __init__(self, message: str, current: int, reason: str):
        super().__init__(message)
        self.current, self.reason = current, reason


class DeadlinePolicy:
    """The deadline adapts to how long workers have been taking: `factor` x the median of the
    recent report times, clamped to [min_s, max_s]; before any report it is max_s."""

    def __init__(self, factor: float, min_s: float, max_s: float, window: int = 64):
        self.factor, self.min_s, self.max_s = factor, min_s, max_s
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self.recent.append(seconds)

    def current(self) -> float:
        if not self.recent:
            return self.max_s
        return min(self.max_s, max(self.min_s, self.factor * statistics.median(self.recent)))


class RoundMachine:
    """Which round is open, who reported, and when it closes."""

    def __init__(self, first_round: int, max_rounds: int, min_workers: int, quorum_fraction: float,
                 deadline: DeadlinePolicy, now: float):
        self.max_rounds, self.min_workers, self.quorum_fraction = max_rounds, min_workers, quorum_fraction
        self.deadline = deadline
        self.round = RoundState(first_round, now, deadline.current())
        if first_round >= max_rounds:
            self.round.phase = Phase.DONE

    @property
    def number(self) -> int:
        return self.round.number

    @property
    def phase(self) -> Phase:
        return self.round.phase

    @property
    def done(self) -> bool:
        return self.round.phase is Phase.DONE

    def quorum(self, active: int) -> int:
        """Reports needed once the deadline has passed."""
        return max(self.min_workers, math.ceil(self.quorum_fraction * active))

    def check_can_report(self, worker_id: str, round_number: int) -> None:
        """Raise StaleRound unless `worker_id` may report for `round_number` now. Changes nothing."""
        current = self.round
        if self.done:
            raise StaleRound(f"the run is done ({self.max_rounds} rounds); nothing more to report", current.number, "done")
        if round_number != current.number:
            when = "already closed" if round_number < current.number else "not open yet"
            raise StaleRound(f"round {round_number} is {when}; the open round is {current.number}: "
                             "download the current weights and train on them", current.number,
                             "closed" if round_number < current.number else "ahead")
        if current.phase is not Phase.OPEN:
            raise StaleRound(f"round {round_number} is {current.phase.value}, no longer taking updates; "
                             "wait for it to close and download the new weights", current.number + 1, "aggregating")
        if worker_id in current.reports:
            raise StaleRound(f"worker {worker_id} already reported for round {round_number}", current.number, "duplicate")

    def record(self, report: Report, round_number: int) -> None:
        """Count an accepted report (call only after check_can_report passed and the update was aggregated)."""
        self.check_can_report(report.worker_id, round_number)
        self.round.reports[report.worker_id] = report
        self.deadline.observe(report.seconds)

    def close_reason(self, now: float, active: set[str]) -> str | None:
        """Why the open round should close now, or None to keep waiting."""
        current = self.round
        if current.phase is not Phase.OPEN:
            return None
        reported = len(current.reports)
        if reported < self.min_workers:
            return None
        if active and active <= set(current.reports):
            return f"all {len(active)} active workers reported"
        if now - current.opened_at >= current.deadline_s and reported >= self.quorum(len(active)):
            return f"deadline {current.deadline_s:.1f}s passed with {reported} of {len(active)} active workers reported"
        return None

    def deadline_for(self, worker_id: str, active: set[str], now: float) -> float | None:
        """Seconds left before the open round may close without `worker_id`: the deadline's, when
        the other active workers can make the quorum alone; None when the round waits for it."""
        current = self.round
        if current.phase is not Phase.OPEN or len(active - {worker_id}) < self.quorum(len(active)):
            return None
        return round(current.deadline_s - (now - current.opened_at), 3)

    def begin_aggregation(self) -> RoundState:
        if self.round.phase is not Phase.OPEN:
            raise RuntimeError(f"round {self.round.number} is {self.round.phase.value}, cannot aggregate it")
        self.round.phase = Phase.AGGREGATING
        return self.round

    def abort_aggregation(self) -> None:
        """The outer step failed (e.g. non-finite result): reopen the round with its reports dropped."""
        self.round.phase = Phase.OPEN
        self.round.reports.clear()

    def finish(self, now: float) -> RoundState:
        """The outer step is applied and persisted: close this round and open the next (or DONE)."""
        if self.round.phase is not Phase.AGGREGATING:
            raise RuntimeError(f"round {self.round.number} is {self.round.phase.value}, not aggregating")
        closed = self.round
        closed.phase = Phase.CLOSED
        self.round = RoundState(closed.number + 1, now, self.deadline.current())
        if self.round.number >= self.max_rounds:
            self.round.phase = Phase.DONE
        return closed
