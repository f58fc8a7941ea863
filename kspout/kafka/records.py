"""The values Kafka I/O hands out: records, fetch results and dead letters.

Plain frozen values with no client types in them, so they pickle between Spark stages and the
driver can reason about them without importing confluent-kafka.
"""

from __future__ import annotations

from dataclasses import dataclass

Headers = tuple[tuple[str, bytes | None], ...]

# What a record's timestamp means: Kafka's own ids (its `TimestampType`), which Spark's Kafka
# source shows in its `timestampType` column. The topic's `message.timestamp.type` decides.
NO_TIMESTAMP = -1
CREATE_TIME = 0  # set by the producer
LOG_APPEND_TIME = 1  # set by the broker when it appended the record


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka message as kspout hands it to user code."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch, -1 when the message carries none
    headers: Headers
    timestamp_type: int = CREATE_TIME  # NO_TIMESTAMP, CREATE_TIME or LOG_APPEND_TIME


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """Fetched records of one partition as columns (`PartitionFetcher.fetch_columns`): the
    fields a columnar first stage reads, one list each, in offset order, with no `Record`
    built per message."""

    partition: int
    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps: list[int]

    def add(self, record: Record) -> None:
        """One more record, after those already in (the fetch's slow path; its hot loop
        appends to the lists itself)."""
        self.offsets.append(record.offset)
        self.keys.append(record.key)
        self.values.append(record.value)
        self.timestamps.append(record.timestamp)


@dataclass(frozen=True, slots=True)
class FetchResult:
    """What one `PartitionFetcher.fetch` call found for the spans it was asked for.

    * `records`: ascending; each requested offset at most once; nothing outside the spans.
    * `missing`: half-open ranges of requested offsets inside Kafka's `[low, high)` that hold
      no record (compacted away, transaction markers): the caller marks them GONE.
    * `out_of_range`: `(low, high)` when a requested offset lies below low or at/above high.
      Fetching stopped there; requested offsets neither returned nor missing are left to the
      caller's out-of-range policy.
    * `leader_epoch`: `(position, epoch)` of the highest record fetched (at `position - 1`,
      written in leader epoch `epoch`), None when no record came or the broker sent no epoch:
      what the driver validates against Kafka to detect a truncated log.
    * `columns`: from `fetch_columns`, the records as columns instead (`records` is empty).
    """

    records: list[Record]
    missing: list[tuple[int, int]]
    out_of_range: tuple[int, int] | None = None
    leader_epoch: tuple[int, int] | None = None
    columns: RecordColumns | None = None

    def reached(self, start: int) -> int:
        """The first requested offset at or after `start` the fetch did not account for
        (neither returned nor missing): where an out-of-range fetch stopped."""
        ends = [start]
        if self.records:
            ends.append(self.records[-1].offset + 1)
        if self.columns is not None and self.columns.offsets:
            ends.append(self.columns.offsets[-1] + 1)
        if self.missing:
            ends.append(self.missing[-1][1])
        return max(ends)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An offset given up on, with the original message when Kafka still has it."""

    topic: str
    partition: int
    offset: int
    attempts: int
    reason: str
    error: str | None
    record: Record | None
    traceback: str | None = None  # where user code raised, when it did


class RecordBuilder:
    """A mutable twin of `Record` (same slots, same order) that turns into one.

    A frozen dataclass sets each field through `object.__setattr__`; for a fetch, which builds
    one record per message, that alone costs as much as librdkafka's whole share of a bare
    consume loop. Fetching instead fills this plain slotted object and then assigns its
    `__class__` to `Record` (allowed: the layouts are identical), which is about half the
    cost. The result is an ordinary, equal, frozen `Record`; tests hold the two in step.
    """

    # Record's field order, which `__class__` assignment requires.
    __slots__ = (  # noqa: RUF023
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "timestamp",
        "headers",
        "timestamp_type",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers,
        timestamp_type: int,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.timestamp = timestamp
        self.headers = headers
        self.timestamp_type = timestamp_type


def make_record(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    timestamp: int,
    headers: Headers,
    timestamp_type: int = CREATE_TIME,
) -> Record:
    """`Record(...)` at half the cost (see RecordBuilder); the fetch loop inlines this."""
    record = RecordBuilder(topic, partition, offset, key, value, timestamp, headers, timestamp_type)
    record.__class__ = Record  # type: ignore[assignment]
    return record  # type: ignore[return-value]
