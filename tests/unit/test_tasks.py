"""The executor-side task body: handler outcomes, run-length encoded acks, GONE holes."""

from __future__ import annotations

import threading

from kspout.contract import PartitionTask
from kspout.errors import KafkaAccessDenied, KafkaUnavailable, OutputFailed, OutputUnavailable
from kspout.executor.task import CUT_SHORT, STOPPED, settle
from kspout.kafka import FetchResult, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind, describe_error
from kspout.partition_manager import Plan, Span

ACK, FAIL, GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
RELEASED = OutcomeKind.RELEASED


def record(offset: int, value: bytes = b"v") -> Record:
    return Record("t", 0, offset, None, value, -1, ())


def test_clean_spans_travel_as_one_counted_ack_per_attempt() -> None:
    plan = Plan((Span(0, 5, 2), Span(5, 10, 1)), generation=3)
    fetched = FetchResult([record(o) for o in range(10)], [])
    result = settle(PartitionTask("t", 0, plan), fetched, lambda r: None)
    assert result.outcomes == [Outcome(0, ACK, 2, count=5), Outcome(5, ACK, 1, count=5)]
    assert result.generation == 3


def test_an_exception_fails_only_its_record_and_splits_the_run() -> None:
    plan = Plan((Span(0, 8, 1),), generation=0)
    fetched = FetchResult([record(o) for o in range(8)], [])

    def handler(r: Record) -> None:
        if r.offset == 3:
            raise ValueError("bad payload\nsecond line")

    result = settle(PartitionTask("t", 0, plan), fetched, handler)
    failure = result.outcomes[1].failure
    assert result.outcomes == [
        Outcome(0, ACK, 1, count=3),
        Outcome(3, FAIL, 1, FailReason.EXCEPTION, "ValueError: bad payload", failure=failure),
        Outcome(4, ACK, 1, count=4),
    ]
    # What the handler raised, and where: the line of the `raise` above.
    line = handler.__code__.co_firstlineno + 2
    assert failure is not None
    assert failure.key == ("ValueError", "bad payload", f"test_tasks.py:{line}")
    assert failure.traceback.splitlines()[1].endswith(f"line {line}, in handler")


def test_a_stop_releases_the_records_not_started() -> None:
    plan = Plan((Span(0, 4, 1), Span(4, 10, 2)), generation=0)
    fetched = FetchResult([record(o) for o in range(10) if o != 1], [(1, 2)])
    stop = threading.Event()

    def handler(r: Record) -> None:
        if r.offset == 5:
            stop.set()  # as Ctrl-C would, while offset 5 is in hand

    result = settle(PartitionTask("t", 0, plan), fetched, handler, stop=stop)
    assert result.outcomes == [
        Outcome(0, ACK, 1),
        Outcome(1, GONE),
        Outcome(2, ACK, 1, count=2),
        Outcome(4, ACK, 2, count=2),  # offset 5 finished: the stop came while it ran
        Outcome(6, RELEASED, 2, error=STOPPED, count=4),
    ]


def test_a_kafka_outage_in_the_handler_releases_its_record_and_tells_the_breaker() -> None:
    """A handler whose own Kafka is down (`KafkaOutput.flush` raising `OutputUnavailable`)
    costs its record no attempt; a refused output (`OutputFailed`) still fails it."""
    plan = Plan((Span(0, 4, 2),), generation=0)
    fetched = FetchResult([record(o) for o in range(4)], [])
    outage = OutputUnavailable("notes", [("t@0:1#0", "Local: Message timed out")])

    def handler(r: Record) -> None:
        if r.offset == 1:
            raise outage
        if r.offset == 2:
            raise OutputFailed("notes", [("t@0:2#0", "Broker: Message size too large")])

    result = settle(PartitionTask("t", 0, plan), fetched, handler)
    refused = "OutputFailed: 1 output to notes not acknowledged by Kafka"
    assert result.outcomes[0] == Outcome(0, ACK, 2, count=1)
    assert result.outcomes[1] == Outcome(1, RELEASED, 2, None, describe_error(outage))
    assert result.outcomes[2].kind is FAIL and result.outcomes[2].error.startswith(refused)
    assert result.outcomes[3] == Outcome(3, ACK, 2, count=1)
    assert result.infra_error == describe_error(outage)
    assert isinstance(outage, KafkaUnavailable)


def test_an_output_refused_for_the_principal_releases_the_rest_and_carries_the_refusal() -> None:
    """A revoked Write on a handler's output topic is not the record's fault and no retry
    cures it: nothing fails (so nothing is dead-lettered), the record and those after it are
    released, and the result carries the refusal that stops the run."""
    plan = Plan((Span(0, 6, 1),), generation=0)
    fetched = FetchResult([record(o) for o in range(6)], [])
    refused = KafkaAccessDenied("User:a", "Write", "out", "k:9093", "t.toml", "not authorized")

    def handler(r: Record) -> None:
        if r.offset == 2:
            raise refused

    result = settle(PartitionTask("t", 0, plan), fetched, handler)
    error = describe_error(refused)
    assert result.outcomes == [
        Outcome(0, ACK, 1, count=2),
        Outcome(2, RELEASED, 1, error=error, count=4),
    ]
    assert result.refused is refused
    assert result.infra_error == error


def test_holes_become_gone_and_out_of_range_is_passed_on() -> None:
    """The fetch stopped at 5 (out of range): 5..9 were never handled, so they are released
    (no attempt spent) for the partition's out-of-range policy, not left to time out."""
    plan = Plan((Span(0, 10, 1),), generation=0)
    fetched = FetchResult([record(0), record(1), record(4)], [(2, 4)], out_of_range=(0, 5))
    result = settle(PartitionTask("t", 0, plan), fetched, lambda r: None)
    assert result.outcomes == [
        Outcome(0, ACK, 1, count=2),
        Outcome(2, GONE, None, count=2),
        Outcome(4, ACK, 1),
        Outcome(5, OutcomeKind.RELEASED, 1, error=CUT_SHORT, count=5),
    ]
    assert result.out_of_range == (0, 5)


def test_describe_error_is_one_line_with_the_type() -> None:
    assert describe_error(KeyError("id")) == "KeyError: 'id'"
    assert describe_error(RuntimeError()) == "RuntimeError"
