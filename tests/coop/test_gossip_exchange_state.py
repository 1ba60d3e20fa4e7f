"""coop.gossip.transport.exchange_state: whom an exchange still waits for, and who went on without us."""
from coop.gossip.transport import exchange_state

ROUND = 5


def test_a_partner_whose_update_came_is_done():
    past, pending = exchange_state(ROUND, {"a"}, {"a"}, {"a": ROUND + 1}, {"a": "accepted"})
    assert past == {} and pending == []


def test_while_our_push_is_in_flight_we_wait_even_if_the_partner_shows_the_next_round():
    # it merged our update (its heartbeat says round 6) and its own update to us is still on the
    # wire: closing the round now would refuse that update as stale
    past, pending = exchange_state(ROUND, {"a"}, set(), {"a": ROUND + 1}, {})
    assert past == {} and pending == ["a"]


def test_a_partner_that_took_our_update_is_waited_for():
    past, pending = exchange_state(ROUND, {"a"}, set(), {"a": ROUND + 1}, {"a": "accepted"})
    assert past == {} and pending == ["a"]


def test_a_partner_that_closed_the_round_without_us_is_past():
    past, pending = exchange_state(ROUND, {"a", "b"}, set(), {"a": ROUND + 2, "b": ROUND + 1},
                                   {"a": "stale", "b": "failed"})
    assert past == {"a": ROUND + 2, "b": ROUND + 1} and pending == []


def test_a_partner_that_refused_or_was_unreachable_at_this_round_is_not_waited_for():
    past, pending = exchange_state(ROUND, {"a", "b"}, set(), {"a": ROUND, "b": ROUND},
                                   {"a": "refused", "b": "failed"})
    assert past == {} and pending == []


def test_a_partner_that_left_is_neither():
    past, pending = exchange_state(ROUND, {"a", "b"}, set(), {"b": ROUND}, {})
    assert past == {} and pending == ["b"]
