"""Member lists, heartbeats' bookkeeping, dead-peer removal (coop.gossip.membership) and the inbox."""
import numpy as np
import pytest

from coop.gossip.inbox import Inbox, InboxRefusal
from coop.gossip.membership import Membership
from coop.gossip.payload import Update
from coop.gossip.protocol import Member


def member(pid, active_from=0, round_index=0):
    return Member(peer_id=pid, url=f"http://127.0.0.1:{8000 + len(pid)}", active_from=active_from, round=round_index)


def test_merge_add_and_active_rounds():
    view = Membership(member("a"), dead_after=5)
    assert view.merge([member("a"), member("b"), member("c", active_from=3)], now=0) == ["b", "c"]
    assert view.active(0) == ["a", "b"] and view.active(3) == ["a", "b", "c"]
    assert [m.peer_id for m in view.others()] == ["b", "c"]
    assert view.merge([member("b", round_index=4)], now=1) == []
    assert view.members["b"].round == 4  # a later round is learned, nothing else


def test_dead_peers_are_dropped_and_not_brought_back_second_hand():
    view = Membership(member("a"), dead_after=5, tombstone_seconds=50)
    view.merge([member("b"), member("c")], now=0)
    view.heard_from("b", now=4)
    assert view.sweep(now=6) == ["c"]  # c silent for 6 s > 5 s
    assert sorted(view.members) == ["a", "b"]
    assert view.merge([member("c")], now=7) == []  # another peer has not noticed yet: ignored
    view.add(member("c"), now=8)  # c itself talks to us: back
    assert "c" in view.members and "c" not in view.departed
    view.remove("c", now=9)
    assert view.merge([member("c")], now=100) == ["c"]  # the tombstone expired
    assert view.sweep(now=100) == ["b"]


def test_self_is_never_removed():
    view = Membership(member("a"), dead_after=1)
    assert not view.remove("a") and view.sweep(now=1e9) == []
    view.set_my_round(7)
    assert view.members["a"].round == 7


def _u(pid, r):
    return Update(pid, r, 1, None, {"w": np.zeros(1, np.float32)}, None)


def test_inbox_rounds_window_duplicates_capacity():
    inbox = Inbox(window=2, max_updates=3)
    inbox.add(_u("b", 0))
    inbox.add(_u("c", 2))  # two rounds ahead: filed
    with pytest.raises(InboxRefusal, match="too far ahead"):
        inbox.add(_u("c", 3))
    with pytest.raises(InboxRefusal, match="already received"):
        inbox.add(_u("b", 0))
    inbox.add(_u("d", 1))
    with pytest.raises(InboxRefusal) as full:
        inbox.add(_u("e", 1))
    assert full.value.status == 503
    assert [u.peer_id for u in inbox.close(0)] == ["b"]
    assert inbox.current_round == 1
    with pytest.raises(InboxRefusal, match="closed") as stale:
        inbox.add(_u("x", 0))
    assert stale.value.status == 409
    assert [u.peer_id for u in inbox.close(2)] == ["c"]  # jumping ahead drops round 1's
    assert inbox.count() == 0 and inbox.current_round == 3
