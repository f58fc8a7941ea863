"""What tasks send the driver over the outcome channel (pickled, authenticated)."""

from __future__ import annotations

from dataclasses import dataclass

from kspout.executor.task import TaskResult
from kspout.outcomes import Outcome

RootKey = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True, slots=True)
class TaskId:
    """One Spark task of one micro-batch: its stage and its index within the stage."""

    batch: int
    stage: int
    index: int


@dataclass(frozen=True, slots=True)
class Beat:
    """A running task's heartbeat.

    `current` is the root the task is handling now (None between records: fetching,
    preparing, claiming, cleaning up) and `busy_for` how long it has been on it, in seconds.
    A plain-handler task also reports `upto`: every record it fetched below that offset is
    settled, acked unless listed in `failures` (its non-ack outcomes since the last beat) or
    inside `missing` (offsets Kafka does not have, sent once after the fetch). `done` is the
    task's last beat.
    """

    task: TaskId
    partition: int | None  # the Kafka partition of a first-stage task
    current: RootKey | None
    busy_for: float
    upto: int | None = None
    failures: tuple[Outcome, ...] = ()
    missing: tuple[tuple[int, int], ...] | None = None
    done: bool = False


@dataclass(frozen=True, slots=True)
class Final:
    """A task's final results, sent as soon as they exist (before Spark's job ends)."""

    batch: int
    results: tuple[TaskResult, ...]


Message = Beat | Final
