"""The unit of work the driver hands to executors, and the task body that runs it.

A `PartitionTask` names offsets (spans with their attempt numbers), never payloads: the
executor fetches them from Kafka itself. `run_task` is the whole executor side for a plain
per-record handler: fetch, call the handler on each record, and turn what happened into one
small `Outcome` per offset. The local runner calls it in-process; a Spark executor calls the
same function inside a Python worker.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from kspout.channel.beacon import thread_beacon
from kspout.errors import KafkaUnavailable
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.kafka import FetchResult, PartitionFetcher, Record
from kspout.ordering import WAITS_FOR_KEY, KeyGate, KeyOrder, fetch_ranges, within
from kspout.outcomes import (
    FailReason,
    Failure,
    FailureCatalog,
    Outcome,
    OutcomeKind,
    describe_error,
)
from kspout.partition_manager import Plan

if TYPE_CHECKING:
    from kspout.channel.reporter import ChannelAddress

Handler = Callable[[Record], object]


@dataclass(frozen=True, slots=True)
class PartitionTask:
    """One partition's share of a micro-batch: the plan's offsets, with their attempts."""

    topic: str
    partition: int
    plan: Plan
    keys: KeyOrder | None = None  # set with `ordering = key`: blockers and the key slice

    def fetch_ranges(self) -> list[tuple[int, int]]:
        """What to fetch: the plan, and with `ordering = key` the blockers too."""
        if self.keys is None or not self.keys.blockers:
            return self.plan.ranges()
        return fetch_ranges(self.plan.ranges(), self.keys.blockers)

    def attempt_lookup(self) -> Callable[[int], int]:
        """An offset -> attempt function for the hot loop (no search when all match)."""
        attempts = {span.attempt for span in self.plan.spans}
        if len(attempts) == 1:
            only = attempts.pop()
            return lambda _offset: only
        return self.plan.attempt_of


@dataclass(frozen=True, slots=True)
class TaskResult:
    """What became of a task: one outcome per offset it could settle."""

    topic: str
    partition: int
    epoch: int
    outcomes: list[Outcome]
    out_of_range: tuple[int, int] | None = None  # (low, high) when Kafka no longer had some
    # Set when the task failed outside per-message code (fetch, a bolt's prepare/cleanup/
    # execute_batch): its unsettled offsets are RELEASED, and the partition's breaker opens.
    infra_error: str | None = None
    # A previous attempt of this task died (Spark retried it): nothing ran; the driver
    # isolates the offsets that attempt left open to find the record that kills workers.
    attempt_died: bool = False


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


def released(task: PartitionTask, error: str) -> TaskResult:
    """Every offset of `task` handed back for an infrastructure failure, no attempt spent."""
    outcomes = [
        Outcome(span.start, _RELEASED, span.attempt, error=error, count=span.end - span.start)
        for span in task.plan.spans
    ]
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, infra_error=error)


class Executor(Protocol):
    """Runs a micro-batch of partition tasks somewhere and reports their results.

    `submit` returns at once; the driver keeps up to `max_batches_in_flight` futures. Each
    batch has its own id, so one stuck batch can be cancelled without touching the others.
    """

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]: ...

    def cancel(self, batch: int) -> None:
        """Stop a running batch (its tasks are killed); its future then fails."""
        ...

    def stop_soon(self) -> None:
        """The spout is stopping: batches may end early, releasing what they did not start
        (in-process tasks do; Spark's jobs run to their end)."""
        ...

    def channel_host(self) -> str | None:
        """Where the driver should listen for this executor's beats (None: it sends none)."""
        ...

    def attach(self, address: ChannelAddress) -> None:
        """Tell the executor where the driver listens, before the first batch."""
        ...

    def close(self, *, cancel: bool = False) -> None:
        """Release resources; with `cancel`, abandon batches still running (an interrupt)."""
        ...


class OutcomeLog:
    """One task's outcomes, with consecutive acks at one attempt folded into counted runs.

    A clean span then costs one small record on its way to the driver, not one per message.
    Offsets must be reported in ascending order.
    """

    __slots__ = ("_attempt", "_attempt_of", "_end", "_failures", "_outcomes", "_spans", "_start")

    def __init__(self, task: PartitionTask) -> None:
        self._spans = task.plan.spans
        self._attempt_of = task.attempt_lookup()
        self._outcomes: list[Outcome] = []
        self._failures = FailureCatalog()
        self._start = self._end = self._attempt = -1  # the run of acks not yet written

    def ack(self, offset: int) -> None:
        self._extend(offset, offset + 1, self._attempt_of(offset))

    def ack_run(self, lo: int, hi: int) -> None:
        """Ack the consecutive offsets `[lo, hi)`, looking attempts up per span, not per offset."""
        spans = self._spans
        i = bisect_right(spans, lo, key=lambda span: span.start) - 1
        while lo < hi:
            span = spans[i]
            end = min(hi, span.end)
            self._extend(lo, end, span.attempt)
            lo, i = end, i + 1

    def _extend(self, lo: int, hi: int, attempt: int) -> None:
        if lo == self._end and attempt == self._attempt:
            self._end = hi
            return
        self._flush()
        self._start, self._end, self._attempt = lo, hi, attempt

    @property
    def outcomes(self) -> list[Outcome]:
        """The outcomes written so far (grows while the task runs; not sorted until
        `finish`). The task's reporter thread reads it to stream failures early."""
        return self._outcomes

    def fail(self, offset: int, exc: Exception) -> None:
        """A failure with EXCEPTION: user code raised `exc` (its type, message, place and
        traceback go with the outcome)."""
        failure = self._failures.of(exc)
        self._outcomes.append(
            Outcome(
                offset,
                _FAIL,
                self._attempt_of(offset),
                FailReason.EXCEPTION,
                describe_error(exc),
                failure=failure,
            )
        )

    def release(self, offset: int, exc: KafkaUnavailable) -> str:
        """User code met an outage of a Kafka it writes to: RELEASED, no attempt spent.
        Returns the error text, for the partition's breaker."""
        error = describe_error(exc)
        self.add(offset, _RELEASED, None, error)
        return error

    def add(
        self,
        offset: int,
        kind: OutcomeKind,
        reason: FailReason | None,
        error: str | Failure | None,
    ) -> None:
        """Any outcome but an ack, at the attempt the plan gave `offset` (`error`: a text, or
        what user code raised)."""
        attempt = self._attempt_of(offset)
        if isinstance(error, Failure):
            outcome = Outcome(offset, kind, attempt, reason, error.description, failure=error)
        else:
            outcome = Outcome(offset, kind, attempt, reason, error)
        self._outcomes.append(outcome)

    def finish(self, missing: Sequence[tuple[int, int]]) -> list[Outcome]:
        """Every outcome, ascending, with `missing` ranges reported GONE."""
        self._flush()
        outcomes = self._outcomes
        outcomes.extend(Outcome(lo, _GONE, count=hi - lo) for lo, hi in missing)
        outcomes.sort(key=lambda o: o.offset)
        return outcomes

    def _flush(self) -> None:
        if self._end > self._start:
            count = self._end - self._start
            self._outcomes.append(Outcome(self._start, _ACK, self._attempt, count=count))
            self._start = self._end


_ACK, _FAIL, _GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
_RELEASED, _DEFERRED = OutcomeKind.RELEASED, OutcomeKind.DEFERRED

OnFetched = Callable[[Sequence[tuple[int, int]], list[Outcome]], None]


def settle(
    task: PartitionTask,
    fetched: FetchResult,
    handler: Handler,
    on_fetched: OnFetched | None = None,
    stop: threading.Event | None = None,
) -> TaskResult:
    """Run `handler` on every fetched record and report what happened, compactly.

    A handler that returns normally acks its record; one that raises fails it with EXCEPTION
    and the error text, unless what it raised is `KafkaUnavailable` (the Kafka it writes to
    is down, e.g. `KafkaOutput.flush`): that is the infrastructure's fault, so the record is
    released, no attempt spent, and the partition's breaker hears of it. Offsets Kafka does
    not have become GONE. `on_fetched(missing, outcomes)` lets a reporter stream the
    outcomes while they grow; its thread's beacon names the record being handled. Once `stop`
    is set, the records not started yet are released (an in-process run stopping).
    """
    log = OutcomeLog(task)
    if on_fetched is not None:
        on_fetched(fetched.missing, log.outcomes)
    beacon = thread_beacon()
    outage: str | None = None  # the first KafkaUnavailable a handler raised
    halted: int | None = None  # where `stop` cut the loop
    start = end = -1  # the run of acked offsets not yet handed to the log
    for record in fetched.records:
        if stop is not None and stop.is_set():
            halted = record.offset
            break
        beacon.current = record
        try:
            handler(record)
        except KafkaUnavailable as exc:
            outage = log.release(record.offset, exc) or outage
            continue
        except Exception as exc:
            log.fail(record.offset, exc)
            continue
        offset = record.offset
        if offset == end:
            end += 1
            continue
        if end > start:
            log.ack_run(start, end)
        start, end = offset, offset + 1
    beacon.current = None
    if end > start:
        log.ack_run(start, end)
    return _result(task, log, fetched, fetched.missing, halted, outage)


def _result(
    task: PartitionTask,
    log: OutcomeLog,
    fetched: FetchResult,
    missing: Sequence[tuple[int, int]],
    halted: int | None,
    outage: str | None,
) -> TaskResult:
    """The task's result once its loop is over: with `halted` (a stop cut the loop there),
    every planned offset from there on is released; else, after an out-of-range fetch, those
    the fetch did not reach."""
    out_of_range = fetched.out_of_range
    if halted is not None:
        log.outcomes.extend(cut_short(task, halted, STOPPED))
        missing = [(lo, min(hi, halted)) for lo, hi in missing if lo < halted]
        out_of_range = None  # found again by the next run
    elif out_of_range is not None:
        log.outcomes.extend(cut_short(task, fetched.reached(task.plan.spans[0].start)))
    outcomes = log.finish(missing)
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, out_of_range, outage)


