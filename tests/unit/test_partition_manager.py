"""PartitionManager scenarios: each storm-kafka 0.9.3 defect from design.md, replayed on kspout.

Every test runs in fake time (a `FakeClock` the manager reads; nothing sleeps) and names, in its
docstring, the storm-kafka behaviour it guards against. The property test next door
(`test_partition_manager_props.py`) checks arbitrary interleavings against a reference model;
these tests pin down the concrete stories an operator would tell.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace

import pytest

from kspout.errors import PartitionStopped
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import (
    DONE,
    UNPLANNED,
    DeadLetterPending,
    InFlight,
    PartitionManager,
    State,
    Stats,
    Waiting,
)
from kspout.policy import (
    Backoff,
    BehindPolicy,
    ExhaustedPolicy,
    PartitionPolicy,
    Position,
    PositionKind,
)
from tests.unit import pm_helpers

EXC = FailReason.EXCEPTION
HIGH = 10**9  # a high watermark that never limits planning


class FakeClock:
    """Seconds as a plain float the manager reads; tests move it with `advance`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


MakePM = Callable[..., tuple[PartitionManager, FakeClock]]


@pytest.fixture
def make_pm() -> MakePM:
    """Factory: `make_pm(start=0, **policy_fields)` -> (manager, its fake clock)."""

    def make(start: int = 0, **policy: object) -> tuple[PartitionManager, FakeClock]:
        clock = FakeClock()
        pm = PartitionManager(
            PartitionPolicy(**policy),  # type: ignore[arg-type]
            start,
            clock=clock,
            topic="orders",
            partition=3,
        )
        return pm, clock

    return make


def assert_drained(pm: PartitionManager) -> Stats:
    """Nothing in flight, waiting or pending a dead-letter write; commit point at the end."""
    s = pm.stats()
    assert (s.in_flight, s.waiting, s.dead_letter_pending) == (0, 0, 0)
    assert s.commit_point == s.emitted_to
    assert s.spans == 0
    return s


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, adjacent-joined half-open ranges (so tests do not depend on how they are cut)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        assert lo < hi, f"empty range {(lo, hi)}"
        if out and out[-1][1] >= lo:
            assert out[-1][1] == lo, f"overlapping ranges at {lo}"
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


# -- max_offset_behind smaller than one fetch -------------------------------------------------


def test_behind_skip_finishes_failed_offset_and_commit_reaches_end(make_pm: MakePM) -> None:
    """storm-kafka 0.9.3: `fail()` skipped offsets behind `maxOffsetBehind` without removing them
    from `pending`, so the commit stalled at the failed offset forever. Here `skip` counts it
    skipped and the commit point runs through to the end of the fetch."""
    pm, _ = make_pm(max_offset_behind=100, behind_policy=BehindPolicy.SKIP)
    plan = pm.plan(1000, 1000)
    assert plan.ranges() == [(0, 1000)]

    pm.fail(10, EXC, "boom", attempt=1)
    assert pm.stats().skipped == 1
    assert pm.state_of(10) is DONE
    pm_helpers.ack_many(pm, (o for o in range(1000) if o != 10))

    s = assert_drained(pm)
    assert s.commit_point == 1000
    assert (s.acked, s.skipped, s.dead_lettered) == (999, 1, 0)
    assert pm.plan(1000, 1000).ranges() == [], "a skipped offset is never offered again"


def test_behind_dead_letter_tickets_offset_then_commit_reaches_end(make_pm: MakePM) -> None:
    """storm-kafka 0.9.3 orphaned failed offsets behind `maxOffsetBehind` in `pending`; here
    `dead_letter` hands out one ticket for it and, once the record is durable, the commit point
    passes it."""
    pm, _ = make_pm(max_offset_behind=100, behind_policy=BehindPolicy.DEAD_LETTER)
    pm.plan(1000, 1000)
    pm.fail(10, EXC, "boom", attempt=1)
    pm_helpers.ack_many(pm, (o for o in range(1000) if o != 10))
    assert pm.commit_point == 10, "the commit waits for the dead-letter write"

    tickets = pm.take_dead_letters()
    assert [(t.offset, t.attempts, t.reason, t.error, t.cause) for t in tickets] == [
        (10, 1, EXC, "boom", "max_offset_behind")
    ]
    assert pm.take_dead_letters() == [], "a handed ticket is not handed twice"
    assert pm.commit_point == 10
    pm.dead_lettered([10])

    s = assert_drained(pm)
    assert s.commit_point == 1000
    assert (s.acked, s.dead_lettered, s.skipped) == (999, 1, 0)


