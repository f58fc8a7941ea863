"""The task body of a plain per-record handler: fetch, run the handler on each record, and
turn what happened into a few small `Outcome`s.

`run_task` is the whole executor side for a handler: the in-process executor calls it on its
worker thread; a Spark executor calls the same function inside a Python worker. `settle` is its
one handler loop; with `ordering = key` a gate (`kspout.executor.gates`) decides which records
run now.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from kspout.channel.beacon import thread_beacon
from kspout.contract import PartitionTask, TaskResult
from kspout.errors import KafkaRefused, KafkaUnavailable
from kspout.executor.gates import Verdict, gated
from kspout.executor.outcome_log import OutcomeLog
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.kafka import FetchResult, PartitionFetcher, Record
from kspout.ordering import WAITS_FOR_KEY
from kspout.outcomes import Outcome, OutcomeKind, describe_error

Handler = Callable[[Record], object]
OnFetched = Callable[[Sequence[tuple[int, int]], list[Outcome]], None]

_RELEASED, _DEFERRED = OutcomeKind.RELEASED, OutcomeKind.DEFERRED
_RUN, _WAIT = Verdict.RUN, Verdict.WAIT

CUT_SHORT = "not fetched: the fetch stopped where Kafka no longer had an offset"
STOPPED = "not run: the spout was stopping"


def cut_short(task: PartitionTask, reached: int, error: str = CUT_SHORT) -> list[Outcome]:
    """RELEASED outcomes for the planned offsets at or after `reached`, where an out-of-range
    fetch (or a stop) cut the task: nobody handled them, so they cost no attempt; after an
    out-of-range fetch the partition's out-of-range policy decides what becomes of them."""
    return [
        Outcome(
            max(span.start, reached),
            _RELEASED,
            span.attempt,
            error=error,
            count=span.end - max(span.start, reached),
        )
        for span in task.plan.spans
        if span.end > reached
    ]


def released(task: PartitionTask, error: str, refused: KafkaRefused | None = None) -> TaskResult:
    """Every offset of `task` handed back for an infrastructure failure, no attempt spent
    (with `refused`, one that stops the run)."""
    outcomes = [
        Outcome(span.start, _RELEASED, span.attempt, error=error, count=span.end - span.start)
        for span in task.plan.spans
    ]
    return TaskResult(
        task.topic,
        task.partition,
        task.plan.generation,
        outcomes,
        infra_error=error,
        refused=refused,
    )


def refused_by_kafka(exc: BaseException) -> KafkaRefused | None:
    """`exc` when Kafka refused the principal (a revoked ACL, a changed password): no retry
    cures it, so the run stops; else None."""
    return exc if isinstance(exc, KafkaRefused) else None


def settle(
    task: PartitionTask,
    fetched: FetchResult,
    handler: Handler,
    on_fetched: OnFetched | None = None,
    stop: threading.Event | None = None,
) -> TaskResult:
    """Run `handler` on the fetched records its gate admits and report what happened, compactly.

    A handler that returns normally acks its record; one that raises fails it with EXCEPTION
    and the error text, unless what it raised is `KafkaUnavailable` (the Kafka it writes to
    is down, e.g. `KafkaOutput.flush`): that is the infrastructure's fault, so the record is
    released, no attempt spent, and the partition's breaker hears of it. A record that does
    not finish is held by the gate. Offsets Kafka does not have become GONE.
    `on_fetched(missing, outcomes)` lets a reporter stream the outcomes while they grow; its
    thread's beacon names the record being handled. Once `stop` is set, the records not
    started yet are released (an in-process run stopping).
    """
    records, missing, gate = gated(task, fetched)
    log = OutcomeLog(task)
    if on_fetched is not None:
        on_fetched(missing, log.outcomes)
    beacon = thread_beacon()
    outage: str | None = None  # the first KafkaUnavailable a handler raised
    halted: int | None = None  # where `stop` (or a refusal) cut the loop
    refused: KafkaRefused | None = None
    start = end = -1  # the run of acked offsets not yet handed to the log
    admit = None if gate is None else gate.admit  # a plain task's loop pays one test
    for record in records:
        offset = record.offset
        if stop is not None and stop.is_set():
            halted = offset
            break
        if admit is None or (verdict := admit(record)) is _RUN:
            beacon.current = record
            try:
                handler(record)
            except KafkaRefused as exc:
                halted, refused = offset, exc
                break
            except KafkaUnavailable as exc:
                error = log.release(offset, exc)
                outage = outage or error
                if gate is not None:
                    gate.hold(record)
                continue
            except Exception as exc:
                log.fail(offset, exc)
                if gate is not None:
                    gate.hold(record)
                continue
        elif verdict is _WAIT:
            log.add(offset, _DEFERRED, None, WAITS_FOR_KEY)
            continue
        if offset == end:  # acked: the handler returned, or the record is another slice's
            end += 1
            continue
        if end > start:
            log.ack_run(start, end)
        start, end = offset, offset + 1
    beacon.current = None
    if end > start:
        log.ack_run(start, end)
    return _result(task, log, fetched, missing, halted, outage, refused)


def _result(
    task: PartitionTask,
    log: OutcomeLog,
    fetched: FetchResult,
    missing: Sequence[tuple[int, int]],
    halted: int | None,
    outage: str | None,
    refused: KafkaRefused | None,
) -> TaskResult:
    """The task's result once its loop is over: with `halted` (a stop or a refusal cut the
    loop there), every planned offset from there on is released; else, after an out-of-range
    fetch, those the fetch did not reach."""
    out_of_range = fetched.out_of_range
    why = STOPPED
    if refused is not None:
        why = outage = describe_error(refused)
    if halted is not None:
        log.outcomes.extend(cut_short(task, halted, why))
        missing = [(lo, min(hi, halted)) for lo, hi in missing if lo < halted]
        out_of_range = None  # found again by the next run
    elif out_of_range is not None:
        log.outcomes.extend(cut_short(task, fetched.reached(task.plan.spans[0].start)))
    outcomes = log.finish(missing)
    return TaskResult(
        task.topic,
        task.partition,
        task.plan.generation,
        outcomes,
        out_of_range,
        outage,
        refused=refused,
        leader_epoch=fetched.leader_epoch,
    )


def run_task(
    fetcher: PartitionFetcher,
    task: PartitionTask,
    handler: Handler,
    on_fetched: OnFetched | None = None,
    stop: threading.Event | None = None,
) -> TaskResult:
    """Fetch a task's offsets from Kafka and settle them with `handler` (until `stop`).

    A failed fetch is the infrastructure's fault, not the messages': the task's offsets are
    released (no attempt spent) and the error is reported for the partition's breaker, or,
    refused by Kafka's ACLs, to stop the run.
    The fetched records are kept out of the cycle collector's scans while the handler runs.
    """
    with cyclic_gc_paused_until_built() as built:
        try:
            fetched = fetcher.fetch(task.topic, task.partition, task.fetch_ranges())
        except Exception as exc:
            return released(task, describe_error(exc), refused_by_kafka(exc))
        built()
        return settle(task, fetched, handler, on_fetched, stop)
