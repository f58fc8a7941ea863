"""The topic's partitions and their watermarks for the stream's planner, asked at a bounded rate.

PySpark calls `latestOffset` every few milliseconds while a query is idle, and a watermark query
is a broker round trip (one batched query for all partitions, `KafkaMetadata.watermarks_of`):
answering every call fresh would keep the brokers busy for nothing. So the watermarks are asked
again at most every `interval` seconds, and the partition list (to find partitions added to the
topic) every `partition_refresh` seconds of the topic file. Each answer also holds the leader
epoch every leader sent with its high watermark: a newer one than a batch was planned in says
a new leader took over since, which the planner checks for a truncated log.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kspout.config import TopicConfig
from kspout.kafka import KafkaMetadata

# Seconds between two watermark queries: a trigger sees new records at most this late, and an
# idle query costs one batched watermark query this often.
INTERVAL = 0.5


class ThrottledWatermarks:
    """`(low, high)` of every partition of the topic, at most `interval` seconds old."""

    def __init__(
        self,
        config: TopicConfig,
        metadata: KafkaMetadata,
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._interval = interval
        self._clock = clock
        self._partitions: list[int] = []
        self._listed_at = float("-inf")
        self._known: dict[int, tuple[int, int]] = {}
        self._epochs: dict[int, int] = {}
        self._asked_at = float("-inf")

    def get(self) -> dict[int, tuple[int, int]]:
        """Each partition's `(low, high)`, asked again when the last answer is `interval` old."""
        if self._clock() - self._asked_at >= self._interval:
            self.refresh()
        return dict(self._known)

    def refresh(self) -> dict[int, tuple[int, int]]:
        """Each partition's `(low, high)` asked of Kafka now; `TopicNotFound` when the topic
        has no partitions."""
        now = self._clock()
        if now - self._listed_at >= self._config.partition_refresh:
            partitions = self._metadata.require_topic(self._config.topic)
            self._partitions, self._listed_at = partitions, now
        epochs: dict[int, int] = {}
        self._known = self._metadata.watermarks_of(
            self._config.topic, self._partitions, epochs=epochs
        )
        self._epochs, self._asked_at = epochs, now
        return dict(self._known)

    def known(self) -> dict[int, tuple[int, int]]:
        """The last answer, without asking ({} before the first)."""
        return dict(self._known)

    def epochs(self) -> dict[int, int]:
        """The leader epochs the leaders sent with the last answer's high watermarks (a
        partition whose leader sent none is left out)."""
        return dict(self._epochs)
