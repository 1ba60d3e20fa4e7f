"""Who is in the swarm, as one peer sees it: member lists merged from heartbeats, and dead peers
dropped after `dead_after` seconds without contact.

Not thread-safe on its own: the peer calls it under its lock. Times come from `time.monotonic()`
unless a test passes `now`.

Rules (docs/p2p.md, Membership):
- A member is *heard from* when it sends us anything (heartbeat, update, join, leave) or answers
  our heartbeat. A member not heard from for `dead_after` seconds is dropped and remembered as
  departed for `tombstone_seconds`, so that lists from peers that have not noticed yet do not
  bring it back; only a message from the departed peer itself does.
- A member learned second-hand (from another peer's list) counts as heard from when learned.
- `active(round)`: the members put in groups for that round: those with `active_from <= round`.
- Every member record carries its peer's signed card (id, url, public key; checked when the
  record was parsed, `coop.gossip.protocol.Member`). The first key learned for an id is kept:
  a record of a known id under another key is ignored (`add` refuses it, `merge` skips it).
"""
from __future__ import annotations

import time
from collections.abc import Iterable

from coop.gossip.protocol import MAX_MEMBERS, Member


class Membership:
    def __init__(self, me: Member, dead_after: float, tombstone_seconds: float | None = None):
        self.me = me
        self.dead_after = dead_after
        self.tombstone_seconds = tombstone_seconds if tombstone_seconds is not None else 10 * dead_after
        self.members: dict[str, Member] = {me.peer_id: me}
        self.last_heard: dict[str, float] = {}
        self.departed: dict[str, float] = {}  # peer id -> when dropped

    @staticmethod
    def _now(now: float | None) -> float:
        return time.monotonic() if now is None else now

    def others(self) -> list[Member]:
        return [m for pid, m in sorted(self.members.items()) if pid != self.me.peer_id]

    def listing(self) -> list[Member]:
        return [m for _, m in sorted(self.members.items())]

    def active(self, round_index: int) -> list[str]:
        """Peer ids in groups for `round_index` (sorted), this peer included if it is active."""
        return sorted(pid for pid, m in self.members.items() if m.active_from <= round_index)

    def add(self, member: Member, now: float | None = None) -> None:
        """Someone contacted us directly (join, heartbeat): (re)admit it, forget any departure."""
        if member.peer_id == self.me.peer_id:
            return
        known = self.members.get(member.peer_id)
        if known is not None and known.public_key != member.public_key:
            return  # the caller refuses it (403); never rebind an id to another key
        self.departed.pop(member.peer_id, None)
        if member.peer_id not in self.members and len(self.members) >= MAX_MEMBERS:
            return
        self.members[member.peer_id] = member
        self.last_heard[member.peer_id] = self._now(now)

    def heard_from(self, peer_id: str, round_index: int | None = None, now: float | None = None) -> None:
        if peer_id in self.members and peer_id != self.me.peer_id:
            self.last_heard[peer_id] = self._now(now)
            if round_index is not None:
                self.members[peer_id] = self.members[peer_id].model_copy(update={"round": round_index})

    def merge(self, listing: Iterable[Member], now: float | None = None) -> list[str]:
        """Learn members from another peer's list; returns the ids that were new to us."""
        now = self._now(now)
        self._expire_tombstones(now)
        new = []
        for member in listing:
            pid = member.peer_id
            if pid == self.me.peer_id or pid in self.departed:
                continue
            if pid not in self.members:
                if len(self.members) >= MAX_MEMBERS:
                    break
                self.members[pid] = member
                self.last_heard[pid] = now
                new.append(pid)
            else:  # keep what we know first-hand, but learn a later active_from decision or round
                known = self.members[pid]
                if known.public_key != member.public_key:
                    continue  # another key claiming a known id: ignored
                if member.round > known.round:
                    self.members[pid] = known.model_copy(update={"round": member.round})
        return new

    def remove(self, peer_id: str, now: float | None = None) -> bool:
        """Drop a member (it left, or is dead); returns whether it was a member."""
        if peer_id == self.me.peer_id or peer_id not in self.members:
            return False
        del self.members[peer_id]
        self.last_heard.pop(peer_id, None)
        self.departed[peer_id] = self._now(now)
        return True

    def sweep(self, now: float | None = None) -> list[str]:
        """Drop every member not heard from for `dead_after` seconds; returns their ids."""
        now = self._now(now)
        dead = [pid for pid, t in self.last_heard.items() if now - t > self.dead_after]
        for pid in dead:
            self.remove(pid, now)
        self._expire_tombstones(now)
        return dead

    def _expire_tombstones(self, now: float) -> None:
        for pid in [p for p, t in self.departed.items() if now - t > self.tombstone_seconds]:
            del self.departed[pid]

    def set_my_round(self, round_index: int) -> None:
        self.me = self.me.model_copy(update={"round": round_index})
        self.members[self.me.peer_id] = self.me