def run_task(
    fetcher: PartitionFetcher,
    task: PartitionTask,
    handler: Handler,
    on_fetched: OnFetched | None = None,
    stop: threading.Event | None = None,
) -> TaskResult:
    """Fetch a task's offsets from Kafka and settle them with `handler` (until `stop`).

    A failed fetch is the infrastructure's fault, not the messages': the task's offsets are
    released (no attempt spent) and the error is reported for the partition's breaker.
    The fetched records are kept out of the cycle collector's scans while the handler runs.
    """
    with cyclic_gc_paused_until_built() as built:
        try:
            fetched = fetcher.fetch(task.topic, task.partition, task.fetch_ranges())
        except Exception as exc:
            return released(task, describe_error(exc))
        built()
        if task.keys is not None:
            return settle_in_key_order(task, task.keys, fetched, handler, on_fetched, stop)
        return settle(task, fetched, handler, on_fetched, stop)


def settle_in_key_order(
    task: PartitionTask,
    order: KeyOrder,
    fetched: FetchResult,
    handler: Handler,
    on_fetched: OnFetched | None = None,
    stop: threading.Event | None = None,
) -> TaskResult:
    """`settle` for `ordering = key` (see kspout.ordering): a record runs only when no
    earlier record of its key is unfinished; one that has to wait is DEFERRED.

    `fetched` holds the blockers too; they only teach the gate their keys. In a slice of a
    split partition, records of other slices are reported acked here: the slices' results
    are merged with every non-ack winning (`merge_slices`), and each record is some slice's.
    """
    planned = task.plan.ranges()
    log = OutcomeLog(task)
    missing = within(planned, fetched.missing)
    if on_fetched is not None:
        on_fetched(missing, log.outcomes)
    records, blockers = _planned_and_blockers(fetched.records, planned)
    gate = KeyGate(blockers)
    beacon = thread_beacon()
    outage: str | None = None  # the first KafkaUnavailable a handler raised
    halted: int | None = None  # where `stop` cut the loop
    for record in records:
        offset = record.offset
        if stop is not None and stop.is_set():
            halted = offset
            break
        if not order.mine(record):
            log.ack(offset)
            continue
        if not gate.admits(record):
            log.add(offset, _DEFERRED, None, WAITS_FOR_KEY)
            gate.hold(record)
            continue
        beacon.current = record
        try:
            handler(record)
        except KafkaUnavailable as exc:
            outage = log.release(offset, exc) or outage
            gate.hold(record)
            continue
        except Exception as exc:
            log.fail(offset, exc)
            gate.hold(record)
            continue
        log.ack(offset)
    beacon.current = None
    return _result(task, log, fetched, missing, halted, outage)


