"""How `foreach_batch` settles a batch: only offsets every evaluation of the frame fetched are
acked; offsets Kafka never had are GONE; offsets a fetch was cut off before stay unfinished and
go to the out-of-range policy. A batch no evaluation reported on is acked within Kafka's
watermarks; a raising batch fails whole."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from itertools import pairwise

from hypothesis import assume, given
from hypothesis import strategies as st

from kspout.contract import PartitionTask
from kspout.errors import KafkaAccessDenied
from kspout.executor.task import CUT_SHORT
from kspout.kafka import FetchResult, Record
from kspout.outcomes import FailReason, Failure, Outcome, OutcomeKind
from kspout.partition_manager import Plan, Span
from kspout.spark.frames import FrameReport, FrameReportsParam, _settled, settle_fetched

ACK, FAIL, GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
TASK = PartitionTask("t", 2, Plan((Span(0, 4, 2), Span(4, 10, 1)), generation=5))
WIDE = PartitionTask("t", 0, Plan((Span(100, 1000, 1),), generation=0))


def records(offsets: Iterable[int]) -> list[Record]:
    return [Record("t", 0, o, None, b"v%d" % o, -1, ()) for o in offsets]


def fetch(
    offsets: Iterable[int],
    missing: Sequence[tuple[int, int]] = (),
    out_of_range: tuple[int, int] | None = None,
) -> FetchResult:
    return FetchResult(records(offsets), list(missing), out_of_range)


def report(task: PartitionTask, fetched: FetchResult) -> FrameReport:
    return FrameReport.of(task.plan.ranges(), fetched)


def evaluations(task: PartitionTask, *fetches: FetchResult) -> FrameReport:
    """What the driver's accumulator holds after one evaluation per fetch (any order)."""
    param = FrameReportsParam()
    value = param.zero({})
    for fetched in fetches:
        value = param.addInPlace(value, {(7, task.partition): report(task, fetched)})
    return value[(7, task.partition)]


# -- a batch no evaluation reported on, and a raising batch (unchanged) -----------------------


def cut(lo: int, hi: int, attempt: int = 1) -> Outcome:
    """A cut offset range: released (no attempt spent), left to the out-of-range policy."""
    return Outcome(lo, OutcomeKind.RELEASED, attempt, error=CUT_SHORT, count=hi - lo)


def test_a_returned_batch_is_acked_span_by_span() -> None:
    result = _settled(TASK, low=0, high=10)
    assert result.outcomes == [Outcome(0, ACK, 2, count=4), Outcome(4, ACK, 1, count=6)]
    assert result.out_of_range is None and result.generation == 5


def test_offsets_outside_the_watermarks_are_reported_not_acked() -> None:
    result = _settled(TASK, low=2, high=8)  # retention below, a truncated log above
    assert result.outcomes == [Outcome(2, ACK, 2, count=2), Outcome(4, ACK, 1, count=4)]
    assert result.out_of_range == (2, 8)


def test_a_raising_batch_fails_every_planned_offset() -> None:
    failure = Failure("ValueError", "boom", "job.py:7", "Traceback ...")
    result = _settled(TASK, failure=failure)
    reason = FailReason.EXCEPTION
    assert result.outcomes == [
        Outcome(0, FAIL, 2, reason, "ValueError: boom", 4),
        Outcome(4, FAIL, 1, reason, "ValueError: boom", 6),
    ]
    assert all(o.failure is failure for o in result.outcomes)


# -- settled by what was fetched ----------------------------------------------------------------


def test_a_whole_fetch_is_acked_span_by_span() -> None:
    result = settle_fetched(TASK, evaluations(TASK, fetch(range(10))))
    assert result.outcomes == [Outcome(0, ACK, 2, count=4), Outcome(4, ACK, 1, count=6)]
    assert result.out_of_range is None and result.generation == 5 and result.partition == 2


def test_low_moving_past_the_start_of_the_plan_acks_nothing() -> None:
    """Retention moved low to 150 before the fetch reached 100: 100..149 are gone, 150..999
    were never read. None of it was in the frame, so none of it is acked."""
    unfetched = evaluations(WIDE, fetch([], out_of_range=(150, 2000)))
    assert unfetched == FrameReport(((100, 1000),), (), (150, 2000))

    result = settle_fetched(WIDE, unfetched)
    assert result.outcomes == [cut(100, 1000)]
    assert result.out_of_range == (150, 2000)


