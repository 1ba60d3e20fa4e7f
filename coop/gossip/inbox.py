"""Updates a peer has received, filed by round, until it merges that round.

Rounds up to `closed_through` are closed: an update for them is stale (409). Rounds after the
current one are accepted up to `window` ahead (a partner that finished sooner, or is one round
ahead after a timeout), never further, and never more than `max_updates` in all, so memory stays
bounded by max_updates x (one pseudo-gradient + one copy of the weights). Not thread-safe on its
own: the peer calls it under its lock.
"""
from __future__ import annotations

from coop.gossip.payload import Update


class InboxRefusal(Exception):
    """An update the inbox will not file: `status` is the HTTP status to answer (409 or 503)."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class Inbox:
    def __init__(self, window: int = 2, max_updates: int = 64):
        self.window = window
        self.max_updates = max_updates
        self.closed_through = -1
        self.updates: dict[int, dict[str, Update]] = {}

    @property
    def current_round(self) -> int:
        """The lowest round still open: the one this peer is training or exchanging."""
        return self.closed_through + 1

    def check_round(self, round_index: int) -> None:
        """Raise InboxRefusal unless an update for `round_index` could be filed now."""
        current = self.current_round
        if round_index < current:
            raise InboxRefusal(409, f"round {round_index} is closed here (this peer is at round {current}); "
                                    "the sender is behind and should move on to this round")
        if round_index > current + self.window:
            raise InboxRefusal(409, f"round {round_index} is too far ahead (this peer is at round {current}, "
                                    f"files at most {self.window} rounds ahead)")

    def add(self, update: Update) -> None:
        self.check_round(update.round)
        filed = self.updates.setdefault(update.round, {})
        if update.peer_id in filed:
            raise InboxRefusal(409, f"an update from peer {update.peer_id} for round {update.round} was already received")
        if sum(len(u) for u in self.updates.values()) >= self.max_updates:
            raise InboxRefusal(503, f"inbox full ({self.max_updates} updates waiting); retry later")
        filed[update.peer_id] = update

    def senders(self, round_index: int) -> set[str]:
        return set(self.updates.get(round_index, {}))

    def close(self, round_index: int) -> list[Update]:
        """Close every round up to `round_index`; returns the updates filed for `round_index`
        (sorted by sender) and forgets those of earlier rounds."""
        taken = self.updates.pop(round_index, {})
        for r in [r for r in self.updates if r <= round_index]:
            del self.updates[r]
        self.closed_through = max(self.closed_through, round_index)
        return [taken[p] for p in sorted(taken)]

    def count(self) -> int:
        return sum(len(u) for u in self.updates.values())