def _planned_and_blockers(
    records: Sequence[Record], planned: Sequence[tuple[int, int]]
) -> tuple[list[Record], list[Record]]:
    """Split fetched records (ascending) into the planned ones and the blockers."""
    mine: list[Record] = []
    others: list[Record] = []
    i = 0
    for record in records:
        offset = record.offset
        while i < len(planned) and planned[i][1] <= offset:
            i += 1
        (mine if i < len(planned) and planned[i][0] <= offset else others).append(record)
    return mine, others


def split_by_key(tasks: Sequence[PartitionTask], slices: int) -> list[PartitionTask]:
    """Each key-ordered task as `slices` tasks that share its plan and split its keys by
    hash (`max_tasks_per_partition`); other tasks as they are."""
    out: list[PartitionTask] = []
    for task in tasks:
        if task.keys is None or slices == 1:
            out.append(task)
        else:
            out.extend(replace(task, keys=keys) for keys in task.keys.sliced(slices))
    return out


def join_slices(tasks: Sequence[PartitionTask], results: Sequence[TaskResult]) -> list[TaskResult]:
    """One result per task of `tasks`, merging the results of a split partition's slices."""
    by_partition: dict[int, list[TaskResult]] = {}
    for result in results:
        by_partition.setdefault(result.partition, []).append(result)
    return [merge_slices(t, by_partition[t.partition]) for t in tasks]