def test_behind_retry_keeps_retrying_and_commit_waits(make_pm: MakePM) -> None:
    """`behind_policy = retry` never gives up (unlike storm-kafka's silent skip): offset 10 is
    offered again once its backoff is due and the commit point waits at 10 until it is acked."""
    pm, clock = make_pm(
        max_offset_behind=100, behind_policy=BehindPolicy.RETRY, backoff=Backoff(1.0, 2.0, 60.0)
    )
    pm.plan(1000, 1000)
    pm.fail(10, EXC, "boom", attempt=1)
    pm_helpers.ack_many(pm, (o for o in range(1000) if o != 10))
    assert pm.commit_point == 10
    assert isinstance(pm.state_of(10), Waiting)

    clock.advance(0.99)
    assert pm.plan(1000, 1000).ranges() == [], "not offered before its backoff is due"
    clock.advance(0.01)
    plan = pm.plan(1000, 1000)
    assert plan.ranges() == [(10, 11)]
    assert plan.attempt_of(10) == 2
    assert pm.commit_point == 10

    pm_helpers.ack(pm, 10)  # the outcome of attempt 2
    s = assert_drained(pm)
    assert s.commit_point == 1000
    assert (s.acked, s.retried, s.skipped, s.dead_lettered) == (1000, 1, 0, 0)


def test_behind_policy_applies_to_offsets_that_failed_before_falling_behind(
    make_pm: MakePM,
) -> None:
    """storm-kafka 0.9.3 trimmed only `pending` (in `ack`), never `failed`: an offset that failed
    while still close and fell behind later stayed forever. One policy covers both here."""
    pm, _ = make_pm(
        max_offset_behind=100, behind_policy=BehindPolicy.SKIP, backoff=Backoff(60.0, 1.0, 60.0)
    )
    pm.plan(50, 50)
    pm.fail(10, EXC, "boom", attempt=1)
    assert isinstance(pm.state_of(10), Waiting), "not behind yet: waits for its retry"
    pm_helpers.ack_many(pm, (o for o in range(50) if o != 10))

    pm.plan(200, 150)  # emitted_to 200: offset 10 is now 190 behind
    assert pm.state_of(10) is DONE
    assert pm.stats().skipped == 1
    pm_helpers.ack_range(pm, 50, 200)
    assert assert_drained(pm).commit_point == 200


def test_behind_in_flight_offset_times_out_then_policy_applies(make_pm: MakePM) -> None:
    """storm-kafka 0.9.3 dropped far-behind offsets from `pending` on the next ack even while they
    still ran. Here an in-flight offset is never given up while it runs: it times out first, and
    then the behind policy applies, so it is neither orphaned nor silently dropped."""
    pm, clock = make_pm(
        max_offset_behind=100, behind_policy=BehindPolicy.SKIP, message_timeout=10.0
    )
    pm.plan(1000, 1000)
    pm_helpers.ack_many(pm, (o for o in range(1000) if o != 5))
    assert pm.commit_point == 5
    assert isinstance(pm.state_of(5), InFlight), "still running: not given up"

    clock.advance(10.0)
    assert pm.expire() == 1
    s = assert_drained(pm)
    assert (s.timed_out, s.skipped, s.commit_point) == (1, 1, 1000)


# -- poison messages ---------------------------------------------------------------------------


def test_poison_message_does_not_stall_new_work(make_pm: MakePM) -> None:
    """storm-kafka 0.9.3: while any failed offset existed, `fill()` refetched only failed offsets,
    so one poison message stalled the partition forever. Here every plan carries the retry *and*
    new offsets; only the commit point waits at the poison offset."""
    pm, clock = make_pm(max_retries=10**9, backoff=Backoff(0.1, 1.0, 0.1))
    poison = 3
    pm.plan(HIGH, 10)
    pm.fail(poison, EXC, "poison", attempt=1)
    pm_helpers.ack_many(pm, (o for o in range(10) if o != poison))

    for round_ in range(2, 52):
        clock.advance(0.1)
        emitted_before = pm.emitted_to
        plan = pm.plan(HIGH, 10)
        offsets = list(plan)
        assert poison in offsets and plan.attempt_of(poison) == round_
        new = [o for o in offsets if o != poison]
        assert new == list(range(emitted_before, emitted_before + 10)), "new work keeps flowing"
        pm_helpers.ack_many(pm, new)
        pm.fail(poison, EXC, "poison", attempt=round_)
        assert pm.commit_point == poison

    s = pm.stats()
    assert s.emitted_to == 510
    assert (s.waiting, s.in_flight, s.retried) == (1, 0, 50)
    assert s.acked == 509


