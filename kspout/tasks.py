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
from typing import Protocol

from kspout.kafka import FetchResult, PartitionFetcher, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind

Handler = Callable[[Record], object]


@dataclass(frozen=True, slots=True)
class PartitionTask:
    """Offsets of one partition to process: `(start, end, attempt)` spans, ascending."""

    topic: str
    partition: int
    epoch: int  # the PartitionManager epoch the plan belongs to
    spans: tuple[tuple[int, int, int], ...]

    def ranges(self) -> list[tuple[int, int]]:
        """Half-open ranges to fetch, adjacent spans joined."""
        out: list[tuple[int, int]] = []
        for start, end, _ in self.spans:
            if out and out[-1][1] == start:
                out[-1] = (out[-1][0], end)
            else:
                out.append((start, end))
        return out

    def attempt_lookup(self) -> Callable[[int], int]:
        """A fast offset -> attempt function for this task's spans."""
        if len(self.spans) == 1:
            only = self.spans[0][2]
            return lambda _offset: only
        starts = [s for s, _, _ in self.spans]
        attempts = [a for _, _, a in self.spans]
        return lambda offset: attempts[bisect_right(starts, offset) - 1]

    def __len__(self) -> int:
        return sum(end - start for start, end, _ in self.spans)


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
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def settle(task: PartitionTask, fetched: FetchResult, handler: Handler) -> TaskResult:
    """Run `handler` on every fetched record; one outcome per record plus GONE for holes.

    A handler that returns normally acks its record; one that raises fails it with
    EXCEPTION and the error text. Offsets Kafka does not have become GONE.
    """
    attempt_of = task.attempt_lookup()
    outcomes: list[Outcome] = []
    ack, fail = OutcomeKind.ACK, OutcomeKind.FAIL
    for record in fetched.records:
        offset = record.offset
        try:
            handler(record)
        except Exception as exc:
            outcomes.append(
                Outcome(offset, fail, attempt_of(offset), FailReason.EXCEPTION, describe_error(exc))
            )
        else:
            outcomes.append(Outcome(offset, ack, attempt_of(offset)))
    if fetched.missing:
        gone = OutcomeKind.GONE
        outcomes.extend(
            Outcome(o, gone, attempt_of(o)) for lo, hi in fetched.missing for o in range(lo, hi)
        )
        outcomes.sort(key=lambda o: o.offset)
    return TaskResult(task.topic, task.partition, task.epoch, outcomes, fetched.out_of_range)


def run_task(fetcher: PartitionFetcher, task: PartitionTask, handler: Handler) -> TaskResult:
    """Fetch a task's offsets from Kafka and settle them with `handler`."""
    fetched = fetcher.fetch(task.topic, task.partition, task.ranges())
    return settle(task, fetched, handler)
