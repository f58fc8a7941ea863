"""What user code raised: `FailureCatalog` (executor side) and `FailureLog` (driver side)."""

from __future__ import annotations

import json
import logging

import pytest

from kspout.driver import failure_log
from kspout.driver.failure_log import FailureLog
from kspout.outcomes import TRACEBACK_LIMIT, FailReason, FailureCatalog, Outcome, OutcomeKind

TOPIC = "orders"


def parse(text: str) -> object:
    return json.loads(text)  # the user's line: the place, though json raises deeper


def raised(text: str) -> Exception:
    try:
        parse(text)
    except ValueError as exc:
        return exc
    raise AssertionError("json accepted it")


def test_a_failure_names_the_users_line_not_the_librarys() -> None:
    failure = FailureCatalog().of(raised("{"))
    assert failure.kind == "JSONDecodeError"
    assert failure.message.startswith("Expecting property name")
    line = parse.__code__.co_firstlineno + 1
    assert failure.place == f"test_failure_log.py:{line}"
    assert str(failure) == f"JSONDecodeError({failure.message!r}) at test_failure_log.py:{line}"
    assert failure.traceback.startswith("Traceback (most recent call last)")
    assert "in parse" in failure.traceback and "json.decoder.JSONDecodeError" in failure.traceback


def test_alike_failures_share_one_object_and_tracebacks_are_bounded() -> None:
    catalog = FailureCatalog()
    assert catalog.of(raised("{")) is catalog.of(raised("{"))
    assert catalog.of(raised("{")) is not catalog.of(raised("["))  # another message
    try:
        raise RuntimeError("x" * (3 * TRACEBACK_LIMIT))
    except RuntimeError as exc:
        long = catalog.of(exc)
    assert len(long.traceback) <= TRACEBACK_LIMIT + len("...\n")
    assert long.traceback.startswith("...\n")


def failed(offset: int, exc: Exception, catalog: FailureCatalog, attempt: int = 1) -> Outcome:
    return Outcome(
        offset,
        OutcomeKind.FAIL,
        attempt,
        FailReason.EXCEPTION,
        str(exc),
        failure=catalog.of(exc),
    )


def test_the_first_failure_per_partition_is_logged_then_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = FailureLog(TOPIC, lambda: now[0], every=10.0)
    catalog = FailureCatalog()
    bad = raised("{")
    with caplog.at_level(logging.WARNING, "kspout.driver.failure_log"):
        failures.record(0, [failed(o, bad, catalog) for o in range(3)])
        failures.record(1, [failed(7, bad, catalog)])
        # Not the record's fault, or no failure: not counted.
        timeout = Outcome(8, OutcomeKind.FAIL, 1, FailReason.TIMEOUT, "not completed")
        outage = Outcome(9, OutcomeKind.RELEASED, 1, error="KafkaUnavailable: broker down")
        failures.record(1, [timeout, outage, Outcome(10, OutcomeKind.ACK, 1, count=5)])
        first = [r.getMessage() for r in caplog.records]
        now[0] = 9.0
        failures.tick()  # not yet: 10 s between count lines
        assert len(caplog.records) == 2
        now[0] = 10.0
        failures.tick()
        failures.tick()  # nothing new to say
    counted = [r.getMessage() for r in caplog.records][2:]

    kind = catalog.of(bad)
    assert [line.splitlines()[0] for line in first] == [
        f"{TOPIC}[0] offset 0 failed (attempt 1): {kind}",
        f"{TOPIC}[1] offset 7 failed (attempt 1): {kind}",
    ]
    assert all("Traceback (most recent call last)" in line for line in first)
    assert counted == [f"{TOPIC}: {kind} again 2 times in the last 10 s, partition 0"]

    [summary] = failures.summary()
    assert (summary.failures, summary.records, summary.dead_lettered) == (4, 4, 0)
    assert summary.partitions == (0, 1) and summary.failure is kind
    assert failures.records == 4


def test_the_summary_groups_by_kind_and_counts_records_and_dead_letters() -> None:
    failures = FailureLog(TOPIC, lambda: 0.0)
    catalog = FailureCatalog()
    a, b = raised("{"), raised("[")
    failures.record(0, [failed(1, a, catalog), failed(2, a, catalog), failed(3, b, catalog)])
    failures.record(0, [failed(1, a, catalog, attempt=2)])  # a retry of offset 1: same record

    assert failures.tracebacks(0, [1, 3, 4]) == {
        1: catalog.of(a).traceback,
        3: catalog.of(b).traceback,
    }
    failures.dead_lettered(0, [1])
    failures.finished_below({0: 3})  # offset 2 succeeded on its retry
    assert failures.tracebacks(0, [1, 2]) == {}

    first, second = failures.summary()  # the most failures first
    assert (first.failure, first.failures, first.records, first.dead_lettered) == (
        catalog.of(a),
        3,
        2,
        1,
    )
    assert (second.failure, second.failures, second.records) == (catalog.of(b), 1, 1)
    assert failures.records == 3


def test_messages_that_name_their_record_are_bounded_in_the_log_and_the_summary(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(failure_log, "MAX_KINDS", 4)
    failures = FailureLog(TOPIC, lambda: 0.0)
    catalog = FailureCatalog()

    def missing(offset: int) -> Exception:
        try:
            {}[f"id-{offset}"]
        except KeyError as exc:
            return exc
        raise AssertionError("found")

    with caplog.at_level(logging.WARNING, "kspout.driver.failure_log"):
        failures.record(0, [failed(o, missing(o), catalog) for o in range(10)])
        failures.tick(final=True)
    lines = [r.getMessage() for r in caplog.records]
    tracebacks = [line for line in lines if "Traceback" in line]
    assert len(tracebacks) == failure_log.TRACEBACKS_PER_PLACE  # one per message, at most 3
    again = [line for line in lines if " again " in line]
    assert again == [  # one line for the type and place, however many messages
        f"{TOPIC}: KeyError (several messages) at {catalog.of(missing(3)).place} again 7 times "
        "in the last 0 s, partition 0"
    ]

    kinds = failures.summary()
    assert len(kinds) == 5  # four kinds, then the rest of that type and place under one
    other = next(k for k in kinds if k.failure.message == failure_log.OTHER_MESSAGES)
    assert (other.failures, other.records) == (6, 6)
    assert failures.records == 10
    assert failures.tracebacks(0, [9])[9] == catalog.of(missing(9)).traceback  # its own
