"""Each partition's `(low, high)` from Kafka, asked only when it can matter, many at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from kspout.errors import KafkaUnavailable
from kspout.kafka import KafkaMetadata

# Seconds a partition's watermarks are reused while it still has a backlog below `high`, and
# its low mark while it is caught up (asked for its high every step). The low moves only when
# retention deletes records; a fetch below it reports that at once (`OutOfRangeHandler.hint`).
MAX_AGE = 1.0


class WatermarkCache:
    """Watermarks per partition, refreshed when the plan reaches the known high mark or the
    answer is older than `MAX_AGE`: a query costs a broker round trip, and the loop steps every
    few milliseconds while batches run. The partitions one step needs are asked together, in
    one batched query (`KafkaMetadata.watermarks_now`), for their high marks only while their
    low marks are younger than `MAX_AGE`: one request per broker instead of two."""

    def __init__(self, metadata: KafkaMetadata, topic: str, clock: Callable[[], float]) -> None:
        self._metadata = metadata
        self._topic = topic
        self._clock = clock
        self._known: dict[int, tuple[int, int]] = {}
        self._asked_at: dict[int, float] = {}
        self._low_asked_at: dict[int, float] = {}

    def refresh(self, wanted: Mapping[int, int]) -> dict[int, KafkaUnavailable]:
        """Make `known` fit for planning each partition of `wanted` (partition -> its
        `emitted_to`): ask again, together, those planned up to their known high and those
        asked `MAX_AGE` ago. Returns the partitions Kafka gave no answer for, and why."""
        now = self._clock()
        return self.ask(
            p
            for p, emitted_to in wanted.items()
            if p not in self._known
            or emitted_to >= self._known[p][1]
            or now - self._asked_at[p] >= MAX_AGE
        )

    def ask(self, partitions: Iterable[int]) -> dict[int, KafkaUnavailable]:
        """Ask Kafka now, once and briefly, for `partitions` in one query; returns those
        without an answer, and why (the caller's breakers decide when to ask again)."""
        asked = list(partitions)
        if not asked:
            return {}
        now = self._clock()
        known, low_at = self._known, self._low_asked_at
        lows = {p: known[p][0] for p in asked if p in low_at and now - low_at[p] < MAX_AGE}
        found, failed = self._metadata.watermarks_now(self._topic, asked, lows)
        now = self._clock()
        known.update(found)
        self._asked_at.update(dict.fromkeys(found, now))
        low_at.update(dict.fromkeys(found.keys() - lows.keys(), now))
        return dict(failed)

    def fresh(self, partition: int) -> tuple[int, int]:
        """`(low, high)` asked of Kafka now, once and briefly (raises KafkaUnavailable: the
        caller's breaker decides when to ask again)."""
        bounds = self._metadata.watermarks(self._topic, partition, quick=True)
        self._known[partition] = bounds
        self._asked_at[partition] = self._low_asked_at[partition] = self._clock()
        return bounds

    def known(self, partition: int) -> tuple[int, int]:
        """The last answer, `(0, 0)` before the first."""
        return self._known.get(partition, (0, 0))