def merge_slices(task: PartitionTask, results: Sequence[TaskResult]) -> TaskResult:
    """One result for a partition split by key hash, from its slices' results.

    Each record belongs to one slice; the others report it acked. So every non-ack outcome
    stands (GONE and out-of-range ones, seen by every slice, once), and the rest is acked. A
    slice that died or failed outside per-message code speaks for the whole partition: which
    offsets were its records is not known here.
    """
    if len(results) == 1:
        return results[0]
    for result in results:
        if result.attempt_died or result.infra_error is not None:
            return result
    settled: dict[tuple[int, int, OutcomeKind], Outcome] = {}
    for result in results:
        for o in result.outcomes:
            if o.kind is not _ACK:
                settled.setdefault((o.offset, o.count, o.kind), o)
    holes: list[Outcome] = []
    for o in sorted(settled.values(), key=lambda o: o.offset):
        if not holes or o.offset >= holes[-1].offset + holes[-1].count:
            holes.append(o)  # an overlap only comes of slices whose fetch stopped apart
    outcomes = list(holes)
    h = 0
    for span in task.plan.spans:
        lo = span.start
        while h < len(holes) and holes[h].offset < span.end:
            hole = holes[h]
            end = hole.offset + hole.count
            if hole.offset > lo:
                outcomes.append(Outcome(lo, _ACK, span.attempt, count=hole.offset - lo))
            lo = max(lo, end)
            if end > span.end:
                break  # the hole goes on into the next span
            h += 1
        if lo < span.end:
            outcomes.append(Outcome(lo, _ACK, span.attempt, count=span.end - lo))
    outcomes.sort(key=lambda o: o.offset)
    out_of_range = next((r.out_of_range for r in results if r.out_of_range), None)
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, out_of_range)
