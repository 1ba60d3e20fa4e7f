"""The round state machine on its own: a fake clock, no I/O."""
import pytest

from coop.coordinator.rounds import DeadlinePolicy, Phase, Report, RoundMachine, StaleRound


def machine(first=0, max_rounds=3, min_workers=1, quorum=0.5, now=0.0):
    return RoundMachine(first, max_rounds, min_workers, quorum, DeadlinePolicy(2.0, 1.0, 10.0), now)


def report(worker, seconds=1.0):
    return Report(worker, tokens=100, loss=2.0, seconds=seconds, nbytes=10)


def test_closes_when_every_active_worker_reported():
    m = machine()
    m.record(report("a"), 0)
    assert m.close_reason(0.5, {"a", "b"}) is None
    m.record(report("b"), 0)
    assert "all 2 active" in m.close_reason(0.5, {"a", "b"})


def test_closes_at_the_deadline_with_a_quorum_only():
    m = machine(quorum=0.5)
    assert m.round.deadline_s == 10.0  # no history yet: the upper bound
    m.record(report("a"), 0)
    active = {"a", "b", "c", "d"}
    assert m.quorum(len(active)) == 2
    assert m.close_reason(11.0, active) is None  # deadline passed but 1 < quorum 2
    m.record(report("b"), 0)
    assert m.close_reason(5.0, active) is None  # quorum but the deadline has not passed
    assert "deadline" in m.close_reason(11.0, active)


def test_min_workers_holds_a_round_open():
    m = machine(min_workers=2)
    m.record(report("a"), 0)
    assert m.close_reason(100.0, {"a"}) is None


def test_deadline_adapts_within_bounds():
    policy = DeadlinePolicy(factor=2.0, min_s=1.0, max_s=10.0)
    assert policy.current() == 10.0
    for s in (2.0, 3.0, 4.0):
        policy.observe(s)
    assert policy.current() == 6.0  # 2 x median 3
    for _ in range(3):
        policy.observe(100.0)
    assert policy.current() == 10.0  # 2 x median 52, clamped
    fast = DeadlinePolicy(2.0, 1.0, 10.0)
    fast.observe(0.1)
    assert fast.current() == 1.0


def test_stale_duplicate_ahead_and_aggregating_reports_are_refused_without_change():
    m = machine()
    m.record(report("a"), 0)
    with pytest.raises(StaleRound) as info:
        m.check_can_report("a", 0)
    assert info.value.reason == "duplicate"
    with pytest.raises(StaleRound) as info:
        m.check_can_report("b", 1)
    assert info.value.reason == "ahead"
    m.begin_aggregation()
    with pytest.raises(StaleRound) as info:
        m.check_can_report("b", 0)
    assert info.value.reason == "aggregating"
    assert list(m.round.reports) == ["a"]
    closed = m.finish(now=3.0)
    assert closed.phase is Phase.CLOSED and m.number == 1 and m.phase is Phase.OPEN and m.round.opened_at == 3.0
    with pytest.raises(StaleRound) as info:
        m.check_can_report("b", 0)
    assert info.value.reason == "closed" and info.value.current == 1


def test_run_is_done_after_max_rounds():
    m = machine(max_rounds=1)
    m.record(report("a"), 0)
    m.begin_aggregation()
    m.finish(1.0)
    assert m.done and m.number == 1
    with pytest.raises(StaleRound) as info:
        m.check_can_report("a", 1)
    assert info.value.reason == "done"
    assert m.close_reason(100.0, {"a"}) is None
    assert machine(first=3, max_rounds=3).done  # resumed after the last round


def test_abort_reopens_the_round_without_its_reports():
    m = machine()
    m.record(report("a"), 0)
    m.begin_aggregation()
    m.abort_aggregation()
    assert m.phase is Phase.OPEN and not m.round.reports and m.number == 0
    with pytest.raises(RuntimeError):
        m.finish(1.0)
