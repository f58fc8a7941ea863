"""What the operator commands read of a topic's partitions, and how they print times.

`read_positions` puts each partition's stored record beside Kafka's watermarks (asked in one batched
query) and, for a partition without a record, the offset the topic file's `start` gives:
`offsets show`, `status` and `lag` all start from it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kspout.config import TopicConfig
from kspout.kafka import KafkaMetadata
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset


@dataclass(frozen=True, slots=True)
class PartitionPositions:
    """One partition: its record, Kafka's watermarks, and where `start` would begin."""

    partition: int
    record: StoredOffset | None
    watermarks: tuple[int, int] | None  # None: not in Kafka's metadata (a leftover record)
    start_offset: int | None  # only for a partition in Kafka without a record

    @property
    def position(self) -> int | None:
        """Where the spout goes on: the record's offset, else where `start` begins."""
        return self.record.offset if self.record is not None else self.start_offset

    @property
    def lag(self) -> int | None:
        """Offsets Kafka holds from `position` up (never negative, as the driver counts it);
        None for a partition Kafka does not have."""
        if self.watermarks is None or self.position is None:
            return None
        return max(0, self.watermarks[1] - self.position)

    @property
    def out_of_range(self) -> bool:
        """The record's offset lies outside Kafka's `[low, high]`."""
        if self.record is None or self.watermarks is None:
            return False
        low, high = self.watermarks
        return not low <= self.record.offset <= high


def read_positions(
    config: TopicConfig, store: ZkOffsetStore, kafka: KafkaMetadata
) -> list[PartitionPositions]:
    """Every partition Kafka knows, plus any stored record for a partition it does not;
    `TopicNotFound` when Kafka does not have the topic."""
    stored = store.read_all()
    in_kafka = kafka.watermarks_of(config.topic, kafka.require_topic(config.topic))
    out = []
    for partition in sorted(in_kafka.keys() | stored.keys()):
        record = stored.get(partition)
        bounds = in_kafka.get(partition)
        start_offset = None
        if record is None and bounds is not None:
            start_offset = kafka.resolve(config.start, config.topic, partition, bounds=bounds)
        out.append(PartitionPositions(partition, record, bounds, start_offset))
    return out


def iso(ms: int) -> str:
    """Wall ms as ISO 8601 UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def age(seconds: float) -> str:
    """A duration for people: `42s`, `7m`, `3h`, `2d`."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"