@pytest.mark.parametrize("exhausted", list(ExhaustedPolicy))
def test_retry_budget_ends_after_exactly_max_retries_plus_one_attempts(
    make_pm: MakePM, exhausted: ExhaustedPolicy
) -> None:
    """storm-kafka 0.9.3 had no retry budget: a poison message was retried forever. Here
    `max_retries=3` allows 4 attempts, each retry waits its exponential backoff (1 s, 2 s,
    4 s), and then the offset is dead-lettered or counted skipped, and the commit passes it."""
    pm, clock = make_pm(max_retries=3, backoff=Backoff(1.0, 2.0, 60.0), on_exhausted=exhausted)
    pm.plan(10, 10)
    pm_helpers.ack_many(pm, (o for o in range(10) if o != 5))
    attempts = 1
    pm.fail(5, EXC, "boom 1", attempt=1)
    for delay in (1.0, 2.0, 4.0):
        clock.advance(delay - 0.001)
        assert pm.plan(10, 100).ranges() == [], f"offered before its {delay}s backoff"
        clock.advance(0.001)
        plan = pm.plan(10, 100)
        assert plan.ranges() == [(5, 6)]
        attempts += 1
        assert plan.attempt_of(5) == attempts
        pm.fail(5, EXC, f"boom {attempts}", attempt=attempts)

    assert attempts == 4
    clock.advance(10_000.0)
    assert pm.plan(10, 100).ranges() == [], "the budget is spent: never offered again"
    s = pm.stats()
    assert s.retried == 3
    if exhausted is ExhaustedPolicy.DEAD_LETTER:
        state = pm.state_of(5)
        assert isinstance(state, DeadLetterPending) and state.attempts == 4
        assert pm.commit_point == 5
        (ticket,) = pm.take_dead_letters()
        assert (ticket.offset, ticket.attempts, ticket.cause) == (5, 4, "retries exhausted")
        assert (ticket.reason, ticket.error) == (EXC, "boom 4")
        pm.dead_lettered([ticket.offset])
        assert pm.stats().dead_lettered == 1
    else:
        assert s.skipped == 1
    assert assert_drained(pm).commit_point == 10


# -- no failure-rate rule ----------------------------------------------------------------------


def test_many_failures_without_any_ack_never_raise(make_pm: MakePM) -> None:
    """storm-kafka 0.9.3 threw when `numberFailed > maxOffsetBehind` with no ack yet, an arbitrary
    rule that killed healthy topologies after an outage. kspout has no failure-rate rule."""
    pm, clock = make_pm(max_offset_behind=100, behind_policy=BehindPolicy.RETRY)
    pm.plan(5000, 5000)
    for o in range(5000):
        pm.fail(o, EXC, "downstream outage", attempt=1)
    s = pm.stats()
    assert (s.waiting, s.acked, s.in_flight, s.commit_point) == (5000, 0, 0, 0)

    clock.advance(10.0)
    plan = pm.plan(5000, 5000)
    assert plan.ranges() == [(0, 5000)], "every failed offset is retried"
    pm_helpers.fail_many(pm, range(5000), EXC, "still down")
    assert pm.stats().waiting == 5000


# -- out of range ------------------------------------------------------------------------------


def _below_low(make_pm: MakePM, **policy: object) -> PartitionManager:
    """commit 20, emitted 100, [30, 40) acked; Kafka will hold [50, 200)."""
    pm, _ = make_pm(**policy)
    pm.plan(100, 100)
    pm_helpers.ack_range(pm, 0, 20)
    pm_helpers.ack_range(pm, 30, 40)
    assert (pm.commit_point, pm.emitted_to) == (20, 100)
    return pm


def test_out_of_range_below_low_earliest_loses_exactly_the_deleted_head(make_pm: MakePM) -> None:
    """Retention deleted offsets the partition still needed (storm-kafka 0.9.3 jumped without
    saying what was lost). `earliest` moves to `low`, counts exactly the unfinished offsets below
    it as lost, and keeps the state of what Kafka still holds."""
    pm = _below_low(make_pm, out_of_range=Position(PositionKind.EARLIEST))
    assert pm.out_of_range(50, 200)
    reset = pm.on_out_of_range(50, 200)
    assert reset is not None
    assert reset.new_start == 50
    assert (reset.old_commit, reset.old_emitted, reset.low, reset.high) == (20, 100, 50, 200)
    assert merged(reset.lost) == [(20, 30), (40, 50)]
    assert reset.lost_count == 20
    assert pm.stats().lost == 20
    assert (pm.commit_point, pm.emitted_to, pm.generation) == (50, 100, 0)
    assert isinstance(pm.state_of(60), InFlight), "offsets Kafka still holds keep their state"
    assert pm.on_out_of_range(50, 200) is None, "in range now"


