"""The unit of work the driver hands to executors, and the task body that runs it.

A `PartitionTask` names offsets (spans with their attempt numbers), never payloads: the
executor fetches them from Kafka itself. `run_task` is the whole executor side for a plain
per-record handler: fetch, call the handler on each record, and turn what happened into one
small `Outcome` per offset. The local runner calls it in-process; a Spark executor calls the
same function inside a Python worker.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kspout.channel.beacon import BEACON
from kspout.kafka import FetchResult, PartitionFetcher, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind, describe_error
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


def cut_short(task: PartitionTask, reached: int) -> list[Outcome]:
    """RELEASED outcomes for the planned offsets at or after `reached`, where an out-of-range
    fetch stopped: nobody handled them, so they cost no attempt; the partition's out-of-range
    policy decides what becomes of them."""
    return [
        Outcome(
            max(span.start, reached),
            _RELEASED,
            span.attempt,
            error=CUT_SHORT,
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

    __slots__ = ("_attempt", "_attempt_of", "_end", "_outcomes", "_spans", "_start")

    def __init__(self, task: PartitionTask) -> None:
        self._spans = task.plan.spans
        self._attempt_of = task.attempt_lookup()
        self._outcomes: list[Outcome] = []
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

    def fail(self, offset: int, error: str) -> None:
        """A failure with EXCEPTION (user code raised or failed the tuple)."""
        self.add(offset, _FAIL, FailReason.EXCEPTION, error)

    def add(
        self, offset: int, kind: OutcomeKind, reason: FailReason | None, error: str | None
    ) -> None:
        """Any outcome but an ack, at the attempt the plan gave `offset`."""
        self._outcomes.append(Outcome(offset, kind, self._attempt_of(offset), reason, error))

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
_RELEASED = OutcomeKind.RELEASED

OnFetched = Callable[[Sequence[tuple[int, int]], list[Outcome]], None]


def settle(
    task: PartitionTask,
    fetched: FetchResult,
    handler: Handler,
    on_fetched: OnFetched | None = None,
) -> TaskResult:
    """Run `handler` on every fetched record and report what happened, compactly.

    A handler that returns normally acks its record; one that raises fails it with EXCEPTION
    and the error text. Offsets Kafka does not have become GONE. `on_fetched(missing,
    outcomes)` lets a reporter stream the outcomes while they grow; `BEACON.current` names
    the record being handled.
    """
    log = OutcomeLog(task)
    if on_fetched is not None:
        on_fetched(fetched.missing, log.outcomes)
    beacon = BEACON
    start = end = -1  # the run of acked offsets not yet handed to the log
    for record in fetched.records:
        beacon.current = record
        try:
            handler(record)
        except Exception as exc:
            log.fail(record.offset, describe_error(exc))
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
    if fetched.out_of_range is not None:
        log.outcomes.extend(cut_short(task, fetched.reached(task.plan.spans[0].start)))
    outcomes = log.finish(fetched.missing)
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, fetched.out_of_range)


def run_task(
    fetcher: PartitionFetcher,
    task: PartitionTask,
    handler: Handler,
    on_fetched: OnFetched | None = None,
) -> TaskResult:
    """Fetch a task's offsets from Kafka and settle them with `handler`.

    A failed fetch is the infrastructure's fault, not the messages': the task's offsets are
    released (no attempt spent) and the error is reported for the partition's breaker.
    """
    try:
        fetched = fetcher.fetch(task.topic, task.partition, task.plan.ranges())
    except Exception as exc:
        return released(task, describe_error(exc))
    return settle(task, fetched, handler, on_fetched)
