"""Member lists, heartbeats' bookkeeping, dead-peer removal (coop.gossip.membership) and the inbox."""
import numpy as np
import pytest

from coop.gossip.identity import Identity, card_bytes
from coop.gossip.inbox import Inbox, InboxRefusal
from coop.gossip.membership import Membership
from coop.gossip.payload import Update
from coop.gossip.protocol import Member

# peer ids derive from keys: one key per name; tests speak of "a", "b", ... and map them
KEYS = {name: Identity.generate() for name in "abcd"}
ID = {name: key.peer_id for name, key in KEYS.items()}


def member(name, active_from=0, round_index=0, key=None):
    key = key or KEYS[name]
    url = f"http://127.0.0.1:{8000 + ord(name)}"
    return Member(peer_id=key.peer_id, url=url, public_key=key.public_key, active_from=active_from, round=round_index,
                  card=key.sign("member", card_bytes(key.peer_id, url, key.public_key)))


def test_merge_add_and_active_rounds():
    view = Membership(member("a"), dead_after=5)
    assert sorted(view.merge([member("a"), member("b"), member("c", active_from=3)], now=0)) == sorted([ID["b"], ID["c"]])
    assert view.active(0) == sorted([ID["a"], ID["b"]]) and view.active(3) == sorted(ID[n] for n in "abc")
    assert [m.peer_id for m in view.others()] == sorted([ID["b"], ID["c"]])
    assert view.merge([member("b", round_index=4)], now=1) == []
    assert view.members[ID["b"]].round == 4  # a later round is learned, nothing else


def test_dead_peers_are_dropped_and_not_brought_back_second_hand():
    view = Membership(member("a"), dead_after=5, tombstone_seconds=50)
    view.merge([member("b"), member("c")], now=0)
    view.heard_from(ID["b"], now=4)
    assert view.sweep(now=6) == [ID["c"]]  # c silent for 6 s > 5 s
    assert sorted(view.members) == sorted([ID["a"], ID["b"]])
    assert view.merge([member("c")], now=7) == []  # another peer has not noticed yet: ignored
    view.add(member("c"), now=8)  # c itself talks to us: back
    assert ID["c"] in view.members and ID["c"] not in view.departed
    view.remove(ID["c"], now=9)
    assert view.merge([member("c")], now=100) == [ID["c"]]  # the tombstone expired
    assert view.sweep(now=100) == [ID["b"]]


def test_self_is_never_removed():
    view = Membership(member("a"), dead_after=1)
    assert not view.remove(ID["a"]) and view.sweep(now=1e9) == []
    view.set_my_round(7)
    assert view.members[ID["a"]].round == 7


def test_a_known_id_is_never_rebound_to_another_key():
    view = Membership(member("a"), dead_after=5)
    view.add(member("b"), now=0)
    impostor = member("b").model_copy(update={"public_key": KEYS["c"].public_key, "url": "http://127.0.0.1:1"})
    view.add(impostor, now=1)  # (a real impostor cannot even make a card: see test_identity.py)
    view.merge([impostor], now=1)
    assert view.members[ID["b"]].public_key == KEYS["b"].public_key and view.members[ID["b"]].url != "http://127.0.0.1:1"


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