def test_out_of_range_below_low_latest_counts_everything_skipped(make_pm: MakePM) -> None:
    """`latest` is an explicit choice (storm-kafka 0.9.3 made it silently): every unfinished or
    unread offset below `high` is counted lost, with its exact range."""
    pm = _below_low(make_pm, out_of_range=Position(PositionKind.LATEST))
    reset = pm.on_out_of_range(50, 200)
    assert reset is not None and reset.new_start == 200
    assert merged(reset.lost) == [(20, 30), (40, 200)]
    assert reset.lost_count == pm.stats().lost == 170
    assert (pm.commit_point, pm.emitted_to, pm.generation) == (200, 200, 1)
    assert pm.plan(250, 10).ranges() == [(200, 210)]


@pytest.mark.parametrize(
    ("timestamp_offset", "expected_start"),
    [(70, 70), (None, 50), (10, 50)],
    ids=["resolved", "no-offset-falls-back-to-earliest", "below-low-clamped"],
)
def test_out_of_range_below_low_timestamp(
    make_pm: MakePM, timestamp_offset: int | None, expected_start: int
) -> None:
    """storm-kafka 0.9.3 with `useStartOffsetTimeIfOffsetOutOfRange` but not `forceFromStart`
    silently jumped to the *latest* offset. `timestamp:<ms>` moves to the resolved offset, and
    with no such offset falls back to `earliest`, never to `latest`."""
    pm = _below_low(make_pm, out_of_range=Position(PositionKind.TIMESTAMP, 1_700_000_000_000))
    reset = pm.on_out_of_range(50, 200, timestamp_offset=timestamp_offset)
    assert reset is not None and reset.new_start == expected_start
    expected_lost = merged([(20, 30), (40, expected_start)])
    assert merged(reset.lost) == expected_lost
    assert pm.stats().lost == sum(hi - lo for lo, hi in expected_lost)
    assert pm.commit_point == expected_start


def test_out_of_range_fail_stops_partition_and_changes_nothing(make_pm: MakePM) -> None:
    """`fail` stops the partition with an error naming the offset and Kafka's range, and leaves
    the state untouched so an operator can decide (storm-kafka 0.9.3 had no such option)."""
    pm = _below_low(make_pm, out_of_range=Position(PositionKind.FAIL))
    before = (pm.stats(), pm.commit_point, pm.emitted_to, pm.generation)
    with pytest.raises(PartitionStopped) as info:
        pm.on_out_of_range(50, 200)
    err = info.value
    assert (err.topic, err.partition, err.offset, err.low, err.high) == ("orders", 3, 20, 50, 200)
    assert "kspout offsets set" in str(err)
    assert (pm.stats(), pm.commit_point, pm.emitted_to, pm.generation) == before
    assert isinstance(pm.state_of(20), InFlight)


def _above_high(make_pm: MakePM, **policy: object) -> PartitionManager:
    """commit 600, emitted 1000; then the partition is recreated and Kafka holds [0, 500)."""
    pm, _ = make_pm(**policy)
    pm.plan(1000, 1000)
    pm_helpers.ack_range(pm, 0, 600)
    return pm


def test_out_of_range_above_high_earliest_moves_back_and_ignores_old_epoch(
    make_pm: MakePM,
) -> None:
    """A truncated or recreated partition (emitted_to > high): `earliest` moves the commit point
    back to `low`, bumps the generation, counts the vanished unfinished offsets as lost, and ignores
    outcomes of plans made before the reset."""
    pm = _above_high(make_pm, out_of_range=Position(PositionKind.EARLIEST))
    reset = pm.on_out_of_range(0, 500)
    assert reset is not None and reset.new_start == 0
    assert merged(reset.lost) == [(600, 1000)]
    assert pm.stats().lost == 400
    assert (pm.commit_point, pm.emitted_to, pm.generation) == (0, 0, 1)

    plan = pm.plan(500, 500)
    assert plan.generation == 1 and plan.ranges() == [(0, 500)]
    stale_before = pm.stats().stale
    pm_helpers.ack(pm, 0, generation=0)
    pm.fail(1, EXC, "old", 1, generation=0)
    pm.apply([Outcome(2, OutcomeKind.ACK, 1), Outcome(3, OutcomeKind.ACK, 1)], generation=0)
    assert pm.commit_point == 0
    assert all(isinstance(pm.state_of(o), InFlight) for o in range(4))
    assert pm.stats().stale == stale_before + 4

    pm.apply([Outcome(o, OutcomeKind.ACK, 1) for o in range(500)], generation=plan.generation)
    assert assert_drained(pm).commit_point == 500


