"""BatchTracker: streamed outcomes, per-message timeouts, holds, cancels and ended batches.

Real PartitionManagers in fake time (nothing sleeps), real `Future`s completed by hand, and
`Beat`/`Final` messages written as a task's reporter would send them.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from kspout.contract import Beat, Final, Message, PartitionTask, RootKey, TaskId, TaskResult
from kspout.driver.batches import CANCEL_GRACE, BatchTracker, RunningBatch
from kspout.driver.isolation import Suspects
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import InFlight, PartitionManager, Plan, Span, Waiting
from kspout.policy import Backoff, PartitionPolicy
from tests.unit import pm_helpers

TOPIC = "orders"
TIMEOUT = 5.0
HIGH = 10**9
ACK, FAIL, GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
DEFERRED = OutcomeKind.DEFERRED
EXC, TIMED_OUT = FailReason.EXCEPTION, FailReason.TIMEOUT
# A batch all of whose tasks are stuck is cancelled once they have been on their records for
# another message_timeout, and stayed so for CANCEL_GRACE.
CANCEL_AFTER = 2 * TIMEOUT
POLICY = PartitionPolicy(message_timeout=TIMEOUT, backoff=Backoff(initial=1.0))


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def manager(clock: FakeClock, partition: int = 0) -> PartitionManager:
    return PartitionManager(POLICY, 0, clock, topic=TOPIC, partition=partition)


def two_span_plan(pm: PartitionManager, clock: FakeClock) -> Plan:
    """`[0, 5)` retried at attempt 2 beside new offsets `[10, 20)` at attempt 1."""
    first = pm.plan(HIGH, 10)
    assert first.spans == (Span(0, 10, 1),)
    pm_helpers.fail_range(pm, 0, 5, EXC, "boom")
    pm_helpers.ack_range(pm, 5, 10)
    clock.now += 1.0  # the retries are due
    plan = pm.plan(20, 15)  # Kafka holds [0, 20)
    assert plan.spans == (Span(0, 5, 2), Span(10, 20, 1))
    return plan


def task_id(index: int = 0, batch: int = 1) -> TaskId:
    return TaskId(batch, 0, index)


def beat(
    current: RootKey | None,
    busy_for: float = 0.0,
    *,
    partition: int | None = 0,
    index: int = 0,
    upto: int | None = None,
    failures: tuple[Outcome, ...] = (),
    missing: tuple[tuple[int, int], ...] | None = None,
    done: bool = False,
) -> Beat:
    return Beat(task_id(index), partition, current, busy_for, upto, failures, missing, done)


def fail(offset: int, attempt: int) -> Outcome:
    return Outcome(offset, FAIL, attempt, EXC, "bad record")


def track(
    tracker: BatchTracker, *plans: tuple[int, Plan], batch: int = 1
) -> Future[list[TaskResult]]:
    future: Future[list[TaskResult]] = Future()
    tracker.add(batch, [PartitionTask(TOPIC, p, plan) for p, plan in plans], future)
    return future


def absorb(
    tracker: BatchTracker, pm: PartitionManager, messages: list[Message], now: float
) -> list[list[Outcome]]:
    """Absorb `messages` and apply what they settle, as the driver loop does."""
    out = []
    for _, result in tracker.absorb(messages, now):
        assert result.partition == pm.partition
        pm.apply(result.outcomes, generation=result.generation)
        out.append(result.outcomes)
    return out


# -- streamed outcomes -------------------------------------------------------------------------

# What the task's `finish` returns for the stream below: every planned offset once, ascending.
FULL = [
    Outcome(0, ACK, 2),
    fail(1, 2),
    Outcome(2, ACK, 2, count=2),
    Outcome(4, DEFERRED, 2),
    Outcome(10, ACK, 1),
    fail(11, 1),
    Outcome(12, GONE, count=2),
    Outcome(14, ACK, 1, count=6),
]

BEAT_1 = beat((0, 3), upto=3, failures=(fail(1, 2),), missing=((12, 14),))
STREAMED_1 = [Outcome(0, ACK, 2), fail(1, 2), Outcome(2, ACK, 2)]
BEAT_2 = beat((0, 16), upto=16, failures=(Outcome(4, DEFERRED, 2), fail(11, 1)))
STREAMED_2 = [
    Outcome(3, ACK, 2),
    Outcome(4, DEFERRED, 2),
    Outcome(10, ACK, 1),
    fail(11, 1),
    Outcome(12, GONE, count=2),
    Outcome(14, ACK, 1, count=2),
]
CLIPPED = [Outcome(16, ACK, 1, count=4)]


def check_settled_once(pm: PartitionManager) -> None:
    stats = pm.stats()
    assert stats.acked == 5 + 10  # [5, 10) before; now 0, 2, 3, 10, 14..19
    assert (stats.gaps, stats.lost) == (2, 0)  # GONE: gaps, not lost
    assert stats.deferred == 1
    assert stats.in_flight == 0
    assert stats.waiting == 3  # 1 and 11 wait for a retry, 4 was deferred
    assert stats.stale == 0, "an outcome was applied twice"
    assert stats.timed_out == 0


def test_beats_stream_outcomes_and_the_final_is_clipped(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)
    tracker = BatchTracker(TIMEOUT)
    future = track(tracker, (0, plan))

    assert absorb(tracker, pm, [BEAT_1], clock.now) == [STREAMED_1]
    assert pm.stats().acked == 5 + 2
    assert absorb(tracker, pm, [BEAT_2], clock.now) == [STREAMED_2]
    assert absorb(tracker, pm, [Final(1, (TaskResult(TOPIC, 0, 0, FULL),))], clock.now) == [CLIPPED]
    check_settled_once(pm)

    # A beat after the final result and the job's own result settle nothing again.
    assert absorb(tracker, pm, [beat(None, upto=20, done=True)], clock.now) == []
    future.set_result([TaskResult(TOPIC, 0, 0, list(FULL))])
    [ended] = tracker.ended()
    assert ended.error is None
    assert ended.results == []
    assert len(tracker) == 0
    check_settled_once(pm)


def test_the_jobs_result_is_clipped_to_what_the_stream_did_not_apply(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)
    tracker = BatchTracker(TIMEOUT)
    future = track(tracker, (0, plan))
    absorb(tracker, pm, [BEAT_1, BEAT_2], clock.now)
    assert tracker.ended() == [], "the job still runs"

    future.set_result([TaskResult(TOPIC, 0, 0, list(FULL), out_of_range=(0, 30))])
    [ended] = tracker.ended()
    assert ended.error is None
    [result] = ended.results
    assert result.outcomes == CLIPPED
    assert result.out_of_range == (0, 30), "clipping keeps what else the task said"
    pm.apply(result.outcomes, generation=result.generation)
    check_settled_once(pm)


def test_a_beat_without_progress_settles_nothing_new(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, plan))
    absorb(tracker, pm, [BEAT_1], clock.now)
    again = absorb(tracker, pm, [beat((0, 3), 0.2, upto=3), beat((0, 3), 0.4, upto=3)], clock.now)
    assert again == [[], []]
    assert pm.stats().acked == 5 + 2
    assert pm.stats().stale == 0


def test_messages_for_unknown_batches_and_partitions_are_ignored(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = pm.plan(HIGH, 10)
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, plan))
    other = Beat(TaskId(9, 0, 0), 0, (0, 5), 0.0, upto=5)
    stranger = beat((7, 5), partition=7, upto=5)
    final = Final(9, (TaskResult(TOPIC, 0, 0, [Outcome(0, ACK, 1, count=10)]),))
    assert tracker.absorb([other, stranger, final], clock.now) == []
    assert pm.stats().acked == 0


# -- per-message timeouts ----------------------------------------------------------------------


def test_a_slow_root_times_out_alone_and_the_rest_is_held(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)  # planned at 101: the plan's deadline is 106
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, plan))
    start = clock.now

    # The task settles [0, 3) and then stays on offset 3 (attempt 2), beating every second.
    for second in range(8):
        clock.now = start + 0.5 + second
        busy = float(second)
        absorb(tracker, pm, [beat((0, 3), busy, upto=3)], clock.now)
        assert tracker.watch({0: pm}, clock.now) == []
        stats = pm.stats()
        if busy <= TIMEOUT:
            assert stats.timed_out == 0, f"timed out after {busy}s"
        else:
            assert stats.timed_out == 1, "exactly the slow root times out, once"
        assert pm.expire() == 0, "held offsets never reach the plan's own deadline"
    assert clock.now > start + TIMEOUT + 1.0, "the plan's own deadline has passed"

    state = pm.state_of(3)
    assert isinstance(state, Waiting)
    assert (state.attempt, state.reason) == (2, TIMED_OUT)
    assert state.error is not None and "message_timeout" in state.error
    for offset in [4, *range(10, 20)]:
        held = pm.state_of(offset)
        assert isinstance(held, InFlight), offset
        assert held.deadline > clock.now
    assert pm.stats().stale == 0, "the stuck root was failed once, not on every step"


def test_a_slow_root_times_out_at_its_planned_attempt_only(clock: FakeClock) -> None:
    """The root already timed out by its deadline and runs again at attempt 2 elsewhere: the
    old task still stuck on attempt 1 must not fail the retry."""
    pm = manager(clock)
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, pm.plan(HIGH, 10)))  # [0, 10) at attempt 1, deadline 105
    absorb(tracker, pm, [beat((0, 3), upto=3)], clock.now)
    clock.now = 105.0
    assert pm.expire() == 7  # nobody held them: 3..9 time out by the plan's deadline
    clock.now = 106.0
    assert pm.plan(10, 1).spans == (Span(3, 4, 2),)
    tracker.watch({0: pm}, clock.now)  # 6s on offset 3 for the task of attempt 1
    retry = pm.state_of(3)
    assert isinstance(retry, InFlight)
    assert retry.attempt == 2
    assert pm.stats().timed_out == 7
    assert pm.stats().stale == 1, "attempt 1's timeout is a stale outcome"


def test_a_silent_task_keeps_aging_from_its_last_beat(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = pm.plan(HIGH, 10)  # deadline 105
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, plan))
    absorb(tracker, pm, [beat((0, 3), 1.0, upto=3)], clock.now)  # on 3 for a second already
    tracker.watch({0: pm}, clock.now)

    clock.now += 3.9
    tracker.watch({0: pm}, clock.now)
    assert pm.stats().timed_out == 0, "4.9s on the root: not yet"
    clock.now += 0.2
    tracker.watch({0: pm}, clock.now)
    assert pm.stats().timed_out == 1, "5.1s on the root without a beat: it timed out"
    assert isinstance(pm.state_of(3), Waiting)

    # Nobody beats any more: nothing is held, the plan's own deadline is the fallback.
    clock.now = 105.0
    assert pm.expire() == 6  # 4..9
    assert pm.stats().timed_out == 7


def test_hold_group_keeps_waiting_suspects_from_timing_out(clock: FakeClock) -> None:
    pm = manager(clock)
    pm.plan(HIGH, 10)
    tracker = BatchTracker(TIMEOUT)
    tracker.hold_group(Suspects(0, 0, (Span(2, 5, 1),)), pm, clock.now + 4.0)
    clock.now += TIMEOUT + 1.0
    assert pm.expire() == 7
    assert all(isinstance(pm.state_of(o), InFlight) for o in (2, 3, 4))
    tracker.hold_group(Suspects(0, 1, (Span(2, 5, 1),)), pm, clock.now + 100.0)
    clock.now += 4.0
    assert pm.expire() == 3, "a group of another generation is not held"


# -- cancels -----------------------------------------------------------------------------------


def two_partitions(clock: FakeClock) -> tuple[BatchTracker, dict[int, PartitionManager]]:
    pms = {p: manager(clock, p) for p in (0, 1)}
    tracker = BatchTracker(TIMEOUT)
    track(tracker, *((p, pm.plan(HIGH, 10)) for p, pm in pms.items()))
    return tracker, pms


def test_a_batch_whose_every_task_is_stuck_is_cancelled_once(clock: FakeClock) -> None:
    tracker, pms = two_partitions(clock)
    t0 = clock.now
    tracker.absorb([beat((0, 3)), beat((1, 7), partition=1, index=1)], t0)

    assert tracker.watch(pms, t0 + TIMEOUT) == []
    assert tracker.watch(pms, t0 + TIMEOUT + 0.5) == []
    assert [pm.stats().timed_out for pm in pms.values()] == [1, 1], "both roots timed out"
    # Stuck, but a slow record gets another message_timeout before its batch is cancelled.
    assert tracker.watch(pms, t0 + TIMEOUT + 0.5 + CANCEL_GRACE) == []
    stuck_at = t0 + CANCEL_AFTER
    assert tracker.watch(pms, stuck_at) == [], "stuck long enough, but not for the grace yet"
    assert tracker.watch(pms, stuck_at + CANCEL_GRACE - 0.25) == []
    assert tracker.watch(pms, stuck_at + CANCEL_GRACE) == [1]
    assert tracker.cancelled == 1
    assert tracker.watch(pms, stuck_at + CANCEL_GRACE + 5.0) == [], "returned once"
    assert tracker.cancelled == 1
    [batch] = list(tracker)
    assert batch.cancelled
    assert [pm.stats().timed_out for pm in pms.values()] == [1, 1]


def test_a_batch_is_not_cancelled_while_one_task_progresses(clock: FakeClock) -> None:
    tracker, pms = two_partitions(clock)
    t0 = clock.now
    tracker.absorb([beat((0, 3)), beat((1, 0), partition=1, index=1)], t0)
    for step in range(1, 10):
        now = t0 + step
        progressing = beat((1, step), partition=1, index=1, upto=step)
        tracker.absorb([beat((0, 3), float(step)), progressing], now)
        assert tracker.watch(pms, now) == [], f"cancelled at {step}s while task 1 progresses"
    assert pms[0].stats().timed_out == 1
    assert pms[1].stats().timed_out == 0
    assert tracker.cancelled == 0

    # Task 1 ends: the only open task left is stuck, so the batch goes after the grace.
    end = t0 + 10
    tracker.absorb([beat(None, partition=1, index=1, done=True)], end)
    assert tracker.watch(pms, end) == []
    assert tracker.watch(pms, end + CANCEL_GRACE) == [1]


def test_a_task_stuck_outside_any_record_counts_as_hung(clock: FakeClock) -> None:
    tracker, pms = two_partitions(clock)
    future = next(iter(tracker)).future
    t0 = clock.now
    # Task 0 is fetching (no record) and never gets further; task 1 is on a slow record.
    tracker.absorb([beat(None, 0.0), beat((1, 7), partition=1, index=1)], t0)
    assert tracker.watch(pms, t0 + TIMEOUT) == []
    assert tracker.watch(pms, t0 + TIMEOUT + 0.5) == []
    assert pms[0].stats().timed_out == 0, "nobody's record: nothing is charged"
    assert pms[1].stats().timed_out == 1
    assert tracker.watch(pms, t0 + CANCEL_AFTER) == []
    assert tracker.watch(pms, t0 + CANCEL_AFTER + CANCEL_GRACE) == [1]

    future.set_exception(RuntimeError("Job 3 cancelled part of cancelled job group kspout-1"))
    [ended] = tracker.ended()
    assert ended.error == "Job 3 cancelled part of cancelled job group kspout-1"
    assert ended.results == []
    assert ended.hung_partitions == frozenset({0})
    assert ended.batch.cancelled


def test_a_later_stage_task_hung_outside_blames_every_partition_of_its_batch(
    clock: FakeClock,
) -> None:
    tracker, pms = two_partitions(clock)
    future = next(iter(tracker)).future
    t0 = clock.now
    tracker.absorb([Beat(TaskId(1, 1, 0), None, None, 0.0)], t0)
    tracker.watch(pms, t0 + TIMEOUT + 0.5)
    tracker.watch(pms, t0 + CANCEL_AFTER)
    assert tracker.watch(pms, t0 + CANCEL_AFTER + CANCEL_GRACE) == [1]
    future.set_exception(RuntimeError("cancelled"))
    [ended] = tracker.ended()
    assert ended.hung_partitions == frozenset({0, 1})


def test_a_busy_task_outside_records_within_the_timeout_is_not_hung(clock: FakeClock) -> None:
    tracker, pms = two_partitions(clock)
    future = next(iter(tracker)).future
    t0 = clock.now
    tracker.absorb([beat(None, 0.0)], t0)
    assert tracker.watch(pms, t0 + TIMEOUT - 0.1) == []
    future.set_exception(RuntimeError("Python worker exited unexpectedly (crashed)"))
    [ended] = tracker.ended()
    assert ended.hung_partitions == frozenset()


# -- ended batches -----------------------------------------------------------------------------


def test_a_failed_job_reports_its_error_what_is_open_and_the_last_root_seen(
    clock: FakeClock,
) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)
    tracker = BatchTracker(TIMEOUT)
    future = track(tracker, (0, plan))
    absorb(tracker, pm, [BEAT_1, beat((0, 13), 0.3, upto=13, failures=(fail(11, 1),))], 101.0)
    assert tracker.ended() == []

    error = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "3.0 failed 1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 7) "
        "(localhost executor driver): org.apache.spark.SparkException: Python worker exited "
        "unexpectedly (crashed)"
    )
    future.set_exception(RuntimeError(error))
    [ended] = tracker.ended()
    assert ended.error == error
    assert ended.results == []
    assert ended.hung_partitions == frozenset()
    batch: RunningBatch = ended.batch
    assert batch.open_spans(0) == [Span(13, 20, 1)]
    assert batch.last_seen(0) == 13
    assert len(tracker) == 0
    assert tracker.ended() == []


def test_a_failed_job_without_beats_leaves_its_whole_plan_open(clock: FakeClock) -> None:
    pm = manager(clock)
    plan = two_span_plan(pm, clock)
    tracker = BatchTracker(TIMEOUT)
    future = track(tracker, (0, plan))
    future.set_exception(RuntimeError())
    [ended] = tracker.ended()
    assert ended.error == "RuntimeError"
    assert ended.batch.open_spans(0) == list(plan.spans)
    assert ended.batch.last_seen(0) is None


def test_last_seen_is_the_newest_beat_on_the_partition(clock: FakeClock) -> None:
    pm = manager(clock)
    tracker = BatchTracker(TIMEOUT)
    track(tracker, (0, pm.plan(HIGH, 10)))
    # A first-stage task and a later-stage task both report roots of partition 0.
    tracker.absorb([beat((0, 2))], 100.0)
    tracker.absorb([Beat(TaskId(1, 1, 0), None, (0, 6), 0.0)], 100.5)
    [batch] = list(tracker)
    assert batch.last_seen(0) == 6
    tracker.absorb([beat((0, 4))], 101.0)
    assert batch.last_seen(0) == 4
    assert batch.last_seen(1) is None
