"""The unit of work the driver hands to executors, and the task body that runs it.

A `PartitionTask` names offsets (spans with their attempt numbers), never payloads: the
executor fetches them from Kafka itself. `run_task` is the whole executor side for a plain
per-record handler: fetch, call the handler on each record, and turn what happened into one
small `Outcome` per offset. The local runner calls it in-process; a Spark executor calls the
same function inside a Python worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from kspout.kafka import FetchResult, PartitionFetcher, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import Plan

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


class Executor(Protocol):
    """Runs a micro-batch of partition tasks somewhere and reports their results.

    `submit` returns at once; the driver keeps up to `max_batches_in_flight` futures.
    """

    def submit(self, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]: ...

    def close(self) -> None: ...


def describe_error(exc: BaseException) -> str:
    """A one-line error for outcomes and dead-letter headers."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def settle(task: PartitionTask, fetched: FetchResult, handler: Handler) -> TaskResult:
    """Run `handler` on every fetched record and report what happened, compactly.

    A handler that returns normally acks its record; one that raises fails it with EXCEPTION
    and the error text. Consecutive acks at one attempt travel as one counted outcome, so a
    clean span costs one small record, not one per message. Offsets Kafka does not have
    become GONE.
    """
    attempt_of = task.attempt_lookup()
    outcomes: list[Outcome] = []
    ack, fail = OutcomeKind.ACK, OutcomeKind.FAIL
    run_start = run_end = run_attempt = -1  # the run of acks not yet reported
    for record in fetched.records:
        offset = record.offset
        try:
            handler(record)
        except Exception as exc:
            error = describe_error(exc)
            attempt = attempt_of(offset)
            outcomes.append(Outcome(offset, fail, attempt, FailReason.EXCEPTION, error))
            continue
        attempt = attempt_of(offset)
        if offset == run_end and attempt == run_attempt:
            run_end += 1
            continue
        if run_end > run_start:
            outcomes.append(Outcome(run_start, ack, run_attempt, count=run_end - run_start))
        run_start, run_end, run_attempt = offset, offset + 1, attempt
    if run_end > run_start:
        outcomes.append(Outcome(run_start, ack, run_attempt, count=run_end - run_start))
    gone = OutcomeKind.GONE
    outcomes.extend(Outcome(lo, gone, count=hi - lo) for lo, hi in fetched.missing)
    outcomes.sort(key=lambda o: o.offset)
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, fetched.out_of_range)


def run_task(fetcher: PartitionFetcher, task: PartitionTask, handler: Handler) -> TaskResult:
    """Fetch a task's offsets from Kafka and settle them with `handler`."""
    fetched = fetcher.fetch(task.topic, task.partition, task.plan.ranges())
    return settle(task, fetched, handler)
