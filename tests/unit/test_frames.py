"""How `foreach_batch` settles a batch: acked within Kafka's watermarks, or failed whole."""

from __future__ import annotations

from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import Plan, Span
from kspout.spark.frames import _settled
from kspout.tasks import PartitionTask

ACK, FAIL = OutcomeKind.ACK, OutcomeKind.FAIL
TASK = PartitionTask("t", 2, Plan((Span(0, 4, 2), Span(4, 10, 1)), epoch=5))


def test_a_returned_batch_is_acked_span_by_span() -> None:
    result = _settled(TASK, low=0, high=10)
    assert result.outcomes == [Outcome(0, ACK, 2, count=4), Outcome(4, ACK, 1, count=6)]
    assert result.out_of_range is None and result.epoch == 5


def test_offsets_outside_the_watermarks_are_reported_not_acked() -> None:
    result = _settled(TASK, low=2, high=8)  # retention below, a truncated log above
    assert result.outcomes == [Outcome(2, ACK, 2, count=2), Outcome(4, ACK, 1, count=4)]
    assert result.out_of_range == (2, 8)


def test_a_raising_batch_fails_every_planned_offset() -> None:
    result = _settled(TASK, error="ValueError: boom")
    reason = FailReason.EXCEPTION
    assert result.outcomes == [
        Outcome(0, FAIL, 2, reason, "ValueError: boom", 4),
        Outcome(4, FAIL, 1, reason, "ValueError: boom", 6),
    ]
