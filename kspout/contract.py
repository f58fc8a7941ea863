"""What the driver and its executors agree on: the task, its result, the `Executor` protocol,
and what running tasks send the driver over the outcome channel.

Both sides import this module and neither imports the other: the driver plans
`PartitionTask`s and reads `TaskResult`s and `Message`s; `kspout.executor` and the Spark
backend run the tasks; `kspout.channel` carries the messages. Pure types only: no I/O, no
client library.

A `PartitionTask` names offsets (spans with their attempt numbers), never payloads: the
executor fetches them from Kafka itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from kspout.errors import KafkaRefused
from kspout.ordering import KeyOrder, fetch_ranges
from kspout.outcomes import Outcome
from kspout.partition_manager import Plan


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
    generation: int
    outcomes: list[Outcome]
    out_of_range: tuple[int, int] | None = None  # (low, high) when Kafka no longer had some
    # Set when the task failed outside per-message code (fetch, a bolt's prepare/cleanup/
    # execute_batch): its unsettled offsets are RELEASED, and the partition's breaker opens.
    infra_error: str | None = None
    # A previous attempt of this task died (Spark retried it): nothing ran; the driver
    # isolates the offsets that attempt left open to find the record that kills workers.
    attempt_died: bool = False
    # Set with `infra_error` when no retry can cure it (Kafka refused the principal Read on the
    # topic, or a handler's output Write: a revoked ACL): the driver stops the run with it.
    refused: KafkaRefused | None = None
    # `(position, epoch)`: the highest record fetched (at position - 1) was written in this
    # leader epoch (FetchResult.leader_epoch); the driver validates it to detect truncation.
    leader_epoch: tuple[int, int] | None = None


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


@dataclass(frozen=True, slots=True)
class ChannelAddress:
    """Where the driver listens, and the key that authenticates its tasks."""

    host: str
    port: int
    authkey: bytes

    def __repr__(self) -> str:  # the key never appears in logs
        return f"ChannelAddress({self.host}:{self.port})"


# What running tasks send the driver over the outcome channel (pickled, authenticated).

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