def test_out_of_range_above_high_latest(make_pm: MakePM) -> None:
    """Above `high` with `latest`: resume at `high`; the unfinished offsets Kafka no longer has
    are counted lost with their exact range."""
    pm = _above_high(make_pm, out_of_range=Position(PositionKind.LATEST))
    reset = pm.on_out_of_range(0, 500)
    assert reset is not None and reset.new_start == 500
    assert merged(reset.lost) == [(600, 1000)]
    assert (pm.commit_point, pm.emitted_to, pm.generation) == (500, 500, 1)
    assert pm.plan(600, 100).ranges() == [(500, 600)]


# -- timeouts ----------------------------------------------------------------------------------


def test_timeout_fails_in_flight_offset_and_late_ack_still_counts(make_pm: MakePM) -> None:
    """storm-kafka relied on Storm's topology timeout, which only replays; kspout fails an attempt
    past `message_timeout` with TIMEOUT, and a late ACK of that attempt is applied (the work was
    done; the retry will find it DUPLICATE)."""
    pm, clock = make_pm(message_timeout=10.0, backoff=Backoff(1.0, 2.0, 60.0))
    pm.plan(10, 10)
    pm_helpers.ack_many(pm, (o for o in range(10) if o != 3))

    clock.advance(9.999)
    assert pm.plan(10, 10).ranges() == []
    assert isinstance(pm.state_of(3), InFlight)
    clock.advance(0.001)
    assert pm.plan(10, 10).ranges() == [], "timed out now, retry not yet due"
    state = pm.state_of(3)
    assert isinstance(state, Waiting) and state.reason is FailReason.TIMEOUT
    assert pm.stats().timed_out == 1

    pm_helpers.ack(pm, 3)  # the outcome of attempt 1
    s = assert_drained(pm)
    assert (s.acked, s.commit_point) == (10, 10)


def test_timeout_late_ack_after_retry_planned_finishes_offset(make_pm: MakePM) -> None:
    """The retry of a timed-out offset is in flight when the original finishes: the late ACK is
    applied and the retry's own outcome is then stale."""
    pm, clock = make_pm(message_timeout=10.0, backoff=Backoff(1.0, 2.0, 60.0))
    pm.plan(1, 1)
    clock.advance(10.0)
    assert pm.expire() == 1  # retry due at 11.0
    clock.advance(1.0)
    plan = pm.plan(1, 1)
    assert plan.attempt_of(0) == 2
    pm_helpers.ack(pm, 0)  # the outcome of attempt 1
    assert pm.commit_point == 1
    stale = pm.stats().stale
    pm_helpers.duplicate(pm, 0)  # the outcome of attempt 2
    s = pm.stats()
    assert (s.acked, s.duplicates, s.stale) == (1, 0, stale + 1)


def test_timeout_late_fail_of_old_attempt_is_ignored(make_pm: MakePM) -> None:
    """A FAIL from an attempt that already timed out is stale: it must neither spend a second
    retry nor fail the attempt now in flight."""
    pm, clock = make_pm(message_timeout=10.0, backoff=Backoff(1.0, 2.0, 60.0))
    pm.plan(1, 1)
    clock.advance(10.0)
    assert pm.expire() == 1
    waiting = pm.state_of(0)
    assert isinstance(waiting, Waiting) and waiting.reason is FailReason.TIMEOUT

    pm.fail(0, EXC, "late", attempt=1)
    assert pm.state_of(0) is waiting, "a late FAIL does not touch the waiting retry"
    assert pm.stats().stale == 1

    clock.advance(1.0)
    assert pm.plan(1, 1).attempt_of(0) == 2
    pm.fail(0, EXC, "late", attempt=1)
    state = pm.state_of(0)
    assert isinstance(state, InFlight) and state.attempt == 2
    assert pm.stats().stale == 2
    pm_helpers.ack(pm, 0)  # the outcome of attempt 2
    assert assert_drained(pm).timed_out == 1


# -- DEFERRED / DUPLICATE / GONE ---------------------------------------------------------------


