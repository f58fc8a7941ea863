"""Each partition's `(low, high)` from Kafka, asked only when it can matter."""

from __future__ import annotations

from collections.abc import Callable

from kspout.kafka import KafkaMetadata

# Seconds a partition's watermarks are reused while it still has a backlog below `high`.
MAX_AGE = 1.0


class WatermarkCache:
    """Watermarks per partition, refreshed when the plan reaches the known high mark or the
    answer is older than `MAX_AGE`: a query costs a broker round trip, and the loop steps every
    few milliseconds while batches run."""

    def __init__(self, metadata: KafkaMetadata, topic: str, clock: Callable[[], float]) -> None:
        self._metadata = metadata
        self._topic = topic
        self._clock = clock
        self._known: dict[int, tuple[int, int]] = {}
        self._asked_at: dict[int, float] = {}

    def get(self, partition: int, emitted_to: int) -> tuple[int, int]:
        """`(low, high)` for planning from `emitted_to`, cached while it has a backlog."""
        cached = self._known.get(partition)
        now = self._clock()
        if (
            cached is not None
            and emitted_to < cached[1]
            and now - self._asked_at.get(partition, float("-inf")) < MAX_AGE
        ):
            return cached
        return self.fresh(partition)

    def fresh(self, partition: int) -> tuple[int, int]:
        """`(low, high)` asked of Kafka now, once and briefly (raises KafkaUnavailable: the
        caller's breaker decides when to ask again)."""
        bounds = self._metadata.watermarks(self._topic, partition, quick=True)
        self._known[partition] = bounds
        self._asked_at[partition] = self._clock()
        return bounds

    def known(self, partition: int) -> tuple[int, int]:
        """The last answer, `(0, 0)` before the first."""
        return self._known.get(partition, (0, 0))