def test_a_fetch_cut_midway_acks_only_what_it_read() -> None:
    """The fetch read 100..119, then low passed 120 (it is 150 now): only 100..119 are acked."""
    result = settle_fetched(WIDE, evaluations(WIDE, fetch(range(100, 120), (), (150, 2000))))
    assert result.outcomes == [Outcome(100, ACK, 1, count=20), cut(120, 1000)]
    assert result.out_of_range == (150, 2000)


def test_a_cut_across_spans_of_several_attempts() -> None:
    """Retries at attempts 2 and 3 before new offsets at attempt 1; the fetch stopped at 6."""
    task = PartitionTask(
        "t",
        0,
        Plan((Span(0, 4, 2), Span(4, 10, 1), Span(20, 22, 3), Span(30, 40, 1)), generation=1),
    )
    unfetched = evaluations(task, fetch(range(6), out_of_range=(8, 100)))
    assert unfetched.cut == ((6, 10), (20, 22), (30, 40))

    result = settle_fetched(task, unfetched)
    assert result.outcomes == [
        Outcome(0, ACK, 2, count=4),
        Outcome(4, ACK, 1, count=2),
        cut(6, 10),
        cut(20, 22, 3),
        cut(30, 40),
    ]
    assert result.out_of_range == (8, 100)


def test_offsets_kafka_never_had_are_gone_not_acked() -> None:
    """Compaction and transaction markers: `missing` inside the watermarks, no cut."""
    task = PartitionTask(
        "t", 0, Plan((Span(0, 4, 2), Span(4, 10, 1), Span(20, 25, 3)), generation=1)
    )
    fetched = fetch([0, 1, 3, 4, 5, 6, 7, 8, 9, 20, 23, 24], missing=[(2, 3), (21, 23)])
    result = settle_fetched(task, evaluations(task, fetched))
    assert result.outcomes == [
        Outcome(0, ACK, 2, count=2),
        Outcome(2, GONE, 2),
        Outcome(3, ACK, 2),
        Outcome(4, ACK, 1, count=6),
        Outcome(20, ACK, 3),
        Outcome(21, GONE, 3, count=2),
        Outcome(23, ACK, 3, count=2),
    ]
    assert result.out_of_range is None


def test_missing_offsets_before_a_cut_are_gone_and_the_rest_unsettled() -> None:
    fetched = fetch([100, 101, 105], missing=[(102, 105)], out_of_range=(300, 2000))
    unfetched = evaluations(WIDE, fetched)
    assert unfetched == FrameReport(((106, 1000),), ((102, 105),), (300, 2000))
    result = settle_fetched(WIDE, unfetched)
    assert result.outcomes == [
        Outcome(100, ACK, 1, count=2),
        Outcome(102, GONE, 1, count=3),
        Outcome(105, ACK, 1),
        cut(106, 1000),
    ]
    assert result.out_of_range == (300, 2000)


def test_an_offset_counts_only_if_every_evaluation_fetched_it() -> None:
    """`f` wrote the frame twice; retention cut the second evaluation at 130."""
    whole = fetch(range(100, 1000))
    short = fetch(range(100, 130), out_of_range=(200, 2000))
    for order in ((whole, short), (short, whole)):
        result = settle_fetched(WIDE, evaluations(WIDE, *order))
        assert result.outcomes == [Outcome(100, ACK, 1, count=30), cut(130, 1000)]
        assert result.out_of_range == (200, 2000)


def test_two_cut_evaluations_keep_the_union_of_cuts_and_the_latest_watermarks() -> None:
    first = fetch(range(100, 400), out_of_range=(420, 1500))
    second = fetch([], out_of_range=(700, 2500))  # low moved on: nothing read at all
    result = settle_fetched(WIDE, evaluations(WIDE, first, second))
    assert result.outcomes == [cut(100, 1000)]
    assert result.out_of_range == (700, 2500)


def test_the_highest_records_leader_epoch_goes_to_the_driver_with_the_result() -> None:
    """What the driver validates to find a truncated log: of several evaluations, the highest
    record fetched, whether its fetch was cut or whole."""
    before = FetchResult(records(range(100, 120)), [], (150, 2000), (120, 4))
    after = FetchResult(records(range(100, 1000)), [], None, (1000, 5))
    result = settle_fetched(WIDE, evaluations(WIDE, after, before))
    assert result.leader_epoch == (1000, 5)
    assert settle_fetched(WIDE, evaluations(WIDE, before)).leader_epoch == (120, 4)
    assert settle_fetched(WIDE, evaluations(WIDE, fetch([]))).leader_epoch is None