def test_deferred_does_not_spend_retry_budget(make_pm: MakePM) -> None:
    """A DEFERRED outcome (live dedup lease elsewhere) is not a failure: after deferring many
    times the offset still gets its full `max_retries` retries."""
    pm, clock = make_pm(max_retries=2, defer_delay=1.0, backoff=Backoff(0.5, 1.0, 0.5))
    pm.plan(1, 1)
    attempt = 1
    for _ in range(6):
        pm_helpers.defer(pm, 0, attempt=attempt)
        state = pm.state_of(0)
        assert isinstance(state, Waiting) and state.reason is None
        clock.advance(0.999)
        assert pm.plan(1, 1).ranges() == [], "deferred offsets wait `defer_delay`"
        clock.advance(0.001)
        attempt += 1
        assert pm.plan(1, 1).attempt_of(0) == attempt

    failures = 0
    while isinstance(pm.state_of(0), InFlight):
        pm.fail(0, EXC, "boom", attempt=attempt)
        failures += 1
        clock.advance(0.5)
        plan = pm.plan(1, 1)
        if plan:
            attempt = plan.attempt_of(0)
    assert failures == 3, "max_retries=2: the first try and two retries, deferrals not counted"
    s = pm.stats()
    assert (s.deferred, s.retried, s.dead_letter_pending) == (6, 2, 1)


def test_duplicate_counts_as_ack(make_pm: MakePM) -> None:
    """DUPLICATE (the dedup bolt found the work already done) finishes the offset like an ACK."""
    pm, _ = make_pm()
    pm.plan(10, 10)
    pm_helpers.duplicate(pm, 0)
    pm.apply([Outcome(o, OutcomeKind.DUPLICATE, 1) for o in range(1, 5)], generation=pm.generation)
    pm_helpers.ack_range(pm, 5, 10)
    s = assert_drained(pm)
    assert (s.duplicates, s.acked, s.commit_point) == (5, 5, 10)


# -- backpressure ------------------------------------------------------------------------------


def test_max_uncommitted_blocks_new_offsets_but_not_due_retries(make_pm: MakePM) -> None:
    """Bounded like Storm's `max.spout.pending`: no new offsets while `emitted_to - commit_point`
    reaches `max_uncommitted`; due retries are still planned (they are what unblocks it)."""
    pm, clock = make_pm(max_uncommitted=100, backoff=Backoff(1.0, 1.0, 1.0))
    assert pm.plan(HIGH, 60).ranges() == [(0, 60)]
    assert pm.plan(HIGH, 60).ranges() == [(60, 100)], "only up to max_uncommitted"
    assert pm.plan(HIGH, 60).ranges() == []

    pm.fail(5, EXC, "boom", attempt=1)
    pm_helpers.ack_many(pm, range(50, 100))
    clock.advance(1.0)
    plan = pm.plan(HIGH, 60)
    assert plan.ranges() == [(5, 6)], "the retry goes out, no new work (100 uncommitted)"
    assert plan.attempt_of(5) == 2

    pm_helpers.ack_many(pm, (o for o in range(50) if o != 5))
    assert pm.commit_point == 5
    assert pm.plan(HIGH, 60).ranges() == [(100, 105)], "95 uncommitted: room for 5"
    assert pm.plan(HIGH, 60).ranges() == []
    pm_helpers.ack(pm, 5)  # the outcome of attempt 2
    assert pm.commit_point == 100
    assert pm.plan(HIGH, 60).ranges() == [(105, 165)]


# -- memory ------------------------------------------------------------------------------------


def test_million_in_flight_offsets_cost_one_span(make_pm: MakePM) -> None:
    """storm-kafka kept a `TreeSet<Long>` entry per pending offset; here a planned range is one
    span however long."""
    pm, _ = make_pm()
    pm.plan(10**6, 10**6)
    s = pm.stats()
    assert (s.in_flight, s.spans) == (10**6, 1)
    pm_helpers.ack_range(pm, 0, 10**6)
    assert assert_drained(pm).commit_point == 10**6


def test_spans_grow_with_gaps_and_shrink_back(make_pm: MakePM) -> None:
    """Memory follows the number of gaps: acking every other offset of a 1000-range makes ~1000
    spans; acking the rest returns to zero."""
    pm, _ = make_pm()
    pm.plan(1000, 1000)
    for o in range(0, 1000, 2):
        pm_helpers.ack(pm, o)
    s = pm.stats()
    assert 990 <= s.spans <= 1000
    assert s.in_flight == 500
    for o in range(1, 1000, 2):
        pm_helpers.ack(pm, o)
    assert assert_drained(pm).commit_point == 1000


# -- batch paths -------------------------------------------------------------------------------


def _mixed_outcomes(rng: random.Random, n: int) -> list[Outcome]:
    """Runs of random kinds (ACK-heavy), some attempts stale, in offset order."""
    kinds = [OutcomeKind.ACK] * 6 + [
        OutcomeKind.FAIL,
        OutcomeKind.DUPLICATE,
        OutcomeKind.DEFERRED,
        OutcomeKind.GONE,
    ]
    out: list[Outcome] = []
    o = 0
    while o < n:
        kind = rng.choice(kinds)
        attempt = rng.choice([None, 1, 1, 1, 2])
        reason = rng.choice(list(FailReason)) if kind is OutcomeKind.FAIL else None
        for _ in range(rng.randint(1, 30)):
            if o >= n:
                break
            if rng.random() > 0.1:  # leave some offsets without an outcome
                out.append(Outcome(o, kind, attempt, reason, "e" if reason else None))
            o += 1
    return out


