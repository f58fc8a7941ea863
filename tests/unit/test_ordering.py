"""The pure parts of `ordering = key`: blockers, fetch ranges, merging a split partition."""

from __future__ import annotations

from kspout.contract import PartitionTask, TaskResult
from kspout.executor.slices import merge_slices
from kspout.ordering import KeyOrder, blockers_of, fetch_ranges, slice_of
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import Plan, Span

ACK, GONE = OutcomeKind.ACK, OutcomeKind.GONE


def test_blockers_are_the_unfinished_offsets_below_the_plan_end_that_it_does_not_cover() -> None:
    unfinished = [(3, 4), (10, 30), (40, 50)]
    plan = [(12, 15), (20, 35)]
    assert blockers_of(unfinished, plan) == ((3, 4), (10, 12), (15, 20))
    assert blockers_of(unfinished, []) == ()


def test_fetch_ranges_merge_the_plan_and_the_blockers() -> None:
    assert fetch_ranges([(10, 20), (30, 31)], [(2, 3), (20, 25)]) == [(2, 3), (10, 25), (30, 31)]


def test_a_key_always_lands_in_the_same_slice_and_keys_spread() -> None:
    keys = [b"k%d" % i for i in range(200)]
    assert [slice_of(k, 3) for k in keys] == [slice_of(k, 3) for k in keys]
    assert {slice_of(k, 3) for k in keys} == {0, 1, 2}


def test_merging_slices_keeps_every_non_ack_once_and_acks_the_rest_per_span_attempt() -> None:
    plan = Plan((Span(0, 5, 1), Span(5, 10, 2)), generation=0)
    task = PartitionTask("t", 0, plan, KeyOrder())
    fail = Outcome(1, OutcomeKind.FAIL, 1, FailReason.EXCEPTION, "boom")
    gone = Outcome(4, GONE, count=3)  # crosses into the span of attempt 2: seen by both
    deferred = Outcome(8, OutcomeKind.DEFERRED, 2, error="waits")
    first = TaskResult("t", 0, 0, [Outcome(0, ACK, 1), fail, Outcome(2, ACK, 1, count=2), gone])
    second = TaskResult("t", 0, 0, [Outcome(0, ACK, 1, count=4), gone, deferred])

    merged = merge_slices(task, [first, second])

    assert merged.outcomes == [
        Outcome(0, ACK, 1),
        fail,
        Outcome(2, ACK, 1, count=2),
        gone,
        Outcome(7, ACK, 2),
        deferred,
        Outcome(9, ACK, 2),
    ]


def test_a_slice_that_died_speaks_for_the_whole_partition() -> None:
    task = PartitionTask("t", 0, Plan((Span(0, 4, 1),), generation=0), KeyOrder())
    died = TaskResult("t", 0, 0, [], attempt_died=True)
    healthy = TaskResult("t", 0, 0, [Outcome(0, ACK, 1, count=4)])
    assert merge_slices(task, [healthy, died]) is died