def test_reports_counted_twice_change_nothing_and_stay_apart_by_batch_and_partition() -> None:
    """Spark may rerun a task (and its accumulator update); batches share one accumulator."""
    param = FrameReportsParam()
    cut = report(WIDE, fetch(range(100, 130), out_of_range=(200, 2000)))
    whole = report(WIDE, fetch(range(100, 1000)))
    value = param.addInPlace(param.zero({}), {(1, 0): cut, (1, 3): whole})
    value = param.addInPlace(value, {(1, 0): cut, (2, 0): whole})
    value = param.addInPlace(value, pickle.loads(pickle.dumps({(1, 0): whole})))
    assert value == {(1, 0): cut, (1, 3): whole, (2, 0): whole}
    assert pickle.loads(pickle.dumps(param)).zero(value) == {}


def test_a_refused_fetch_is_kept_through_merges_and_pickles() -> None:
    """A fetch Kafka refused the principal reports the refusal, whatever else the partition's
    evaluations found, so the batch is released and the run stops."""
    refused = KafkaAccessDenied("User:a", "Read", "t", "k:9093", "t.toml", "not authorized")
    param = FrameReportsParam()
    whole = report(WIDE, fetch(range(100, 1000)))
    value = param.addInPlace(param.zero({}), {(1, 0): whole})
    value = param.addInPlace(
        value, pickle.loads(pickle.dumps({(1, 0): FrameReport(refused=refused)}))
    )
    kept = value[(1, 0)].refused
    assert isinstance(kept, KafkaAccessDenied) and str(kept) == str(refused)


# -- property: the outcomes partition the plan exactly ------------------------------------------


@st.composite
def plans_and_fetches(draw: st.DrawFn) -> tuple[PartitionTask, list[FetchResult]]:
    """A plan of a few spans over 0..60 and 1-3 evaluations, each a fetch that returns or
    misses offsets in order and may be cut at some point."""
    points = sorted(draw(st.sets(st.integers(0, 60), min_size=2, max_size=8)))
    spans = tuple(  # adjacent spans (of different attempts) are fetched as one range
        Span(a, b, draw(st.integers(1, 3))) for a, b in pairwise(points) if draw(st.booleans())
    )
    assume(spans)
    task = PartitionTask("t", 0, Plan(spans, generation=0))
    planned = list(task.plan)
    gone = draw(st.sets(st.sampled_from(planned)))  # never in Kafka: missing in every fetch
    fetches = []
    for _ in range(draw(st.integers(1, 3))):
        cut_at = draw(st.sampled_from([*planned, None]))
        read = [o for o in planned if cut_at is None or o < cut_at]
        fetches.append(
            FetchResult(
                records(o for o in read if o not in gone),
                _as_ranges(o for o in read if o in gone),
                None if cut_at is None else (cut_at, 100),
            )
        )
    return task, fetches


def _as_ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def _offsets(outcomes: Iterable[Outcome], kind: OutcomeKind) -> list[int]:
    return [o for x in outcomes if x.kind is kind for o in range(x.offset, x.offset + x.count)]


@given(plans_and_fetches())
def test_acked_is_what_every_evaluation_fetched_and_gone_what_kafka_lacks(
    case: tuple[PartitionTask, list[FetchResult]],
) -> None:
    task, fetches = case
    result = settle_fetched(task, evaluations(task, *fetches))

    fetched_by_all = set.intersection(*({r.offset for r in f.records} for f in fetches))
    missing = {o for f in fetches for lo, hi in f.missing for o in range(lo, hi)}
    acked, gone = _offsets(result.outcomes, ACK), _offsets(result.outcomes, GONE)
    released = _offsets(result.outcomes, OutcomeKind.RELEASED)
    assert acked == sorted(fetched_by_all)
    assert gone == sorted(missing)
    assert released == sorted(set(task.plan) - fetched_by_all - missing)
    assert [x.offset for x in result.outcomes] == sorted(x.offset for x in result.outcomes)
    for outcome in result.outcomes:  # each outcome at the attempt of the span holding it
        lo, hi = outcome.offset, outcome.offset + outcome.count
        assert {task.plan.attempt_of(o) for o in range(lo, hi)} == {outcome.attempt}
    cuts = [f.out_of_range for f in fetches if f.out_of_range is not None]
    assert result.out_of_range == (max(cuts) if cuts else None)