def _run_length(outcomes: list[Outcome]) -> list[Outcome]:
    """Merge contiguous alike outcomes into counted ones."""
    out: list[Outcome] = []
    for o in outcomes:
        last = out[-1] if out else None
        if (
            last is not None
            and last.offset + last.count == o.offset
            and (last.kind, last.attempt, last.reason, last.error)
            == (o.kind, o.attempt, o.reason, o.error)
        ):
            out[-1] = replace(last, count=last.count + 1)
        else:
            out.append(o)
    return out


def _apply_one(pm: PartitionManager, out: Outcome) -> None:
    if out.kind is OutcomeKind.ACK:
        pm_helpers.ack(pm, out.offset)
    elif out.kind is OutcomeKind.FAIL:
        assert out.reason is not None
        pm.fail(out.offset, out.reason, out.error, out.attempt)
    elif out.kind is OutcomeKind.DUPLICATE:
        pm_helpers.duplicate(pm, out.offset)
    elif out.kind is OutcomeKind.DEFERRED:
        pm_helpers.defer(pm, out.offset, out.attempt)
    else:
        pm_helpers.gone(pm, out.offset)


def _state_key(value: State | None) -> object:
    """A state's type and fields (sentinels as they are)."""
    if value is None or value is DONE or value is UNPLANNED:
        return value
    assert isinstance(value, tuple)
    return (type(value).__name__, *value)


@pytest.mark.parametrize("seed", range(5))
def test_apply_batch_equals_outcomes_one_by_one(make_pm: MakePM, seed: int) -> None:
    """`apply` groups consecutive outcomes into ranges; the result must equal applying the same
    outcomes one call at a time, including stale attempts and a second round after retries,
    and equal applying them run-length encoded (counted outcomes, as executors send them)."""
    rng = random.Random(seed)
    policy = {"max_retries": 1, "backoff": Backoff(1.0, 1.0, 1.0), "max_offset_behind": 150}
    policy["behind_policy"] = rng.choice(list(BehindPolicy))
    batch_pm, batch_clock = make_pm(**policy)
    single_pm, single_clock = make_pm(**policy)
    counted_pm, counted_clock = make_pm(**policy)
    for _ in range(3):
        plans = [pm.plan(HIGH, 400) for pm in (batch_pm, single_pm, counted_pm)]
        assert plans[0] == plans[1] == plans[2]
        outcomes = _mixed_outcomes(rng, batch_pm.emitted_to)
        batch_pm.apply(outcomes, generation=batch_pm.generation)
        for out in outcomes:
            _apply_one(single_pm, out)
        encoded = _run_length(outcomes)
        assert len(encoded) < len(outcomes)
        counted_pm.apply(encoded, generation=counted_pm.generation)
        assert counted_pm.stats() == batch_pm.stats()
        assert all(
            _state_key(counted_pm.state_of(o)) == _state_key(batch_pm.state_of(o))
            for o in range(batch_pm.emitted_to)
        )
        # Equal in everything but memory: single `fail` calls give each offset its own state
        # object, so neighbours failed one call at a time do not merge; a batch run does.
        batch_stats, single_stats = batch_pm.stats(), single_pm.stats()
        assert replace(batch_stats, spans=0) == replace(single_stats, spans=0)
        assert batch_stats.spans <= single_stats.spans
        assert batch_pm.commit_point == single_pm.commit_point
        for o in range(batch_pm.emitted_to):
            assert _state_key(batch_pm.state_of(o)) == _state_key(single_pm.state_of(o)), o
        tickets = batch_pm.take_dead_letters()
        assert tickets == single_pm.take_dead_letters() == counted_pm.take_dead_letters()
        batch_clock.advance(1.0)
        single_clock.advance(1.0)
        counted_clock.advance(1.0)
    assert batch_pm.stats().acked > 0 and batch_pm.stats().retried > 0


def test_ack_many_accepts_unsorted_input(make_pm: MakePM) -> None:
    """`ack_many` coalesces runs of consecutive offsets; a shuffled batch (Spark returns outcomes
    in task order, not offset order) must give the same result as a sorted one."""
    rng = random.Random(11)
    offsets = [o for o in range(1000) if o % 97 != 0]
    shuffled = offsets[:]
    rng.shuffle(shuffled)
    sorted_pm, _ = make_pm()
    shuffled_pm, _ = make_pm()
    for pm, batch in ((sorted_pm, offsets), (shuffled_pm, shuffled)):
        pm.plan(1000, 1000)
        pm_helpers.ack_many(pm, iter(batch))
    s = shuffled_pm.stats()
    assert s == sorted_pm.stats()
    assert (s.acked, s.in_flight, s.stale, s.commit_point) == (len(offsets), 11, 0, 0)
    assert all(isinstance(shuffled_pm.state_of(o), InFlight) for o in range(0, 1000, 97))

    # duplicates in a batch count as stale
    pm_helpers.ack_many(shuffled_pm, [679, 0, 388, 0, 97, 679])
    pm_helpers.ack_many(shuffled_pm, reversed(range(0, 1000, 97)))
    s = shuffled_pm.stats()
    assert (s.acked, s.stale, s.commit_point, s.spans) == (1000, 2 + 4, 1000, 0)


def test_fail_many_and_dead_lettered_accept_unsorted_input(make_pm: MakePM) -> None:
    """The other batch calls share `ack_many`'s run coalescing: unsorted input must work too."""
    pm, _ = make_pm(max_retries=0)
    pm.plan(100, 100)
    pm_helpers.fail_many(pm, [50, 10, 11, 90, 12], EXC, "boom")
    assert pm.stats().dead_letter_pending == 5
    tickets = pm.take_dead_letters()
    assert [t.offset for t in tickets] == [10, 11, 12, 50, 90]
    pm.dead_lettered([90, 12, 50, 10, 11])
    pm_helpers.ack_many(pm, (o for o in range(100) if o not in {10, 11, 12, 50, 90}))
    s = assert_drained(pm)
    assert (s.dead_lettered, s.acked) == (5, 95)


def test_acking_separately_planned_offsets_in_reverse_reaches_the_end(make_pm: MakePM) -> None:
    """Regression: three one-offset plans acked newest first. Each ack finishes a whole span
    whose right neighbour is already DONE; the commit point must reach 3 with nothing left in
    flight (a SpanMap fast path once resurrected the acked offset 2 as in flight)."""
    pm, _ = make_pm()
    for _ in range(3):
        pm.plan(3, 1)
    assert pm.stats().spans == 3
    pm_helpers.ack(pm, 2)
    pm_helpers.ack(pm, 1)
    assert pm.state_of(2) is DONE
    pm_helpers.ack(pm, 0)
    s = assert_drained(pm)
    assert (s.acked, s.commit_point) == (3, 3)


def test_failed_dead_letter_write_hands_the_offset_out_again(make_pm: MakePM) -> None:
    """A dead letter whose write failed is not lost: it is handed out again, and the commit
    point passes it only once a write is confirmed."""
    pm, _ = make_pm(max_retries=0)
    pm.plan(10, 10)
    pm.fail(4, EXC, "boom")
    pm_helpers.ack_many(pm, (o for o in range(10) if o != 4))
    first = pm.take_dead_letters()
    assert [t.offset for t in first] == [4]
    assert pm.take_dead_letters() == [], "handed out once until the write settles"
    pm.dead_letter_failed([4])
    assert pm.commit_point == 4
    again = pm.take_dead_letters()
    assert again == first
    pm.dead_lettered([4])
    s = assert_drained(pm)
    assert (s.commit_point, s.dead_lettered) == (10, 1)


# -- restart: finished spans restored from the stored record --------------------------------------


def test_restored_spans_are_done_counted_apart_and_skipped() -> None:
    """After a restart at 100 with [103, 110) and [112, 200) finished, only the gaps run again;
    the commit point moves over the restored spans as over acked ones."""
    pm = PartitionManager(PartitionPolicy(), 100, FakeClock(), finished=[(103, 110), (112, 200)])
    s = pm.stats()
    assert (s.restored, s.acked, s.unplanned) == (95, 0, 5)
    assert (pm.commit_point, pm.emitted_to) == (100, 200)
    plan = pm.plan(200, 4)  # the high watermark holds new offsets back: only gaps
    assert plan.ranges() == [(100, 103), (110, 111)], "the gaps, lowest first"
    assert {plan.attempt_of(o) for o in plan} == {1}, "a first attempt, like a new offset"
    pm_helpers.ack_many(pm, range(100, 103))
    assert pm.commit_point == 110
    pm_helpers.ack(pm, 110)
    assert pm.finished_spans(10) == ([(112, 200)], None)
    assert pm.plan(HIGH, 3).ranges() == [(111, 112), (200, 203)]
    pm_helpers.ack(pm, 111)
    assert pm.commit_point == 200 and pm.stats().acked == 5
